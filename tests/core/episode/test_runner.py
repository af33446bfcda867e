"""The run wrapper: timeouts, crashes, wrong returns, cancellation, waiting for children."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from platoon.config_defs import RolloutConfig
from platoon.harness.agent import AgentResult

from .conftest import FakeService, fh, open_episode, run


def test_a_completed_run_is_recorded_and_the_agent_finishes(service: FakeService):
    async def h(ctx: Any) -> AgentResult:
        reply = await ctx.chat([{"role": "user", "content": ctx.instruction}])
        return AgentResult(final_message=reply.text)

    async def main() -> None:
        ep = await open_episode(service, fh(h))
        result = await ep.run()
        assert result == AgentResult("completed", final_message="ok")
        assert ep.root.result is result and ep.root_agent.finished
        assert ep.root.ended is not None and len(ep.root.calls) == 1

    run(main())


def test_a_slow_harness_times_out_with_the_text(service: FakeService):
    async def h(ctx: Any) -> AgentResult:
        await asyncio.sleep(10)
        return AgentResult()

    async def main() -> None:
        ep = await open_episode(service, fh(h), config=RolloutConfig(timeout=0.05))
        result = await ep.run()
        assert result.status == "timeout"
        assert result.error.startswith("Agent timed out after 0.05s: ")

    run(main())


def test_the_root_time_limit_is_the_smaller_of_rollout_and_session(service: FakeService):
    async def h(ctx: Any) -> AgentResult:
        await asyncio.sleep(10)
        return AgentResult()

    service.session_kwargs["agent_timeout_s"] = 0.02

    async def main() -> None:
        ep = await open_episode(service, fh(h), config=RolloutConfig(timeout=100))
        result = await ep.run()
        assert result.status == "timeout" and "after 0.02s" in result.error

    run(main())


def test_a_timeout_error_raised_by_the_harness_is_a_crash(service: FakeService):
    async def h(ctx: Any) -> AgentResult:
        raise TimeoutError("upstream slow")

    result = run(_run(service, h, RolloutConfig(timeout=5)))
    assert result == AgentResult("error", error="TimeoutError: upstream slow")


def test_an_exception_becomes_an_error_result(service: FakeService):
    async def h(ctx: Any) -> AgentResult:
        raise KeyError("x")

    assert run(_run(service, h)) == AgentResult("error", error="KeyError: 'x'")


def test_a_wrong_return_is_an_error_naming_harness_and_type(service: FakeService):
    async def h(ctx: Any) -> Any:
        return "done"

    harness = fh(h)

    async def main() -> AgentResult:
        ep = await open_episode(service, harness)
        return await ep.run()

    result = run(main())
    assert result.status == "error"
    assert result.error == f"Harness {harness.ref} returned str, not an AgentResult"


def test_cancellation_propagates_and_stamps_cancelled(service: FakeService):
    started = asyncio.Event()

    async def h(ctx: Any) -> AgentResult:
        started.set()
        await asyncio.sleep(10)
        return AgentResult()

    async def main() -> None:
        ep = await open_episode(service, fh(h))
        task = asyncio.create_task(ep.run())
        await started.wait()  # cancelled while the harness runs
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ep.root.result.status == "cancelled"
        assert ep.root_agent.finished

    run(main())


def test_the_agent_waits_for_children_left_running(service: FakeService):
    done: list[str] = []

    async def h(ctx: Any) -> AgentResult:
        if ctx.depth == 0:
            await ctx.chat([{"role": "user", "content": "go"}])
            # un-awaited spawns: the runner must find them after the harness returns
            ctx.annotate(
                pending=[
                    asyncio.ensure_future(ctx.agents.spawn(g, max_steps=2)) for g in ("child a", "child b")
                ]
            )
            return AgentResult(final_message="parent done")
        await asyncio.sleep(0.02)
        done.append(ctx.task.goal)
        return AgentResult(final_message=ctx.task.goal)

    async def main() -> None:
        ep = await open_episode(service, fh(h))
        result = await ep.run()
        assert result.final_message == "parent done"
        assert sorted(done) == ["child a", "child b"]
        children = [a for a in ep.state.rollout.agents if a.parent is not None]
        assert [c.result.status for c in children] == ["completed", "completed"]
        assert ep.root_agent.children == set()
        # the reservations were returned
        assert ep.root_agent.budget.tracker.get(ep.root.agent_id).reserved == 0

    run(main())


def test_children_still_running_at_the_deadline_are_cancelled(service: FakeService):
    async def h(ctx: Any) -> AgentResult:
        if ctx.depth == 0:
            ctx.annotate(pending=asyncio.ensure_future(ctx.agents.spawn("slow child", max_steps=2)))
            return AgentResult()
        await asyncio.sleep(10)
        return AgentResult()

    async def main() -> None:
        ep = await open_episode(service, fh(h), config=RolloutConfig(timeout=0.1))
        result = await ep.run()
        assert result.status == "completed"  # the harness itself returned in time
        child = ep.state.rollout.agents[1]
        assert child.result.status == "cancelled"
        assert child.outcome.status == "cancelled" and child.outcome.reason == "agent_cancelled"
        assert service.sessions[1].closed and not service.sessions[0].closed

    run(main())


def test_a_harness_reporting_timeout_gets_its_children_cancelled_without_waiting(service: FakeService):
    async def h(ctx: Any) -> AgentResult:
        if ctx.depth == 0:
            ctx.annotate(pending=asyncio.ensure_future(ctx.agents.spawn("slow child", max_steps=2)))
            await asyncio.sleep(0.01)
            return AgentResult("timeout", error="gave up")
        await asyncio.sleep(10)
        return AgentResult()

    async def main() -> None:
        ep = await open_episode(service, fh(h))
        await ep.run()
        # cancelled, not waited for: waiting would have let it complete its ten seconds
        assert ep.state.rollout.agents[1].result.status == "cancelled"

    run(main())


def test_spawns_after_the_agent_finished_are_refused(service: FakeService):
    holder: dict[str, Any] = {}

    async def h(ctx: Any) -> AgentResult:
        holder["ctx"] = ctx
        return AgentResult()

    async def main() -> None:
        ep = await open_episode(service, fh(h))
        await ep.run()
        late = await holder["ctx"].agents.spawn("too late")
        assert not late.launched and late.agent_id == "" and late.trajectory_id == ""
        assert (
            late.message
            == "Failed to launch subagent for goal too late: the parent agent has already finished."
        )
        assert late.result.status == "error"

    run(main())


def test_keep_children_lets_a_cancelled_spawn_run_on(service: FakeService):
    finished: list[str] = []
    child_started = asyncio.Event()

    async def h(ctx: Any) -> AgentResult:
        if ctx.depth == 0:
            ctx.agents.keep_children()
            spawn = asyncio.ensure_future(ctx.agents.spawn("kept", max_steps=2))
            await child_started.wait()  # the spawn is cancelled once its child runs
            spawn.cancel()
            with pytest.raises(asyncio.CancelledError):
                await spawn
            return AgentResult()
        child_started.set()
        await asyncio.sleep(0.05)
        finished.append("kept")
        return AgentResult()

    async def main() -> None:
        ep = await open_episode(service, fh(h))
        await ep.run()
        assert finished == ["kept"]
        assert ep.state.rollout.agents[1].result.status == "completed"

    run(main())


def test_cancelling_a_spawn_cancels_the_child_and_returns_its_budget(service: FakeService):
    child_started = asyncio.Event()

    async def h(ctx: Any) -> AgentResult:
        if ctx.depth == 0:
            spawn = asyncio.ensure_future(ctx.agents.spawn("doomed", max_steps=4))
            await child_started.wait()
            assert ctx.budget.remaining() == 20 - 5
            spawn.cancel()
            with pytest.raises(asyncio.CancelledError):
                await spawn
            await _until(lambda: ctx.budget.remaining() == 20, "the cancelled child's budget comes back")
            return AgentResult()
        child_started.set()
        await asyncio.sleep(10)
        return AgentResult()

    async def main() -> None:
        ep = await open_episode(service, fh(h), config=RolloutConfig(max_steps=20))
        result = await ep.run()
        assert result.status == "completed", result.error
        assert ep.state.rollout.agents[1].result.status == "cancelled"

    run(main())


async def _until(condition: Any, what: str) -> None:
    """Let the loop run until `condition()` holds; the timeout is a hang guard."""
    try:
        async with asyncio.timeout(60):
            while not condition():
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"never happened: {what}") from None


async def _run(service: FakeService, h: Any, config: RolloutConfig | None = None) -> AgentResult:
    ep = await open_episode(service, fh(h), config=config)
    return await ep.run()
