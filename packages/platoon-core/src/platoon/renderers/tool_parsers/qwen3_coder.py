"""The `qwen3_coder` parser (aliases `qwen3_xml`, `step3p5`, `nanbeige`): Qwen3-Coder / Qwen3.5+ XML tool calls.

`<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`; values are
text typed by the tool's JSON schema. A close tag ends a value only when the structure after it confirms.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from platoon.renderers.tool_parsers import ParsedToolCall, ToolCallParser, UnparsedToolCall
from platoon.renderers.tool_parsers._common import schema_types, tool_parameters, type_value

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

    def parse_calls(
        self, text: str, tools: Sequence[Any] | None
    ) -> tuple[str, list[ParsedToolCall], list[UnparsedToolCall]]:
        content: list[str] = []
        calls: list[ParsedToolCall] = []
        unparsed: list[UnparsedToolCall] = []
        pos = 0
        while (match := _BLOCK_START.search(text, pos)) is not None:
            content.append(text[pos : match.start()])
            call, pos = self._read_block(text, match.start(), tools)
            if isinstance(call, ParsedToolCall):
                calls.append(call)
            else:
                unparsed.append(call)
        content.append(text[pos:])
        return "".join(content), calls, unparsed

    def _read_block(
        self, text: str, start: int, tools: Sequence[Any] | None
    ) -> tuple[ParsedToolCall | UnparsedToolCall, int]:
        """One call from `start`: (the call or the unparsed block, the position after it)."""
        recovered = False
        pos = start
        if text.startswith("<tool_call>", pos):
            pos += len("<tool_call>")
        else:
            recovered = True  # a line-starting <function= without its <tool_call>
        function = _FUNCTION.match(text, pos)
        if function is None:
            end = text.find("</tool_call>", pos)
            stop = end + len("</tool_call>") if end >= 0 else len(text)
            return UnparsedToolCall(text[start:stop], "expected <function=NAME> after <tool_call>"), stop
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
            value, pos, lenient = self._read_value(text, opened.end(), arguments, declared)
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
                end = text.find("</tool_call>", pos)
                stop = end + len("</tool_call>") if end >= 0 else len(text)
                return UnparsedToolCall(text[start:stop], "unexpected text inside <function>"), stop
        rest = text[pos:]
        stripped = rest.lstrip()
        if stripped.startswith("</tool_call>"):
            pos += len(rest) - len(stripped) + len("</tool_call>")
        else:
            recovered = True
        return ParsedToolCall(name, arguments, None, recovered, text[start:pos]), pos

    def _read_value(
        self, text: str, pos: int, given: dict[str, Any], declared: dict[str, Any] | None
    ) -> tuple[str, int, bool]:
        """A parameter value from `pos`: (value text, the position after its close tag, recovered)."""
        search = pos
        while (close := text.find(_CLOSE_PARAM, search)) >= 0:
            if _AFTER_PARAM.match(text, close + len(_CLOSE_PARAM)):
                return self._trim(text[pos:close]), close + len(_CLOSE_PARAM), False
            search = close + len(_CLOSE_PARAM)  # literal markup inside the value
        # No confirmed close tag: the value ends where a new, not-yet-given declared parameter opens on a new
        # line, or at the end of the function or call.
        for opened in _PARAM_OPEN.finditer(text, pos):
            key = opened.group(1).strip()
            if (
                text[opened.start() - 1 : opened.start()] == "\n"
                and key not in given
                and (declared is None or key in declared)
            ):
                return self._trim(text[pos : opened.start()]), opened.start(), True
        for marker in ("</function>", "</tool_call>"):
            end = text.find(marker, pos)
            if end >= 0:
                return self._trim(text[pos:end]), end, True
        return self._trim(text[pos:]), len(text), True

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
