"""The `llama3` parser (aliases `llama3_json`, `llama4_json`): Llama 3.x/4 JSON tool calls.

The whole message, or what follows `<|python_tag|>`, is `{"name": ..., "parameters": {...}}` (or `arguments`),
several separated by `;`. An object without both name and parameters is content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from platoon.renderers.tool_parsers import ParsedToolCall, ToolCallParser, UnparsedToolCall
from platoon.renderers.tool_parsers._common import (
    ArgumentsError,
    normalize_arguments,
    raw_decode,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(ToolCallParser):
    name = "llama3"
    aliases = ("llama3_json", "llama4_json")

    def call_start(self, text: str) -> int | None:
        tag = text.find(PYTHON_TAG)
        if tag >= 0:
            return tag
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith('{"name"') else None

    def parse_calls(
        self, text: str, tools: Sequence[Any] | None
    ) -> tuple[str, list[ParsedToolCall], list[UnparsedToolCall]]:
        tag = text.find(PYTHON_TAG)
        if tag >= 0:
            before, payload = text[:tag], text[tag + len(PYTHON_TAG) :]
        else:
            before, payload = "", text
        if not payload.strip().startswith("{"):
            return text, [], []
        calls: list[ParsedToolCall] = []
        pos = len(payload) - len(payload.lstrip())
        while True:
            try:
                value, end, recovered = raw_decode(payload, pos)
            except ArgumentsError as exc:
                if '"name"' in payload[pos:]:  # call-like JSON that does not decode
                    return before, [], [UnparsedToolCall(text[len(before) :], str(exc))]
                return text, [], []
            call = self._call(value, payload[pos:end], recovered)
            if call is None:  # JSON that is not a call: the message is content
                return text, [], []
            if isinstance(call, UnparsedToolCall):
                return before, [], [UnparsedToolCall(text[len(before) :], call.error)]
            calls.append(call)
            rest = payload[end:].lstrip()
            if not rest:
                return before, calls, []
            if not rest.startswith(";"):
                return text, [], []
            pos = len(payload) - len(rest) + 1
            while pos < len(payload) and payload[pos].isspace():
                pos += 1
            if pos >= len(payload):
                return before, calls, []

    @staticmethod
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
