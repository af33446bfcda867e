"""The Qwen3.5 renderers: `qwen3_5` and `qwen3_5_disable_thinking` (tinker-cookbook 0.3.0's, token for token).

Qwen3's `<|im_start|>` turns with newline-padded `<think>` blocks, a `<think>\\n` (or empty think block) generation
prefill, and XML tool calls (`<tool_call><function=name><parameter=p>value</parameter></function></tool_call>`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from platoon.renderers.base import (
    BLOCK_PATTERN,
    CompletionParts,
    FunctionBody,
    Message,
    RenderContext,
    RenderedMessage,
    RendererError,
    ToolCall,
    ToolSpec,
    UnparsedToolCall,
    attach_tool_calls,
    parse_content_blocks,
    parse_tool_call_json,
)
from platoon.renderers.qwen3 import Qwen3VLRenderer

#: the instructions after the tool list, shared with Nemotron-3 (both templates write the same text)
XML_TOOL_INSTRUCTIONS = (
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n"
    "<function=example_function_name>\n"
    "<parameter=example_parameter_1>\n"
    "value_1\n"
    "</parameter>\n"
    "<parameter=example_parameter_2>\n"
    "This is the value for the second parameter\n"
    "that can span\n"
    "multiple lines\n"
    "</parameter>\n"
    "</function>\n"
    "</tool_call>\n\n"
    "<IMPORTANT>\n"
    "Reminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be "
    "nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function "
    "call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n"
    "</IMPORTANT>"
)

_XML_CALL = re.compile(
    r"^\s*<tool_call>\s*<function=(?P<name>[^>\n]+)>\s*(?P<body>.*?)\s*</function>\s*</tool_call>\s*$",
    re.DOTALL,
)
_XML_PARAM = re.compile(r"<parameter=(?P<name>[^>\n]+)>\s*(?P<value>.*?)\s*</parameter>", re.DOTALL)


def format_xml_tool_call(call: Any) -> str:
    """One call as a `<tool_call>` block with one `<parameter=...>` per argument.

    Objects and lists are written as JSON, everything else with Python's `str` (so `True`, `None`), as the
    cookbook does.
    """
    tool_call = ToolCall.from_obj(call)
    try:
        arguments = json.loads(tool_call.function.arguments) if tool_call.function.arguments else {}
    except ValueError as exc:
        raise RendererError(
            f"tool call {tool_call.function.name!r} has arguments that are not JSON: {exc}"
        ) from exc
    if not isinstance(arguments, dict):
        raise RendererError(f"tool call {tool_call.function.name!r} needs a JSON object as arguments")
    lines = [f"<tool_call>\n<function={tool_call.function.name}>"]
    for name, value in arguments.items():
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        lines.append(f"<parameter={name}>\n{text}\n</parameter>")
    lines.append("</function>\n</tool_call>")
    return "\n".join(lines)


def parse_xml_tool_call(raw_text: str) -> ToolCall | UnparsedToolCall:
    """A `<tool_call><function=...>` block as a `ToolCall` (values read as JSON where they parse), or why not."""
    match = _XML_CALL.match(raw_text)
    if not match:
        return UnparsedToolCall(raw_text, "Malformed Qwen3.5 tool call XML")
    name = match.group("name").strip()
    if not name:
        return UnparsedToolCall(raw_text, "Missing function name")
    body = match.group("body")
    arguments: dict[str, Any] = {}
    pos = 0
    for param in _XML_PARAM.finditer(body):
        if body[pos : param.start()].strip():
            return UnparsedToolCall(raw_text, "Unexpected non-parameter content inside <function> block")
        param_name = param.group("name").strip()
        if not param_name:
            return UnparsedToolCall(raw_text, "Empty parameter name")
        value_text = param.group("value").strip("\n")
        try:
            arguments[param_name] = json.loads(value_text)
        except (ValueError, RecursionError):  # not JSON: the value is the text itself
            arguments[param_name] = value_text
        pos = param.end()
    if body[pos:].strip():
        return UnparsedToolCall(raw_text, "Unexpected trailing content inside <function> block")
    return ToolCall(FunctionBody(name, json.dumps(arguments)), None, raw_text=raw_text)


def _has_thinking_part(content: Any) -> bool:
    if isinstance(content, list):
        return any(p["type"] == "thinking" for p in content)
    return isinstance(content, str) and "<think>" in content


class Qwen3_5Renderer(Qwen3VLRenderer):
    """Qwen3.5 with thinking: the cookbook's Qwen3-VL format with Qwen3.5's template rules.

    Assistant turns after the last user message get an empty `<think>\\n\\n</think>\\n\\n` when they carry no
    thinking; history thinking is dropped (`strip_thinking_from_history`); the generation prompt ends with
    `<think>\\n`, so prompt + target differs from the supervised example. Text only: image parts are refused.
    """

    #: what the generation prompt writes after the assistant header
    generation_prefill = "<think>\n"
    #: the closing tag of a tool result (Nemotron-3 adds a newline)
    tool_response_close = "\n</tool_response>"

    # ---- rendering -----------------------------------------------------------------------------------------

    def _get_generation_suffix(self, role: str, ctx: RenderContext) -> list[int]:
        newline = "\n" if ctx.idx > 0 else ""
        return self._encode(f"{newline}<|im_start|>{role}\n{self.generation_prefill}")

    def _assistant_header_suffix(self, message: Message, ctx: RenderContext) -> str:
        """The empty think block the template writes into turns after the last user message."""
        if ctx.idx <= ctx.last_user_index:
            return ""
        return "" if _has_thinking_part(message.get("content", "")) else "<think>\n\n</think>\n\n"

    def _format_thinking_text(self, thinking: str) -> str:
        return f"<think>\n{thinking}\n</think>\n\n"

    def _format_tool_calls(self, message: Message) -> str:
        return "\n\n" + "\n".join(format_xml_tool_call(call) for call in message["tool_calls"])

    def _content_pieces(self, message: Message, strip_thinking: bool) -> list[str]:
        content = message["content"]
        if isinstance(content, str):
            return [content]
        pieces: list[str] = []
        for part in content:
            kind = part.get("type")
            if kind == "text":
                pieces.append(part["text"])
            elif kind == "thinking":
                if not strip_thinking:
                    pieces.append(self._format_thinking_text(part["thinking"]))
            elif kind == "image":
                raise RendererError(
                    f"image parts are not supported: platoon's {self.name or type(self).__name__} renderer renders text"
                )
            # Other part types are skipped, as the cookbook's VL preprocessing does.
        return pieces

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        role = "user" if message["role"] == "tool" else message["role"]
        header = ("\n" if ctx.idx > 0 else "") + f"<|im_start|>{role}\n"
        if message["role"] == "assistant":
            header += self._assistant_header_suffix(message, ctx)
        strip = self.strip_thinking_from_history and message["role"] == "assistant" and not ctx.is_last
        pieces = self._content_pieces(message, strip)
        if message["role"] == "tool":
            pieces = ["<tool_response>\n", *pieces, self.tool_response_close]
        if "tool_calls" in message:
            pieces.append(self._format_tool_calls(message))
        pieces.append("<|im_end|>")
        # Merged text is tokenized as one string, as HF's template output is; unmerged, piece by piece.
        output = (
            [self._encode("".join(pieces))] if self.merge_text_chunks else [self._encode(p) for p in pieces]
        )
        return RenderedMessage(output=output, header=self._encode(header))

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """One system message: the `# Tools` block (one JSON object per tool), then the system prompt."""
        if not tools:
            return [{"role": "system", "content": system_prompt}]
        tools_text = (
            "# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
            + "\n".join(json.dumps(tool) for tool in tools)
            + "\n</tools>\n\n"
            + XML_TOOL_INSTRUCTIONS
        )
        return [
            {
                "role": "system",
                "content": tools_text + "\n\n" + system_prompt if system_prompt else tools_text,
            }
        ]

    # ---- parsing -------------------------------------------------------------------------------------------

    def _normalize_response_tokens(self, response: list[int]) -> list[int]:
        """Put the prefilled `<think>\\n` back in front of a completion that closes a think block."""
        prefix = self._encode("<think>\n")
        close = self._single_token("</think>")
        if response[: len(prefix)] != prefix and close in response:
            return prefix + list(response)
        return list(response)

    def _strip_after_thinking(self, text: str) -> str:
        """The separator the template writes between `</think>` and the text, removed."""
        return text[2:] if text.startswith("\n\n") else text

    def _postprocess(self, message: Message) -> None:
        """Trim thinking, drop the separator after `</think>`, and read XML tool calls the JSON pass left."""
        content = message.get("content")
        if isinstance(content, list):
            seen_thinking = False
            for part in content:
                if part["type"] == "thinking":
                    part["thinking"] = part["thinking"].strip()
                    seen_thinking = True
                elif seen_thinking and part["type"] == "text":
                    # Only the first text after thinking, and thinking after it stays as written (cookbook).
                    part["text"] = self._strip_after_thinking(part["text"])
                    break
        converted: list[ToolCall] = []
        remaining: list[UnparsedToolCall] = []
        for unparsed in message.get("unparsed_tool_calls", []):
            if "<function=" not in unparsed.raw_text:
                remaining.append(unparsed)
                continue
            parsed = parse_xml_tool_call(unparsed.raw_text)
            (converted if isinstance(parsed, ToolCall) else remaining).append(parsed)  # type: ignore[arg-type]
        if converted:
            message["tool_calls"] = [*message.get("tool_calls", []), *converted]
        if remaining:
            message["unparsed_tool_calls"] = remaining
        else:
            message.pop("unparsed_tool_calls", None)

    def parse_response(self, response: list[int]) -> tuple[Message, bool]:
        """The cookbook's parse: think and tool-call blocks (XML, or Qwen3 JSON) once `<|im_end|>` ended the turn."""
        message, ok = self._parse_to_end_of_message(response)
        if not ok:
            return message, False
        blocks = parse_content_blocks(message["content"])
        if blocks is not None:
            parts, calls = blocks
            message["content"] = parts
            attach_tool_calls(message, calls)
        self._postprocess(message)
        return message, True

    # ---- the gateway's reading -----------------------------------------------------------------------------

    def _call_suffix(self) -> str:
        """Markup the renderer writes after each tool-call block (Nemotron-3: a newline)."""
        return ""

    def completion_parts(self, tokens: list[int]) -> tuple[CompletionParts, bool]:
        """Content, reasoning and tool blocks of a completion, so that rendering the message back is exact.

        The newlines the renderer writes before (and, for Nemotron-3, after) each tool-call block are markup:
        they move into that call's raw text. With the `<think>\\n` prefill a truncated completion that never
        closed its think block is all reasoning; an unclosed `<tool_call>` is one unparsed block. The segments
        keep the blocks in place, so a block that is not emitted reaches the agent where it was written.
        """
        end = self._end_message_token
        ok = end in tokens
        body = self._normalize_response_tokens(tokens[: tokens.index(end)] if ok else list(tokens))
        text = str(self.tokenizer.decode(body))
        parts = CompletionParts()
        if not ok and self.generation_prefill == "<think>\n" and "<think>" not in text:
            parts.reasoning = text.strip()
            return parts, False
        segments: list[Any] = []
        after_think = False
        pos = 0
        suffix = self._call_suffix()
        for match in BLOCK_PATTERN.finditer(text):
            before = text[pos : match.start()]
            if after_think:
                before = self._strip_after_thinking(before)
                after_think = False
            if match.group(1) is not None:
                segments.append(before)
                parts.reasoning += match.group(1).strip()
                after_think = True
                pos = match.end()
                continue
            block = match.group(0)
            end_pos = match.end()
            if suffix and text.startswith(suffix, end_pos):
                end_pos += len(suffix)
            call = self._parse_block(block)
            if isinstance(call, ToolCall):
                kept = before.rstrip("\n")
                call = ToolCall(
                    call.function, call.id, raw_text=before[len(kept) :] + text[match.start() : end_pos]
                )
                before = kept
            segments.extend((before, call))
            pos = end_pos
        rest = text[pos:]
        if after_think:
            rest = self._strip_after_thinking(rest)
        think, tool = rest.find("<think>"), rest.find("<tool_call>")
        if think >= 0 and (tool < 0 or think < tool):
            segments.append(rest[:think])
            parts.reasoning += rest[think + len("<think>") :].strip()
        elif tool >= 0:
            segments.extend((rest[:tool], UnparsedToolCall(rest[tool:], "Unterminated <tool_call> block")))
        else:
            segments.append(rest)
        return CompletionParts.from_segments(segments, parts.reasoning), ok

    @staticmethod
    def _parse_block(block: str) -> ToolCall | UnparsedToolCall:
        if "<function=" in block:
            return parse_xml_tool_call(block)
        return parse_tool_call_json(block[len("<tool_call>") : -len("</tool_call>")], block)

    def _tool_call_text(self, call: ToolCall) -> str:
        return format_xml_tool_call(call)


class Qwen3_5DisableThinkingRenderer(Qwen3_5Renderer):
    """Qwen3.5 with thinking off: the generation prompt ends with an empty `<think>\\n\\n</think>\\n\\n`."""

    generation_prefill = "<think>\n\n</think>\n\n"
