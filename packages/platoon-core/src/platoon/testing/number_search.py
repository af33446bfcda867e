"""Scripted players of number search (`platoon-number-search@1`), for tests and benchmarks that need a policy whose
play is known.

Each reads what a rendered prompt shows: the task's range ("between LOW and HIGH"), the guesses made so far (as
platoon-react's tool calls or platoon-codeact's `guess(...)` cells) and the environment's "Too low" / "Too high"
answers, and narrows the range a binary search would.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from platoon.testing.policy import tool_call

__all__ = ["codeact_guesses", "open_range", "react_binary_search", "react_guesses"]

_RANGE = re.compile(r"between (-?\d+) and (-?\d+)")
_FEEDBACK = re.compile(r"Too (low|high), try again\.")
_REACT_GUESS = re.compile(r'"number": (-?\d+)')
_CODEACT_GUESS = re.compile(r"guess\((?:number=)?(-?\d+)\)")


def react_guesses(prompt: str) -> list[int]:
    """The numbers guessed so far through platoon-react's `guess` tool calls."""
    return [int(n) for n in _REACT_GUESS.findall(prompt)]


def codeact_guesses(prompt: str) -> list[int]:
    """The numbers guessed so far in platoon-codeact cells (`guess(7)` or `guess(number=7)`)."""
    return [int(n) for n in _CODEACT_GUESS.findall(prompt)]


def open_range(prompt: str, guesses: Sequence[int]) -> tuple[int, int]:
    """The range `(low, high)` the answer can still be in after `guesses` and the feedback the prompt shows."""
    found = _RANGE.search(prompt)
    if found is None:
        raise ValueError(f"no 'between LOW and HIGH' in the prompt: ...{prompt[-300:]}")
    low, high = int(found.group(1)), int(found.group(2))
    for guess, word in zip(guesses, _FEEDBACK.findall(prompt), strict=False):
        low, high = (guess + 1, high) if word == "low" else (low, guess - 1)
    return min(low, high), max(low, high)


def react_binary_search(prompt: str) -> str:
    """platoon-react's next reply: a `guess` tool call halving the open range. The leading newline is what the
    Qwen3 format renders in the history, so each prompt extends the last exactly."""
    low, high = open_range(prompt, react_guesses(prompt))
    return "\n" + tool_call("guess", {"number": (low + high) // 2})
