"""The DeepSeek parsers: `deepseekv31` (alias `deepseek_v31`) and `deepseekv3` (alias `deepseek_v3`).

Both use the tool-calls section markup (full-width bars, written as escapes here); V3.1 writes NAME, the tool
separator and {json} per call, V3 writes `function`, the separator, NAME and a fenced json block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from platoon.train.tinker.renderers.tool_parsers import ParsedToolCall, ToolCallParser, UnparsedToolCall
from platoon.train.tinker.renderers.tool_parsers._common import ArgumentsError, loads, normalize_arguments

# DeepSeek's markers use FULLWIDTH VERTICAL LINE (U+FF5C) and LOWER ONE EIGHTH BLOCK (U+2581).
SECTION_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
SECTION_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
SEP = "<\uff5ctool\u2581sep\uff5c>"


class _DeepSeekParser(ToolCallParser):
    def call_start(self, text: str) -> int | None:
        starts = [i for i in (text.find(SECTION_BEGIN), text.find(CALL_BEGIN)) if i >= 0]
        return min(starts) if starts else None

    def parse_calls(
        self, text: str, tools: Sequence[Any] | None
    ) -> tuple[str, list[ParsedToolCall], list[UnparsedToolCall]]:
        content: list[str] = []
        calls: list[ParsedToolCall] = []
        unparsed: list[UnparsedToolCall] = []
        pos = 0
        while (start := self.call_start(text[pos:])) is not None:
            start += pos
            content.append(text[pos:start])
            end = text.find(SECTION_END, start)
            stop = end if end >= 0 else len(text)
            pos = end + len(SECTION_END) if end >= 0 else len(text)
            section = text[start:stop]
            if section.startswith(SECTION_BEGIN):
                section = section[len(SECTION_BEGIN) :]
            # Each call runs from its begin marker to its end marker (or the next call, or the section's end).
            cursor = 0
            while (begin := section.find(CALL_BEGIN, cursor)) >= 0:
                content.append(_stray(section[cursor:begin]))
                body_start = begin + len(CALL_BEGIN)
                close = section.find(CALL_END, body_start)
                following = section.find(CALL_BEGIN, body_start)
                closed = close >= 0 and (following < 0 or close < following)
                body_end = close if closed else (following if following >= 0 else len(section))
                cursor = close + len(CALL_END) if closed else body_end
                call = self._read_call(section[body_start:body_end], section[begin:cursor], closed)
                (calls if isinstance(call, ParsedToolCall) else unparsed).append(call)  # type: ignore[arg-type]
            content.append(_stray(section[cursor:]))
        content.append(text[pos:])
        return "".join(content), calls, unparsed

    def _read_call(self, body: str, raw: str, closed: bool) -> ParsedToolCall | UnparsedToolCall:
        raise NotImplementedError


def _stray(text: str) -> str:
    # Whitespace between calls is the template's; anything else the model wrote there stays visible.
    return text if text.strip() else ""


def _arguments(payload: str, raw: str) -> tuple[dict[str, Any], bool] | UnparsedToolCall:
    try:
        value, recovered = loads(payload)
        arguments, lenient = normalize_arguments(value)
    except ArgumentsError as exc:
        return UnparsedToolCall(raw, str(exc))
    return arguments, recovered or lenient


class DeepSeekV31Parser(_DeepSeekParser):
    name = "deepseekv31"
    aliases = ("deepseek_v31",)

    def _read_call(self, body: str, raw: str, closed: bool) -> ParsedToolCall | UnparsedToolCall:
        name, sep, payload = body.partition(SEP)
        name = name.strip()
        if not sep or not name:
            return UnparsedToolCall(raw, "expected NAME, the tool separator and {arguments}")
        read = _arguments(payload, raw)
        if isinstance(read, UnparsedToolCall):
            return read
        return ParsedToolCall(name, read[0], None, read[1] or not closed, raw)


class DeepSeekV3Parser(_DeepSeekParser):
    name = "deepseekv3"
    aliases = ("deepseek_v3",)

    def _read_call(self, body: str, raw: str, closed: bool) -> ParsedToolCall | UnparsedToolCall:
        kind, sep, rest = body.partition(SEP)
        if not sep or kind.strip() != "function":
            return UnparsedToolCall(raw, "expected function, the tool separator and NAME")
        name, _, payload = rest.partition("\n")
        name = name.strip()
        if not name:
            return UnparsedToolCall(raw, "missing the function name")
        payload = payload.strip()
        recovered = not closed
        if payload.startswith("```json"):
            payload = payload[len("```json") :]
        elif payload.startswith("```"):
            payload = payload[3:]
        else:
            return UnparsedToolCall(raw, "expected a ```json block")
        payload = payload.rstrip()
        if payload.endswith("```"):
            payload = payload[:-3]
        else:
            recovered = True  # a missing closing fence
        read = _arguments(payload, raw)
        if isinstance(read, UnparsedToolCall):
            return read
        return ParsedToolCall(name, read[0], None, read[1] or recovered, raw)
