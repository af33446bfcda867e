"""Episode programs: run once, failure semantics of programs and finalizers, snapshots."""

from __future__ import annotations

from typing import Any

import pytest

from platoon.config_defs import RolloutConfig
from platoon.envs.service import Outcome
from platoon.episode.program import Episode, run_program
from platoon.episode.rollout import harness_rollout
from platoon.harness.agent import AgentResult
from platoon.harness.spec import SpecError
from platoon.task import Task

from .conftest import FakeService, fh, make_gateway, open_episode, route, run


async def _chat_once(ctx: Any) -> AgentResult:
    await ctx.chat([{"role": "user", "content": ctx.instruction}])
    return AgentResult(final_message="done")


CHAT = fh(_chat_once)


def rollout(service: FakeService, program: Any, harness: Any = CHAT, **kwargs: Any) -> Any:
    config = kwargs.pop("config", None) or RolloutConfig(verbose=False)
    return run(
        harness_rollout(
            Task(goal="solve it", id="t1"),
            service=service,
            route=route(harness, program=program, **kwargs),
            config=config,
            gateway=make_gateway(),
        )
    )


def test_run_twice_raises_and_a_spec_that_does_not_load_leaves_the_run_to_do(service: FakeService):
    async def main() -> None:
        ep = await open_episode(service, CHAT)
        with pytest.raises(SpecError, match=r"agents/x\.toml"):
            # specs run as the root (through the spec runner); this one is missing
            await ep.run("agents/x.toml")
        await ep.run()
        with pytest.raises(RuntimeError, match="runs once per episode"):
            await ep.run()
        none = await open_episode(service)
        with pytest.raises(ValueError, match="no harness"):
            await none.run()

    run(main())


def test_run_takes_goal_and_options(service: FakeService):
    seen: dict[str, Any] = {}

    async def h(ctx: Any) -> AgentResult:
        seen.update(goal=ctx.instruction, options=dict(ctx.options), role=ctx.role, depth=ctx.depth)
        with pytest.raises(TypeError):
            ctx.options["x"] = 2  # read-only
        return AgentResult()

    async def main() -> Episode:
        ep = await open_episode(service, fh(h), harness_options={"x": 1})
        await ep.run(goal="other goal")
        return ep

    ep = run(main())
    assert seen == {"goal": "other goal", "options": {"x": 1}, "role": "policy", "depth": 0}
    assert ep.root.goal == "other goal"


def test_a_raising_program_gives_an_infra_outcome(service: FakeService):
    async def broken(ep: Any) -> Outcome:
        await ep.run()
        raise ValueError("bad program")

    collection = rollout(service, broken)
    misc = collection.root.misc
    assert misc["outcome"]["status"] == "error"
    assert misc["outcome"]["failure_kind"] == "unexpected:ValueError"
    assert misc["outcome"]["reason"].endswith(": bad program")
    assert misc["outcome"]["reason"].startswith("program ")
    assert misc["trajectory_invalid"] and collection.root.reward == 0.0
    assert service.sessions[0].closed


def test_a_non_outcome_return_is_unexpected_type_error(service: FakeService):
    async def wrong(ep: Any) -> Any:
        return 1.0

    async def main() -> Outcome:
        ep = await open_episode(service, CHAT)
        return await run_program(wrong, ep)

    outcome = run(main())
    assert outcome.failure_kind == "unexpected:TypeError"
    assert outcome.reason.endswith("returned float, not an Outcome")


def test_finalizers_run_in_order_once_and_a_raising_one_rebuilds(service: FakeService):
    order: list[str] = []

    def first(collection: Any) -> None:
        order.append("first")
        collection.root.misc["touched"] = True

    async def second(collection: Any) -> None:
        order.append("second")

    async def program(ep: Any) -> Outcome:
        await ep.run()
        ep.add_finalizer(first)
        ep.add_finalizer(second)
        ep.add_finalizer(first)  # a no-op
        return await ep.grade()

    collection = rollout(service, program)
    assert order == ["first", "second"]
    assert collection.root.misc["touched"] and collection.root.reward == 1.0

    def boom(collection: Any) -> None:
        collection.root.misc["touched"] = True
        raise KeyError("k")

    async def failing(ep: Any) -> Outcome:
        await ep.run()
        ep.add_finalizer(boom)
        ep.add_finalizer(second)
        return await ep.grade()

    order.clear()
    collection = rollout(service, failing)
    outcome = collection.root.misc["outcome"]
    assert outcome["failure_kind"] == "finalizer:KeyError" and outcome["status"] == "error"
    assert "touched" not in collection.root.misc  # rebuilt from the records
    assert order == []  # later finalizers do not run


def test_snapshot_and_judge_endpoint(service: FakeService):
    async def program(ep: Any) -> Outcome:
        await ep.run()
        snap = ep.snapshot()
        assert snap.root.misc["outcome"]["reason"] == "snapshot"
        assert len(snap.root.steps) == 1
        with pytest.raises(RuntimeError, match="HTTP"):
            ep.judge_endpoint()
        return await ep.grade()

    assert rollout(service, program).root.reward == 1.0

    async def no_judges(ep: Any) -> Outcome:
        with pytest.raises(RuntimeError, match="judges are off"):
            ep.judge_endpoint()
        assert not ep.judges
        return Outcome("scored", rewards={"reward": 0.25})

    collection = rollout(service, no_judges, config=RolloutConfig(judges=False, verbose=False))
    assert collection.root.reward == 0.25 and collection.root.misc["judges"] == {"enabled": False}


def test_the_single_program_adds_reward_shaping_finalizers(service: FakeService):
    async def h(ctx: Any) -> AgentResult:
        await ctx.chat([{"role": "user", "content": "x"}])
        if ctx.depth == 0:
            await ctx.agents.spawn("child", max_steps=2)
        return AgentResult()

    collection = rollout(
        service, "single", fh(h), config=RolloutConfig(propagate_root_success=True, verbose=False)
    )
    root, child = collection.trajectories.values()
    assert root.reward == child.reward == 1.0
    assert root.steps[0].misc["reward_misc"]["reward/subagent_succeeded"] == 1.0

    collection = rollout(
        service, "single", fh(h), config=RolloutConfig(skip_subagent_reward_computation=True, verbose=False)
    )
    root, child = collection.trajectories.values()
    assert root.reward == 1.0 and child.reward == 0.0


def test_the_root_records_the_harness_and_program(service: FakeService):
    harness = fh(_chat_once, executes_model_code=True)
    collection = rollout(service, "single", harness)
    assert collection.root.misc["harness"] == {
        "spec": harness.ref,
        "kind": "function",
        "runtime": "inline",
        "executes_model_code": True,
        "program": "single@1",
    }
