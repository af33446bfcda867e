"""`ctx.agents.spawn`: rejections, access clamping, TOML specs, anchors, child grading."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from platoon.config_defs import RolloutConfig
from platoon.envs.service import Outcome
from platoon.harness.agent import AgentResult, LaunchFailure, SubagentResult

from .conftest import FakeService, fh, open_episode, run

USER = [{"role": "user", "content": "go"}]


def spawning(
    service: FakeService,
    parent: Any,
    child: Any = None,
    *,
    config: RolloutConfig | None = None,
    **route_kwargs: Any,
) -> tuple[Any, Any]:
    """Run `parent(ctx)` as the root (children run `child(ctx)`); returns (episode, the parent's return value)."""
    child = child or _finish

    async def h(ctx: Any) -> AgentResult:
        if ctx.depth == 0:
            value = await parent(ctx)
            holder["value"] = value
            return AgentResult(final_message="parent")
        return await child(ctx)

    holder: dict[str, Any] = {}

    async def main() -> Any:
        ep = await open_episode(service, fh(h), config=config, **route_kwargs)
        await ep.run()
        return ep

    ep = run(main())
    return ep, holder.get("value")


async def _finish(ctx: Any) -> AgentResult:
    await ctx.chat([{"role": "user", "content": ctx.instruction}])
    return AgentResult(final_message=f"did {ctx.instruction}")


def test_a_child_runs_on_a_forked_session_and_task(service: FakeService):
    async def parent(ctx: Any) -> SubagentResult:
        await ctx.chat(USER)
        return await ctx.agents.spawn("sub goal", max_steps=3, task_misc={"k": 1})

    ep, result = spawning(service, parent)
    assert result.launched and result.ok
    assert result.message == "did sub goal" and result.goal == "sub goal"
    assert result.outcome is None  # child_grading none: shares the episode outcome
    child = ep.state.rollout.agents[1]
    assert result.agent_id == child.agent_id and result.trajectory_id == child.trajectory_id
    assert child.role == "subagent" and child.depth == 1 and child.max_steps == 3
    assert child.task.goal == "sub goal" and child.task.max_steps == 3 and child.task.misc == {"k": 1}
    assert child.task.parent_tasks[-1] is ep.task
    assert child.fork_step == 1
    forked = service.sessions[1]
    assert forked.parent is service.sessions[0] and forked.mode == "shared"  # the session's own default
    assert forked.closed and not service.sessions[0].closed


def test_fork_mode_comes_from_spawn_then_agents_fork(service: FakeService):
    async def parent(ctx: Any) -> None:
        await ctx.agents.spawn("a", max_steps=1)
        await ctx.agents.spawn("b", max_steps=1, fork="fresh")

    spawning(service, parent, agents={"fork": "copy"})
    assert [s.mode for s in service.sessions[1:]] == ["copy", "fresh"]


def test_rejections_return_results_with_exact_texts(service: FakeService):
    async def parent(ctx: Any) -> list[SubagentResult]:
        return [
            await ctx.agents.spawn("g1", max_steps=0),
            await ctx.agents.spawn("g2", max_steps=True),
            await ctx.agents.spawn("g3", max_steps=50),
        ]

    ep, results = spawning(service, parent, config=RolloutConfig(max_steps=10))
    zero, boolean, big = results
    for result in results:
        assert not result.launched and result.agent_id == "" and result.trajectory_id == ""
        assert isinstance(result.message, LaunchFailure) and result.result.status == "error"
        assert result.result.error == result.message
    assert (
        zero.message == "Failed to launch subagent for goal g1: max_steps must be a positive integer; got 0."
    )
    assert boolean.message.endswith("got True.")
    assert big.message == (
        "Not enough budget to launch subagent for goal g3. Requested 51 steps (max_steps 50 + 1) but only 10 "
        "remain. Note: spawning a subagent automatically reserves max_steps + 1 steps since you will need one or "
        "more steps to process the result of the subagent and complete the task. You could try requesting a "
        "smaller budget or perform the task yourself."
    )
    assert len(ep.state.rollout.agents) == 1  # nothing opened


def test_depth_rejection_and_default_child_budget(service: FakeService):
    async def parent(ctx: Any) -> SubagentResult:
        return await ctx.agents.spawn("deeper")

    async def child(ctx: Any) -> AgentResult:
        nested = await ctx.agents.spawn("too deep", max_steps=1)
        return AgentResult(final_message=nested.message)

    ep, result = spawning(service, parent, child, agents={"max_depth": 1, "child_max_steps": 4})
    assert ep.state.rollout.agents[1].max_steps == 4
    assert result.message.startswith("Not enough budget to launch subagent for goal too deep. ")
    assert "maximum subagent depth (1)" in result.message


def test_a_gateway_shutting_down_refuses_launches(service: FakeService):
    async def parent(ctx: Any) -> SubagentResult:
        ctx.episode.gateway._shut_down = True
        return await ctx.agents.spawn("late")

    _, result = spawning(service, parent)
    assert result.message == "Failed to launch subagent for goal late: the model gateway is shutting down."


def test_a_fork_failure_is_a_failed_launch_and_releases_the_budget(service: FakeService):
    service.fork_error = RuntimeError("no snapshots")

    async def parent(ctx: Any) -> tuple[SubagentResult, float]:
        result = await ctx.agents.spawn("x", max_steps=2)
        return result, ctx.budget.remaining()

    _, (result, remaining) = spawning(service, parent, config=RolloutConfig(max_steps=10))
    assert result.message == (
        "Failed to launch subagent for goal x: the environment could not be forked (RuntimeError: no snapshots)."
    )
    assert remaining == 10


def test_a_toml_spec_raises_type_error(service: FakeService):
    async def parent(ctx: Any) -> str:
        with pytest.raises(TypeError, match="TOML spec"):
            await ctx.agents.spawn("x", harness="agents/claude.toml")
        unknown = await ctx.agents.spawn("x", harness="no-such-harness-anywhere")
        return unknown.message

    _, message = spawning(service, parent)
    assert message.startswith("Failed to launch subagent for goal x: the harness could not be found (")


def test_access_is_clamped_to_the_parents(service: FakeService):
    seen: list[tuple[str, list[str], str]] = []

    async def parent(ctx: Any) -> None:
        await ctx.agents.spawn("a", max_steps=1, access="full")  # child_access no_terminal caps nothing here
        await ctx.agents.spawn("b", max_steps=1, access="read_only")

    async def child(ctx: Any) -> AgentResult:
        tools = [t.name for t in await ctx.list_tools()]
        refused = await ctx.call_tool("submit", {"answer": "x"})
        seen.append((str(ctx.access), tools, refused.as_text()))
        return AgentResult()

    spawning(service, parent, child)
    assert seen[0] == ("full", ["look", "write", "submit"], "submit done")
    assert seen[1] == (
        "read_only",
        ["look"],
        "Tool 'submit' is not available to this agent (tool access: read_only).",
    )
    assert service.sessions[2].calls == []  # the refused call was never sent


def test_child_access_defaults_and_never_exceeds_the_parent(service: FakeService):
    seen: list[str] = []

    async def parent(ctx: Any) -> None:
        await ctx.agents.spawn("a", max_steps=5)

    async def child(ctx: Any) -> AgentResult:
        seen.append(str(ctx.access))
        if ctx.depth == 1:
            await ctx.agents.spawn("b", max_steps=1, access="full")
        return AgentResult()

    spawning(service, parent, child, agents={"child_access": "no_terminal"})
    assert seen == ["no_terminal", "no_terminal"]


def test_anchor_counters_go_on_the_last_call_at_spawn_time(service: FakeService):
    service.grader = lambda session: Outcome("scored", rewards={"reward": 0.5})

    async def parent(ctx: Any) -> None:
        await ctx.chat(USER)
        await ctx.chat(USER)
        await asyncio.gather(ctx.agents.spawn("a", max_steps=1), ctx.agents.spawn("b", max_steps=1))
        await ctx.chat(USER)

    ep, _ = spawning(service, parent, agents={"child_grading": "env"})
    calls = ep.root.calls
    assert calls[1].step_misc["reward_misc"] == {
        "reward/subagent_launched": 2,
        "reward/subagent_succeeded": 1.0,
    }
    assert "reward_misc" not in calls[0].step_misc and "reward_misc" not in calls[2].step_misc


def test_env_grading_grades_the_forked_session_and_failures_are_untrainable(service: FakeService):
    graded: list[Any] = []

    def grader(session: Any) -> Outcome:
        graded.append(session)
        return Outcome("scored", rewards={"reward": 1.0}, reason="tests passed")

    service.grader = grader

    async def parent(ctx: Any) -> list[SubagentResult]:
        return list(
            await asyncio.gather(
                ctx.agents.spawn("fine", max_steps=2),
                ctx.agents.spawn("crash", max_steps=2),
                ctx.agents.spawn("limit", max_steps=2),
            )
        )

    async def child(ctx: Any) -> AgentResult:
        if ctx.instruction == "crash":
            raise ValueError("boom")
        if ctx.instruction == "limit":
            return AgentResult("limit")
        return AgentResult(final_message="fine!")

    ep, (fine, crash, limit) = spawning(service, parent, child, agents={"child_grading": "env"})
    assert fine.outcome.reward == 1.0 and fine.message == "fine!"
    assert crash.outcome.status == "error" and crash.outcome.failure_kind == "harness_crash"
    assert crash.message == "Subagent failed before finishing."
    assert limit.outcome.reward == 1.0
    assert limit.message == "Subagent did not finish before its step budget was exhausted."
    assert len(graded) == 2 and all(session.parent is service.sessions[0] for session in graded)
    assert ep.state.rollout.agents[1].outcome is fine.outcome


def test_a_child_timeout_is_untrainable_without_grading(service: FakeService):
    async def parent(ctx: Any) -> SubagentResult:
        return await ctx.agents.spawn("slow", max_steps=2)

    async def child(ctx: Any) -> AgentResult:
        await asyncio.sleep(5)
        return AgentResult()

    _, result = spawning(service, parent, child, agents={"child_grading": "env", "child_timeout_s": 0.02})
    assert result.result.status == "timeout" and not result.ok
    assert result.outcome.status == "timeout" and result.outcome.reason == "agent_timeout"
    assert result.message == "Subagent failed before finishing."


def test_verifier_grading_is_skipped_with_the_reason(service: FakeService):
    async def parent(ctx: Any) -> SubagentResult:
        return await ctx.agents.spawn("v", max_steps=2)

    ep, result = spawning(service, parent, agents={"child_grading": "verifier"})
    assert result.outcome is None
    assert ep.state.rollout.agents[1].misc["verifier_skipped"] == (
        "verifier grading is not available in this build yet"
    )
    ep, _ = spawning(
        service, parent, agents={"child_grading": "verifier"}, config=RolloutConfig(judges=False)
    )
    assert ep.state.rollout.agents[1].misc["verifier_skipped"] == "judges are off for this rollout"


def test_concurrent_spawns_reserve_atomically(service: FakeService):
    async def parent(ctx: Any) -> list[SubagentResult]:
        return list(await asyncio.gather(*(ctx.agents.spawn(f"g{i}", max_steps=3) for i in range(5))))

    _, results = spawning(service, parent, config=RolloutConfig(max_steps=10))
    assert [r.launched for r in results] == [True, True, False, False, False]


def test_annotations_and_tool_calls_are_recorded(service: FakeService):
    async def parent(ctx: Any) -> None:
        with pytest.raises(RuntimeError):
            ctx.annotate_step(x=1)
        await ctx.chat(USER)
        ctx.annotate(note="hi")
        ctx.annotate_step(exclude_from_training=True, reward_misc={"reward/a": 1})
        ctx.annotate_step(reward_misc={"reward/b": 2})
        await ctx.call_tool("look", {})

    ep, _ = spawning(service, parent)
    root = ep.root
    assert root.misc["note"] == "hi"
    assert root.calls[0].step_misc == {
        "exclude_from_training": True,
        "reward_misc": {"reward/a": 1, "reward/b": 2},
    }
    assert root.misc["tool_calls"] == [
        {"name": "look", "arguments": {}, "is_error": False, "finished": False, "step": 1}
    ]
