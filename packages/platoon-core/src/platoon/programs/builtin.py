"""The built-in episode programs `single@1` and `gym@1`, declared as entry points of platoon-core like any plugin's.

`single` runs the root agent, adds the reward-shaping finalizers the rollout config asks for (zero subagent
rewards, then propagate root success) and grades; `gym` scores a step environment's summed return.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard

from platoon.hookspecs import hookimpl
from platoon.programs.registry import program

if TYPE_CHECKING:
    from platoon.envs.service import Outcome
    from platoon.programs.context import EpisodeContext
    from platoon.trajectory import TrajectoryCollection


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _last_step_misc(trajectory: Any) -> dict[str, Any] | None:
    if not trajectory.steps:
        return None
    return trajectory.steps[-1].misc.setdefault("reward_misc", {})


def _forced_zero(trajectory: Any) -> bool:
    """A zero that platoon assigned itself (an outcome without a reward key), which no propagation overrides."""
    outcome = trajectory.misc.get("outcome")
    return isinstance(outcome, dict) and "reward_key" in outcome and outcome["reward_key"] is None


def propagate_root_success(collection: TrajectoryCollection) -> None:
    """Give every trajectory the root's success; forced-zero trajectories keep 0."""
    trajectories = list(collection.trajectories.values())
    if not trajectories:
        return
    root = trajectories[0]
    root_misc = _last_step_misc(root) or {}
    success = root_misc.get("reward/success")
    if not _number(success):
        success = 0.0 if _forced_zero(root) else root.reward
    for trajectory in trajectories:
        reward = 0.0 if _forced_zero(trajectory) else float(success)
        trajectory.reward = reward
        last = _last_step_misc(trajectory)
        if last is not None:
            last["reward/success"] = reward
        for step in trajectory.steps:
            reward_misc = step.misc.get("reward_misc") or {}
            launched = reward_misc.get("reward/subagent_launched")
            if _number(launched) and launched > 0:
                reward_misc["reward/subagent_succeeded"] = launched * float(success)


@program("single")
async def single(ep: EpisodeContext) -> Outcome:
    """Run the root agent once, shape subagent rewards as the rollout config asks, then grade the session."""
    from platoon.rewards import zero_subagent_rewards

    await ep.run()
    if getattr(ep.config, "skip_subagent_reward_computation", False):
        ep.add_finalizer(zero_subagent_rewards)
    if getattr(ep.config, "propagate_root_success", False):
        ep.add_finalizer(propagate_root_success)
    return await ep.grade()


@program("gym")
async def gym(ep: EpisodeContext) -> Outcome:
    """Run the root; a completed or limited run that recorded `gym_return` scores that return, else grade."""
    from platoon.envs.service import Outcome

    result = await ep.run()
    gym_return = ep.root.misc.get("gym_return")
    if result.status in ("completed", "limit") and _number(gym_return):
        return Outcome("scored", rewards={"reward": float(gym_return)})
    return await ep.grade()


@hookimpl
def platoon_register_programs(name: str) -> list[Any]:
    return [fn for fn in (single, gym) if fn.__name__ == name]
