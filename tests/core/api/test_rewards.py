"""Reward helpers: `delegation_capped`, `zero_subagent_rewards`, and the `platoon-delegation` plugin."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import pluggy

from platoon import hookspecs
from platoon.hookspecs import RewardProcessor
from platoon.rewards import DELEGATION_REWARD_CAP, delegation_capped, zero_subagent_rewards
from platoon.trajectory import ParentInfo, Trajectory, TrajectoryCollection, TrajectoryStep


def _step(**reward_misc: float) -> dict[str, Any]:
    return {"misc": {"reward_misc": {k.replace("__", "/"): v for k, v in reward_misc.items()}}}


def test_delegation_capped_sums_reward_components() -> None:
    trajectory = {
        "reward": 0.0,
        "steps": [
            _step(reward__subagent_launched=1, reward__subagent_succeeded=1.0, other=5),
            {"misc": {"action_misc": {}}},
            {},
            _step(reward__subagent_launched=1, reward__subagent_succeeded=0.0, reward__success=1.0),
        ],
    }
    score, components = delegation_capped(trajectory)
    assert components == {
        "reward/subagent_launched": 2.0,
        "reward/subagent_succeeded": 1.0,
        "reward/success": 1.0,
    }
    assert DELEGATION_REWARD_CAP == 0.0
    assert score == 1.0  # success + 0.0 * 1/2


def test_delegation_capped_defaults() -> None:
    score, components = delegation_capped({"reward": 0.75, "steps": []})
    assert (score, components) == (
        0.75,
        {"reward/success": 0.75, "reward/subagent_launched": 0.0, "reward/subagent_succeeded": 0.0},
    )
    assert delegation_capped({"steps": [_step(reward__success=0.0)], "reward": 1.0})[0] == 0.0
    assert delegation_capped({})[0] == 0.0


def test_delegation_capped_reads_a_real_trajectory_dict() -> None:
    trajectory = Trajectory("t", steps=[TrajectoryStep({"reward_misc": {"reward/success": 1.0}})], reward=1.0)
    assert delegation_capped(trajectory.to_dict()) == (
        1.0,
        {"reward/success": 1.0, "reward/subagent_launched": 0.0, "reward/subagent_succeeded": 0.0},
    )


def _tree() -> TrajectoryCollection:
    root = Trajectory(
        "root",
        steps=[
            TrajectoryStep(
                {"reward_misc": {"reward/subagent_launched": 2.0, "reward/subagent_succeeded": 1.5}}
            ),
            TrajectoryStep({"reward_misc": {"reward/success": 1.0}}),
        ],
        reward=1.0,
    )
    child = Trajectory(
        "child",
        parent_info=ParentInfo("root", 0),
        steps=[
            TrajectoryStep(
                {"reward_misc": {"reward/subagent_launched": 1.0, "reward/subagent_succeeded": 1.0}}
            )
        ],
        reward=1.0,
    )
    grandchild = Trajectory("grandchild", parent_info=ParentInfo("child", 0), steps=[], reward=0.5)
    return TrajectoryCollection("rid", {"root": root, "child": child, "grandchild": grandchild})


def test_zero_subagent_rewards_on_objects() -> None:
    collection = _tree()
    assert zero_subagent_rewards(collection) is collection
    root, child, grandchild = collection.trajectories.values()
    assert root.reward == 1.0
    assert root.steps[0].misc["reward_misc"] == {
        "reward/subagent_launched": 2.0,
        "reward/subagent_succeeded": 0.0,
    }
    assert root.steps[1].misc["reward_misc"] == {"reward/success": 1.0}
    assert child.reward == 0.0
    assert child.steps[-1].misc["reward_misc"] == {
        "reward/subagent_launched": 1.0,
        "reward/subagent_succeeded": 0.0,
        "reward/success": 0.0,
    }
    assert grandchild.reward == 0.0 and grandchild.steps == []


def test_zero_subagent_rewards_on_dicts() -> None:
    data = _tree().to_dict()
    zero_subagent_rewards(data)
    trajectories = data["trajectories"]
    assert trajectories["root"]["reward"] == 1.0
    assert trajectories["root"]["steps"][0]["misc"]["reward_misc"]["reward/subagent_succeeded"] == 0.0
    assert trajectories["child"]["reward"] == 0.0
    assert trajectories["child"]["steps"][-1]["misc"]["reward_misc"]["reward/success"] == 0.0
    assert trajectories["grandchild"]["reward"] == 0.0


def test_platoon_delegation_is_a_registered_entry_point() -> None:
    (entry,) = [
        ep for ep in entry_points(group="platoon.reward_processors") if ep.name == "platoon-delegation"
    ]
    assert entry.value == "platoon.rewards"
    manager = pluggy.PluginManager("platoon")
    manager.add_hookspecs(hookspecs)
    manager.register(entry.load())
    results = manager.hook.platoon_register_reward_processors(name="platoon-delegation")
    assert len(results) == 1
    processor = results[0]
    assert isinstance(processor, RewardProcessor)
    assert processor.name == "platoon-delegation"
    assert processor.summary and "\n" not in processor.summary
    assert processor.fn is delegation_capped
