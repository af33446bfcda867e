"""The named environment `platoon-number-search@1`: guess a hidden integer, ORS in process.

This module is what the `platoon-number-search` entry point of `platoon.environments` names; the environment class
(`platoon.envs.number_search.env`) and its CodeAct builder (`.prompts`) are imported only when a run uses them.
"""

from __future__ import annotations

import functools

from platoon.config.named import EnvironmentEntry
from platoon.hookspecs import hookimpl

__all__ = ["NAME", "REACT_SYSTEM_PROMPT", "SERVICE", "entry"]

NAME = "platoon-number-search"
SERVICE = "python://platoon.envs.number_search.env:NumberSearchEnvironment"

#: platoon-react's system prompt for number search.
REACT_SYSTEM_PROMPT = (
    "You are playing a number guessing game: find the hidden integer in the range the task gives. "
    "Call the guess tool with one integer per turn; after each guess you are told whether it was too low or "
    "too high. Stop when you have guessed the number."
)


@functools.cache
def entry() -> EnvironmentEntry:
    """The `platoon-number-search@1` entry (built once; entries validate against the config schema)."""
    return EnvironmentEntry(
        NAME,
        "1",
        description="Guess a hidden integer in a range, told too low / too high; ORS in process.",
        harness_defaults={
            "platoon-codeact": {
                "prompt_builder": "platoon.envs.number_search.prompts:NumberSearchPromptBuilder",
                "include_reasoning": False,
                "subagents": False,
            },
            "platoon-react": {"system_prompt": REACT_SYSTEM_PROMPT},
        },
        service=SERVICE,
        agents={"max_depth": 0},
        eval_dataset_kwargs={"split_name": "val"},
    )


@hookimpl
def platoon_register_environments(name: str) -> EnvironmentEntry | None:
    """`platoon-number-search@1`."""
    return entry() if name == NAME else None
