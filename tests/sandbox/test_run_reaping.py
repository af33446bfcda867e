"""Run-level labels and reaping with real `process` sandboxes started by real owner
processes: `platoon sandbox list | reap RUN_DIR` and its refusals, the run label carried in the environment, and
core's run-level reap through the sandbox-runtime entry points."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from platoon.cli import main
from platoon.rollouts.records import PROCESS_FILE, ProcessRecord, process_start_time
from platoon.sandbox_runs import LABELS_ENV, reap_run, run_label, set_run_label
from platoon_sandbox.procs import pids_with_marker
from platoon_sandbox.registry import clear_process_labels, process_labels

# An owner process: its sandbox gets its labels from $PLATOON_SANDBOX_LABELS alone (as a rollout worker's does),
# runs a background command, and the owner waits to be killed.
OWNER = """
import asyncio, sys
from platoon.sandbox import SandboxSpec
from platoon_sandbox.process import ProcessProvider

async def main():
    # unconfined: its background command outlives it (confined, it would die with it: test_process_confine.py)
    sandbox = await ProcessProvider(scratch_root=sys.argv[1], confine="none").start(SandboxSpec())
    await sandbox.exec("sleep 300 >/dev/null 2>&1 &")
    print(sandbox.root, flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


@pytest.fixture(autouse=True)
def _no_process_labels() -> Iterator[None]:
    clear_process_labels()
    yield
    clear_process_labels()


def make_run(root: Path, name: str, scratch: Path, *, provider: str = "process") -> Path:
    """A run dir whose resolved config names one Harbor entry on `provider` with its sandboxes under scratch."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    entry = {
        "name": "h",
        "service": "harbor",
        "service_kwargs": {"provider": provider, "provider_options": {"scratch_root": str(scratch)}},
    }
    (run_dir / "config.resolved.yaml").write_text(yaml.safe_dump({"environments": [entry]}))
    return run_dir


def record(run_dir: Path, pid: int, start: int | None, *, host: str | None = None) -> None:
    data = ProcessRecord(
        command=["platoon", "train"], host=host or socket.gethostname(), pid=pid, start_time=start
    ).to_json()
    data.update(trainer_pid=pid, trainer_start_time=start)
    (run_dir / PROCESS_FILE).write_text(json.dumps(data))


def dead_pid() -> tuple[int, int | None]:
    gone = subprocess.Popen(["sleep", "30"])
    start = process_start_time(gone.pid)
    gone.kill()
    gone.wait()
    return gone.pid, start


def start_owner(scratch: Path, run_dir: Path) -> tuple[subprocess.Popen[str], Path]:
    env = {**os.environ, LABELS_ENV: json.dumps({"platoon.run": run_label(run_dir), "platoon.worker": "w1"})}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(scratch)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert owner.stdout is not None
    return owner, Path(owner.stdout.readline().strip())


def kill(owner: subprocess.Popen[str]) -> None:
    owner.send_signal(signal.SIGKILL)
    owner.wait()


def test_reap_takes_a_killed_runs_sandboxes_and_another_runs_survive(tmp_path: Path, capsys):
    scratch = tmp_path / "scratch"
    mine, other = make_run(tmp_path, "a", scratch), make_run(tmp_path, "b", scratch)
    owner, root = start_owner(scratch, mine)
    other_owner, other_root = start_owner(scratch, other)
    try:
        meta = json.loads((root / "sandbox.json").read_text())
        assert meta["labels"] == {"platoon.run": str(mine), "platoon.worker": "w1"}  # from the environment
        kill(owner)
        kill(other_owner)  # dead too: only the label keeps its sandbox out of this reap
        record(mine, *dead_pid())
        marker = f"PLATOON_SANDBOX_ROOT={root / 'fs'}".encode()
        assert pids_with_marker([marker])  # the killed owner's background command still runs

        assert main(["sandbox", "list", str(mine)]) == 0
        captured = capsys.readouterr()
        assert root.name in captured.out and "owner gone" in captured.out
        assert other_root.name not in captured.out
        assert captured.err.endswith(f"1 sandbox(es) of {mine}\n")

        assert main(["sandbox", "reap", str(mine)]) == 0
        assert capsys.readouterr().out == f"reaped 1 sandbox(es) of {mine}\n"
        assert not root.exists() and not pids_with_marker([marker])
        assert other_root.exists()
        assert main(["sandbox", "reap", str(mine)]) == 0  # nothing left: still fine
        assert capsys.readouterr().out == f"reaped 0 sandbox(es) of {mine}\n"
    finally:
        for each in (owner, other_owner):
            each.kill()
            each.wait()
        assert main(["sandbox", "reap", str(other)]) == 0
    assert not other_root.exists()


def test_reap_refuses_a_live_recorded_process(tmp_path: Path, capsys):
    scratch = tmp_path / "scratch"
    run_dir = make_run(tmp_path, "a", scratch)
    owner, root = start_owner(scratch, run_dir)
    try:
        kill(owner)
        record(run_dir, os.getpid(), process_start_time(os.getpid()))  # this test process: alive
        assert main(["sandbox", "reap", str(run_dir)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"platoon: {run_dir} is in use: {PROCESS_FILE} names pid {os.getpid()}")
        assert err.count("\n") == 1
        assert root.exists()
    finally:
        record(run_dir, *dead_pid())
        assert main(["sandbox", "reap", str(run_dir)]) == 0
    assert not root.exists()


def test_reap_refuses_a_run_that_last_ran_on_another_host(tmp_path: Path, capsys):
    run_dir = make_run(tmp_path, "a", tmp_path / "scratch")
    record(run_dir, *dead_pid(), host="not-" + socket.gethostname())
    assert main(["sandbox", "reap", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"platoon: {run_dir} last ran on not-{socket.gethostname()} ({PROCESS_FILE})")
    assert err.count("\n") == 1


def test_a_directory_without_a_resolved_config_is_a_usage_error(tmp_path: Path, capsys):
    for command in ("reap", "list"):
        assert main(["sandbox", command, str(tmp_path)]) == 64
        assert capsys.readouterr().err == (
            f"platoon: {tmp_path} is not a run directory: it has no config.resolved.yaml\n"
        )


def test_a_provider_that_is_not_installed_is_named_and_skipped(tmp_path: Path, capsys):
    # every built-in provider is installed here (enroot and singularity with the hpc extra): a name none provides
    run_dir = make_run(tmp_path, "a", tmp_path / "scratch", provider="no-such-runtime")
    assert main(["sandbox", "reap", str(run_dir)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"reaped 0 sandbox(es) of {run_dir}\n"
    assert "sandbox provider 'no-such-runtime' is not installed: install a distribution whose" in captured.err


def test_an_hpc_provider_reaps_through_hpc_sandbox(tmp_path: Path, capsys):
    """enroot, through its entry point: the adapter runs hpc-sandbox's janitor on the run's label (nothing of
    this run was left, so nothing is reaped; no enroot binary is needed to reap)."""
    run_dir = make_run(tmp_path, "a", tmp_path / "scratch", provider="enroot")
    assert main(["sandbox", "reap", str(run_dir)]) == 0
    assert capsys.readouterr().out == f"reaped 0 sandbox(es) of {run_dir}\n"


def test_the_run_label_reaches_the_registry_and_core_reaps_by_it(tmp_path: Path):
    """What train and eval do: set the label (core, no platoon_sandbox import), then reap through the entry
    points at their reaping points; a second run's sandboxes survive."""
    scratch = tmp_path / "scratch"
    mine, other = make_run(tmp_path, "a", scratch), make_run(tmp_path, "b", scratch)
    assert set_run_label(mine) == str(mine)
    assert process_labels() == {"platoon.run": str(mine)}
    owner, root = start_owner(scratch, mine)
    other_owner, other_root = start_owner(scratch, other)
    try:
        assert reap_run(mine) == 0  # the owner is alive: never reaped under it
        kill(owner)
        assert reap_run(mine) == 1
        assert not root.exists() and other_root.exists()
    finally:
        for each in (owner, other_owner):
            each.kill()
            each.wait()
        reap_run(other)
    assert not other_root.exists()


# A stand-in trainer start, run by the real supervisor: the first start labels its run as `_train` does, starts a
# sandbox with a background command and dies by SIGKILL; the second notes whether that sandbox was still there.
KILLED_START = """
import asyncio, os, signal, sys
from pathlib import Path
from platoon.sandbox_runs import set_run_label
from platoon.sandbox import SandboxSpec
from platoon_sandbox.process import ProcessProvider

run, scratch, always = Path(sys.argv[1]), sys.argv[2], sys.argv[3:] == ["always"]
first = run / "first-sandbox"
if always or not first.exists():
    set_run_label(run)
    async def main():
        sandbox = await ProcessProvider(scratch_root=scratch).start(SandboxSpec())
        await sandbox.exec("sleep 300 >/dev/null 2>&1 &")
        first.write_text(str(sandbox.root))
    asyncio.run(main())
    os.kill(os.getpid(), signal.SIGKILL)
(run / "second-start-saw").write_text(str(Path(first.read_text()).exists()))
"""


def test_a_trainer_killed_by_sigkill_is_reaped_before_the_supervised_restart(tmp_path: Path, capsys):
    from platoon.train.tinker.supervisor import supervise

    scratch = tmp_path / "scratch"
    run_dir, other = make_run(tmp_path, "a", scratch), make_run(tmp_path, "b", scratch)
    other_owner, other_root = start_owner(scratch, other)
    kill(other_owner)  # another run's sandbox whose owner is dead too: never this run's restart's to reap
    try:
        command = [sys.executable, "-c", KILLED_START, str(run_dir), str(scratch)]
        assert supervise(run_dir, max_restarts=1, command=command) == 0
        root = Path((run_dir / "first-sandbox").read_text())
        assert (run_dir / "second-start-saw").read_text() == "False"  # reaped before the restart began
        assert not pids_with_marker([f"PLATOON_SANDBOX_ROOT={root / 'fs'}".encode()])
        err = capsys.readouterr().err
        assert "training exited with 137; starting again" in err
        assert f"reaped 1 sandbox(es) of {run_dir}" in err
        assert other_root.exists()
    finally:
        reap_run(other)
    assert not other_root.exists()


def test_the_supervisor_reaps_at_exit_after_a_last_start_that_was_killed(tmp_path: Path, capsys):
    from platoon.train.tinker.supervisor import supervise

    scratch = tmp_path / "scratch"
    run_dir = make_run(tmp_path, "a", scratch)
    command = [sys.executable, "-c", KILLED_START, str(run_dir), str(scratch), "always"]
    assert supervise(run_dir, max_restarts=1, command=command) == 137
    last = Path((run_dir / "first-sandbox").read_text())  # the second start's, killed with no restart left
    assert not last.exists()
    assert not pids_with_marker([f"PLATOON_SANDBOX_ROOT={last / 'fs'}".encode()])
    assert (
        capsys.readouterr().err.count(f"reaped 1 sandbox(es) of {run_dir}") == 2
    )  # before the restart, at exit
