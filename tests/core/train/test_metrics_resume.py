"""`metrics.jsonl` across resumes holds one history: the rows of steps a start redoes (logged by a start that was
killed before a checkpoint kept them) move to `metrics_superseded.jsonl`, so a plot of `metrics.jsonl` shows each
step once, in order. The attempt log (`attempts.jsonl`) does the same for groups: each group of the weights' lineage
trained exactly once, none is missing, checked on the datums the service received. And a checkpoint due on a step
without an update is saved anyway, so a crash loses no more.

Real faults: the trainer process is SIGKILLed by its own rollout in the middle of a step, then the same command
resumes it; a step's rollouts all fail, so it applies no update.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.harness.agent import AgentResult
from platoon.harness.function import harness
from platoon.trajectory_events import read_events

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
# Killed, then resumed from an earlier checkpoint

KILLER = textwrap.dedent(
    '''
    """A harness the child start imports by name: the rollout numbered $KILL_AT SIGKILLs the trainer, once. Importing
    it also records the fingerprint of every datum the trainer sends to the service in $SENT_DATUMS (the real call
    still runs), and each rollout's prompt carries a nonce, so that every datum is told apart."""
    import json
    import os
    import signal
    import uuid
    from pathlib import Path

    import tinker

    from platoon.harness.agent import AgentResult
    from platoon.harness.function import harness
    from platoon.train.tinker.attempt_log import datum_digest

    _seen = [0]
    _forward_backward = tinker.TrainingClient.forward_backward_async


    async def _recording(self, data, *args, **kwargs):
        with open(os.environ["SENT_DATUMS"], "a") as sent:
            for datum in data:
                sent.write(json.dumps({"pid": os.getpid(), "digest": datum_digest(datum)}) + "\\n")
        return await _forward_backward(self, data, *args, **kwargs)


    tinker.TrainingClient.forward_backward_async = _recording


    @harness("test-metrics-killer")
    async def killer(ctx):
        _seen[0] += 1
        number = _seen[0]
        marker = Path(os.environ["KILLED_MARKER"])
        if number == int(os.environ["KILL_AT"]) and not marker.exists():
            marker.write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)  # the trainer dies mid-step, as with kill -9 or the OOM killer
        nonce = uuid.uuid4().hex
        reply = await ctx.chat([{"role": "user", "content": f"{ctx.instruction} {nonce}"}], max_tokens=1)
        # every other rollout answers right: a group's rewards differ, so every step applies an update
        await ctx.call_tool("answer", {"letter": "C" if number % 2 else "A"})
        return AgentResult(final_message=reply.text)
    '''
)


@pytest.mark.slow
@pytest.mark.guarantee(
    "The trainer is SIGKILLed and resumed",
    "bandit, training",
    "each step's metrics once, every step's trajectory events on disk, every group of the weights' lineage trained exactly once (`attempts.jsonl`, checked on the datums the service received)",
)
def test_after_sigkill_and_a_resume_from_an_earlier_checkpoint_each_step_is_plotted_once(site, tmp_path):
    (tmp_path / "metrics_killer.py").write_text(KILLER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    env["KILLED_MARKER"] = str(tmp_path / "killed")
    env["KILL_AT"] = str(3 * 2 * 4 + 1)  # the first rollout of step 4
    env["SENT_DATUMS"] = str(tmp_path / "sent.jsonl")
    argv = _bandit(
        site,
        "train.max_training_steps=4",
        "checkpoint.every=2",  # checkpoints at steps 2 and 4: the kill in step 4 loses step 3
        "environments=[{env: platoon-bandit, harness: 'metrics_killer:killer'}]",
    )
    command = [sys.executable, "-m", "platoon", *argv]
    killed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert killed.returncode == -9, killed.stderr[-3000:]
    run = site / "bandit" / "run"
    assert _plot(run) == [1, 2, 3]
    first_step_3 = _lines(run / "metrics.jsonl")[-1]
    assert [row["name"] for row in _lines(run / "checkpoints.jsonl")] == ["recovery-000000", "000002"]

    resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step 3 from 000002" in resumed.stderr
    assert _plot(run) == [1, 2, 3, 4]  # not [1, 2, 3, 3, 4]
    assert (
        "platoon: metrics.jsonl: this start redoes steps after 2, so the 1 row(s) an earlier start logged for "
        "steps 3..3 moved to metrics_superseded.jsonl"
    ) in resumed.stderr.splitlines()
    (superseded,) = _lines(run / "metrics_superseded.jsonl")
    assert superseded["superseded_by_start_at_step"] == 2
    assert {k: v for k, v in superseded.items() if not k.startswith("superseded")} == first_step_3
    _assert_each_group_of_the_lineage_trained_once(run, tmp_path / "sent.jsonl")


def _assert_each_group_of_the_lineage_trained_once(run: Path, sent_log: Path) -> None:
    """The attempt log and the datums the service received after the kill in step 4 and the resume at step 2."""
    attempts = _lines(run / "attempts.jsonl")
    # the kill left step 3's groups trained (into weights no checkpoint kept) and step 4's started: all superseded
    superseded = sorted(
        (row["batch"], row["slot"], row["was"]) for row in attempts if row["state"] == "superseded"
    )
    assert superseded == [(2, 0, "trained"), (2, 1, "trained"), (3, 0, "started"), (3, 1, "started")]
    assert {row["superseded_by_start_at_step"] for row in attempts if row["state"] == "superseded"} == {2}
    last = {(row["batch"], row["slot"], row["attempt"]): row for row in attempts}
    lineage = [row for row in last.values() if row["state"] == "trained"]
    # every group of steps 1..4 trained once in the lineage, in the step of its batch; steps 3 and 4 on a 2nd attempt
    assert sorted((row["batch"], row["slot"], row["step"], row["attempt"]) for row in lineage) == [
        (batch, slot, batch + 1, 1 if batch < 2 else 2) for batch in range(4) for slot in range(2)
    ]
    sent = _lines(sent_log)
    killed_pid, resumed_pid = sent[0]["pid"], sent[-1]["pid"]
    assert killed_pid != resumed_pid
    received: dict[str, list[int]] = {}
    for row in sent:
        received.setdefault(row["digest"], []).append(row["pid"])
    trained = [digest for row in lineage for digest in row["datums"]]
    # each datum of the lineage reached the service exactly once; steps 1-2 from the killed start, 3-4 from the resume
    assert len(trained) == len(set(trained)) >= len(lineage)  # nonces: no two rollouts' datums are the same
    assert all(len(received[digest]) == 1 for digest in trained)
    for row in lineage:
        pid = killed_pid if row["step"] <= 2 else resumed_pid
        assert {received[digest][0] for digest in row["datums"]} == {pid}
    # what else reached the service is step 3 of the killed start, which the lineage's weights do not contain
    redone = [
        digest
        for row in attempts
        if row["state"] == "trained"
        and last[(row["batch"], row["slot"], row["attempt"])]["state"] == "superseded"
        for digest in row["datums"]
    ]
    assert sorted(received) == sorted(trained + redone)

    # The trajectory events of every step are on disk: the resumed start appended the steps it redid and trained
    # to the step files (the redone step's file is one the killed start had written).
    def rollouts_by_process(version: int) -> dict[int, int]:
        events = run / "rollouts" / "train" / str(version) / "events" / f"events_train_{version}.jsonl"
        finished = [record for record in read_events(events) if record["type"] == "trajectory_finished"]
        counts: dict[int, int] = {}
        for record in finished:
            counts[record["process_id"]] = counts.get(record["process_id"], 0) + 1
        return counts

    (killed_start,) = rollouts_by_process(0)
    for version in (0, 1):
        assert rollouts_by_process(version) == {killed_start: 2 * 4}
    for version in (2, 3):  # step 3 (redone) and step 4 sample policy versions 2 and 3
        resumed_start = {pid: n for pid, n in rollouts_by_process(version).items() if pid != killed_start}
        assert list(resumed_start.values()) == [2 * 4], version


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
