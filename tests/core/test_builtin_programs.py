"""The built-in programs `single` and `gym`, and the propagate-root-success finalizer, on hand-made episodes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import platoon as pt
from platoon.programs.builtin import propagate_root_success
from platoon.rewards import zero_subagent_rewards
from platoon.trajectory import Trajectory, TrajectoryCollection, TrajectoryStep


def _collection() -> TrajectoryCollection:
    root = Trajectory(
        "root",
        reward=1.0,
        steps=[
            TrajectoryStep(misc={"reward_misc": {"reward/subagent_launched": 2}}),
            TrajectoryStep(misc={"reward_misc": {"reward/success": 0.75}}),
        ],
    )
    child = Trajectory("child", reward=0.0, steps=[TrajectoryStep()])
    forced = Trajectory(
        "forced", reward=0.0, steps=[TrajectoryStep()], misc={"outcome": {"reward_key": None}}
    )
    return TrajectoryCollection("c", {"root": root, "child": child, "forced": forced})


def test_propagate_root_success_gives_every_trajectory_the_roots_success():
    collection = _collection()
    propagate_root_success(collection)
    root, child, forced = collection.trajectories.values()
    assert (root.reward, child.reward, forced.reward) == (0.75, 0.75, 0.0)  # forced-zero trajectories stay 0
    assert child.steps[-1].misc["reward_misc"]["reward/success"] == 0.75
    assert root.steps[0].misc["reward_misc"]["reward/subagent_succeeded"] == 1.5  # launched x success


def test_propagate_root_success_falls_back_to_the_root_reward():
    collection = _collection()
    del collection.trajectories["root"].steps[-1].misc["reward_misc"]["reward/success"]
    propagate_root_success(collection)
    assert [t.reward for t in collection.trajectories.values()] == [1.0, 1.0, 0.0]


class FakeEpisode:
    """Just enough of an EpisodeContext to run a program: the runtime that implements it comes later."""

    def __init__(self, status: str = "completed", **config: object) -> None:
        defaults = {"skip_subagent_reward_computation": False, "propagate_root_success": False}
        self.config = SimpleNamespace(**{**defaults, **config})
        self.root = SimpleNamespace(misc={})
        self.finalizers: list[object] = []
        self.status = status
        self.graded = 0

    async def run(self) -> pt.AgentResult:
        return pt.AgentResult(self.status)

    def add_finalizer(self, fn: object) -> None:
        self.finalizers.append(fn)

    async def grade(self) -> pt.Outcome:
        self.graded += 1
        return pt.Outcome("scored", rewards={"reward": 0.5})


def test_single_adds_finalizers_in_order_then_grades():
    from platoon.programs import get_program

    single = get_program("single").fn
    episode = FakeEpisode(skip_subagent_reward_computation=True, propagate_root_success=True)
    outcome = asyncio.run(single(episode))
    assert outcome.reward == 0.5 and episode.graded == 1
    assert episode.finalizers == [zero_subagent_rewards, propagate_root_success]
    plain = FakeEpisode()
    asyncio.run(single(plain))
    assert plain.finalizers == []


def test_gym_scores_the_recorded_return():
    from platoon.programs import get_program

    gym = get_program("gym").fn
    episode = FakeEpisode("limit")
    episode.root.misc["gym_return"] = 3.0
    outcome = asyncio.run(gym(episode))
    assert (outcome.status, outcome.rewards, episode.graded) == ("scored", {"reward": 3.0}, 0)
    crashed = FakeEpisode("error")
    crashed.root.misc["gym_return"] = 3.0
    assert asyncio.run(gym(crashed)).reward == 0.5 and crashed.graded == 1  # not a return: graded normally
