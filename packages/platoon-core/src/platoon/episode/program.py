"""The concrete `EpisodeContext` an episode program receives, and running a program and its
finalizers with the failure semantics: a program that raises or returns a non-Outcome gives an infra outcome
`unexpected:<ExcType>`; a finalizer that raises gives `finalizer:<ExcType>` and the collection is rebuilt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from platoon.envs.service import Outcome
from platoon.episode.budget import BudgetTracker
from platoon.episode.context import Agent, EndpointUnavailable, EpisodeState
from platoon.episode.outcomes import graded_with_reason, judge_run
from platoon.episode.runner import run_agent
from platoon.episode.spec_runs import open_spec_rollout, run_spec
from platoon.episode.subagents import resolve_harness
from platoon.gateway.trace import build_collection as build
from platoon.harness.agent import AgentStatus
from platoon.harness.function import FunctionHarness

if TYPE_CHECKING:
    from platoon.envs.service import EnvSession
    from platoon.episode.spec_runs import SpecRollout
    from platoon.harness.agent import AgentResult, ModelEndpoint
    from platoon.harness.spec import HarnessSpec
    from platoon.programs.context import Finalizer
    from platoon.task import Task
    from platoon.trajectory import TrajectoryCollection

__all__ = ["Episode", "build_collection", "run_finalizers", "run_program"]

#: The outcome `snapshot()` gives agents that have none yet.
_SNAPSHOT_OUTCOME = Outcome("scored", rewards={"reward": 0.0}, reason="snapshot")


def build_collection(rollout: Any, outcome: Outcome) -> TrajectoryCollection:
    """The rollout's trajectories (the gateway's trace builder)."""
    return build(rollout, episode_outcome=outcome)


#: A function harness's deadline when neither `rollout_config.timeout` nor the session states one: the 24 h a rollout
#: worker allows a rollout with no limit (`worker_unbounded_rollout_budget_seconds`), so that no rollout runs
#: forever, in process or not. Each model call and tool call has its own, shorter bound besides.
UNBOUNDED_ROLLOUT_DEADLINE_S = 24 * 3600.0


def _min_timeout(*limits: Any) -> float | None:
    present = [float(limit) for limit in limits if limit is not None]
    return min(present) if present else None


class Episode:
    """One episode as its program sees it: implements `EpisodeContext` over the episode's state.

    The root agent's gateway record is opened here, so every rollout has a root trajectory even when the
    program never runs it.
    """

    def __init__(
        self,
        *,
        task: Task,
        session: EnvSession,
        config: Any,
        route: Any,
        gateway: Any,
        rollout: Any,
        spec_rollout: SpecRollout | None = None,
        logs_dir: Any = None,
        route_harness: FunctionHarness | HarnessSpec | None = None,
    ) -> None:
        agents = route.agents
        self._task = task
        self._session = session
        self._config = config
        self._route = route
        self.state = EpisodeState(
            gateway=gateway,
            rollout=rollout,
            tracker=BudgetTracker(agents.budget, agents.max_depth),
            route=route,
            config=config,
        )
        instruction = getattr(session, "instruction", None) or task.goal
        # The root's budget: rollout_config.max_steps overrides the task's (only task-table rows carry one).
        config_steps = getattr(config, "max_steps", None)
        max_steps = task.max_steps if config_steps is None else config_steps
        if max_steps != task.max_steps:
            # Shallow: the prompt text (`str(task)`) must state the budget the agent really has.
            task = dataclasses.replace(task, max_steps=max_steps)
            self._task = task
        self.root_record = gateway.open_agent(
            rollout, role="policy", goal=instruction, task=task, max_steps=max_steps
        )
        self._finalizers: list[Finalizer] = []
        self._ran = False
        self._result: AgentResult | None = None
        self.root_agent: Agent | None = None
        #: the harness `run` used (or would use): recorded as the root's misc `harness`
        self.harness: FunctionHarness | HarnessSpec | None = None
        #: the spec runner's handle when the root runs a TOML spec (prepared before the session opened, or here)
        self.spec_rollout = spec_rollout
        self._logs_dir = logs_dir
        #: the route's harness as the rollout resolved it (None: not resolved), so `run` need not look it up again
        self._route_harness = route_harness
        #: the infra outcome of a spec run whose runner failed (setup, spec, unexpected): it decides the grade
        self._spec_failure: Outcome | None = None
        self.behavior_judge: Any = None
        self.tool_transform: Any = None

    def release(self) -> None:
        """Break the episode's reference cycles once it has ended (`EpisodeState.release`)."""
        self.state.release()

    # ---- EpisodeContext members

    @property
    def task(self) -> Task:
        return self._task

    @property
    def session(self) -> EnvSession:
        return self._session

    @property
    def config(self) -> Any:
        return self._config

    @property
    def route(self) -> Any:
        return self._route

    @property
    def root(self) -> Any:
        return self.root_record

    @property
    def judges(self) -> bool:
        return self.state.judges

    @property
    def result(self) -> AgentResult | None:
        """The root run's result, once `run` returned."""
        return self._result

    async def run(
        self,
        harness: Any = None,
        *,
        goal: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> AgentResult:
        """Run the root agent once under min(rollout timeout, session agent_timeout_s); a function harness with
        neither runs under `UNBOUNDED_ROLLOUT_DEADLINE_S` (a spec harness under its runner's own limit)."""
        if self._ran:
            raise RuntimeError("EpisodeContext.run runs once per episode: the root agent already ran")
        chosen = harness if harness is not None else self._route.harness
        if chosen is None:
            raise ValueError("no harness to run: the environment entry names none and run() was given none")
        # the route's own harness was resolved when the rollout began (a registry lookup through the plugins)
        record = (
            self._route_harness
            if harness is None and self._route_harness is not None
            else resolve_harness(chosen)
        )
        self._ran = True
        self.harness = record
        root = self.root_record
        if goal is not None:
            root.goal = goal

        self.root_agent = Agent(
            self.state,
            root,
            session=self._session,
            task=self._task,
            harness=record if isinstance(record, FunctionHarness) else None,
            goal=goal,
            options=self._route.harness_options if options is None else options,
            budget=self.state.tracker.add_agent(
                root.agent_id, max_steps=root.max_steps, steps=lambda: root.policy_calls
            ),
            tool_transform=self.tool_transform,
        )
        timeout = _min_timeout(
            getattr(self._config, "timeout", None), getattr(self._session, "agent_timeout_s", None)
        )
        if isinstance(record, FunctionHarness):
            if timeout is None:
                timeout = UNBOUNDED_ROLLOUT_DEADLINE_S
            self._result = await run_agent(self.root_agent, timeout=timeout)
        else:
            self._result = await self._run_spec(record, self.root_agent, timeout)
        return self._result

    async def _run_spec(self, spec: HarnessSpec, agent: Agent, timeout: float | None) -> AgentResult:
        """Run the root on a TOML spec through the spec runner; the runner enforces the deadline itself (it kills
        the agent's processes and answers `timeout`), so the run wrapper gets no timeout of its own."""
        handle = self.spec_rollout
        if handle is None or getattr(handle, "spec", spec) != spec:
            # `ep.run(harness=...)` naming a spec the rollout did not prepare: no session needs, the rest works.
            handle = open_spec_rollout(
                spec,
                gateway=self.state.gateway,
                rollout=self.state.rollout,
                route=self._route,
                logs_dir=self._logs_dir,
            )
            self.spec_rollout = handle

        async def launch(running: Agent) -> AgentResult:
            result, failure = await run_spec(handle, running, options=running.options, timeout=timeout)
            self._spec_failure = failure
            return result

        return await run_agent(agent, launch, timeout=None)

    @property
    def spec_misc(self) -> dict[str, Any] | None:
        """The spec runner's record of the root's run (placement, exit code, timed out, logs path), if a spec ran."""
        handle = self.spec_rollout
        return None if handle is None else dict(handle.misc)

    async def grade(self) -> Outcome:
        """The root run's failure taxonomy, else the session's grade; never raises (fails closed).

        A spec run adds its own rules first: a failure of the runner itself is its infra outcome, and a run that
        completed after the gateway-enforced budget sent a stop reply is graded with reason `budget`.
        """
        if self._spec_failure is not None:
            return self._spec_failure
        outcome = await judge_run(
            self._result,
            self.root_record,
            self._session.grade,
            on_harness_exit=self._route.on_harness_exit,
            on_context_overflow=self._route.on_context_overflow,
        )
        assert outcome is not None  # a grader was given, so judge_run always answers
        result = self._result
        budget = self.root_record.misc.get("budget")
        if (
            self.spec_rollout is not None
            and result is not None
            and result.status is AgentStatus.COMPLETED
            and isinstance(budget, dict)
            and budget.get("enforce") == "gateway"
            and int(budget.get("stops") or 0) > 0
        ):
            outcome = graded_with_reason(outcome, "budget")
        return outcome

    def judge_endpoint(self) -> ModelEndpoint:
        """Refused while judges are off; otherwise needs the gateway's HTTP server, which this build lacks."""
        if not self.judges:
            raise RuntimeError("judges are off for this rollout (judges: false): no judge endpoint")

        raise EndpointUnavailable(
            "judge_endpoint() needs the gateway's HTTP server, which this build does not run yet"
        )

    def add_finalizer(self, fn: Finalizer) -> None:
        """Run `fn(collection)` after the collection is built, in the order added; adding twice is a no-op."""
        if not callable(fn):
            raise TypeError(f"a finalizer must be callable; got {type(fn).__name__}")
        if fn not in self._finalizers:
            self._finalizers.append(fn)

    @property
    def finalizers(self) -> list[Finalizer]:
        return list(self._finalizers)

    def snapshot(self) -> TrajectoryCollection:
        """The agent tree so far; agents without an outcome get a placeholder (scored 0, reason `snapshot`)."""
        return build_collection(self.state.rollout, _SNAPSHOT_OUTCOME)


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


async def run_program(program: Any, episode: Episode) -> Outcome:
    """Run an episode program (an `EpisodeProgram` record or a callable); never raises but for cancellation."""
    fn: Callable[..., Any] = getattr(program, "fn", program)
    name = getattr(program, "ref", None) or _name(fn)
    try:
        value = fn(episode)
        if inspect.isawaitable(value):
            value = await value
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return Outcome.infra(f"unexpected:{type(exc).__name__}", reason=f"program {name}: {exc}")
    if not isinstance(value, Outcome):
        return Outcome.infra(
            "unexpected:TypeError",
            reason=f"program {name}: returned {type(value).__name__}, not an Outcome",
        )
    return value


async def run_finalizers(
    finalizers: list[Finalizer],
    collection: TrajectoryCollection,
    rebuild: Callable[[Outcome], TrajectoryCollection],
) -> tuple[TrajectoryCollection, Outcome | None]:
    """Run the finalizers in order; the first that raises stops them, and the collection is rebuilt with an infra
    outcome `finalizer:<ExcType>` (returned as the second item; None when all ran)."""
    for fn in finalizers:
        try:
            value = fn(collection)
            if inspect.isawaitable(value):
                await value
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            outcome = Outcome.infra(f"finalizer:{type(exc).__name__}", reason=f"finalizer {_name(fn)}: {exc}")
            return rebuild(outcome), outcome
    return collection, None
