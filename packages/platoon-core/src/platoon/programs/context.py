"""`EpisodeContext`: what an episode program receives, `async def program(ep: EpisodeContext) -> Outcome`.

A protocol only (standard library); the episode runtime implements it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from platoon.envs.service import EnvSession, Outcome
    from platoon.harness.agent import AgentResult, ModelEndpoint
    from platoon.task import Task
    from platoon.trajectory import TrajectoryCollection

__all__ = ["EpisodeContext", "Finalizer"]

#: A finalizer: called with the built collection, sync or async; its return value is ignored.
Finalizer = Callable[["TrajectoryCollection"], Any]


@runtime_checkable
class EpisodeContext(Protocol):
    """One episode as its program sees it: run the root agent, grade, add finalizers.

    A program that raises, or returns something that is not an `Outcome`, yields an infra outcome with
    failure_kind `unexpected:<ExcType>`; a finalizer that raises turns it into `finalizer:<ExcType>`.
    """

    @property
    def task(self) -> Task:
        """The episode's task."""
        ...

    @property
    def session(self) -> EnvSession:
        """The root's environment session."""
        ...

    @property
    def config(self) -> Any:
        """The rollout's `RolloutConfig`."""
        ...

    @property
    def route(self) -> Any:
        """The entry's route: harness, program, harness options and `agents` settings."""
        ...

    @property
    def root(self) -> Any:
        """The root agent's record: `misc`, `result` (its `AgentResult`, once run) and `calls`."""
        ...

    #: A judge of the root's behaviour, used when grading; settable before `run`.
    behavior_judge: Any
    #: A transform applied to the root's tool list and calls; settable before `run`.
    tool_transform: Any

    @property
    def judges(self) -> bool:
        """Whether this rollout's judges run."""
        ...

    async def run(
        self,
        harness: Any = None,
        *,
        goal: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> AgentResult:
        """Run the root agent once (a second call raises `RuntimeError` "runs once per episode").

        `harness` defaults to the route's and must be a function harness (`TypeError` for a TOML spec,
        `ValueError` when there is none); `goal` defaults to the instruction and `options` to the route's. The
        time limit is min(the rollout `timeout`, the session's `agent_timeout_s`).
        """
        ...

    async def grade(self) -> Outcome:
        """The episode outcome: the root run's failure taxonomy, else the session's grade.

        Fails closed: a grader that raises gives an `error` outcome.
        """
        ...

    def judge_endpoint(self) -> ModelEndpoint:
        """A lazily opened `judge`-role agent under the root (recorded for audit, never trained).

        Refused while judges are off.
        """
        ...

    def add_finalizer(self, fn: Finalizer) -> None:
        """Run `fn(TrajectoryCollection)` after the collection is built, in the order added (twice = once)."""
        ...

    def snapshot(self) -> TrajectoryCollection:
        """The agent tree so far, read-only; agents without an outcome get a placeholder (scored 0, `snapshot`)."""
        ...
