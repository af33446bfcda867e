"""The DeepSeek parsers: `deepseekv31` (alias `deepseek_v31`) and `deepseekv3` (alias `deepseek_v3`).

Both use the tool-calls section markup (full-width bars, written as escapes here); V3.1 writes NAME, the tool
separator and {json} per call, V3 writes `function`, the separator, NAME and a fenced json block.
"""

from __future__ import annotations

from platoon.renderers.tool_parsers import ParsedToolCall, UnparsedToolCall
from platoon.renderers.tool_parsers._sections import SectionedCallsParser, read_arguments

# DeepSeek's markers use FULLWIDTH VERTICAL LINE (U+FF5C) and LOWER ONE EIGHTH BLOCK (U+2581).
SECTION_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
SECTION_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
SEP = "<\uff5ctool\u2581sep\uff5c>"


class _DeepSeekParser(SectionedCallsParser):
    SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_END = SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_END


class DeepSeekV31Parser(_DeepSeekParser):
    name = "deepseekv31"
    aliases = ("deepseek_v31",)

    def _read_call(self, body: str, raw: str, closed: bool) -> ParsedToolCall | UnparsedToolCall:
        name, sep, payload = body.partition(SEP)
        name = name.strip()
        if not sep or not name:
            return UnparsedToolCall(raw, "expected NAME, the tool separator and {arguments}")
        read = read_arguments(payload, raw)
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
        read = read_arguments(payload, raw)
        if isinstance(read, UnparsedToolCall):
            return read
        return ParsedToolCall(name, read[0], None, read[1] or recovered, raw)
