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
from platoon.renderers.tool_parsers._common import ArgumentsError, NextFind, loads, normalize_arguments

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
            return ParseResult.from_segments([text])
        reasoning: list[str] = []
        segments: list[Any] = []
        shown = False  # visible pieces are joined by newlines

        def show(piece: str) -> None:
            nonlocal shown
            if piece.strip():
                segments.append(("\n" if shown else "") + piece.strip())
                shown = True

        for before, header, body, raw in _messages(text):
            show(before)
            recipient_match = _RECIPIENT.search(header)
            channel_match = _CHANNEL.search(header)
            channel = channel_match.group(1) if channel_match else ""
            if recipient_match:
                segments.append(_read_call(recipient_match.group(1), body, raw))
            elif channel == "analysis":
                if body.strip():
                    reasoning.append(body.strip())
            else:  # final, recipient-less commentary, or no channel at all
                show(body)
        return ParseResult.from_segments(segments, "\n".join(reasoning))


def _messages(text: str) -> list[tuple[str, str, str, str]]:
    """The messages as (text before the header, header, body, raw message), and the text after the last one.

    A message ends at its terminator; the next one starts there, with `<|start|>` or (as models often write it)
    straight with `<|channel|>`. The first continues the prompt's `<|start|>assistant`.
    """
    out: list[tuple[str, str, str, str]] = []
    ends = [NextFind(text, t) for t in _TERMINATORS]
    pos = 0
    while (at := text.find(MESSAGE, pos)) >= 0:
        region = text[pos:at]
        opened = region.rfind(START)
        if opened < 0:
            # Without <|start|>, text before the first <|channel|> that is no header of its own is the model's.
            channel = region.find(CHANNEL)
            lead = region[: max(channel, 0)]
            opened = channel if channel > 0 and "to=" not in lead and lead.strip() != "assistant" else 0
        body_start = at + len(MESSAGE)
        found = [(e(body_start), t) for e, t in zip(ends, _TERMINATORS, strict=True)]
        stop, terminator = min(((i, t) for i, t in found if i >= 0), default=(len(text), ""))
        pos = stop + len(terminator)
        out.append(
            (region[:opened], region[opened:], text[body_start:stop], text[at - len(region) + opened : pos])
        )
    out.append((text[pos:], "", "", ""))
    return out


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
