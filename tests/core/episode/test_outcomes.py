"""The failure taxonomy table and grading that never raises."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from platoon.config.environments import HarnessExitPolicy
from platoon.envs.service import Outcome
from platoon.episode.outcomes import classify, graded_with_reason, judge_run, safe_grade
from platoon.harness.agent import AgentResult

SCORED = Outcome("scored", rewards={"reward": 1.0}, reason="tests passed")


def record(overflows: int = 0, gateway_errors: int = 0) -> Any:
    return SimpleNamespace(context_overflows=overflows, gateway_errors=gateway_errors)


async def grader() -> Outcome:
    return SCORED


def judge(result: AgentResult, rec: Any = None, **policy: Any) -> Outcome | None:
    return asyncio.run(judge_run(result, rec or record(), grader, **policy))


@pytest.mark.parametrize(
    ("status", "exit_policy", "overflow", "expected"),
    [
        ("completed", None, "grade", ("scored", "tests passed", None)),
        ("limit", None, "grade", ("scored", "tests passed", None)),
        ("cancelled", "grade", "grade", ("cancelled", "agent_cancelled", None)),
        ("timeout", None, "grade", ("timeout", "agent_timeout", None)),
        ("timeout", {"timeout": "grade"}, "grade", ("scored", "agent_timeout", None)),
        ("error", None, "grade", ("error", "KeyError: 'x'", "harness_crash")),
        ("error", "grade", "grade", ("scored", "harness_crash", None)),
        ("error", {"crash": "grade_if_gateway_clean"}, "grade", ("scored", "harness_crash", None)),
    ],
)
def test_the_taxonomy_table(status: str, exit_policy: Any, overflow: str, expected: tuple[Any, ...]):
    if isinstance(exit_policy, dict):
        exit_policy = HarnessExitPolicy(**exit_policy)
    outcome = judge(
        AgentResult(status, error="KeyError: 'x'" if status == "error" else None),
        on_harness_exit=exit_policy,
        on_context_overflow=overflow,
    )
    assert outcome is not None
    assert (outcome.status, outcome.reason, outcome.failure_kind) == expected
    if outcome.status == "scored" and outcome.reason != "tests passed":
        assert outcome.metadata["grade_reason"] == "tests passed"
    assert not outcome.trainable or outcome.reward == 1.0


def test_a_crash_after_a_context_overflow_is_graded_unless_excluded():
    crashed = AgentResult("error", error="ContextWindowExceeded: too long")
    graded = judge(crashed, record(overflows=1))
    assert graded.status == "scored" and graded.reason == "context_overflow"
    excluded = judge(crashed, record(overflows=1), on_context_overflow="exclude")
    assert excluded.status == "error" and excluded.failure_kind == "context_overflow"


def test_grade_if_gateway_clean_excludes_a_crash_after_a_gateway_failure():
    policy = HarnessExitPolicy(crash="grade_if_gateway_clean")
    outcome = judge(AgentResult("error", error="boom"), record(gateway_errors=1), on_harness_exit=policy)
    assert outcome.status == "error" and outcome.failure_kind == "harness_crash_gateway"


def test_the_shorthand_string_sets_both_fields():
    assert classify(AgentResult("timeout"), record(), on_harness_exit="grade").reason == "agent_timeout"
    assert classify(AgentResult("error"), record(), on_harness_exit="grade").reason == "harness_crash"


def test_without_a_grader_a_gradable_run_shares_the_episode_outcome():
    assert asyncio.run(judge_run(AgentResult(), record(), None)) is None
    crashed = asyncio.run(judge_run(AgentResult("error", error="x"), record(), None))
    assert crashed.failure_kind == "harness_crash"


def test_graded_with_reason_keeps_the_graders_reason_and_leaves_untrainable_outcomes_alone():
    replaced = graded_with_reason(SCORED, "agent_timeout")
    assert replaced.reason == "agent_timeout" and replaced.metadata == {"grade_reason": "tests passed"}
    assert SCORED.reason == "tests passed" and SCORED.metadata == {}  # not mutated
    failed = Outcome.infra("env_error", reason="gone")
    assert graded_with_reason(failed, "agent_timeout") is failed


def test_grading_never_raises():
    async def raising() -> Outcome:
        raise ConnectionError("sandbox died")

    async def wrong() -> Any:
        return 1.0

    outcome = asyncio.run(safe_grade(raising))
    assert outcome.status == "error" and outcome.failure_kind == "unexpected:ConnectionError"
    assert outcome.reason == "grader raised ConnectionError: sandbox died" and not outcome.trainable
    outcome = asyncio.run(safe_grade(wrong))
    assert outcome.failure_kind == "unexpected:TypeError"
    assert outcome.reason == "grader returned float, not an Outcome"


def test_a_raising_grader_stays_untrainable_even_when_graded_with_a_reason():
    async def raising() -> Outcome:
        raise RuntimeError("x")

    outcome = asyncio.run(judge_run(AgentResult("timeout"), record(), raising, on_harness_exit="grade"))
    assert outcome.status == "error" and outcome.failure_kind == "unexpected:RuntimeError"
