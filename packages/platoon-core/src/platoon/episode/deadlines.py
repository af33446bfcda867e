"""Step deadlines: `rollout_config.step_timeout` bounds every environment call of a rollout's agent steps — each
tool call and the session's grading. A call that runs past it ends the rollout as the untrainable outcome `timeout`
(failure kind `step_timeout`), never a reward of 0. Model calls have their own bound (the sample timeout).

An environment that states its own limits (a Harbor task's agent timeout, its service's rollout overhead, which
holds the verifier's timeout) keeps them: the step deadline is then the largest of those and `step_timeout`, so it
only catches what the environment's own limits did not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from platoon import rollout_progress
from platoon.envs.service import Outcome

__all__ = [
    "STEP_TIMEOUT_KIND",
    "StepDeadline",
    "StepDeadlineSession",
    "StepTimeoutError",
    "step_deadline_for",
]

STEP_TIMEOUT_KIND = "step_timeout"

_T = TypeVar("_T")


class StepTimeoutError(Exception):
    """An environment call ran past `rollout_config.step_timeout`: the rollout is over (raised into the harness,
    which may catch it; the rollout's outcome is the timeout whatever the harness does next)."""


class StepDeadline:
    """One rollout's step deadline, shared by its session and every session forked from it."""

    def __init__(self, seconds: float, setting: str = "rollout_config.step_timeout") -> None:
        self.seconds = float(seconds)
        #: what set the deadline, as the timeout's reason names it
        self.setting = setting
        #: the rollout's outcome once a call ran past the deadline; None while none has
        self.expired: Outcome | None = None

    async def bound(self, what: str, call: Awaitable[_T]) -> _T:
        """Await `call`, at most `seconds`; past that (or once an earlier call expired) raise StepTimeoutError."""
        if self.expired is not None:
            if asyncio.iscoroutine(call):
                call.close()  # never started: no "was never awaited" warning
            raise StepTimeoutError(self.expired.reason)
        try:
            with rollout_progress.bounded_wait(self.seconds):
                async with asyncio.timeout(self.seconds) as scope:
                    return await call
        except TimeoutError:
            if not scope.expired():
                raise  # the environment's own TimeoutError: its failure, not this deadline
        reason = f"{what} did not return within {self.setting} ({self.seconds:g} s)"
        self.expired = Outcome.infra(STEP_TIMEOUT_KIND, status="timeout", reason=reason)
        raise StepTimeoutError(reason)


async def step_deadline_for(
    step_timeout: float | None, service: Any, session: Any, task_id: str | None
) -> StepDeadline | None:
    """The step deadline of one rollout: None without `step_timeout`; else the largest of it and the limits the
    environment states for the task (`session.agent_timeout_s`, `service.rollout_overhead_s(task_id)`)."""
    if step_timeout is None:
        return None
    limits = [float(step_timeout)]
    own = getattr(session, "agent_timeout_s", None)
    try:
        overhead = getattr(service, "rollout_overhead_s", None)
        stated = [own, overhead(task_id) if callable(overhead) and task_id is not None else None]
        for value in stated:
            if asyncio.iscoroutine(value):
                value = await value
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                limits.append(float(value))
    except Exception:  # an environment's own limit is advice: without it, step_timeout alone
        pass
    if max(limits) == limits[0]:
        return StepDeadline(limits[0])
    return StepDeadline(max(limits), "the environment's own time limit (above rollout_config.step_timeout)")


class StepDeadlineSession:
    """An environment session whose tool calls and grading each end within the rollout's step deadline; every
    other member is the wrapped session's."""

    def __init__(self, session: Any, deadline: StepDeadline) -> None:
        self._session = session
        self.step_deadline = deadline

    def __getattr__(self, name: str) -> Any:
        if name == "_session":  # not set yet (a copy being made): no endless lookup
            raise AttributeError(name)
        return getattr(self._session, name)

    async def call_tool(self, name: str, arguments: Mapping[str, Any], **kwargs: Any) -> Any:
        return await self.step_deadline.bound(
            f"tool {name!r}", self._session.call_tool(name, arguments, **kwargs)
        )

    async def grade(self) -> Outcome:
        """The session's grade; the timeout outcome when grading (or an earlier call) ran past the deadline."""
        try:
            outcome: Outcome = await self.step_deadline.bound("grading", self._session.grade())
        except StepTimeoutError:
            assert self.step_deadline.expired is not None
            return self.step_deadline.expired
        return outcome

    async def fork(self, *args: Any, **kwargs: Any) -> StepDeadlineSession:
        return StepDeadlineSession(await self._session.fork(*args, **kwargs), self.step_deadline)
