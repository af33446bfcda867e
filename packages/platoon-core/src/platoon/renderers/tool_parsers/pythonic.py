"""The `pythonic` parser (alias `llama4_pythonic`): a Python list of keyword-only calls, `[f(a=1), g()]`.

The list may sit inside `<|python_start|>`/`<|python_end|>`; values must be literals JSON can hold (`true`,
`false`, `null` accepted). Each call is parsed on its own, so a truncated list keeps the calls it closed.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any

from platoon.renderers.tool_parsers import CallGroup, ParsedToolCall, ToolCallParser, UnparsedToolCall
from platoon.renderers.tool_parsers._common import literal_to_json

PY_START, PY_END = "<|python_start|>", "<|python_end|>"
_LIST_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_CLOSERS = {")": "(", "]": "[", "}": "{"}


class PythonicParser(ToolCallParser):
    name = "pythonic"
    aliases = ("llama4_pythonic",)

    def call_start(self, text: str) -> int | None:
        tag = text.find(PY_START)
        match = _LIST_START.search(text)
        starts = [i for i in (tag, match.start() if match else -1) if i >= 0]
        return min(starts) if starts else None

    def parse_segments(self, text: str, tools: Sequence[Any] | None) -> list[Any]:
        match = _LIST_START.search(text)
        if match is None:
            return [text]
        start = match.start()
        spans, end, closed = _scan_list(text, start)
        if not closed and not spans:
            return [text]
        # The list's brackets, commas and whitespace (and the python tags around it) are the format's markup.
        open_at = start
        before = text[:start].rstrip()
        if before.endswith(PY_START):
            open_at = len(before) - len(PY_START)
        items: list[Any] = []
        for span_start, span_end, complete in spans:
            raw = text[span_start:span_end]
            source = raw.strip()
            lead = raw[: len(raw) - len(raw.lstrip())]
            trail = raw[len(lead) + len(source) :] + ("," if text.startswith(",", span_end) else "")
            if not source:
                items.append(lead + trail)
                continue
            if lead:
                items.append(lead)
            if complete:
                items.append(_read_call(source))
            else:
                items.append(UnparsedToolCall(source, "an unclosed call in a truncated list"))
            if trail:
                items.append(trail)
        close_at = end
        if closed:
            after = text[end:]
            if after.lstrip().startswith(PY_END):
                close_at = end + len(after) - len(after.lstrip()) + len(PY_END)
        close = text[end - 1 : close_at] if closed else ""
        return [text[:open_at], CallGroup(text[open_at : start + 1], items, close), text[close_at:]]


def _scan_list(text: str, start: int) -> tuple[list[tuple[int, int, bool]], int, bool]:
    """The call spans of the list at `start`: ([(start, end, closed)], end of the list, whether it closed)."""
    spans: list[tuple[int, int, bool]] = []
    stack: list[str] = []
    quote: str | None = None
    item_start = start + 1
    i = start + 1
    while i < len(text):
        char = text[i]
        if quote is not None:
            if char == "\\":
                i += 2
                continue
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in "([{":
            stack.append(char)
        elif char in ")]}":
            if not stack:
                if char == "]":  # the list closes
                    if text[item_start:i].strip():
                        spans.append((item_start, i, True))
                    return spans, i + 1, True
                break
            if stack[-1] != _CLOSERS[char]:
                break
            stack.pop()
        elif char == "," and not stack:
            spans.append((item_start, i, True))
            item_start = i + 1
        i += 1
    # Truncated (or malformed): the unfinished item is not a call.
    if text[item_start:].strip():
        spans.append((item_start, len(text), False))
    return spans, len(text), False


def _read_call(source: str) -> ParsedToolCall | UnparsedToolCall:
    try:
        node = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return UnparsedToolCall(source, f"not a Python call: {exc}")
    if not isinstance(node, ast.Call) or node.args:
        return UnparsedToolCall(source, "expected a call with keyword arguments only")
    name = _dotted(node.func)
    if name is None:
        return UnparsedToolCall(source, "the callee is not a name")
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return UnparsedToolCall(source, "**kwargs is not a literal argument")
        try:
            arguments[keyword.arg] = literal_to_json(keyword.value)
        except ValueError as exc:
            return UnparsedToolCall(source, f"argument {keyword.arg!r}: {exc}")
    return ParsedToolCall(name, arguments, None, False, source)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None
