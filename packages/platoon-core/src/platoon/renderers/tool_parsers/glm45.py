"""The `glm45` parser (aliases `glm`, `glm47`): GLM-4.5/4.6/4.7 `<tool_call>NAME<arg_key>K</arg_key><arg_value>V`.

Pairs follow the name with or without newlines; values are text typed by the tool's schema (values no schema
declares are decoded when they read as JSON or Python literals, as GLM's template writes non-strings as JSON).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from platoon.renderers.tool_parsers import ParsedToolCall, ToolCallParser, UnparsedToolCall
from platoon.renderers.tool_parsers._common import NextFind, schema_types, tool_parameters, type_value

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r"[^\s<>{}\[\]\"']+")
_KEY = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>", re.DOTALL)


class Glm45Parser(ToolCallParser):
    name = "glm45"
    aliases = ("glm", "glm47")

    def call_start(self, text: str) -> int | None:
        start = text.find(OPEN)
        return start if start >= 0 else None

    def parse_segments(self, text: str, tools: Sequence[Any] | None) -> list[Any]:
        segments: list[Any] = []
        next_close = NextFind(text, CLOSE)
        pos = 0
        while (start := text.find(OPEN, pos)) >= 0:
            segments.append(text[pos:start])
            end = next_close(start + len(OPEN))
            following = text.find(OPEN, start + len(OPEN))
            closed = end >= 0 and (following < 0 or end < following)
            stop = end if closed else (following if following >= 0 else len(text))
            pos = end + len(CLOSE) if closed else stop
            call = self._read_call(text[start + len(OPEN) : stop], text[start:pos], tools)
            if isinstance(call, ParsedToolCall) and not closed:
                call = ParsedToolCall(call.name, call.arguments, call.id, True, call.raw_text)
            segments.append(call)
        segments.append(text[pos:])
        return segments

    def _read_call(
        self, body: str, raw: str, tools: Sequence[Any] | None
    ) -> ParsedToolCall | UnparsedToolCall:
        cut = min((i for i in (body.find("<arg_key>"), body.find("\n")) if i >= 0), default=len(body))
        name = body[:cut].strip()
        if not _NAME.fullmatch(name):
            return UnparsedToolCall(raw, "expected a function name after <tool_call>")
        declared = tool_parameters(tools, name)
        arguments: dict[str, Any] = {}
        recovered = False
        pos = cut
        value_close, key_open = NextFind(body, "</arg_value>"), NextFind(body, "<arg_key>")
        while (pair := _KEY.match(body, pos)) is not None:
            key = pair.group(1).strip()
            value_start = pair.end()
            end = value_close(value_start)
            next_key = key_open(value_start)
            if end >= 0 and (next_key < 0 or end < next_key):
                value, pos = body[value_start:end], end + len("</arg_value>")
            else:  # a missing </arg_value>: the value ends at the next key or the end of the block
                recovered = True
                stop = next_key if next_key >= 0 else len(body)
                value, pos = body[value_start:stop].rstrip("\n"), stop
            if declared is not None and key in declared:
                arguments[key] = type_value(value, schema_types(declared[key]))
            else:
                arguments[key] = type_value(value, None)
        if body[pos:].strip():
            return UnparsedToolCall(raw, "unexpected text in a <tool_call> block")
        return ParsedToolCall(name, arguments, None, recovered, raw)
