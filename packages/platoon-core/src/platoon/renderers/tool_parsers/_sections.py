"""The shared reading of "tool-calls section" formats (DeepSeek V3/V3.1, Kimi K2): a section begin marker, calls
each wrapped in call begin/end markers, a section end marker; subclasses read one call's body.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from platoon.renderers.tool_parsers import ParsedToolCall, ToolCallParser, UnparsedToolCall
from platoon.renderers.tool_parsers._common import ArgumentsError, loads, normalize_arguments


class SectionedCallsParser(ToolCallParser):
    """Finds each calls section (or a lone call) and each call in it; `_read_call` reads one call's body."""

    SECTION_BEGIN: ClassVar[str]
    SECTION_END: ClassVar[str]
    CALL_BEGIN: ClassVar[str]
    CALL_END: ClassVar[str]

    def call_start(self, text: str) -> int | None:
        starts = [i for i in (text.find(self.SECTION_BEGIN), text.find(self.CALL_BEGIN)) if i >= 0]
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
            end = text.find(self.SECTION_END, start)
            stop = end if end >= 0 else len(text)
            pos = end + len(self.SECTION_END) if end >= 0 else len(text)
            section = text[start:stop].removeprefix(self.SECTION_BEGIN)
            # Each call runs from its begin marker to its end marker (or the next call, or the section's end).
            cursor = 0
            while (begin := section.find(self.CALL_BEGIN, cursor)) >= 0:
                content.append(_stray(section[cursor:begin]))
                body_start = begin + len(self.CALL_BEGIN)
                close = section.find(self.CALL_END, body_start)
                following = section.find(self.CALL_BEGIN, body_start)
                closed = close >= 0 and (following < 0 or close < following)
                body_end = close if closed else (following if following >= 0 else len(section))
                cursor = close + len(self.CALL_END) if closed else body_end
                call = self._read_call(section[body_start:body_end], section[begin:cursor], closed)
                if isinstance(call, ParsedToolCall):
                    calls.append(call)
                else:
                    unparsed.append(call)
            content.append(_stray(section[cursor:]))
        content.append(text[pos:])
        return "".join(content), calls, unparsed

    def _read_call(self, body: str, raw: str, closed: bool) -> ParsedToolCall | UnparsedToolCall:
        raise NotImplementedError


def _stray(text: str) -> str:
    # Whitespace between calls is the template's; anything else the model wrote there stays visible.
    return text if text.strip() else ""


def read_arguments(payload: str, raw: str) -> tuple[dict[str, Any], bool] | UnparsedToolCall:
    """A call's JSON arguments and whether they were recovered leniently, or the unparsed call saying why."""
    try:
        value, recovered = loads(payload)
        arguments, lenient = normalize_arguments(value)
    except ArgumentsError as exc:
        return UnparsedToolCall(raw, str(exc))
    return arguments, recovered or lenient
