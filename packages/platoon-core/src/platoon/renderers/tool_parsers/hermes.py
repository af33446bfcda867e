"""The `hermes` parser (aliases `qwen25`, `qwen`): JSON objects inside `<tool_call>...</tool_call>`.

Qwen2.5/Qwen3 and Hermes templates write `{"name": ..., "arguments": {...}}` per block; `parameters` is accepted
for `arguments`. Lenient: several objects in one block, a missing close tag, raw control characters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from platoon.renderers.tool_parsers import ParsedToolCall, ToolCallParser, UnparsedToolCall
from platoon.renderers.tool_parsers._common import (
    ArgumentsError,
    NextFind,
    normalize_arguments,
    raw_decode,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# A block starts at a tag followed by JSON, or at a tag that starts a line (whatever follows, so a malformed
# block is shown as unparsed rather than silently read as content).
_START = re.compile(r"<tool_call>(?=\s*[\[{])|(?:^|(?<=\n))<tool_call>")


def read_call_object(value: Any, raw_text: str, recovered: bool) -> ParsedToolCall | UnparsedToolCall:
    """A `{"name", "arguments"|"parameters", "id"?}` object as a call."""
    if not isinstance(value, dict):
        return UnparsedToolCall(raw_text, "a tool call must be a JSON object")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return UnparsedToolCall(raw_text, "missing or invalid 'name'")
    arguments = value.get("arguments", value.get("parameters"))
    try:
        args, lenient = normalize_arguments(arguments)
    except ArgumentsError as exc:
        return UnparsedToolCall(raw_text, str(exc))
    call_id = value.get("id")
    return ParsedToolCall(
        name, args, call_id if isinstance(call_id, str) and call_id else None, recovered or lenient, raw_text
    )


def read_json_calls(payload: str, raw_text: str) -> list[ParsedToolCall | UnparsedToolCall]:
    """Every JSON object (or list of objects) in a block's payload; anything undecodable makes it unparsed."""
    values: list[Any] = []
    pos, recovered = 0, False
    while True:
        while pos < len(payload) and payload[pos].isspace():
            pos += 1
        if pos >= len(payload):
            break
        try:
            value, pos, lenient = raw_decode(payload, pos)
        except ArgumentsError as exc:
            return [UnparsedToolCall(raw_text, str(exc))]
        recovered = recovered or lenient
        values.extend(value if isinstance(value, list) else [value])
    if not values:
        return [UnparsedToolCall(raw_text, "an empty tool-call block")]
    recovered = recovered or len(values) > 1
    # The block's text goes with its first call only, so a block that is not emitted is shown once.
    calls = [read_call_object(v, raw_text if i == 0 else "", recovered) for i, v in enumerate(values)]
    if any(isinstance(c, UnparsedToolCall) for c in calls):
        return [UnparsedToolCall(raw_text, next(c.error for c in calls if isinstance(c, UnparsedToolCall)))]
    return calls


class HermesParser(ToolCallParser):
    name = "hermes"
    aliases = ("qwen25", "qwen")

    def call_start(self, text: str) -> int | None:
        match = _START.search(text)
        return match.start() if match else None

    def parse_segments(self, text: str, tools: Sequence[Any] | None) -> list[Any]:
        segments: list[Any] = []
        next_close = NextFind(text, CLOSE)
        pos = 0
        while (match := _START.search(text, pos)) is not None:
            segments.append(text[pos : match.start()])
            body_start = match.end()
            end = next_close(body_start)
            # Without a close tag the block runs to the next block or the end of the text (recovered).
            following = _START.search(text, body_start)
            closed = end >= 0 and (following is None or end < following.start())
            stop = end if closed else (following.start() if following else len(text))
            after = end + len(CLOSE) if closed else stop
            raw = text[match.start() : after]
            for call in read_json_calls(text[body_start:stop], raw):
                if isinstance(call, ParsedToolCall) and not closed:
                    call = ParsedToolCall(call.name, call.arguments, call.id, True, call.raw_text)
                segments.append(call)
            pos = after
        segments.append(text[pos:])
        return segments
