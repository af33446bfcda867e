"""Supervised training: restarts per exit code, `max_restarts` and progress, signal forwarding and
`trainer_pid`, with a fake child that scripts its exit codes and checkpoint rows (no model, no server).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from platoon.rollouts.records import read_jsonl
from platoon.train.tinker.supervisor import progress_mark, supervise

# Each start pops its plan: append checkpoint rows, then either exit with `code` or wait for SIGUSR1.
FAKE_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path

    run = Path(sys.argv[1])
    starts = run / "starts.jsonl"
    n = sum(1 for _ in open(starts)) if starts.exists() else 0
    plan = json.loads((run / "plan.json").read_text())
    step = plan[min(n, len(plan) - 1)]
    seen = None
    for _ in range(200):  # the supervisor records trainer_pid just after the start
        try:
            seen = json.loads((run / "process.json").read_text()).get("trainer_pid")
        except (OSError, ValueError):
            seen = None
        if seen == os.getpid():
            break
        time.sleep(0.01)
    with open(starts, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "trainer_pid": seen}) + "\\n")
    for row in step.get("rows", []):
        with open(run / "checkpoints.jsonl", "a") as f:
            f.write(json.dumps(row) + "\\n")
    if step.get("wait"):
        def note(signum, frame):
            with open(run / "signals.txt", "a") as f:
                f.write(signal.Signals(signum).name + "\\n")
            if signum == signal.SIGUSR1:
                os._exit(1)
        signal.signal(signal.SIGUSR1, note)
        signal.signal(signal.SIGUSR2, note)
        (run / "ready").touch()
        deadline = time.time() + 300  # a hang guard: the test's signals end this
        while time.time() < deadline:
            time.sleep(0.05)
        sys.exit(3)
    if step.get("kill"):
        os.kill(os.getpid(), step["kill"])
    sys.exit(step["code"])
    """
)


def _row(batch: int, kind: str = "recovery") -> dict[str, Any]:
    name = f"recovery-{batch:06d}" if kind in ("recovery", "launch") else f"{batch:06d}"
    return {"name": name, "kind": kind, "batch": batch, "state_path": f"tinker://r/weights/{name}"}


def _setup(tmp_path: Path, plan: list[dict[str, Any]]) -> tuple[Path, list[str]]:
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps(plan))
    script = tmp_path / "fake_child.py"
    script.write_text(FAKE_CHILD)
    return run, [sys.executable, str(script), str(run)]


def _starts(run: Path) -> list[dict[str, Any]]:
    return read_jsonl(run / "starts.jsonl")


def test_restarts_after_a_failure_until_a_start_succeeds(tmp_path, capsys):
    plan = [{"code": 1, "rows": [_row(1)]}, {"code": 1, "rows": [_row(2)]}, {"code": 0, "rows": [_row(3)]}]
    run, command = _setup(tmp_path, plan)
    assert supervise(run, max_restarts=5, command=command) == 0
    assert len(_starts(run)) == 3
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("platoon: ")]
    assert len(lines) == 2
    assert "restart 1 of 5" in lines[0] and "from step 1" in lines[0]


@pytest.mark.parametrize("code", [0, 78, 130, 143])
def test_no_restart_after_a_final_exit(tmp_path, code):
    run, command = _setup(tmp_path, [{"code": code}, {"code": 0}])
    assert supervise(run, max_restarts=3, command=command) == code
    assert len(_starts(run)) == 1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_no_restart_after_the_child_was_killed_by_an_interrupt(tmp_path, signum):
    run, command = _setup(tmp_path, [{"kill": int(signum)}, {"code": 0}])
    assert supervise(run, max_restarts=3, command=command) == 128 + signum
    assert len(_starts(run)) == 1


def test_at_most_max_restarts_and_the_last_code_is_returned(tmp_path, capsys):
    plan = [{"code": 1, "rows": [_row(1)]}, {"code": 2, "rows": [_row(2)]}, {"code": 5, "rows": [_row(3)]}]
    run, command = _setup(tmp_path, plan)
    assert supervise(run, max_restarts=2, command=command) == 5
    assert len(_starts(run)) == 3
    assert "watchdog.max_restarts (2) used" in capsys.readouterr().err


def test_stops_after_three_consecutive_starts_without_a_new_checkpoint(tmp_path, capsys):
    # The first start saves step 2; later ones save only the launch recovery save, which is no progress.
    plan = [{"code": 1, "rows": [_row(2)]}, {"code": 4, "rows": [_row(2, "launch")]}]
    run, command = _setup(tmp_path, plan)
    assert supervise(run, max_restarts=10, command=command) == 4
    assert len(_starts(run)) == 4
    assert "3 starts in a row saved no new checkpoint" in capsys.readouterr().err


def test_progress_resets_the_stall_count(tmp_path):
    plan: list[dict[str, Any]] = [
        {"code": 1},
        {"code": 1},
        {"code": 1, "rows": [_row(1, "permanent")]},
        {"code": 1},
        {"code": 1},
        {"code": 9},
    ]
    run, command = _setup(tmp_path, plan)
    assert supervise(run, max_restarts=10, command=command) == 9
    assert len(_starts(run)) == 6


def test_progress_mark_skips_the_launch_save_and_rows_without_state(tmp_path):
    run = tmp_path
    assert progress_mark(run) is None
    rows = [_row(3), _row(3, "launch") | {"batch": 4}, {"name": "000005", "batch": 5, "sampler_path": "x"}]
    (run / "checkpoints.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "{cut")
    assert progress_mark(run) == 3


def test_trainer_pid_is_recorded_for_each_start(tmp_path):
    run, command = _setup(tmp_path, [{"code": 1, "rows": [_row(1)]}, {"code": 0, "rows": [_row(2)]}])
    assert supervise(run, max_restarts=1, command=command) == 0
    starts = _starts(run)
    assert [s["trainer_pid"] for s in starts] == [s["pid"] for s in starts]
    assert all(s["ppid"] == os.getpid() for s in starts)
    record = json.loads((run / "process.json").read_text())
    assert record["pid"] == os.getpid() and record["trainer_pid"] == starts[-1]["pid"]


def _wait_for(predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_signals_are_forwarded_first_as_sigusr2_then_sigusr1_and_end_supervision(tmp_path):
    run, command = _setup(tmp_path, [{"wait": True}, {"code": 0}])
    code = (
        "import sys; from pathlib import Path; from platoon.train.tinker.supervisor import supervise; "
        f"sys.exit(supervise(Path({str(run)!r}), max_restarts=3, command={command!r}))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    signals = run / "signals.txt"
    try:
        _wait_for(lambda: (run / "ready").exists())
        proc.send_signal(signal.SIGTERM)
        _wait_for(lambda: signals.exists() and "SIGUSR2" in signals.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 1  # the child's exit on SIGUSR1; no restart after a signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for start in _starts(run):
            try:
                os.kill(start["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert signals.read_text().split() == ["SIGUSR2", "SIGUSR1"]
    assert len(_starts(run)) == 1


def test_the_child_entry_point_sets_stop_requested_then_exits_1(tmp_path):
    # The real child module's signal contract, driven in a subprocess so this test's process keeps its handlers.
    probe = textwrap.dedent(
        f"""
        import os, signal, sys, time
        from pathlib import Path
        from platoon.train.tinker import supervised, supervisor
        supervised.install_signal_contract()
        out = Path({str(tmp_path)!r})
        os.kill(os.getpid(), signal.SIGUSR2)
        (out / "after_usr2").write_text(str(supervisor.stop_requested()))
        os.kill(os.getpid(), signal.SIGTERM)  # the first real interrupt: still only a stop at the boundary
        (out / "after_term").write_text("alive")
        os.kill(os.getpid(), signal.SIGINT)  # the second: exit 1 now
        time.sleep(60)
        sys.exit(0)
        """
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert (tmp_path / "after_usr2").read_text() == "True"
    assert (tmp_path / "after_term").read_text() == "alive"
    assert "stopping now" in done.stderr


def test_the_child_entry_point_wants_exactly_one_config(capsys):
    from platoon.startup.supervised_start import main

    assert main([]) == 64
    assert capsys.readouterr().err.count("\n") == 1


REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "bandit" / "train.yaml"


@pytest.mark.slow
def test_platoon_train_supervises_the_bandit_example_to_the_end(tmp_path, monkeypatch, capsys):
    from platoon.cli import main

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    # The local server keeps its checkpoints under the site cache: a profile points it into the test's directory.
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    argv = [
        "train",
        str(EXAMPLE),
        "watchdog.max_restarts=1",
        "train.max_training_steps=2",
        f"log_path={tmp_path}",
    ]
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 0, err
    run = tmp_path / "bandit" / "run"
    assert (run / "config.resolved.yaml").is_file() and (run / "lock.json").is_file()
    assert progress_mark(run) == 2
    assert not (run / "process.json").exists()  # released when platoon train exits


def test_hold_for_trainer_only_under_a_supervisor(tmp_path):
    from platoon.rollouts.records import hold_run_dir, read_process
    from platoon.train.tinker.supervisor import hold_for_trainer

    assert not hold_for_trainer(tmp_path)  # no process.json
    hold_run_dir(tmp_path)  # this process holds it: it is not this process's parent
    assert not hold_for_trainer(tmp_path)
    probe = (
        "import sys; from pathlib import Path; from platoon.train.tinker.supervisor import hold_for_trainer; "
        "import os; print(os.getpid()); "
        f"sys.exit(0 if hold_for_trainer(Path({str(tmp_path)!r})) else 1)"
    )
    child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert child.returncode == 0, child.stderr
    record = read_process(tmp_path)
    assert record is not None and record.pid == os.getpid()
    assert record.trainer_pid == int(child.stdout) and record.trainer_start_time is not None
