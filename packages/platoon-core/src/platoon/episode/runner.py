"""The inline run wrapper: run a function harness under its time limit, turn every failure into
an `AgentResult`, wait for the children it left running, and mark the agent finished.

Only cancellation propagates (the agent's result is stamped `cancelled` first).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any, Protocol

from platoon.harness.agent import AgentResult, AgentStatus

if TYPE_CHECKING:
    from platoon.gateway.records import AgentRecord
    from platoon.harness.function import FunctionHarness

__all__ = ["CHILD_GRACE_S", "RunnableAgent", "cancel_children", "run_agent"]

#: How long cancelled children get to unwind (release budgets, close forked sessions).
CHILD_GRACE_S = 10.0


class RunnableAgent(Protocol):
    """What running an agent uses of it. `platoon.episode.context.Agent` is the one the product runs; it is typed
    by this protocol because the context sits above this module (through its subagents), even for type checking."""

    #: set once the run is over: spawns are refused after it
    finished: bool

    @property
    def agent_id(self) -> str: ...

    @property
    def harness(self) -> FunctionHarness | None: ...

    @property
    def record(self) -> AgentRecord: ...

    @property
    def children(self) -> set[asyncio.Task[Any]]: ...


def _harness_name(agent: RunnableAgent, fn: Any) -> str:
    harness = agent.harness
    if harness is not None:
        return str(harness.ref)
    return getattr(fn, "__qualname__", None) or repr(fn)


async def run_agent(agent: RunnableAgent, fn: Any = None, *, timeout: float | None = None) -> AgentResult:
    """Run `fn(agent)` (default: the agent's harness function) and return its result; never raises but for
    cancellation. The result is also stored on the agent's record."""
    if fn is None:
        if agent.harness is None:
            raise ValueError(f"agent {agent.agent_id} has no harness to run")
        fn = agent.harness.fn
    record = agent.record
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    result: AgentResult
    try:
        try:
            # asyncio.timeout_at rather than wait_for: no extra task per run, and a TimeoutError the harness raises
            # itself stays a crash (only an expired deadline is a timeout).
            async with asyncio.timeout_at(deadline) as scope:
                value = await fn(agent)
        except TimeoutError as exc:
            if scope.expired():
                result = AgentResult(
                    AgentStatus.TIMEOUT,
                    error=f"Agent timed out after {timeout:g}s: the harness did not return within its time limit",
                )
            else:
                result = AgentResult(AgentStatus.ERROR, error=f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            result = AgentResult(AgentStatus.ERROR, error=f"{type(exc).__name__}: {exc}")
        else:
            if isinstance(value, AgentResult):
                result = value
            else:
                result = AgentResult(
                    AgentStatus.ERROR,
                    error=f"Harness {_harness_name(agent, fn)} returned {type(value).__name__}, not an AgentResult",
                )
        record.result = result
        if result.status is AgentStatus.TIMEOUT:
            # A harness that reports a timeout gets its children cancelled without waiting.
            await cancel_children(agent)
        else:
            await _wait_for_children(agent, deadline)
    except asyncio.CancelledError:
        record.result = AgentResult(AgentStatus.CANCELLED, error="Agent cancelled")
        # Unwind the children even though this task is being cancelled: their budgets and sessions must go.
        await asyncio.shield(cancel_children(agent))
        raise
    finally:
        agent.finished = True
        if record.ended is None:
            record.ended = time.perf_counter()
    return result


async def _wait_for_children(agent: RunnableAgent, deadline: float | None) -> None:
    """Wait for children still running, up to `deadline`; cancel the rest there."""
    loop = asyncio.get_running_loop()
    while True:
        # Yield first so spawns scheduled just before the harness returned register their children.
        await asyncio.sleep(0)
        pending = [task for task in agent.children if not task.done()]
        if not pending:
            return
        left = math.inf if deadline is None else deadline - loop.time()
        if left <= 0:
            await cancel_children(agent)
            return
        await asyncio.wait(pending, timeout=None if left == math.inf else left)


async def cancel_children(agent: RunnableAgent, grace: float = CHILD_GRACE_S) -> None:
    """Cancel the agent's running children and give them `grace` seconds to unwind."""
    pending = [task for task in agent.children if not task.done()]
    if not pending:
        return
    for task in pending:
        task.cancel()
    await asyncio.wait(pending, timeout=grace)
