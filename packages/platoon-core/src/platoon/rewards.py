"""Reward helpers: the `platoon-delegation` reward processor and the `zero_subagent_rewards` finalizer.

This module is also the entry point of the built-in reward processor `platoon-delegation`, so it imports only
the standard library and `platoon.hookspecs` (pluggy).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from platoon.hookspecs import RewardProcessor, hookimpl

__all__ = ["DELEGATION_REWARD_CAP", "delegation_capped", "zero_subagent_rewards"]

#: The weight of the subagent success rate in `delegation_capped`. 0.0: delegation earns no bonus by itself.
DELEGATION_REWARD_CAP = 0.0

_SUCCESS = "reward/success"
_LAUNCHED = "reward/subagent_launched"
_SUCCEEDED = "reward/subagent_succeeded"


def delegation_capped(trajectory: Mapping[str, Any]) -> tuple[float, dict[str, float]]:
    """Score one trajectory dict: success plus `DELEGATION_REWARD_CAP` times the subagent success rate.

    The components are the sums over steps of every `reward_misc` key starting with `reward/`; `reward/success`
    defaults to the trajectory's reward and the two subagent components to 0.
    """
    components: dict[str, float] = {}
    for step in trajectory.get("steps") or ():
        reward_misc = ((step or {}).get("misc") or {}).get("reward_misc") or {}
        for key, value in reward_misc.items():
            if isinstance(key, str) and key.startswith("reward/") and value is not None:
                components[key] = components.get(key, 0.0) + float(value)
    components.setdefault(_SUCCESS, float(trajectory.get("reward") or 0.0))
    components.setdefault(_LAUNCHED, 0.0)
    components.setdefault(_SUCCEEDED, 0.0)
    score = components[_SUCCESS]
    if components[_LAUNCHED] > 0:
        score += DELEGATION_REWARD_CAP * components[_SUCCEEDED] / components[_LAUNCHED]
    return score, components


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _reward_misc(step: Any) -> MutableMapping[str, Any]:
    # Works on TrajectoryStep objects and on their dict form; creates the nested mappings when missing.
    if isinstance(step, MutableMapping):
        misc = step.setdefault("misc", {})
    else:
        if step.misc is None:
            step.misc = {}
        misc = step.misc
    return misc.setdefault("reward_misc", {})


def zero_subagent_rewards(collection: Any) -> Any:
    """Zero every subagent's reward (a finalizer for `skip_subagent_reward_computation`); returns the collection.

    Every non-root trajectory's reward becomes 0, and so does its last step's `reward/success`; every step's
    `reward/subagent_succeeded` (the root's included) is set to 0. Takes a `TrajectoryCollection` or its dict form.
    """
    trajectories = _get(collection, "trajectories") or {}
    for index, trajectory in enumerate(trajectories.values()):
        steps = _get(trajectory, "steps") or []
        if index > 0:  # the root comes first
            if isinstance(trajectory, MutableMapping):
                trajectory["reward"] = 0.0
            else:
                trajectory.reward = 0.0
            if steps:
                _reward_misc(steps[-1])[_SUCCESS] = 0.0
        for step in steps:
            misc = _get(step, "misc") or {}
            if _SUCCEEDED in (misc.get("reward_misc") or {}):
                _reward_misc(step)[_SUCCEEDED] = 0.0
    return collection


@hookimpl
def platoon_register_reward_processors(name: str) -> RewardProcessor:
    """The built-in reward processor `platoon-delegation`."""
    return RewardProcessor(
        "platoon-delegation",
        "success plus a capped bonus for the subagent success rate (cap 0.0)",
        delegation_capped,
    )
