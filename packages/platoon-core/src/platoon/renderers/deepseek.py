"""The DeepSeek-V3.1 renderers: `deepseekv3` and `deepseekv3_disable_thinking` (non-thinking), `deepseekv3_thinking`.

Each renders exactly what tinker-cookbook 0.3.0's renderer of the same name renders: DeepSeek's User/Assistant role
tokens after begin-of-sentence, a leading system prompt without a role token, DeepSeek's tool-call tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from platoon.renderers.base import (
    CallGroup,
    CompletionParts,
    FunctionBody,
    Message,
    RenderContext,
    RenderedMessage,
    Renderer,
    RendererError,
    Tokenizer,
    ToolCall,
    ToolSpec,
    UnparsedToolCall,
    attach_tool_calls,
    group_items,
    parse_think_blocks,
)
from platoon.renderers.role_colon import ensure_text

_SEP = "\uff5c"  # the fullwidth bar of DeepSeek's special tokens, written escaped to keep the source ASCII-legible

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def _special(name: str) -> str:
    return f"<{_SEP}{name}{_SEP}>"


TOOL_CALLS_BEGIN = _special("tool▁calls▁begin")
TOOL_CALLS_END = _special("tool▁calls▁end")
TOOL_CALL_BEGIN = _special("tool▁call▁begin")
TOOL_CALL_END = _special("tool▁call▁end")
TOOL_SEP = _special("tool▁sep")
TOOL_OUTPUT_BEGIN = _special("tool▁output▁begin")
TOOL_OUTPUT_END = _special("tool▁output▁end")

_CALLS_SECTION = re.compile(f"{TOOL_CALLS_BEGIN}(.*?){TOOL_CALLS_END}", re.DOTALL)
_CALLS_SECTION_WITH_SPACE = re.compile(rf"\s*{TOOL_CALLS_BEGIN}.*?{TOOL_CALLS_END}", re.DOTALL)
_CALL = re.compile(rf"{TOOL_CALL_BEGIN}(\w+){TOOL_SEP}(.*?){TOOL_CALL_END}", re.DOTALL)

_TOOLS_TEMPLATE = """

## Tools
You have access to the following tools:

{tool_blocks}

IMPORTANT: ALWAYS adhere to this exact format for tool use:
{format_line}

Where:
- `tool_call_name` must be an exact match to one of the available tools
- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema
- For multiple tool calls, chain them directly without separators or spaces"""


class _DeepSeekV3Renderer(Renderer):
    """The shared DeepSeek-V3.1 format.

    `system_role_as_user` renders a system message after the first as a user turn (else it is an error);
    `strip_thinking_from_history` (default True, HF's behaviour) drops the thinking of earlier assistant turns
    without tool calls.
    """

    # The cookbook's is True; platoon has no streaming parse (as for qwen3), so it says False.
    supports_streaming = False
    #: a message's render is a function of the message, its context and the renderer's attributes
    memoize_renders = True

    def __init__(
        self,
        tokenizer: Tokenizer,
        system_role_as_user: bool = False,
        strip_thinking_from_history: bool = True,
    ) -> None:
        super().__init__(tokenizer)
        self.system_role_as_user = system_role_as_user
        self.strip_thinking_from_history = strip_thinking_from_history

    @property
    def has_extension_property(self) -> bool:
        return not self.strip_thinking_from_history

    # ---- tokens --------------------------------------------------------------------------------------------

    def _special_token(self, name: str) -> int:
        return self._single_token(_special(name))

    @property
    def _bos_tokens(self) -> list[int]:
        return [self._special_token("begin▁of▁sentence")]

    @property
    def _end_message_token(self) -> int:
        return self._special_token("end▁of▁sentence")

    def get_stop_sequences(self) -> list[int]:
        return [self._end_message_token]

    @property
    def history_turn_end_ids(self) -> list[int]:
        """A turn of tool calls without content ends at the calls' section end in history (no end of sentence):
        where token-in history finds the end of such a turn."""
        tokens = self._encode(TOOL_CALLS_END)
        return tokens if len(tokens) == 1 else []

    # ---- rendering -----------------------------------------------------------------------------------------

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        follows_tool = ctx.prev_message is not None and ctx.prev_message["role"] == "tool"
        role, content = message["role"], message["content"]
        header: list[int] = []
        if role == "system":
            output = ensure_text(content)
            if ctx.idx == 0:
                pass  # HF's template puts the leading system prompt right after BOS, without a role token
            elif self.system_role_as_user:
                header = [self._special_token("User")]
            else:
                raise RendererError(
                    "DeepSeek only supports system message at start. "
                    "Use system_role_as_user=True to convert later system messages to user role."
                )
        elif role == "user":
            header = [self._special_token("User")]
            output = ensure_text(content)
        elif role == "assistant":
            strip = self.strip_thinking_from_history and not message.get("tool_calls") and not ctx.is_last
            if isinstance(content, list):
                output = "".join(
                    f"<think>{p['thinking']}</think>" if p["type"] == "thinking" else p["text"]
                    for p in content
                    if p["type"] == "text" or (p["type"] == "thinking" and not strip)
                )
            else:
                output = content  # inline `<think>` text in a string is passed through as written
            if not follows_tool:
                # After a tool result the answer continues the tool output without a role token (HF's template).
                header = [self._special_token("Assistant")]
        elif role == "tool":
            header = self._encode(TOOL_OUTPUT_BEGIN)
            output = ensure_text(content) + TOOL_OUTPUT_END
        else:
            raise RendererError(f"Unsupported role: {role}")

        if message.get("tool_calls"):
            output += TOOL_CALLS_BEGIN
            for call in message["tool_calls"]:
                tool_call = ToolCall.from_obj(call)
                output += (
                    f"{TOOL_CALL_BEGIN}{tool_call.function.name}{TOOL_SEP}"
                    f"{tool_call.function.arguments}{TOOL_CALL_END}"
                )
            output += TOOL_CALLS_END
        tokens = self._encode(output)
        # Only an assistant message with content ends the sentence (so not the empty generation-suffix message;
        # as in the cookbook, neither a tool-call turn whose content is "").
        if role == "assistant" and message["content"]:
            tokens.append(self._end_message_token)
        return RenderedMessage(output=[tokens], header=header or None)

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """One system message: the system prompt, then DeepSeek-V3.1's `## Tools` block."""
        tools_text = ""
        if tools:
            blocks = "\n".join(
                f"### {tool['name']}\nDescription: {tool['description']}\n\n"
                f"Parameters: {json.dumps(tool['parameters'])}"
                for tool in tools
            )
            format_line = (
                f"{TOOL_CALLS_BEGIN}{TOOL_CALL_BEGIN}tool_call_name{TOOL_SEP}tool_call_arguments"
                f"{TOOL_CALL_END}{TOOL_CALLS_END}"
            )
            tools_text = _TOOLS_TEMPLATE.format(tool_blocks=blocks, format_line=format_line)
        return [{"role": "system", "content": system_prompt + tools_text}]

    # ---- parsing -------------------------------------------------------------------------------------------

    def _parse_tool_calls(self, content: str) -> list[ToolCall | UnparsedToolCall]:
        """The calls of the first tool-calls section, in order; invalid JSON is unparsed."""
        section = _CALLS_SECTION.search(content)
        if not section:
            return []
        return [self._section_call(match) for match in _CALL.finditer(section.group(1))]

    def parse_response(self, response: list[int]) -> tuple[Message, bool]:
        """Content (thinking and text parts when there is a `<think>`) and tool calls, when the turn ended."""
        message, ok = self._parse_to_end_of_message(response)
        if not ok:
            return message, False
        content = message["content"]
        calls = self._parse_tool_calls(content)
        attach_tool_calls(message, calls)
        if calls:
            content = _CALLS_SECTION_WITH_SPACE.sub("", content).strip()
        parts = parse_think_blocks(content)
        message["content"] = parts if parts is not None else content
        return message, True

    def _completion_text(self, text: str) -> str:
        return text

    def completion_parts(self, tokens: list[int]) -> tuple[CompletionParts, bool]:
        """Content, reasoning and tool calls for the gateway; a truncated turn is read the same way (its calls are
        then not emitted), and an unclosed `<think>` makes the rest reasoning.

        Every tool-calls section is read (the cookbook's parse reads the first); each is a `CallGroup`, so a
        section whose calls are not emitted reaches the agent as written, markers and whitespace included. A
        section with no call in it, or one never closed, is one unparsed block."""
        end = self._end_message_token
        ok = end in tokens
        text = self._completion_text(
            str(self.tokenizer.decode(tokens[: tokens.index(end)] if ok else tokens))
        )
        segments: list[Any] = []
        parsed_any = False
        pos = 0
        for section in _CALLS_SECTION_WITH_SPACE.finditer(text):
            segments.append(text[pos : section.start()])
            pos = section.end()
            inner_at = text.index(TOOL_CALLS_BEGIN, section.start()) + len(TOOL_CALLS_BEGIN)
            inner = text[inner_at : section.end() - len(TOOL_CALLS_END)]
            blocks = [(m.start(), m.end(), self._section_call(m)) for m in _CALL.finditer(inner)]
            if not blocks and inner.strip():
                segments.append(UnparsedToolCall(section.group(0), "No tool call in the tool-calls section"))
                continue
            parsed_any = parsed_any or any(isinstance(b, ToolCall) for _, _, b in blocks)
            opener, closer = text[section.start() : inner_at], TOOL_CALLS_END
            segments.append(CallGroup(opener, group_items(inner, blocks), closer))
        rest = text[pos:]
        if TOOL_CALLS_BEGIN in rest:
            start = rest.index(TOOL_CALLS_BEGIN)
            segments.extend((rest[:start], UnparsedToolCall(rest[start:], "Unterminated tool-calls section")))
        else:
            segments.append(rest)
        # Reasoning: closed <think> blocks in the text, and an unclosed one runs to the end of the text.
        reasoning: list[str] = []
        visible: list[Any] = []
        in_think = False
        for segment in segments:
            if not isinstance(segment, str):
                visible.append(segment)
                continue
            while segment:
                if in_think:
                    close = segment.find("</think>")
                    reasoning.append(segment if close < 0 else segment[:close])
                    segment = "" if close < 0 else segment[close + len("</think>") :]
                    in_think = close < 0
                    continue
                opened = segment.find("<think>")
                if opened < 0:
                    visible.append(segment)
                    break
                visible.append(segment[:opened])
                segment, in_think = segment[opened + len("<think>") :], True
        return CompletionParts.from_segments(visible, "".join(reasoning), strip_content=parsed_any), ok

    @staticmethod
    def _section_call(match: re.Match[str]) -> ToolCall | UnparsedToolCall:
        raw_text, name, arguments = match.group(0), match.group(1), match.group(2).strip()
        try:
            json.loads(arguments)
        except (ValueError, RecursionError) as exc:
            return UnparsedToolCall(raw_text, f"Invalid JSON: {exc}")
        return ToolCall(FunctionBody(name, arguments), None, raw_text=raw_text)


class DeepSeekV3DisableThinkingRenderer(_DeepSeekV3Renderer):
    """Non-thinking mode (`deepseekv3`, `deepseekv3_disable_thinking`): every assistant turn that does not follow a
    tool result opens with `</think>` in its header (weight 0), and its thinking is dropped."""

    @property
    def has_extension_property(self) -> bool:
        return True

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        follows_tool = ctx.prev_message is not None and ctx.prev_message["role"] == "tool"
        opens_turn = message["role"] == "assistant" and not follows_tool
        if opens_turn:
            content = message["content"]
            text = (
                "".join(p["text"] for p in content if p["type"] == "text")
                if isinstance(content, list)
                else _THINK.sub("", content)
            )
            message = {**message, "content": text}
        rendered = super().render_message(message, ctx)
        if opens_turn:
            header = [*(rendered.header or []), *self._encode("</think>")]
            rendered = RenderedMessage(output=rendered.output, header=header)
        return rendered


class DeepSeekV3ThinkingRenderer(_DeepSeekV3Renderer):
    """Thinking mode (`deepseekv3_thinking`): the generation prompt is prefilled with `<think>` (not after a tool
    result: tool use stays in non-thinking mode), and earlier assistant turns open with `</think>` in their header
    when thinking is stripped from history."""

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        rendered = super().render_message(message, ctx)
        follows_tool = ctx.prev_message is not None and ctx.prev_message["role"] == "tool"
        if (
            message["role"] == "assistant"
            and not follows_tool
            and self.strip_thinking_from_history
            and not ctx.is_last
        ):
            header = [*(rendered.header or []), *self._encode("</think>")]
            rendered = RenderedMessage(output=rendered.output, header=header)
        return rendered

    def generation_prompt_chunks(
        self, messages: Sequence[Message], role: str = "assistant", prefill: str | None = None
    ) -> list[list[int]]:
        messages = list(messages)
        if messages and messages[-1]["role"] == "tool":
            return super().generation_prompt_chunks(messages, role, prefill)
        return super().generation_prompt_chunks(messages, role, "<think>" + (prefill or ""))

    def _normalize_response_tokens(self, response: list[int]) -> list[int]:
        """Put back the prefilled `<think>` when the sample closes a think block it did not open.

        Only where `<think>`/`</think>` are single tokens (V3.1); with the V3 vocabulary they are several tokens,
        which the cookbook's `convert_tokens_to_ids` lookup does not find either, so nothing changes.
        """
        think_open, think_close = self._encode("<think>"), self._encode("</think>")
        if len(think_open) != 1 or len(think_close) != 1:
            return response
        if not (response and response[0] == think_open[0]) and think_close[0] in response:
            return [think_open[0], *response]
        return response

    def _completion_text(self, text: str) -> str:
        # The gateway reads text, so the prefilled `<think>` is restored whatever the vocabulary.
        if "</think>" in text and not text.lstrip().startswith("<think>"):
            return "<think>" + text
        return text
