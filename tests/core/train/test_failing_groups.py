"""`platoon train` whose groups all fail for one cause, on the embedded local server with the real Tinker SDK: the
start stops with exit 1 and that cause in one line (after 3 such steps in a row, or at its end when it trained
nothing), never "no scored rollout (no update)" step after step and exit 0. What trained before is kept, and the
same command resumes once the cause is fixed."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.harness.agent import AgentResult
from platoon.harness.function import harness

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"

SCORING = textwrap.dedent(
    """
    def strict(trajectory):
        return trajectory["score"], {}  # a key trajectories do not have: raises KeyError every time


    def bonus(trajectory):
        return float(trajectory["reward"]) + 0.25, {"reward/bonus": 0.25}
    """
)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site profile whose cache (the local server's checkpoints) is in the test's directory; returns log_path.
    The reward processors of this file import as `failing_groups_scoring:...`."""
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    (tmp_path / "failing_groups_scoring.py").write_text(SCORING)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "logs"


def _bandit(log_path: Path, *overrides: str) -> list[str]:
    """The bandit cut down to seconds a step: 2 tasks of 4 rollouts, steps one after the other."""
    return [
        "train",
        str(BANDIT),
        f"log_path={log_path}",
        "train.batch_size=2",
        "train.workflow_config.group_size=4",
        "train.max_staleness=0",
        *overrides,
    ]


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _said(err: str) -> list[str]:
    """The lines a start says about its steps and its end."""
    return [
        line for line in err.splitlines() if line.startswith(("platoon: step ", "platoon: training stopped"))
    ]


STRICT_CAUSE = "reward processor 'failing_groups_scoring:strict' raised KeyError: 'score'"


@pytest.mark.slow
@pytest.mark.guarantee(
    "Every group fails for one cause (a reward processor that raises)",
    "bandit, training",
    "each step's line names the cause; after 3 such steps in a row the run stops with one line, exit 1, resumable",
)
def test_a_processor_failing_every_group_stops_the_run_after_three_steps_with_its_cause(site, capsys):
    argv = _bandit(
        site, "train.max_training_steps=10", "environments.0.reward_processor=failing_groups_scoring:strict"
    )
    assert main(argv) == 1
    said = _said(capsys.readouterr().err)
    assert [line.split(";")[0] for line in said[:3]] == [
        f"platoon: step {n}/10: no scored rollout (no update: every group failed: {STRICT_CAUSE})"
        for n in (1, 2, 3)
    ]
    assert said[3:] == [
        f"platoon: training stopped at step 3: every group of steps 1..3 failed, so nothing trained: "
        f"{STRICT_CAUSE}; fix that, then the same command resumes"
    ]
    run = site / "bandit" / "run"
    assert [row["step"] for row in _rows(run / "metrics.jsonl")] == [1, 2, 3]
    # nothing marks the run done: only the launch checkpoint, so the steps are trained again
    assert [row["name"] for row in _rows(run / "checkpoints.jsonl")] == ["recovery-000000"]

    # The cause fixed (another processor), the same run trains from its start.
    fixed = _bandit(
        site, "train.max_training_steps=2", "environments.0.reward_processor=failing_groups_scoring:bonus"
    )
    assert main(fixed) == 0
    err = capsys.readouterr().err
    assert "resuming at step 1 from recovery-000000" in err and "step 2/2: reward" in err
    assert [row["name"] for row in _rows(run / "checkpoints.jsonl")][-1] == "final"


@pytest.mark.slow
def test_a_short_run_that_trained_nothing_for_one_cause_fails_at_its_end(site, capsys):
    argv = _bandit(
        site, "train.max_training_steps=2", "environments.0.reward_processor=failing_groups_scoring:strict"
    )
    assert main(argv) == 1
    said = _said(capsys.readouterr().err)
    assert said[-1] == (
        f"platoon: training stopped at step 2: every group of steps 1..2 failed, so nothing trained: "
        f"{STRICT_CAUSE}; fix that, then the same command resumes"
    )
    assert [row["name"] for row in _rows(site / "bandit" / "run" / "checkpoints.jsonl")] == [
        "recovery-000000"
    ]


BROKEN_AFTER = "test-failing-groups-broken-after-step-1"
_started = [0]  # rollouts started so far


@harness(BROKEN_AFTER)
async def _broken_after_step_1(ctx: Any) -> AgentResult:
    """Step 1 trains (every other rollout answers right, so each group's rewards differ); from step 2 on every
    rollout crashes the same way, as a harness does when something it needs went away."""
    _started[0] += 1
    number = _started[0]
    if number > 2 * 4:
        raise RuntimeError("the toolchain at /opt/acme is gone")
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=1)
    await ctx.call_tool("answer", {"letter": "C" if number % 2 else "A"})
    return AgentResult(final_message=reply.text)


@pytest.mark.slow
def test_what_trained_before_the_failing_steps_is_kept_and_they_are_redone_on_resume(site, capsys):
    harness(BROKEN_AFTER)(_broken_after_step_1)  # again: another test may have cleared the registry
    _started[0] = 0
    argv = _bandit(
        site,
        "train.max_training_steps=10",
        f"environments=[{{env: platoon-bandit, harness: {BROKEN_AFTER}}}]",
    )
    assert main(argv) == 1
    said = _said(capsys.readouterr().err)
    assert said[0].startswith("platoon: step 1/10: reward ") and "(no update" not in said[0]
    assert said[-1].startswith(
        "platoon: training stopped at step 4: every group of steps 2..4 failed, so nothing trained: "
    )
    assert "RuntimeError: the toolchain at /opt/acme is gone" in said[-1]
    run = site / "bandit" / "run"
    checkpoints = _rows(run / "checkpoints.jsonl")
    # step 1's update is kept as of step 1: a resume redoes steps 2..4
    assert [(row["name"], row["batch"], row["optimizer_steps"]) for row in checkpoints] == [
        ("recovery-000000", 0, 0),
        ("000001_interrupted", 1, 1),
    ]
