"""The trainer's own faults in a training run on Harbor tasks in Docker: a SIGKILL and a resume, Ctrl-C with output
into a pipe whose reader has gone, a disk that fills. On the bandit these faults are tested one by one
(tests/core/train); here each leaves what only a sandboxed environment has: containers still running under a
trainer that is gone, rollouts mid-episode when the stop comes, and grading whose logs go to the run's disk.

One run of 4 steps (2 tasks of `examples/harbor-dataset`, groups of 2, a checkpoint every 2 steps) in four starts of
the same command, each a `platoon train` process:

1. killed (SIGKILL, by its own agent) in step 4, with that step's containers running;
2. resumed at step 3, its output into a pipe; once step 3 trained, the reader goes and Ctrl-C comes during step 4;
3. resumed at step 4, whose first rollout fills the run's disk;
4. resumed at step 4 once there is space again, to the end.

The agent (written beside the test, imported by name) samples one token, then solves its task on every other
rollout of it, so every group's rewards differ and every step trains; it records the fingerprint of every datum
the trainer sends to the service. Everything is read from what the run left: the metrics, checkpoints and attempt
rows, the datums the service received, the trajectory events, the engine's containers and the host's processes.

CI starts the Docker engine and builds `platoon-test/python:bookworm` first (`.ci/docker-engine start`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docker_cli import containers

from platoon.trajectory_events import read_events

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "harbor-dataset" / "train.yaml"
STEPS = 4
TASKS = 2
GROUP_SIZE = 2
ROLLOUTS_PER_STEP = TASKS * GROUP_SIZE
#: a hang guard on one start of `platoon train` on a busy two-core machine, not a margin
HANG_GUARD = 600.0

AGENT = textwrap.dedent(
    '''
    """The agent of tests/faults/test_trainer_faults.py. $FAULT names what the rollout numbered $FAULT_AT (counted
    in this process) does first: `kill` SIGKILLs the trainer, `interrupt` writes $FAULT_MARKER for the test (which
    then closes the pipe and sends SIGINT), `fill` fills the disk at $FAULT_DISK. Importing it records every datum
    the trainer sends to the service in $SENT_DATUMS (the real call still runs)."""
    import errno
    import json
    import os
    import signal
    import uuid
    from pathlib import Path

    import tinker

    from platoon.harness.agent import AgentResult
    from platoon.harness.function import harness
    from platoon.train.tinker.attempt_log import datum_digest

    _forward_backward = tinker.TrainingClient.forward_backward


    def _recording(self, data, *args, **kwargs):
        with open(os.environ["SENT_DATUMS"], "a") as sent:
            for datum in data:
                sent.write(json.dumps({"pid": os.getpid(), "digest": datum_digest(datum)}) + "\\n")
        return _forward_backward(self, data, *args, **kwargs)


    tinker.TrainingClient.forward_backward = _recording
    _started = [0]
    _by_task = {}


    def _fill(disk):
        with open(Path(disk) / "filler", "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"\\0" * 65536)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC


    def _fault():
        fault = os.environ.get("FAULT")
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # as kill -9 or the OOM killer: nothing runs after it
        elif fault == "interrupt":
            Path(os.environ["FAULT_MARKER"]).write_text("in a rollout")
        elif fault == "fill":
            _fill(os.environ["FAULT_DISK"])


    @harness("test-trainer-faults-agent")
    async def agent(ctx):
        _started[0] += 1
        if _started[0] == int(os.environ.get("FAULT_AT", "0")):
            _fault()
        # a group's two rollouts are consecutive for its task: one solves, one does not, so its rewards differ
        _by_task[ctx.task.id] = mine = _by_task.get(ctx.task.id, 0) + 1
        reply = await ctx.chat([{"role": "user", "content": f"{ctx.instruction} {uuid.uuid4().hex}"}], max_tokens=1)
        if mine % 2:
            await ctx.session.run_solution()
        return AgentResult(final_message=reply.text)
    '''
)


def _lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSONL file as a row: fails on a line that does not parse."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def run_disk(tmp_path: Path) -> Iterator[Path]:
    """The run's records on a tmpfs of their own (16 MiB: 4 steps' records fit, filling it takes milliseconds)."""
    where = tmp_path / "disk"
    where.mkdir()
    _mount("-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where))
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], capture_output=True)


class Start:
    """One start of the run's command: a `platoon train` process whose stderr goes to a pipe the test reads."""

    def __init__(self, command: list[str], env: dict[str, str], **fault: str) -> None:
        read_end, write_end = os.pipe()
        try:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                env={**env, **fault},
                cwd=REPO,
            )
        finally:
            os.close(write_end)
        self._read_end: int | None = read_end
        self.output = b""
        self.deadline = time.monotonic() + HANG_GUARD

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    def read_until(self, done: Any) -> None:
        """Read the output until `done()` holds; fails if the start ends or passes its hang guard first."""
        assert self._read_end is not None
        while not done():
            assert time.monotonic() < self.deadline and self.process.poll() is None, self.text[-4000:]
            if select.select([self._read_end], [], [], 0.5)[0]:
                self.output += os.read(self._read_end, 65536)

    def close_reader(self) -> None:
        """The reader goes (`tee` killed by the same Ctrl-C): every later write of the start hits a closed pipe."""
        assert self._read_end is not None
        os.close(self._read_end)
        self._read_end = None

    def wait(self) -> int:
        """Read to the end (while a reader is left) and return the exit status."""
        while self._read_end is not None:
            assert time.monotonic() < self.deadline, self.text[-4000:]
            if select.select([self._read_end], [], [], 0.5)[0]:
                chunk = os.read(self._read_end, 65536)
                if not chunk:
                    self.close_reader()
                self.output += chunk
        try:
            return self.process.wait(timeout=max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"platoon train hung; its output so far:\n{self.text[-4000:]}") from None


def _platoon_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("platoon: ")]


@pytest.mark.slow
@pytest.mark.guarantee(
    "The trainer is SIGKILLed with containers running and resumed; Ctrl-C with output into a closed pipe; the disk "
    "fills",
    "Harbor tasks in Docker, training (one run, four starts)",
    "the resume reaps what the killed start left and redoes what it lost; Ctrl-C mid-step abandons that step and "
    "keeps what the start trained in `_interrupted`, exit 130; a full disk stops at the step boundary with one "
    "line, exit 1; every group of the weights' lineage trained exactly once (on the datums the service received); "
    "each step's metrics once and its rollouts' events on disk; no container left after any start that ended",
)
def test_a_harbor_run_survives_sigkill_piped_ctrl_c_and_a_full_disk_and_trains_each_group_once(
    tmp_path: Path, run_disk: Path
) -> None:
    (tmp_path / "trainer_faults_agent.py").write_text(AGENT)
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    env = {
        **os.environ,
        "PLATOON_SITE": str(profile),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "SENT_DATUMS": str(tmp_path / "sent.jsonl"),
    }
    for name in ("TINKER_API_KEY", "TINKER_BASE_URL", "WANDB_API_KEY", "FAULT", "FAULT_AT"):
        env.pop(name, None)
    command = [
        sys.executable,
        "-m",
        "platoon",
        "train",
        str(CONFIG),
        f"log_path={run_disk}",
        f"environments.0.service_kwargs.dataset_dir={CONFIG.parent / 'tasks'}",
        "environments.0.service_kwargs.harbor_check=off",
        "environments.0.harness=trainer_faults_agent:agent",
        f"train.max_training_steps={STEPS}",
        f"train.batch_size={TASKS}",
        f"train.workflow_config.group_size={GROUP_SIZE}",
        "train.max_staleness=0",
        "checkpoint.every=2",
    ]
    run = run_disk / "harbor-dataset" / "run"

    # 1. SIGKILLed by the first rollout of step 4: the checkpoint of step 2 is the last one, step 3 is lost.
    killed = Start(command, env, FAULT="kill", FAULT_AT=str(3 * ROLLOUTS_PER_STEP + 1))
    assert killed.wait() == -signal.SIGKILL, killed.text[-4000:]
    assert [row["step"] for row in _lines(run / "metrics.jsonl")] == [1, 2, 3]
    lost_step_3 = _lines(run / "metrics.jsonl")[-1]
    assert [row["name"] for row in _lines(run / "checkpoints.jsonl")] == ["recovery-000000", "000002"]
    left = containers(f"platoon.run={run}")
    assert left, "the killed start had step 4's sandbox running; SIGKILL gave it no chance to stop it"

    # 2. Resumed with its output into a pipe; the reader goes and Ctrl-C comes while step 4's rollouts run: the
    # step that applied no update is abandoned, the one this start trained is kept in an `_interrupted` checkpoint.
    marker = tmp_path / "interrupted"
    interrupted = Start(
        command, env, FAULT="interrupt", FAULT_AT=str(ROLLOUTS_PER_STEP + 1), FAULT_MARKER=str(marker)
    )
    interrupted.read_until(marker.exists)
    interrupted.close_reader()
    interrupted.process.send_signal(signal.SIGINT)
    assert interrupted.wait() == 130, interrupted.text[-4000:]
    assert f"platoon: reaped {len(left)} sandbox(es) of {run}" in _platoon_lines(interrupted.text)
    assert "platoon: resuming at step 3 from 000002" in interrupted.text, interrupted.text
    assert _lines(run / "checkpoints.jsonl")[-1]["name"] == "000003_interrupted"
    assert containers(f"platoon.run={run}") == []

    # 3. Resumed at step 4, whose first rollout fills the disk: the run stops at the step boundary.
    filling = Start(command, env, FAULT="fill", FAULT_AT="1", FAULT_DISK=str(run_disk))
    assert filling.wait() == 1, filling.text[-4000:]
    assert "Traceback" not in filling.text
    (line,) = [line for line in filling.text.splitlines() if "no space" in line]
    assert line.startswith(f"platoon: could not write {run}/"), line
    assert [row["step"] for row in _lines(run / "metrics.jsonl")] == [1, 2, 3]  # every row parses
    assert containers(f"platoon.run={run}") == []

    # 4. Space again: the same command finishes the run.
    (run_disk / "filler").unlink()
    finished = Start(command, env)
    assert finished.wait() == 0, finished.text[-4000:]
    # from the launch checkpoint the third start saved, as of step 3
    assert "platoon: resuming at step 4 from " in finished.text, finished.text
    assert [row["step"] for row in _lines(run / "metrics.jsonl")] == [1, 2, 3, 4]
    (superseded,) = _lines(run / "metrics_superseded.jsonl")  # the lost step 3's row, kept aside
    assert superseded["superseded_by_start_at_step"] == 2
    assert {
        key: value for key, value in superseded.items() if not key.startswith("superseded")
    } == lost_step_3
    assert _lines(run / "checkpoints.jsonl")[-1]["name"] == "final"
    assert containers(f"platoon.run={run}") == []

    trained_by = {1: killed, 2: killed, 3: interrupted, 4: finished}
    _assert_each_group_of_the_lineage_trained_once(
        run, tmp_path / "sent.jsonl", {step: start.process.pid for step, start in trained_by.items()}
    )


def _assert_each_group_of_the_lineage_trained_once(
    run: Path, sent_log: Path, trainer_of: dict[int, int]
) -> None:
    """The attempt log against the datums the service received, and every step's rollouts on disk: each group of
    the weights' lineage trained once, by the start that trained its step, and nothing else reached the service but
    what a lost start trained into weights no checkpoint kept."""
    attempts = _lines(run / "attempts.jsonl")
    # what each resume set aside: the killed start's step 3 (trained into weights no checkpoint kept) and step 4
    # (in flight), then the step 4 that Ctrl-C abandoned and the one the full disk stopped (each with its groups still
    # running, or sent to the service without an optimizer step, as the fault found them)
    superseded = [row for row in attempts if row["state"] == "superseded"]
    assert sorted(
        (row["batch"], row["slot"], row["superseded_by_start_at_step"]) for row in superseded
    ) == sorted(
        [(2, slot, 2) for slot in range(TASKS)]
        + [(3, slot, 2) for slot in range(TASKS)]
        + [(3, slot, 3) for slot in range(TASKS) for _ in ("interrupted", "filling")]
    )
    was = {(row["batch"], row["slot"], row["attempt"]): row["was"] for row in superseded}
    assert {was[2, slot, 1] for slot in range(TASKS)} == {"trained"}
    assert {was[3, slot, 1] for slot in range(TASKS)} == {"started"}
    assert {was[3, slot, attempt] for slot in range(TASKS) for attempt in (2, 3)} <= {"started", "trained"}
    last = {(row["batch"], row["slot"], row["attempt"]): row for row in attempts}
    lineage = [row for row in last.values() if row["state"] == "trained"]
    # every group of steps 1..4 trained once in the lineage: step 3 on its 2nd attempt, step 4 on its 4th
    assert sorted((row["batch"], row["slot"], row["step"], row["attempt"]) for row in lineage) == [
        (batch, slot, batch + 1, {0: 1, 1: 1, 2: 2, 3: 4}[batch])
        for batch in range(STEPS)
        for slot in range(TASKS)
    ]
    received: dict[str, list[int]] = {}
    for row in _lines(sent_log):
        received.setdefault(row["digest"], []).append(row["pid"])
    trained = [digest for row in lineage for digest in row["datums"]]
    assert len(trained) == len(set(trained)) >= len(lineage)  # nonces: no two rollouts' datums are the same
    for row in lineage:
        assert {pid for digest in row["datums"] for pid in received[digest]} == {trainer_of[row["step"]]}, row
    lost = [
        digest
        for row in attempts
        if row["state"] == "trained"
        and last[(row["batch"], row["slot"], row["attempt"])]["state"] == "superseded"
        for digest in row["datums"]
    ]
    assert sorted(received) == sorted(trained + lost)
    assert lost, "the killed start trained step 3 into weights no checkpoint kept"

    for version in range(STEPS):  # step N samples policy version N - 1
        events = run / "rollouts" / "train" / str(version) / "events"
        finished = [
            record
            for record in read_events(sorted(events.glob("*.jsonl")))
            if record["type"] == "trajectory_finished"
        ]
        by_trainer = [record for record in finished if record["process_id"] == trainer_of[version + 1]]
        assert len(by_trainer) == ROLLOUTS_PER_STEP, (version, len(finished))
