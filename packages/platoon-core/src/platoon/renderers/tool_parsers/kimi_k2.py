"""The `kimi_k2` parser: `<|tool_calls_section_begin|>` ... `<|tool_call_begin|>functions.NAME:N
<|tool_call_argument_begin|>{json}<|tool_call_end|>` ... `<|tool_calls_section_end|>` (Kimi K2 / K2.5).

The name comes from the id, and the call keeps that id because Kimi's template writes it back into history.
"""

from __future__ import annotations

import re

from platoon.renderers.tool_parsers import ParsedToolCall, UnparsedToolCall
from platoon.renderers.tool_parsers._sections import SectionedCallsParser, read_arguments

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGS_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
# `functions.NAME:N` or `NAME:N`, NAME an identifier (dotted parts, dashes allowed): an id like `invalid.0` or
# `functions.0:1` names no function, so its call is unparsed rather than run under a made-up name.
_ID = re.compile(r"(?:functions\.)?(?P<name>[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*):\d+")


class KimiK2Parser(SectionedCallsParser):
    name = "kimi_k2"
    SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_END = SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_END

    def _read_call(self, body: str, raw: str, closed: bool) -> ParsedToolCall | UnparsedToolCall:
        call_id, sep, payload = body.partition(ARGS_BEGIN)
        call_id = call_id.strip()
        if not sep:
            return UnparsedToolCall(raw, "expected <|tool_call_argument_begin|> after the call id")
        match = _ID.fullmatch(call_id)
        if match is None:
            return UnparsedToolCall(raw, f"the call id {call_id!r} is not functions.NAME:N or NAME:N")
        name = match.group("name")
        read = read_arguments(payload, raw)
        if isinstance(read, UnparsedToolCall):
            return read
        return ParsedToolCall(name, read[0], call_id, read[1] or not closed, raw)
