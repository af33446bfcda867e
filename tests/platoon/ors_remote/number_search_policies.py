"""Scripted policies for number search (ReAct tool calls) shared by the remote-service tests."""

from __future__ import annotations

import re

from platoon.testing import tool_call


def binary_search(prompt: str) -> str:
    """The next guess of a binary search, replaying the range and the feedback the prompt shows."""
    low, high = map(int, re.search(r"between (\d+) and (\d+)", prompt).groups())  # type: ignore[union-attr]
    guesses = [int(n) for n in re.findall(r'"number": (\d+)', prompt)]
    for guess, word in zip(guesses, re.findall(r"Too (low|high), try again\.", prompt), strict=False):
        low, high = (guess + 1, high) if word == "low" else (low, guess - 1)
    return "\n" + tool_call("guess", {"number": (low + high) // 2})


def always_zero(prompt: str) -> str:
    """A policy that never finds the number (unless it is 0)."""
    return "\n" + tool_call("guess", {"number": 0})
