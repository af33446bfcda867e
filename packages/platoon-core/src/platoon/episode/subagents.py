"""`ctx.agents`: launching subagents. Spawn never raises into the parent (except `TypeError` for
a TOML spec): rejections come back as `SubagentResult`s with empty ids and a `LaunchFailure` message.

A child's life cycle (reserve -> fork -> open -> run -> release -> grade -> close) runs as a task owned by the
parent, so a parent that returns early waits for it and a cancelled parent cancels it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from platoon.envs.service import ForkMode, Outcome
from platoon.episode.access import clamp_access
from platoon.episode.budget import AgentBudget, BudgetError, BudgetTracker, Reservation
from platoon.episode.outcomes import judge_run
from platoon.episode.runner import RunnableAgent, run_agent
from platoon.harness.agent import AgentStatus, SubagentResult, ToolAccess
from platoon.harness.function import FunctionHarness, record_of
from platoon.harness.registry import get_harness
from platoon.harness.spec import HarnessSpec, not_a_function_harness

if TYPE_CHECKING:
    from platoon.envs.service import EnvSession
    from platoon.gateway.records import AgentRecord
    from platoon.task import Task

__all__ = [
    "SESSION_CLOSE_TIMEOUT_S",
    "ParentAgent",
    "SharedEpisode",
    "Subagents",
    "resolve_function_harness",
    "resolve_harness",
]

#: How long closing a child's forked session may take before it is abandoned.
SESSION_CLOSE_TIMEOUT_S = 10.0
_LIMIT_TEXT = "Subagent did not finish before its step budget was exhausted."
_FAILED_TEXT = "Subagent failed before finishing."
_VERIFIER_UNAVAILABLE = "verifier grading is not available in this build yet"


class SharedEpisode(Protocol):
    """What launching a child reads of the episode its agents share (`platoon.episode.context.EpisodeState`)."""

    @property
    def gateway(self) -> Any: ...

    @property
    def rollout(self) -> Any: ...

    @property
    def tracker(self) -> BudgetTracker: ...

    @property
    def route(self) -> Any: ...

    @property
    def config(self) -> Any: ...

    @property
    def judges(self) -> bool: ...

    @property
    def agents_config(self) -> Any: ...


class ParentAgent(RunnableAgent, Protocol):
    """What launching a child uses of its parent: `platoon.episode.context.Agent`, which sits above this module
    (it builds its `Subagents`), so it is typed by this protocol rather than imported, even for type checking."""

    #: set by `keep_children()`: children outlive a cancelled spawn call
    keep: bool

    @property
    def episode(self) -> SharedEpisode: ...

    @property
    def task(self) -> Task: ...

    @property
    def session(self) -> EnvSession: ...

    @property
    def options(self) -> Mapping[str, Any]: ...

    @property
    def access(self) -> ToolAccess: ...

    @property
    def budget(self) -> AgentBudget: ...

    def new_child(
        self,
        record: AgentRecord,
        *,
        session: EnvSession,
        task: Task,
        harness: FunctionHarness,
        goal: str,
        options: Mapping[str, Any],
        budget: AgentBudget,
    ) -> ParentAgent: ...


def resolve_harness(harness: Any) -> FunctionHarness | HarnessSpec:
    """A `FunctionHarness` or a `HarnessSpec` from a record, a decorated function, a spec, a spec path or a ref."""
    record = record_of(harness, register_it=False)
    if record is not None:
        return record
    if isinstance(harness, HarnessSpec):
        return harness
    if isinstance(harness, str) or hasattr(harness, "__fspath__"):
        return get_harness(harness if isinstance(harness, str) else str(harness))
    raise TypeError(
        f"harness {harness!r} is not a harness (an @platoon.harness function, its record, a TOML spec or a ref)"
    )


def resolve_function_harness(harness: Any) -> FunctionHarness:
    """A `FunctionHarness` from a record, a decorated function or a reference; a TOML spec is a `TypeError`
    (a subagent runs function harnesses only)."""
    if (isinstance(harness, str) and harness.endswith(".toml")) or hasattr(harness, "__fspath__"):
        raise TypeError(not_a_function_harness(str(harness)))  # a spec path: refused without loading it
    found = resolve_harness(harness)
    if not isinstance(found, FunctionHarness):
        raise TypeError(not_a_function_harness(found.ref))
    return found


def _launch_failed(goal: str, why: str) -> SubagentResult:
    return SubagentResult.rejected(goal, f"Failed to launch subagent for goal {goal}: {why}")


def _anchor_counters(anchor: Any) -> dict[str, Any] | None:
    if anchor is None:
        return None
    counters: dict[str, Any] = anchor.step_misc.setdefault("reward_misc", {})
    return counters


class Subagents:
    """The `AgentAPI` of one agent: `spawn` and `keep_children`."""

    __slots__ = ("_agent",)

    def __init__(self, agent: ParentAgent) -> None:
        self._agent = agent

    def keep_children(self) -> None:
        """Children keep running when their spawn call is cancelled; the agent waits for them at its end."""
        self._agent.keep = True

    async def spawn(
        self,
        goal: str,
        *,
        harness: Any = None,
        max_steps: int | None = None,
        fork: ForkMode | str | None = None,
        access: ToolAccess | str | None = None,
        role: str = "subagent",
        options: Mapping[str, Any] | None = None,
        task_misc: Mapping[str, Any] | None = None,
    ) -> SubagentResult:
        """Run a child on `goal` and return its result (see `AgentAPI.spawn`)."""
        parent = self._agent
        episode = parent.episode
        settings = episode.agents_config
        goal = str(goal)
        # 1. Immediate rejections: nothing is opened.
        if parent.finished:
            return _launch_failed(goal, "the parent agent has already finished.")
        if getattr(episode.gateway, "is_shut_down", False):
            return _launch_failed(goal, "the model gateway is shutting down.")
        if max_steps is not None and (
            isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1
        ):
            return _launch_failed(goal, f"max_steps must be a positive integer; got {max_steps!r}.")
        # 2. Harness and options (a TOML spec raises TypeError into the caller: a programming error).
        if harness is None:
            child_harness = parent.harness
            child_options = parent.options if options is None else options
        else:
            try:
                child_harness = resolve_function_harness(harness)
            except TypeError:
                raise
            except Exception as exc:  # an unknown name is the model's mistake, not the harness's crash
                return _launch_failed(goal, f"the harness could not be found ({exc}).")
            same = parent.harness is not None and child_harness.ref == parent.harness.ref
            child_options = options if options is not None else (parent.options if same else {})
        if child_harness is None:
            return _launch_failed(goal, "the parent has no harness to give it.")
        # 3. Budget and access.
        steps = settings.child_max_steps if max_steps is None else max_steps
        try:
            child_access = clamp_access(access or settings.child_access, parent.access)
        except ValueError:
            return _launch_failed(goal, f"unknown tool access {access!r}.")
        mode = fork or settings.fork
        if mode is not None:
            try:
                mode = ForkMode(mode)
            except ValueError:
                return _launch_failed(goal, f"unknown fork mode {mode!r}.")
        # Reserve now, synchronously, so concurrent spawns see each other's holds and a spawn that is never
        # awaited to completion still registers its child before the parent's end-of-run wait.
        try:
            reservation = episode.tracker.reserve(parent.budget, steps)
        except BudgetError as exc:
            return SubagentResult.rejected(
                goal, f"Not enough budget to launch subagent for goal {goal}. {exc} {exc.guidance}"
            )
        # 4. The child's task; 5. the anchor is the parent's last recorded call now.
        child_task = parent.task.fork(goal, steps, None if task_misc is None else dict(task_misc))
        anchor = parent.record.last_call()
        life = asyncio.create_task(
            _child_life(
                parent,
                goal=goal,
                harness=child_harness,
                options=child_options,
                max_steps=steps,
                access=child_access,
                role=role,
                mode=mode,
                task=child_task,
                reservation=reservation,
                anchor=anchor,
            ),
            name=f"platoon-subagent:{goal[:40]}",
        )
        parent.children.add(life)
        life.add_done_callback(parent.children.discard)
        try:
            # Shielded so that keep_children() (called before or after this spawn) can let the child run on.
            return await asyncio.shield(life)
        except asyncio.CancelledError:
            if not parent.keep:
                life.cancel()
            raise
        except Exception as exc:  # a runtime bug: still never raised into the parent's harness
            return _launch_failed(goal, f"the subagent runtime failed ({type(exc).__name__}: {exc}).")


async def _child_life(
    parent: ParentAgent,
    *,
    goal: str,
    harness: FunctionHarness,
    options: Mapping[str, Any],
    max_steps: int,
    access: ToolAccess,
    role: str,
    mode: ForkMode | None,
    task: Any,
    reservation: Reservation,
    anchor: Any,
) -> SubagentResult:
    episode = parent.episode
    tracker = episode.tracker
    settings = episode.agents_config
    session = None
    try:
        # 6. Fork the session: spawn's mode, else agents.fork, else the session's default.
        try:
            if mode is None:
                session = await parent.session.fork(task=task)
            else:
                session = await parent.session.fork(mode, task=task)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return _launch_failed(goal, f"the environment could not be forked ({type(exc).__name__}: {exc}).")
        try:
            record = episode.gateway.open_agent(
                episode.rollout,
                parent=parent.record,
                role=role,
                goal=goal,
                task=task,
                max_steps=max_steps,
                access=access.value,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # e.g. the gateway began shutting down while the session forked
            return _launch_failed(goal, f"the model gateway refused a new agent ({exc}).")
        child = parent.new_child(
            record,
            session=session,
            task=task,
            harness=harness,
            goal=goal,
            options=options,
            budget=tracker.add_agent(
                record.agent_id,
                max_steps=max_steps,
                steps=lambda: record.policy_calls,
                parent=parent.budget,
            ),
        )
        # Verifier children grade; they are not delegation, so they never count on the anchor.
        counters = None if role == "verifier" else _anchor_counters(anchor)
        if counters is not None:
            counters["reward/subagent_launched"] = counters.get("reward/subagent_launched", 0) + 1
        try:
            timeout = settings.child_timeout_s
            result = await run_agent(child, timeout=timeout)
        except asyncio.CancelledError:
            record.outcome = Outcome("cancelled", reason="agent_cancelled")
            raise
        finally:
            tracker.release(reservation)  # synchronously, before any cleanup await
        # 7. Grade.
        record.outcome = Outcome("cancelled", reason="grading_cancelled")
        outcome = await judge_run(
            result,
            record,
            _child_grader(child, session),
            on_harness_exit=episode.route.on_harness_exit,
            on_context_overflow=episode.route.on_context_overflow,
        )
        record.outcome = outcome
        # 8. Success stats on the anchor step.
        if counters is not None:
            reward = 0.0 if outcome is None or outcome.reward is None else outcome.reward
            counters["reward/subagent_succeeded"] = counters.get("reward/subagent_succeeded", 0) + reward
        # 9. The message the parent reads.
        message = result.final_message
        if message is None:
            if result.status is AgentStatus.LIMIT:
                message = _LIMIT_TEXT
            elif result.status is not AgentStatus.COMPLETED:
                message = _FAILED_TEXT
            else:
                message = ""
        return SubagentResult(
            agent_id=record.agent_id,
            trajectory_id=record.trajectory_id,
            goal=goal,
            result=result,
            outcome=outcome,
            message=message,
        )
    finally:
        tracker.release(reservation)
        if session is not None and session is not parent.session:
            await _close_quietly(session)


def _child_grader(child: ParentAgent, session: Any) -> Any:
    """The grader `agents.child_grading` asks for, or None when the child shares the episode outcome."""
    episode = child.episode
    grading = episode.agents_config.child_grading
    if grading == "env":
        return session.grade
    if grading == "verifier":
        child.record.misc["verifier_skipped"] = _verifier_skip_reason(child)
    return None


def _verifier_skip_reason(child: ParentAgent) -> str:
    episode = child.episode
    verifier = episode.agents_config.verifier
    if not episode.judges:
        return "judges are off for this rollout"
    if episode.config is not None and not getattr(episode.config, "enable_subagent_verifiers", True):
        return "subagent verifiers are disabled for this rollout (enable_subagent_verifiers: false)"
    if not verifier.enabled:
        return "verifiers are disabled for this environment (agents.verifier.enabled: false)"
    return _VERIFIER_UNAVAILABLE


async def _close_quietly(session: Any) -> None:
    """Close a forked session within the close timeout; a failure to close never reaches the parent."""
    try:
        await asyncio.wait_for(asyncio.shield(session.close()), SESSION_CLOSE_TIMEOUT_S)
    except asyncio.CancelledError:
        raise
    except Exception:  # best effort: the session's own teardown reports its problems
        pass
