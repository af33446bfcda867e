"""The `kimi_k2` parser: `<|tool_calls_section_begin|>` ... `<|tool_call_begin|>functions.NAME:N
<|tool_call_argument_begin|>{json}<|tool_call_end|>` ... `<|tool_calls_section_end|>` (Kimi K2 / K2.5).

The name comes from the id, and the call keeps that id because Kimi's template writes it back into history.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from platoon.train.tinker.renderers.tool_parsers import ParsedToolCall, ToolCallParser, UnparsedToolCall
from platoon.train.tinker.renderers.tool_parsers._common import ArgumentsError, loads, normalize_arguments

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGS_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_ID = re.compile(r"(?:functions\.)?(?P<name>.*?)(?::\d+)?")


class KimiK2Parser(ToolCallParser):
    name = "kimi_k2"

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
            section = text[start:stop].removeprefix(SECTION_BEGIN)
            cursor = 0
            while (begin := section.find(CALL_BEGIN, cursor)) >= 0:
                stray = section[cursor:begin]
                content.append(stray if stray.strip() else "")
                body_start = begin + len(CALL_BEGIN)
                close = section.find(CALL_END, body_start)
                following = section.find(CALL_BEGIN, body_start)
                closed = close >= 0 and (following < 0 or close < following)
                body_end = close if closed else (following if following >= 0 else len(section))
                cursor = close + len(CALL_END) if closed else body_end
                call = self._read_call(section[body_start:body_end], section[begin:cursor], closed)
                if isinstance(call, ParsedToolCall):
                    calls.append(call)
                else:
                    unparsed.append(call)
            stray = section[cursor:]
            content.append(stray if stray.strip() else "")
        content.append(text[pos:])
        return "".join(content), calls, unparsed

    def _read_call(self, body: str, raw: str, closed: bool) -> ParsedToolCall | UnparsedToolCall:
        call_id, sep, payload = body.partition(ARGS_BEGIN)
        call_id = call_id.strip()
        if not sep:
            return UnparsedToolCall(raw, "expected <|tool_call_argument_begin|> after the call id")
        match = _ID.fullmatch(call_id)
        name = match.group("name").strip() if match else ""
        if not name:
            return UnparsedToolCall(raw, f"the call id {call_id!r} has no function name")
        try:
            value, recovered = loads(payload)
            arguments, lenient = normalize_arguments(value)
        except ArgumentsError as exc:
            return UnparsedToolCall(raw, str(exc))
        return ParsedToolCall(name, arguments, call_id, recovered or lenient or not closed, raw)
