"""`metrics.jsonl` across resumes holds one history: the rows of steps a start redoes (logged by a start that was
killed before a checkpoint kept them) move to `metrics_superseded.jsonl`, so a plot of `metrics.jsonl` shows each
step once, in order. And a checkpoint due on a step without an update is saved anyway, so a crash loses no more.

The real SIGKILL of a trainer mid-step and its resume (each step plotted once, each group of the weights' lineage
trained once, checked on the datums the service received) is tests/faults/test_trainer_faults.py's run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.harness.agent import AgentResult
from platoon.harness.function import harness

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"


def _lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSONL file as a row: fails on a line that does not parse."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def _plot(run: Path) -> list[int]:
    """The steps a plot of `metrics.jsonl` draws training rows at, in file order."""
    return [row["step"] for row in _lines(run / "metrics.jsonl") if "train/step" in row]


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site profile whose cache (the local server's checkpoints, kept for a resume) is in the test's directory;
    returns log_path."""
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
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


# ---------------------------------------------------------------------------------------------------------------
# What a kill between a step's metrics row and its checkpoint row leaves


def test_a_step_logged_but_not_checkpointed_is_superseded_when_the_resume_redoes_it(tmp_path, capsys):
    from platoon.rollouts.records import append_jsonl
    from platoon.train.tinker.metrics_log import supersede_redone_steps

    # What SIGKILL leaves after step 2's row and before step 2's checkpoint row: the resume point is step 1.
    metrics = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 1, "train/step": 1.0, "train/batch/task_reward/avg": 0.1},
        {"step": 1, "eval/step": 0, "eval/reward/avg": 0.0},  # an evaluation of step 0, logged at step 1
        {"step": 2, "train/step": 2.0, "train/batch/task_reward/avg": 0.5},
        {"step": 2, "eval/step": 1, "eval/reward/avg": 0.2},  # measured step 1's policy: still valid
        {"step": 2, "eval/step": 2, "eval/reward/avg": 0.6},  # measured the policy the resume throws away
    ]
    for row in rows:
        append_jsonl(metrics, row)
    assert supersede_redone_steps(tmp_path, 1) == 2
    assert _lines(metrics) == [*rows[:2], rows[3]]
    assert [row["step"] for row in _lines(tmp_path / "metrics_superseded.jsonl")] == [2, 2]
    assert "the 2 row(s) an earlier start logged for steps 2..2 moved" in capsys.readouterr().err
    # a start that redoes nothing leaves the file as it is, and says nothing
    before = metrics.read_bytes()
    assert supersede_redone_steps(tmp_path, 2) == 0
    assert metrics.read_bytes() == before and capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------------------------
# A due checkpoint on a step without an update

NO_UPDATE = "test-metrics-resume-no-update"
_started = [0]  # rollouts started so far


@harness(NO_UPDATE)
async def _fails_in_step_2(ctx: Any) -> AgentResult:
    """Every rollout of step 2 fails (its batch has no datums); in the other steps every other rollout answers
    right, so each group's rewards differ and the step applies an update."""
    _started[0] += 1
    number = _started[0]  # the group's rollouts run at once: each keeps its own number
    if 2 * 4 < number <= 2 * 2 * 4:
        raise RuntimeError("this rollout fails, as every one of step 2 does")
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=1)
    await ctx.call_tool("answer", {"letter": "C" if number % 2 else "A"})
    return AgentResult(final_message=reply.text)


@pytest.mark.slow
def test_a_checkpoint_due_on_a_step_without_an_update_is_saved_anyway(site, capsys):
    harness(NO_UPDATE)(
        _fails_in_step_2
    )  # again: another test may have cleared the registry since this loaded
    _started[0] = 0
    argv = _bandit(
        site,
        "train.max_training_steps=3",
        "checkpoint.every=2",
        f"environments=[{{env: platoon-bandit, harness: {NO_UPDATE}}}]",
    )
    assert main(argv) == 0, capsys.readouterr().err
    run = site / "bandit" / "run"
    steps = [row for row in _lines(run / "metrics.jsonl") if "train/step" in row]
    assert [row["train/batch/skipped_optimizer"] for row in steps] == [0.0, 1.0, 0.0]
    checkpoints = _lines(run / "checkpoints.jsonl")
    assert [row["name"] for row in checkpoints] == ["recovery-000000", "000002", "final"]
    saved = checkpoints[1]
    # the weights of step 1 (the policy did not move), saved so that a resume starts after the skipped step
    assert (saved["batch"], saved["policy_version"], saved["kind"]) == (2, 1, "permanent")
    assert saved["optimizer_steps"] == 1
