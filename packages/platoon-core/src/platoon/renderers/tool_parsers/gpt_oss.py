"""The `gpt-oss` parser (aliases `openai`, `gpt_oss`): OpenAI Harmony messages.

`<|channel|>analysis<|message|>...<|end|>` is reasoning; `commentary to=functions.NAME <|constrain|>json
<|message|>{json}` (the recipient before or after the channel) is a tool call; `final` and recipient-less
commentary are content. Reasoning tags do not apply.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from platoon.renderers.tool_parsers import (
    ParsedToolCall,
    ParseResult,
    ToolCallParser,
    UnparsedToolCall,
)
from platoon.renderers.tool_parsers._common import ArgumentsError, loads, normalize_arguments

START, MESSAGE, CHANNEL = "<|start|>", "<|message|>", "<|channel|>"
_TERMINATORS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")


class GptOssParser(ToolCallParser):
    name = "gpt-oss"
    aliases = ("openai", "gpt_oss")
    default_reasoning_tags = None

    def parse(
        self, text: str, *, tools: Sequence[Any] | None = None, in_reasoning: bool = False
    ) -> ParseResult:
        if MESSAGE not in text:
            return ParseResult(content=text.strip())
        result = ParseResult()
        reasoning: list[str] = []
        content: list[str] = []
        for segment in _segments(text):
            header, sep, rest = segment.partition(MESSAGE)
            if not sep:
                if segment.strip():
                    content.append(segment)
                continue
            body, trailing = _cut(rest)
            channel_match = _CHANNEL.search(header)
            channel = channel_match.group(1) if channel_match else ""
            recipient_match = _RECIPIENT.search(header)
            if recipient_match:
                call = _read_call(recipient_match.group(1), body, segment)
                if isinstance(call, ParsedToolCall):
                    result.tool_calls.append(call)
                else:
                    result.unparsed.append(call)
            elif channel == "analysis":
                reasoning.append(body)
            else:  # final, recipient-less commentary, or no channel at all
                content.append(body)
            if trailing.strip():
                content.append(trailing)
        result.reasoning = "\n".join(r.strip() for r in reasoning if r.strip())
        result.content = "\n".join(c.strip() for c in content if c.strip())
        return result


def _segments(text: str) -> list[str]:
    """The messages: the first continues the prompt's `<|start|>assistant`, the rest open with `<|start|>`."""
    pieces = text.split(START)
    return [pieces[0], *(START + piece for piece in pieces[1:])]


def _cut(rest: str) -> tuple[str, str]:
    """(the message body, what follows its terminator)."""
    ends = [(rest.find(t), t) for t in _TERMINATORS if rest.find(t) >= 0]
    if not ends:
        return rest, ""
    at, terminator = min(ends)
    return rest[:at], rest[at + len(terminator) :]


def _read_call(recipient: str, body: str, raw: str) -> ParsedToolCall | UnparsedToolCall:
    name = recipient.removeprefix("functions.")
    if not name:
        return UnparsedToolCall(raw, "a tool call without a function name")
    try:
        value, recovered = loads(body) if body.strip() else ({}, False)
        arguments, lenient = normalize_arguments(value)
    except ArgumentsError as exc:
        return UnparsedToolCall(raw, str(exc))
    return ParsedToolCall(name, arguments, None, recovered or lenient, raw)
