"""The episode runtime: agent contexts, step budgets, subagents, the run wrapper, episode programs and the
harness rollout. Light to import: names resolve from their modules on first use.
"""

from __future__ import annotations

from platoon._lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
