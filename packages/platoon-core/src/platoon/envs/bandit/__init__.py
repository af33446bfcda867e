"""The named environment `platoon-bandit@1`: answer with one letter, and exactly one letter scores; ORS in process.

The smallest task a toy model can learn on the embedded local server (the README's `platoon train` example). This
module is what the `platoon-bandit` and `platoon-bandit-answer` entry points name: it gives the environment and
the one-call harness (`.harness`) through their hooks; the environment class (`.env`) is imported only when a run
opens it.
"""

from __future__ import annotations

import functools
from typing import Any

from platoon.config.named import EnvironmentEntry
from platoon.envs.bandit import harness as _harness
from platoon.hookspecs import hookimpl

__all__ = ["HARNESS", "NAME", "SERVICE", "entry"]

NAME = "platoon-bandit"
SERVICE = "python://platoon.envs.bandit.env:BanditEnvironment"
HARNESS = _harness.NAME


@functools.cache
def entry() -> EnvironmentEntry:
    """The `platoon-bandit@1` entry (built once; entries validate against the config schema)."""
    return EnvironmentEntry(
        NAME,
        "1",
        description="Answer with one letter (A, B, C or D); only C scores 1. One model call; ORS in process.",
        service=SERVICE,
        harness=HARNESS,
        agents={"max_depth": 0},
        eval_dataset_kwargs={"split_name": "val"},
    )


@hookimpl
def platoon_register_environments(name: str) -> EnvironmentEntry | None:
    """`platoon-bandit@1`."""
    return entry() if name == NAME else None


@hookimpl
def platoon_register_harnesses(name: str) -> Any:
    """`platoon-bandit-answer`, answered by the hook (not only registered on import) so a harness registry that
    was cleared still finds it through its entry point."""
    return _harness.answer if name == HARNESS else None
