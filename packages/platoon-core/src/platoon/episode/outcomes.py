"""The failure taxonomy: what a harness run's result means for grading, and
grading that never raises. Failures are not zeros: timeouts, crashes and cancellations become untrainable
outcomes, and a grader that raises is an infra error.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# infra_from_exception lives beside Outcome (plugins' sessions use it); named here as before
from platoon.envs.service import REASON_LIMIT, Outcome, infra_from_exception
from platoon.harness.agent import AgentResult, AgentStatus

__all__ = [
    "Verdict",
    "classify",
    "graded_with_reason",
    "judge_run",
    "safe_grade",
]


@dataclass(frozen=True)
class Verdict:
    """What the taxonomy decided: an untrainable `outcome` without grading, or grade (with `reason`, if set)."""

    outcome: Outcome | None = None
    reason: str | None = None

    @property
    def grade(self) -> bool:
        return self.outcome is None


_GRADE = Verdict()


def _setting(policy: Any, name: str, default: str) -> str:
    if policy is None:
        return default
    if isinstance(policy, str):  # the `grade` / `exclude` shorthand for both fields
        return policy
    value = policy.get(name) if isinstance(policy, dict) else getattr(policy, name, None)
    return str(value) if value is not None else default


def _short(text: str | None) -> str | None:
    if text is None or len(text) <= REASON_LIMIT:
        return text
    return text[: REASON_LIMIT - 3] + "..."


def classify(
    result: AgentResult | None,
    record: Any = None,
    *,
    on_harness_exit: Any = None,
    on_context_overflow: str = "grade",
) -> Verdict:
    """Apply the failure taxonomy to a run's result.

    `record` is the agent's gateway record (its `context_overflows` and `gateway_errors` counters decide an
    overflow crash and `grade_if_gateway_clean`); `on_harness_exit` is a `HarnessExitPolicy`, a mapping or the
    shorthand string.
    """
    if result is None:
        return _GRADE
    status = result.status
    if status in (AgentStatus.COMPLETED, AgentStatus.LIMIT):
        return _GRADE
    if status is AgentStatus.CANCELLED:
        return Verdict(Outcome("cancelled", reason="agent_cancelled"))
    if status is AgentStatus.TIMEOUT:
        if _setting(on_harness_exit, "timeout", "exclude") == "grade":
            return Verdict(reason="agent_timeout")
        return Verdict(Outcome("timeout", reason="agent_timeout"))
    # status error
    if record is not None and getattr(record, "context_overflows", 0) > 0:
        if on_context_overflow == "exclude":
            return Verdict(Outcome.infra("context_overflow", reason=_short(result.error)))
        return Verdict(reason="context_overflow")
    crash = _setting(on_harness_exit, "crash", "exclude")
    if crash == "grade":
        return Verdict(reason="harness_crash")
    if crash == "grade_if_gateway_clean":
        if record is not None and getattr(record, "gateway_errors", 0) > 0:
            return Verdict(Outcome.infra("harness_crash_gateway", reason=_short(result.error)))
        return Verdict(reason="harness_crash")
    return Verdict(Outcome.infra("harness_crash", reason=_short(result.error)))


def graded_with_reason(outcome: Outcome, reason: str | None) -> Outcome:
    """ "Graded with reason R": a scored outcome reports R and keeps the grader's reason in `metadata.grade_reason`."""
    if reason is None or outcome.status != "scored":
        return outcome
    metadata = dict(outcome.metadata)
    if outcome.reason is not None:
        metadata["grade_reason"] = outcome.reason
    return dataclasses.replace(outcome, reason=reason, metadata=metadata)


async def safe_grade(grader: Callable[[], Awaitable[Any]], *, what: str = "grader") -> Outcome:
    """Await `grader()`; an exception becomes infra (`infra_from_exception`), a non-Outcome answer infra
    `unexpected:TypeError` (never raises,
    except for cancellation, which propagates)."""
    try:
        outcome = await grader()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return infra_from_exception(exc, what=what)
    if not isinstance(outcome, Outcome):
        return Outcome.infra(
            "unexpected:TypeError",
            reason=f"{what} returned {type(outcome).__name__}, not an Outcome",
        )
    return outcome


async def judge_run(
    result: AgentResult | None,
    record: Any,
    grader: Callable[[], Awaitable[Any]] | None,
    *,
    on_harness_exit: Any = None,
    on_context_overflow: str = "grade",
) -> Outcome | None:
    """The outcome of a finished run: the taxonomy's untrainable outcome, else `grader()`'s (with the taxonomy's
    reason). With no grader (a child that shares the episode outcome) a gradable run gives None."""
    verdict = classify(
        result, record, on_harness_exit=on_harness_exit, on_context_overflow=on_context_overflow
    )
    if verdict.outcome is not None:
        return verdict.outcome
    if grader is None:
        return None
    return graded_with_reason(await safe_grade(grader), verdict.reason)
