"""`harness_rollout` and `Route`: routes from entries, harness mixtures, reward processors, tool transforms."""

from __future__ import annotations

from typing import Any

from platoon.config.environments import EnvironmentConfig
from platoon.config_defs import RolloutConfig
from platoon.envs.service import Outcome
from platoon.episode.rollout import Route, draw_harness, harness_rollout
from platoon.harness.agent import AgentResult
from platoon.task import Task

from .conftest import FakeService, fh, make_gateway, route, run


async def _chat(ctx: Any) -> AgentResult:
    await ctx.chat([{"role": "user", "content": "x"}])
    return AgentResult()


CHAT = fh(_chat)


def test_route_from_an_entry():
    entry = EnvironmentConfig(
        service="table",
        harness="platoon-react",
        program="gym",
        harness_options={"a": {"b": 1, "c": 2}},
        eval_overrides={"harness_options": {"a": {"c": 3}}},
        on_harness_exit="grade",
        on_context_overflow="exclude",
        reward_processor="platoon-delegation",
        agents={"max_depth": 2, "budget": "depth_aware"},
    )
    train = Route.from_entry(entry)
    assert train.harness == "platoon-react" and train.program == "gym"
    assert train.harness_options == {"a": {"b": 1, "c": 2}}
    assert train.on_harness_exit.timeout == "grade" and train.on_harness_exit.crash == "grade"
    assert train.on_context_overflow == "exclude" and train.reward_processor == "platoon-delegation"
    assert train.agents.max_depth == 2 and train.agents.budget == "depth_aware"
    evaluation = Route.from_entry(entry, split="test")
    assert evaluation.harness_options == {"a": {"b": 1, "c": 3}}


def test_a_harness_mixture_draws_per_task_deterministically():
    entry = EnvironmentConfig(service="table", harness={"a": 1, "b": 3}, seed=7)
    picks = [Route.from_entry(entry, task_id=str(i)).harness for i in range(200)]
    assert set(picks) == {"a", "b"} and 30 < picks.count("a") < 80
    assert picks == [draw_harness({"b": 3, "a": 1}, seed=7, task_id=str(i)) for i in range(200)]


def test_the_reward_processor_is_named_on_the_root_and_scores_only_trainable_trajectories(monkeypatch):
    from platoon import registry
    from platoon.episode.rollout import process_rewards

    def doubled(trajectory: dict[str, Any]) -> tuple[float, dict[str, float]]:
        return 2 * trajectory["reward"], {"reward/success": trajectory["reward"]}

    # registered for this test only
    monkeypatch.setitem(registry._registries["reward_processor"], "test-episode-doubled", doubled)
    service = FakeService()
    service.grader = lambda session: Outcome("scored", rewards={"reward": 0.5})
    collection = run(
        harness_rollout(
            Task(goal="g", id="1"),
            service=service,
            route=route(CHAT, reward_processor="test-episode-doubled"),
            config=RolloutConfig(verbose=False),
            gateway=make_gateway(),
        )
    )
    # the rollout keeps the outcome's reward; the trainer and the evaluator run the processor once
    assert collection.root.reward == 0.5
    assert collection.root.misc["reward_processor"] == "test-episode-doubled"
    assert process_rewards("test-episode-doubled", collection) == {
        collection.root.id: (1.0, {"reward/success": 0.5})
    }

    service.grader = lambda session: Outcome.infra("env_error")
    collection = run(
        harness_rollout(
            Task(goal="g", id="1"),
            service=service,
            route=route(CHAT, reward_processor="test-episode-doubled"),
            config=RolloutConfig(verbose=False),
            gateway=make_gateway(),
        )
    )
    assert collection.root.reward == 0.0 and process_rewards("test-episode-doubled", collection) == {}


def test_tool_transform_applies_to_the_root_and_config_max_steps_overrides_the_task():
    seen: dict[str, Any] = {}

    async def h(ctx: Any) -> AgentResult:
        seen["tools"] = [t.name for t in await ctx.list_tools()]
        seen["max_steps"] = ctx.max_steps
        seen["task"] = str(ctx.task)
        seen["remaining"] = ctx.budget.remaining()
        return AgentResult()

    async def program(ep: Any) -> Outcome:
        ep.tool_transform = lambda tools: [t for t in tools if t.name != "write"]
        await ep.run()
        return await ep.grade()

    run(
        harness_rollout(
            Task(goal="g", id="1", max_steps=50),
            service=FakeService(),
            route=route(fh(h), program=program),
            config=RolloutConfig(verbose=False, max_steps=7),
            gateway=make_gateway(),
        )
    )
    assert seen["tools"] == ["look", "submit"]
    assert seen["max_steps"] == 7 and seen["remaining"] == 7
    assert "total budget of 7 steps" in seen["task"]


def test_a_goal_less_task_records_the_session_instruction():
    service = FakeService(instruction="from the environment")
    collection = run(
        harness_rollout(
            Task(id="ors-1"),
            service=service,
            route=route(CHAT),
            config=RolloutConfig(verbose=False),
            gateway=make_gateway(),
        )
    )
    assert collection.root.task.goal == "from the environment"
