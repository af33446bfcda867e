"""The episode runtime: agent contexts, step budgets, subagents, the run wrapper, episode programs and the
harness rollout. Light to import: names resolve from their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "Agent": "platoon.episode.context",
    "BudgetError": "platoon.episode.budget",
    "BudgetTracker": "platoon.episode.budget",
    "Episode": "platoon.episode.program",
    "Route": "platoon.episode.rollout",
    "harness_rollout": "platoon.episode.rollout",
    "run_agent": "platoon.episode.runner",
    "run_program": "platoon.episode.program",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'platoon.episode' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
