"""The `mistral` parser: `[TOOL_CALLS][{"name", "arguments", "id"}...]` (tokenizer v3/v7) or
`[TOOL_CALLS]NAME[CALL_ID]id[ARGS]{json}` / `[TOOL_CALLS]NAME[ARGS]{json}` (v11+), reasoning in `[THINK]`.

Mistral templates need 9-alphanumeric call ids, so any other id (or none) becomes a fresh one.
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Sequence
from typing import Any

from platoon.renderers.tool_parsers import (
    CallGroup,
    ParsedToolCall,
    Text,
    ToolCallParser,
    UnparsedToolCall,
)
from platoon.renderers.tool_parsers._common import (
    ArgumentsError,
    NextFind,
    decode_at,
    normalize_arguments,
)
from platoon.renderers.tool_parsers.hermes import read_call_object

TOOL_CALLS, CALL_ID, ARGS = "[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"
_VALID_ID = re.compile(r"[A-Za-z0-9]{9}")
_NAME_THEN_JSON = re.compile(r"([A-Za-z_][\w.-]*)\s*(?=\{)")
_ARRAY = re.compile(r"\[\s*\{")
_ALPHABET = string.ascii_letters + string.digits


def mistral_id(call_id: str | None) -> str:
    """The id if it is 9 alphanumerics, else a fresh one."""
    if call_id is not None and _VALID_ID.fullmatch(call_id):
        return call_id
    return "".join(secrets.choice(_ALPHABET) for _ in range(9))


class MistralParser(ToolCallParser):
    name = "mistral"
    default_reasoning_tags = ("[THINK]", "[/THINK]")

    def tags_for(self, text: str) -> tuple[str, str] | None:
        # Some Mistral fine-tunes think in <think> tags: honour them when the response opens with one.
        if self.reasoning_tags == self.default_reasoning_tags and text.lstrip().startswith("<think>"):
            return ("<think>", "</think>")
        return self.reasoning_tags

    def call_start(self, text: str) -> int | None:
        start = text.find(TOOL_CALLS)
        return start if start >= 0 else None

    def parse_segments(self, text: str, tools: Sequence[Any] | None) -> list[Any]:
        segments: list[Any] = []
        next_marker, next_args = NextFind(text, TOOL_CALLS), NextFind(text, ARGS)
        pos = 0
        while (start := next_marker(pos)) >= 0:
            segments.append(text[pos:start])
            body = start + len(TOOL_CALLS)
            following = next_marker(body)
            limit = following if following >= 0 else len(text)
            found, pos = self._read_block(text, start, body, limit, next_args)
            segments.extend(found)
        segments.append(text[pos:])
        return segments

    def _read_block(
        self, text: str, start: int, body: int, limit: int, next_args: NextFind
    ) -> tuple[list[Any], int]:
        """The calls after the marker at `start` (the block ends by `limit`, the next marker): (segments, end)."""
        skip = body
        while skip < limit and text[skip].isspace():
            skip += 1
        if skip < limit and text[skip] in "[{":  # v3/v7: a JSON list of call objects (or one object)
            return self._read_json(text, start, skip, limit, recovered=False)
        args_at = next_args(body)
        if 0 <= args_at < limit:  # v11+: NAME, an optional [CALL_ID]id, then [ARGS] and a JSON object
            name, _, call_id = text[body:args_at].partition(CALL_ID)
            return self._read_named(text, start, name.strip(), call_id.strip(), args_at + len(ARGS), limit)
        named = _NAME_THEN_JSON.match(text, skip, limit)
        if named:  # NAME{json}: the v11 form without [ARGS], as some Mistral models write it
            return self._read_named(text, start, named.group(1), "", named.end(1), limit)
        array = _ARRAY.search(text, skip, limit)
        if array:  # text before the list: the list is still the calls, the text stays visible
            found, end = self._read_json(text, array.start(), array.start(), limit, recovered=True)
            if found and all(isinstance(f, ParsedToolCall) for f in found):
                junk = text[body : array.start()]
                return [CallGroup(TOOL_CALLS, [Text(junk), *found])], end
        error = "expected a JSON list or NAME{arguments} after [TOOL_CALLS]"
        return [UnparsedToolCall(text[start:limit], error)], limit

    def _read_json(
        self, text: str, start: int, pos: int, limit: int, *, recovered: bool
    ) -> tuple[list[Any], int]:
        """A JSON list of call objects (or one object) at `pos`; any invalid one leaves the block unparsed.

        The JSON may run past `limit` (a string holding the marker's text): it is read from the text itself, in
        windows that grow with the value, so a long run of markers costs linear time."""
        try:
            value, end, lenient = decode_at(text, pos)
        except ArgumentsError as exc:
            return [UnparsedToolCall(text[start:limit], str(exc))], limit
        raw = text[start:end]
        values = value if isinstance(value, list) else [value]
        if not values:
            return [UnparsedToolCall(raw, "an empty tool-call list")], end
        # The block's text goes with its first call only, so a block that is not emitted is shown once.
        calls = [
            read_call_object(v, raw if i == 0 else "", recovered or lenient) for i, v in enumerate(values)
        ]
        bad = next((c for c in calls if isinstance(c, UnparsedToolCall)), None)
        if bad is not None:
            return [UnparsedToolCall(raw, bad.error)], end
        return [_with_mistral_id(c) for c in calls], end

    def _read_named(
        self, text: str, start: int, name: str, call_id: str, pos: int, limit: int
    ) -> tuple[list[Any], int]:
        """NAME (and an id) then a JSON object at `pos`."""
        while pos < limit and text[pos].isspace():
            pos += 1
        try:
            value, end, recovered = decode_at(text, pos)
            arguments, lenient = normalize_arguments(value)
        except ArgumentsError as exc:
            return [UnparsedToolCall(text[start:limit], str(exc))], limit
        if not name:
            return [UnparsedToolCall(text[start:end], "missing the function name")], end
        call = ParsedToolCall(name, arguments, call_id or None, recovered or lenient, text[start:end])
        return [_with_mistral_id(call)], end


def _with_mistral_id(call: Any) -> Any:
    return ParsedToolCall(call.name, call.arguments, mistral_id(call.id), call.recovered, call.raw_text)
