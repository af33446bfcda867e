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

from platoon.renderers.tool_parsers import ParsedToolCall, ToolCallParser, UnparsedToolCall
from platoon.renderers.tool_parsers._common import (
    ArgumentsError,
    normalize_arguments,
    raw_decode,
)
from platoon.renderers.tool_parsers.hermes import read_call_object

TOOL_CALLS, CALL_ID, ARGS = "[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"
_VALID_ID = re.compile(r"[A-Za-z0-9]{9}")
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

    def parse_calls(
        self, text: str, tools: Sequence[Any] | None
    ) -> tuple[str, list[ParsedToolCall], list[UnparsedToolCall]]:
        content: list[str] = []
        calls: list[ParsedToolCall] = []
        unparsed: list[UnparsedToolCall] = []
        pos = 0
        while (start := text.find(TOOL_CALLS, pos)) >= 0:
            content.append(text[pos:start])
            body = start + len(TOOL_CALLS)
            skip = body
            while skip < len(text) and text[skip].isspace():
                skip += 1
            if skip < len(text) and text[skip] in "[{":
                found, pos = self._read_json(text, start, skip)
            else:
                found, pos = self._read_v11(text, start, body)
            for call in found:
                if isinstance(call, ParsedToolCall):
                    calls.append(
                        ParsedToolCall(
                            call.name, call.arguments, mistral_id(call.id), call.recovered, call.raw_text
                        )
                    )
                else:
                    unparsed.append(call)
        content.append(text[pos:])
        return "".join(content), calls, unparsed

    def _read_json(
        self, text: str, start: int, pos: int
    ) -> tuple[list[ParsedToolCall | UnparsedToolCall], int]:
        """v3/v7: a JSON list of call objects (or one object) after the marker."""
        try:
            value, end, recovered = raw_decode(text, pos)
        except ArgumentsError as exc:
            nxt = text.find(TOOL_CALLS, pos)
            end = nxt if nxt >= 0 else len(text)
            return [UnparsedToolCall(text[start:end], str(exc))], end
        raw = text[start:end]
        values = value if isinstance(value, list) else [value]
        if not values:
            return [UnparsedToolCall(raw, "an empty tool-call list")], end
        return [read_call_object(v, raw if i == 0 else "", recovered) for i, v in enumerate(values)], end

    def _read_v11(
        self, text: str, start: int, pos: int
    ) -> tuple[list[ParsedToolCall | UnparsedToolCall], int]:
        """v11+: NAME, an optional [CALL_ID]id, then [ARGS] and a JSON object."""
        args_at = text.find(ARGS, pos)
        nxt = text.find(TOOL_CALLS, pos)
        if args_at < 0 or (0 <= nxt < args_at):
            end = nxt if nxt >= 0 else len(text)
            return [
                UnparsedToolCall(text[start:end], "expected NAME[ARGS]{arguments} after [TOOL_CALLS]")
            ], end
        head = text[pos:args_at]
        name, _, call_id = head.partition(CALL_ID)
        name = name.strip()
        json_at = args_at + len(ARGS)
        try:
            value, end, recovered = raw_decode(
                text, json_at + (len(text[json_at:]) - len(text[json_at:].lstrip()))
            )
            arguments, lenient = normalize_arguments(value)
        except ArgumentsError as exc:
            end = nxt if nxt >= 0 else len(text)
            return [UnparsedToolCall(text[start:end], str(exc))], end
        if not name:
            return [UnparsedToolCall(text[start:end], "missing the function name")], end
        call = ParsedToolCall(name, arguments, call_id.strip() or None, recovered or lenient, text[start:end])
        return [call], end
