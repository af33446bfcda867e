"""The `llama3` parser (aliases `llama3_json`, `llama4_json`): Llama 3.x/4 JSON tool calls.

A call is `{"name": ..., "parameters": {...}}` (or `arguments`): the whole message, what follows `<|python_tag|>`
(once or before each call), several separated by `;`, or an object written among prose, as other servers read
them. An object without both name and parameters is content; call-like JSON (a `"name"` key) that fails to
decode is unparsed, and the objects after it are still read. Linear time: each object is decoded once and a
failed decode resumes where it stopped.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import Any

from platoon.renderers.tool_parsers import CallGroup, ParsedToolCall, ToolCallParser, UnparsedToolCall
from platoon.renderers.tool_parsers._common import ArgumentsError, decode_at, normalize_arguments

PYTHON_TAG = "<|python_tag|>"
# Where an object with a key starts: the only places a call can start.
_OBJECT = re.compile(r'\{\s*"')
_NAME_KEY = re.compile(r'"name"\s*:')
# What may join two calls of one group: whitespace, `;` or `,` separators, python tags.
_JOIN = re.compile(r"(?:\s|[;,]|<\|python_tag\|>)*")
_LIST_CLOSE = re.compile(r"\s*\]")
# A call at the start of a line (or of the text): ends an unclosed reasoning block.
_LINE_CALL = re.compile(r'(?:^|\n)[ \t]*(\{\s*"name"\s*:)')
_BRACES = re.compile(r'[{}"\\]')


class Llama3JsonParser(ToolCallParser):
    name = "llama3"
    aliases = ("llama3_json", "llama4_json")

    def call_start(self, text: str) -> int | None:
        starts = [text.find(PYTHON_TAG)]
        line_call = _LINE_CALL.search(text)
        if line_call:
            starts.append(line_call.start(1))
        found = [s for s in starts if s >= 0]
        return min(found) if found else None

    def parse_segments(self, text: str, tools: Sequence[Any] | None) -> list[Any]:
        segments: list[Any] = []
        group: CallGroup | None = None
        pos = 0
        for start, end, block in _find_calls(text):
            gap = text[pos:start]
            if group is not None and _JOIN.fullmatch(gap):
                if gap:
                    group.items.append(gap)
                group.items.append(block)
            else:
                if group is not None:
                    gap = _close_list(group, gap)
                prose, opener = _split_opener(gap)
                segments.append(prose)
                group = CallGroup(opener, [block])
                segments.append(group)
            pos = end
        rest = text[pos:]
        if group is not None:
            rest = _close_list(group, rest)
        segments.append(rest)
        return segments


def _split_opener(gap: str) -> tuple[str, str]:
    """(prose, the markup that opens the calls): a python tag and/or a `[` right before the first call."""
    cut = len(gap.rstrip())
    if gap[:cut].endswith("["):
        cut = len(gap[: cut - 1].rstrip())
    if gap[:cut].endswith(PYTHON_TAG):
        cut -= len(PYTHON_TAG)
    opener = gap[cut:]
    if opener.strip() in ("", ","):  # only whitespace: it stays with the prose
        return gap, ""
    return gap[:cut], opener


def _close_list(group: CallGroup, rest: str) -> str:
    """A list opened before the group's first call closes after its last: the `]` is the group's markup."""
    if group.open.rstrip().endswith("["):
        closing = _LIST_CLOSE.match(rest)
        if closing:
            group.close = closing.group(0)
            return rest[closing.end() :]
    return rest


def _find_calls(text: str) -> list[tuple[int, int, ParsedToolCall | UnparsedToolCall]]:
    """Every call object in the text, in order, as (start, end, call or unparsed block)."""
    found: list[tuple[int, int, ParsedToolCall | UnparsedToolCall]] = []
    name_keys: list[int] | None = None
    braces: dict[int, int] | None = None
    pos = 0
    for match in _OBJECT.finditer(text):
        start = match.start()
        if start < pos:
            continue
        try:
            value, end, recovered = decode_at(text, start)
        except ArgumentsError as exc:
            if braces is None:
                braces, name_keys = _match_braces(text), [m.start() for m in _NAME_KEY.finditer(text)]
            assert name_keys is not None
            # The decode resumes where it stopped; one that says nothing of where (nesting too deep, NaN) skips
            # the object whole, so a deep unclosed one is not decoded again from each of its inner objects.
            stopped = exc.pos if exc.pos is not None and exc.pos > start else braces.get(start, len(text))
            # The broken object runs to its matching brace, else to where the decode stopped.
            extent = braces.get(start, stopped)
            keys_at = bisect.bisect_left(name_keys, start)
            if keys_at < len(name_keys) and name_keys[keys_at] < extent:  # call-like: shown as unparsed
                found.append((start, extent, UnparsedToolCall(text[start:extent], str(exc))))
                pos = extent
            else:
                pos = stopped
            continue
        call = _call(value, text[start:end], recovered)
        if call is not None:
            found.append((start, end, call))
        pos = end  # an object that is not a call is content, nested objects included
    return found


def _match_braces(text: str) -> dict[int, int]:
    """Each `{` -> the index after its matching `}`; strings are tracked only inside braces (prose quotes do not
    count). One pass."""
    matched: dict[int, int] = {}
    stack: list[int] = []
    in_string = False
    escaped_at = -1  # the character a backslash escapes
    for token in _BRACES.finditer(text):
        char, at = token.group(0), token.start()
        if at == escaped_at:
            continue
        if in_string:
            if char == "\\":
                escaped_at = at + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = bool(stack)
        elif char == "{":
            stack.append(at)
        elif char == "}" and stack:
            matched[stack.pop()] = at + 1
    return matched


def _call(value: Any, raw: str, recovered: bool) -> ParsedToolCall | UnparsedToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    if "parameters" in value:
        arguments = value["parameters"]
    elif "arguments" in value:
        arguments = value["arguments"]
    else:
        return None
    try:
        args, lenient = normalize_arguments(arguments)
    except ArgumentsError as exc:
        return UnparsedToolCall(raw, str(exc))
    return ParsedToolCall(value["name"], args, None, recovered or lenient, raw)
