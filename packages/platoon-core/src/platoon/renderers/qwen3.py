"""The Qwen3 renderers: `qwen3`, `qwen3_disable_thinking`, `qwen3_instruct`, `qwen3_vl`, `qwen3_vl_instruct`.

Each renders exactly the tokens tinker-cookbook 0.3.0's renderer of the same name renders (the golden files in
testdata/renders): `<|im_start|>role\\n...<|im_end|>` turns, tool results as user turns in `<tool_response>`.
Where the goldens are silent they write what Qwen3's own chat template writes (JSON with non-ASCII kept); where
they differ from the template, the golden case that pins the difference is named beside the code (docs/gateway.md
lists them, tests/core/renderers/test_qwen3_template_faithfulness.py checks them against `apply_chat_template`).
"""

from __future__ import annotations

import json
from typing import Any

from platoon.renderers.base import (
    BLOCK_PATTERN,
    CompletionParts,
    ContentPart,
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
    has_thinking,
    parse_content_blocks,
    parse_tool_call_json,
    remove_thinking,
)

_TOOLS_TEMPLATE = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tool_lines}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def _json_text(value: Any) -> str:
    """`value` as the template's `tojson` writes it: `", "`/`": "` spacing, non-ASCII kept as written.

    A string holding a lone surrogate (a `\\ud800` escape that JSON decoded) cannot be UTF-8 encoded: that text
    alone keeps ASCII escapes, so it still renders.
    """
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value)
    return text


def _tool_call_payload(call: Any) -> dict[str, Any]:
    """The `{"name", "arguments"}` object written inside a `<tool_call>` block."""
    tool_call = ToolCall.from_obj(call)
    try:
        arguments: Any = json.loads(tool_call.function.arguments)
    except ValueError:
        # The cookbook raises here; a harness's malformed history should still render, so the text is kept.
        arguments = tool_call.function.arguments
    return {"name": tool_call.function.name, "arguments": arguments}


class Qwen3Renderer(Renderer):
    """Qwen3 with thinking (HF template, `enable_thinking=True`): `<think>` blocks of history turns are dropped.

    History is every assistant turn but the last, including turns after the last user query, whose thinking the
    template keeps (the goldens' `reasoning_tool_call` pins the cookbook's drop). `strip_thinking_from_history`
    (default True, the template's behaviour) removes thinking parts from assistant messages that are not last;
    set it False (renderer_kwargs) to keep them, which gives the extension property.
    """

    supports_streaming = False
    #: a message's render is a function of the message, its context and the renderer's attributes
    memoize_renders = True

    def __init__(self, tokenizer: Tokenizer, strip_thinking_from_history: bool = True) -> None:
        super().__init__(tokenizer)
        self.strip_thinking_from_history = strip_thinking_from_history

    @property
    def has_extension_property(self) -> bool:
        return not self.strip_thinking_from_history

    # ---- rendering -----------------------------------------------------------------------------------------

    def _turn_memo(self) -> bool:
        # The methods written in this module read only `ctx.idx > 0` (the newline before the header) and, for an
        # assistant message, `ctx.is_last` (thinking stripped from history; the empty think block); an override
        # elsewhere may read more.
        cls = type(self)
        return (
            cls.render_message in _TURN_RENDERS
            and cls._content_text in _TURN_CONTENT
            and cls._get_generation_suffix is Renderer._get_generation_suffix
        )

    def _content_text(self, message: Message, ctx: RenderContext) -> str:
        content = message["content"]
        if isinstance(content, str):
            # Inline `<think>` text in a string is passed through as written (only parts are stripped); the
            # template would drop it before the last query (pinned by the goldens' `string_think_content`).
            return content
        parts = content
        if self.strip_thinking_from_history and message["role"] == "assistant" and not ctx.is_last:
            parts = remove_thinking(parts)
        rendered = []
        for part in parts:
            if part["type"] == "thinking":
                rendered.append(f"<think>{part['thinking']}</think>")
            elif part["type"] == "text":
                rendered.append(part["text"])
            elif part["type"] == "image":
                raise RendererError(
                    "image parts are not supported: platoon's Qwen3 renderers render text only"
                )
        return "".join(rendered)

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        role = "user" if message["role"] == "tool" else message["role"]
        header = ("\n" if ctx.idx > 0 else "") + f"<|im_start|>{role}\n"
        output = self._content_text(message, ctx)
        if message["role"] == "tool":
            # A user turn per result; the template puts consecutive results in one user turn (pinned by the
            # goldens' `parallel_tool_calls`).
            output = f"<tool_response>\n{output}\n</tool_response>"
        if "tool_calls" in message:
            # The cookbook writes the newline even when the content is empty (HF's template does not; pinned by
            # the goldens' `tool_call_roundtrip`). Arguments are re-serialised as `tojson` writes an object.
            output += "\n" + "\n".join(
                f"<tool_call>\n{_json_text(_tool_call_payload(call))}\n</tool_call>"
                for call in message["tool_calls"]
            )
        output += "<|im_end|>"
        return RenderedMessage(output=[self._encode(output)], header=self._encode(header))

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """One system message: the system prompt, a blank line, then Qwen's `# Tools` block (HF `tojson` spacing)."""
        tools_text = ""
        if tools:
            tool_lines = "\n".join(_json_text({"type": "function", "function": tool}) for tool in tools)
            tools_text = _TOOLS_TEMPLATE.format(tool_lines=tool_lines)
        content = system_prompt + "\n\n" + tools_text if system_prompt else tools_text
        return [{"role": "system", "content": content}]

    # ---- stops and parsing ---------------------------------------------------------------------------------

    @property
    def _end_message_token(self) -> int:
        return self._single_token("<|im_end|>")

    def get_stop_sequences(self) -> list[int]:
        return [self._end_message_token]

    def parse_response(self, response: list[int]) -> tuple[Message, bool]:
        """The cookbook's parse: content parts and tool calls when `<|im_end|>` ended the turn, else raw text."""
        message, ok = self._parse_to_end_of_message(response)
        if not ok:
            return message, False
        content = message["content"]
        blocks = parse_content_blocks(content)
        if blocks is not None:
            parts, calls = blocks
            message["content"] = parts
            attach_tool_calls(message, calls)
        return message, True

    def completion_parts(self, tokens: list[int]) -> tuple[CompletionParts, bool]:
        """Content, reasoning and tool blocks of a completion, read so that rendering it back is exact.

        The renderer writes `content + "\\n" + "\\n".join(blocks)`, so the newline written before each parsed
        `<tool_call>` is markup, not content: it moves into that call's raw text (shown if the call is not
        emitted). Truncated text is read the same way; an unclosed `<think>` makes the rest reasoning and an
        unclosed `<tool_call>` makes the rest one unparsed block. The segments keep the blocks in place, so a
        block that is not emitted reaches the agent where it was written.
        """
        end = self._end_message_token
        ok = end in tokens
        text = str(self.tokenizer.decode(tokens[: tokens.index(end)] if ok else tokens))
        parts = CompletionParts()
        segments: list[Any] = []
        pos = 0
        for match in BLOCK_PATTERN.finditer(text):
            before = text[pos : match.start()]
            pos = match.end()
            if match.group(1) is not None:
                segments.append(before)
                parts.reasoning += match.group(1)
                continue
            call = parse_tool_call_json(match.group(2), match.group(0))
            if isinstance(call, ToolCall) and before.endswith("\n"):
                before = before[:-1]
                call = ToolCall(call.function, call.id, raw_text="\n" + match.group(0))
            segments.extend((before, call))
        rest = text[pos:]
        think, tool = rest.find("<think>"), rest.find("<tool_call>")
        if think >= 0 and (tool < 0 or think < tool):
            segments.append(rest[:think])
            parts.reasoning += rest[think + len("<think>") :]
        elif tool >= 0:
            segments.extend((rest[:tool], UnparsedToolCall(rest[tool:], "Unterminated <tool_call> block")))
        else:
            segments.append(rest)
        return CompletionParts.from_segments(segments, parts.reasoning), ok


class Qwen3DisableThinkingRenderer(Qwen3Renderer):
    """Qwen3 with thinking off (HF `enable_thinking=False`): the turn being produced opens with an empty
    `<think>\\n\\n</think>\\n\\n` in its header (weight 0), unless that message already carries thinking."""

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        rendered = super().render_message(message, ctx)
        if message["role"] == "assistant" and ctx.is_last and not has_thinking(message.get("content", "")):
            # Encoded on its own and appended, as the cookbook does (a BPE would merge it differently otherwise).
            header = [*(rendered.header or []), *self._encode("<think>\n\n</think>\n\n")]
            rendered = RenderedMessage(
                output=rendered.output, header=header, stop_overlap=rendered.stop_overlap
            )
        return rendered


class Qwen3InstructRenderer(Qwen3Renderer):
    """Qwen3 Instruct 2507 (no `<think>` tag): the same format; it claims the extension property, as in the
    cookbook (history thinking parts, which these models never write, are still stripped)."""

    @property
    def has_extension_property(self) -> bool:
        return True


class Qwen3VLRenderer(Qwen3Renderer):
    """Qwen3-VL with thinking: for text the cookbook's VL renderer writes exactly what `qwen3` writes.

    Image parts are refused: platoon renders text only (the image processor is accepted and kept).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        image_processor: Any = None,
        strip_thinking_from_history: bool = True,
        merge_text_chunks: bool = True,
    ) -> None:
        super().__init__(tokenizer, strip_thinking_from_history)
        self.image_processor = image_processor
        self.merge_text_chunks = merge_text_chunks

    def _content_text(self, message: Message, ctx: RenderContext) -> str:
        content = message["content"]
        if isinstance(content, list) and any(_is_image(p) for p in content):
            raise RendererError(
                "image parts are not supported: platoon's Qwen3-VL renderers render text only"
            )
        return super()._content_text(message, ctx)


class Qwen3VLInstructRenderer(Qwen3VLRenderer):
    """Qwen3-VL Instruct: the same text format as `qwen3_vl`."""


def _is_image(part: ContentPart) -> bool:
    return part.get("type") == "image"


#: the methods `Qwen3Renderer._turn_memo` vouches for
_TURN_RENDERS = (Qwen3Renderer.render_message, Qwen3DisableThinkingRenderer.render_message)
_TURN_CONTENT = (Qwen3Renderer._content_text, Qwen3VLRenderer._content_text)
