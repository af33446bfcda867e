"""Token-in history: a prompt that repeats an agent's earlier calls reuses their exact tokens.

A conversation sent back to the gateway carries the assistant turns the gateway produced. Re-rendering them from
their parsed text need not give back the tokens the model sampled (JSON re-serialised, whitespace normalised,
non-ASCII escaped), which breaks the prefix property training relies on. This module builds the next prompt from
the recorded prompt and sampled tokens of the latest matching call and renders only the messages after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PromptBuild:
    """A call's prompt tokens and how they were built.

    `history` is recorded on the call (`generation["history"]`): `extends` (the call id whose prompt and sampled
    tokens this prompt starts with, or None), `reused_tokens` (how many tokens came from it), and `segment` (None
    when the prompt extends an earlier call; else why a new segment starts).
    """

    tokens: list[int]
    history: dict[str, Any] = field(default_factory=dict)
