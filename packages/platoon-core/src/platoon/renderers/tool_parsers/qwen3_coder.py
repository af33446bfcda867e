"""The `qwen3_coder` parser (aliases `qwen3_xml`, `step3p5`, `nanbeige`): Qwen3-Coder / Qwen3.5+ XML tool calls.

`<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`; values are
text typed by the tool's JSON schema. A close tag ends a value only when the structure after it confirms.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from platoon.renderers.tool_parsers import ParsedToolCall, ToolCallParser, UnparsedToolCall
from platoon.renderers.tool_parsers._common import NextFind, schema_types, tool_parameters, type_value

_BLOCK_START = re.compile(r"<tool_call>(?=\s*<function=)|(?:^|(?<=\n))<tool_call>|(?:^|(?<=\n))<function=")
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAM_OPEN = re.compile(r"<parameter=([^>\n]+)>")
_CLOSE_PARAM = "</parameter>"
# What may follow a real `</parameter>`: another parameter, the end of the function or call, or the end.
_AFTER_PARAM = re.compile(r"\s*(?:<parameter=|</function>|</tool_call>|$)")


class Qwen3CoderParser(ToolCallParser):
    name = "qwen3_coder"
    aliases = ("qwen3_xml", "step3p5", "nanbeige")
    #: values of parameters no schema declares stay text (as vLLM's qwen3_coder parser keeps them)
    type_undeclared = False

    def call_start(self, text: str) -> int | None:
        match = _BLOCK_START.search(text)
        return match.start() if match else None

    def parse_segments(self, text: str, tools: Sequence[Any] | None) -> list[Any]:
        segments: list[Any] = []
        scan = _Scanner(text)
        pos = 0
        while (match := _BLOCK_START.search(text, pos)) is not None:
            segments.append(text[pos : match.start()])
            call, pos = self._read_block(scan, match.start(), tools)
            segments.append(call)
        segments.append(text[pos:])
        return segments

    def _read_block(
        self, scan: _Scanner, start: int, tools: Sequence[Any] | None
    ) -> tuple[ParsedToolCall | UnparsedToolCall, int]:
        """One call from `start`: (the call or the unparsed block, the position after it)."""
        text = scan.text
        recovered = False
        pos = start
        if text.startswith("<tool_call>", pos):
            pos += len("<tool_call>")
        else:
            recovered = True  # a line-starting <function= without its <tool_call>
        function = _FUNCTION.match(text, pos)
        if function is None:
            return self._unparsed(scan, start, pos, "expected <function=NAME> after <tool_call>")
        name = function.group(1).strip()
        pos = function.end()
        declared = tool_parameters(tools, name)
        arguments: dict[str, Any] = {}
        while True:
            skip = pos
            while skip < len(text) and text[skip].isspace():
                skip += 1
            opened = _PARAM_OPEN.match(text, skip)
            if opened is None:
                break
            key = opened.group(1).strip()
            read = self._read_value(scan, opened.end(), key, arguments, declared)
            if read is None:  # the value holds another parameter's markup mid-line: no honest split
                return self._unparsed(scan, start, opened.end(), f"parameter {key!r} swallowed another")
            value, pos, lenient = read
            recovered = recovered or lenient or key in arguments  # a duplicated parameter: the last wins
            arguments[key] = self._type(value, key, declared)
        rest = text[pos:]
        stripped = rest.lstrip()
        pos += len(rest) - len(stripped)
        if stripped.startswith("</function>"):
            pos += len("</function>")
        else:
            recovered = True
            if stripped and not stripped.startswith("</tool_call>"):
                # Stray text inside the block: the call is not what the format says, show it as written.
                return self._unparsed(scan, start, pos, "unexpected text inside <function>")
        rest = text[pos:]
        stripped = rest.lstrip()
        if stripped.startswith("</tool_call>"):
            pos += len(rest) - len(stripped) + len("</tool_call>")
        else:
            recovered = True
        return ParsedToolCall(name, arguments, None, recovered, text[start:pos]), pos

    @staticmethod
    def _unparsed(scan: _Scanner, start: int, pos: int, error: str) -> tuple[UnparsedToolCall, int]:
        """The block from `start` to its `</tool_call>` (or the end of the text) as unparsed."""
        end = scan.call_close(pos)
        stop = end + len("</tool_call>") if end >= 0 else len(scan.text)
        return UnparsedToolCall(scan.text[start:stop], error), stop

    def _read_value(
        self, scan: _Scanner, pos: int, key: str, given: dict[str, Any], declared: dict[str, Any] | None
    ) -> tuple[str, int, bool] | None:
        """A parameter value from `pos`: (value text, the position after its close tag, recovered), or None when
        the value would swallow another parameter that does not open a line (the block is then unparsed).

        The value ends at the first `</parameter>` the structure after it confirms, or, without one, at the end of
        the function or call. Either way, a new, not-yet-given declared parameter opening on a new line before
        that end means this value lost its close tag: it ends there (recovered), so it never swallows it. Without
        a schema any key not given yet counts as a parameter.
        """
        text = scan.text

        def opens_another(other: str) -> bool:
            return other != key and other not in given and (declared is None or other in declared)

        close = scan.param_close(pos)
        if close >= 0:
            split = scan.param_open(pos, close, opens_another)
            if split is None:
                return None
            if split < 0:
                return self._trim(text[pos:close]), close + len(_CLOSE_PARAM), False
            return self._trim(text[pos:split]), split, True
        # No confirmed close tag: the value ends at the end of the function or call (recovered).
        ends = [e for e in (scan.function_close(pos), scan.call_close(pos)) if e >= 0]
        end = min(ends) if ends else len(text)
        split = scan.param_open(pos, end, opens_another)
        if split is None:
            return None
        if split >= 0:
            end = split
        return self._trim(text[pos:end]), end, True

    @staticmethod
    def _trim(value: str) -> str:
        # The newline after the open tag and the one before the close tag are the format's, not the value's.
        if value.startswith("\n"):
            value = value[1:]
        if value.endswith("\n"):
            value = value[:-1]
        return value

    def _type(self, value: str, key: str, declared: dict[str, Any] | None) -> Any:
        if declared is None or key not in declared:
            return type_value(value, None) if self.type_undeclared else value
        return type_value(value, schema_types(declared[key]))


class _Scanner:
    """The markers of one response, found left to right in linear time overall (positions only move forward).

    `param_close` finds the next `</parameter>` the structure after it confirms, remembering the answer so the
    literal close tags inside a long value are not checked again for every later position; `param_open` walks the
    `<parameter=` tags once, in order.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.call_close = NextFind(text, "</tool_call>")
        self.function_close = NextFind(text, "</function>")
        self._closes = NextFind(text, _CLOSE_PARAM)
        self._close_from, self._close_at = len(text) + 1, -1
        self._opens = _PARAM_OPEN.finditer(text)
        self._open: re.Match[str] | None = next(self._opens, None)

    def param_close(self, pos: int) -> int:
        if pos < self._close_from or (self._close_at != -1 and self._close_at < pos):
            self._close_from, self._close_at = pos, -1
            search = pos
            while (close := self._closes(search)) >= 0:
                if _AFTER_PARAM.match(self.text, close + len(_CLOSE_PARAM)):
                    self._close_at = close
                    break
                search = close + len(_CLOSE_PARAM)  # literal markup inside the value
        return self._close_at

    def param_open(self, pos: int, end: int, accept: Callable[[str], bool]) -> int | None:
        """Where the first accepted `<parameter=KEY>` in [pos, end) opens a line (-1: none); None when an accepted
        one comes first in the middle of a line (no honest place to split the value)."""
        while self._open is not None and self._open.start() < pos:
            self._open = next(self._opens, None)
        # Tags before `end` that are not accepted are passed for good: the next value starts beyond them.
        while self._open is not None and self._open.start() < end:
            opened = self._open
            if accept(opened.group(1).strip()):
                if opened.start() > 0 and self.text[opened.start() - 1] == "\n":
                    return opened.start()
                return None
            self._open = next(self._opens, None)
        return -1
