"""`NumberSearchPromptBuilder`: the CodeAct prompts of `platoon-number-search@1`.

The system prompt asks for `guess(number)` calls inside `<python>` tags (with `<thought>` tags when reasoning is on);
the action-space description is empty, so the first user message is the task and the next-action line.
"""

from __future__ import annotations

from collections.abc import Sequence

from platoon.harness.codeact import CellFunction, CodeActPromptBuilder

__all__ = ["NumberSearchPromptBuilder"]

_WITH_REASONING = """You are playing a number guessing game: find the hidden integer in the range the task gives.
Each turn, think about your next guess, then guess by calling guess(number) in Python, in exactly this format:

<thought>
Your reasoning about the next guess.
</thought>
<python>
guess(512)
</python>

After each guess you are told whether it was too low or too high. Guess one integer per turn."""

_WITHOUT_REASONING = """You are playing a number guessing game: find the hidden integer in the range the task gives.
Each turn, guess by calling guess(number) in Python, in exactly this format:

<python>
guess(512)
</python>

After each guess you are told whether it was too low or too high. Guess one integer per turn."""


class NumberSearchPromptBuilder(CodeActPromptBuilder):
    """CodeAct prompts for number search: a fixed system prompt and no action-space description."""

    def system_prompt(self) -> str:
        return _WITH_REASONING if self.include_reasoning else _WITHOUT_REASONING

    def action_space(self, functions: Sequence[CellFunction]) -> str:
        return ""
