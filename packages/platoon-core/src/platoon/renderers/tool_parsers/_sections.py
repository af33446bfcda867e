"""The shared reading of "tool-calls section" formats (DeepSeek V3/V3.1, Kimi K2): a section begin marker, calls
each wrapped in call begin/end markers, a section end marker; subclasses read one call's body.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from platoon.renderers.tool_parsers import CallGroup, ParsedToolCall, Text, ToolCallParser, UnparsedToolCall
from platoon.renderers.tool_parsers._common import ArgumentsError, NextFind, loads, normalize_arguments


class SectionedCallsParser(ToolCallParser):
    """Finds each calls section (or a lone call) and each call in it; `_read_call` reads one call's body."""

    SECTION_BEGIN: ClassVar[str]
    SECTION_END: ClassVar[str]
    CALL_BEGIN: ClassVar[str]
    CALL_END: ClassVar[str]

    def call_start(self, text: str) -> int | None:
        starts = [i for i in (text.find(self.SECTION_BEGIN), text.find(self.CALL_BEGIN)) if i >= 0]
        return min(starts) if starts else None

    def parse_segments(self, text: str, tools: Sequence[Any] | None) -> list[Any]:
        """Each section (or run of lone calls) is one `CallGroup`: its markers and the whitespace between calls are
        the format's markup, anything else the model wrote there is kept as stray text."""
        segments: list[Any] = []
        section_begin, section_end = NextFind(text, self.SECTION_BEGIN), NextFind(text, self.SECTION_END)
        call_begin, call_end = NextFind(text, self.CALL_BEGIN), NextFind(text, self.CALL_END)
        pos = 0
        while starts := [i for i in (section_begin(pos), call_begin(pos)) if i >= 0]:
            start = min(starts)
            segments.append(text[pos:start])
            end = section_end(start)
            stop = end if end >= 0 else len(text)
            opener = self.SECTION_BEGIN if text.startswith(self.SECTION_BEGIN, start) else ""
            items: list[Any] = []
            # Each call runs from its begin marker to its end marker (or the next call, or the section's end).
            cursor = start + len(opener)
            while 0 <= (begin := call_begin(cursor)) < stop:
                items.extend(_between(text[cursor:begin]))
                body_start = begin + len(self.CALL_BEGIN)
                close = call_end(body_start)
                following = call_begin(body_start)
                following = following if 0 <= following < stop else stop
                closed = 0 <= close < following
                body_end = close if closed else following
                cursor = close + len(self.CALL_END) if closed else body_end
                items.append(self._read_call(text[body_start:body_end], text[begin:cursor], closed))
            items.extend(_between(text[cursor:stop]))
            closer = self.SECTION_END if end >= 0 else ""
            segments.append(CallGroup(opener, items, closer))
            pos = stop + len(closer)
        segments.append(text[pos:])
        return segments

    def _read_call(self, body: str, raw: str, closed: bool) -> ParsedToolCall | UnparsedToolCall:
        raise NotImplementedError


def _between(text: str) -> list[Any]:
    # Whitespace between calls is the template's markup; anything else the model wrote there stays visible.
    if not text:
        return []
    return [text] if not text.strip() else [Text(text)]


def read_arguments(payload: str, raw: str) -> tuple[dict[str, Any], bool] | UnparsedToolCall:
    """A call's JSON arguments and whether they were recovered leniently, or the unparsed call saying why."""
    try:
        value, recovered = loads(payload)
        arguments, lenient = normalize_arguments(value)
    except ArgumentsError as exc:
        return UnparsedToolCall(raw, str(exc))
    return arguments, recovered or lenient
