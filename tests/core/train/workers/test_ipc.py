"""The rollout-worker files and rules without a worker: the scratch dir and its refusals, private atomic files,
diag markers, the orphan and stale sweeps, the binding a worker follows, budgets and classification."""

from __future__ import annotations

import json
import os
import pickle
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from platoon.config.training import WorkflowConfig
from platoon.config_defs import RolloutConfig
from platoon.rollouts.one_rollout import MemberOutcome
from platoon.rollouts.workers import ipc
from platoon.rollouts.workers.binding import FollowingSampler, binding_blob, publish_binding
from platoon.rollouts.workers.ipc import WorkerSetupError, scratch_dir
from platoon.rollouts.workers.pool import classify_exit, rollout_budget_seconds
from platoon.rollouts.workers.startup import worker_environment

from .conftest import gone, wait_for

UID = os.getuid()


def test_the_scratch_dir_is_private_and_its_base_follows_the_variables(tmp_path):
    for name, expected_base in [
        ("PLATOON_NODE_SCRATCH", "a"),
        ("PBS_LOCALDIR", "b"),
        ("SLURM_TMPDIR", "c"),
        ("TMPDIR", "d"),
    ]:
        (tmp_path / expected_base).mkdir()
        environ = {name: str(tmp_path / expected_base)}
        if name != "PLATOON_NODE_SCRATCH":  # the earlier variables win over the later ones
            environ["TMPDIR" if name != "TMPDIR" else "HOME"] = str(tmp_path)
        path = scratch_dir(environ)
        assert path == tmp_path / expected_base / f"platoon-rollout-ipc-{UID}"
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
        assert (path / "workers").is_dir() and (path / "sessions").is_dir()
    assert ipc.scratch_base({}) == Path("/tmp")
    # a dir of ours that became readable by others is made private again
    path = tmp_path / "a" / f"platoon-rollout-ipc-{UID}"
    path.chmod(0o755)
    scratch_dir({"PLATOON_NODE_SCRATCH": str(tmp_path / "a")})
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_an_unsafe_scratch_dir_is_refused_in_one_line(tmp_path):
    env = {"PLATOON_NODE_SCRATCH": str(tmp_path)}
    target = tmp_path / f"platoon-rollout-ipc-{UID}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    target.symlink_to(elsewhere)
    with pytest.raises(WorkerSetupError, match="is a symlink, which is refused") as refused:
        scratch_dir(env)
    assert "\n" not in str(refused.value) and refused.value.exit_code == 78
    target.unlink()
    target.write_text("")
    with pytest.raises(WorkerSetupError, match="is not a directory"):
        scratch_dir(env)
    target.unlink()
    with pytest.raises(WorkerSetupError, match="cannot create the rollout-worker scratch dir"):
        scratch_dir({"PLATOON_NODE_SCRATCH": str(tmp_path / "missing")})


@pytest.mark.skipif(UID != 0, reason="giving a directory to another user needs root")
def test_a_scratch_dir_of_another_user_is_refused(tmp_path):
    target = tmp_path / f"platoon-rollout-ipc-{UID}"
    target.mkdir(mode=0o700)
    os.chown(target, 65534, 65534)
    with pytest.raises(WorkerSetupError, match="belongs to uid 65534, not to you"):
        scratch_dir({"PLATOON_NODE_SCRATCH": str(tmp_path)})


def test_private_files_are_0600_and_replace_atomically(tmp_path):
    path = tmp_path / "x.res"
    ipc.write_private(path, b"one")
    ipc.write_private(path, b"two")
    assert path.read_bytes() == b"two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["x.res"]  # no temporary file left behind


def test_request_ids_name_the_task_and_are_fresh():
    first = ipc.new_request_id("math::task/7 (hard)", 3)
    second = ipc.new_request_id("math::task/7 (hard)", 3)
    assert first.startswith("math_task_7_hard-r3-") and len(first.rsplit("-", 1)[1]) == 8
    assert first != second


def test_diag_markers_are_tab_separated_and_bounded():
    data = ipc.format_diag(
        {"phase": "rollout", "note": "a\tb\nc=d", **{f"k{i}": "v" * 200 for i in range(40)}}
    )
    assert len(data) <= 4096 and data.endswith(b"\n")
    fields = ipc.parse_diag(data.decode())
    assert fields["phase"] == "rollout" and fields["note"] == "a b c d"
    assert len(fields) < 42  # what does not fit is left out, whole


def test_a_response_of_another_protocol_or_request_is_not_read(tmp_path):
    outcome = MemberOutcome.missing("error", version=1)
    path = tmp_path / "r.res"
    for protocol, request_id, readable in [(2, "r", True), (1, "r", False), (2, "other", False)]:
        ipc.write_private(path, pickle.dumps(ipc.WorkerResponse(protocol, request_id, outcome)))
        assert (ipc.read_response(path, "r") is not None) is readable
    path.write_bytes(b"torn")
    assert ipc.read_response(path, "r") is None


def test_the_worker_environment_overrides(monkeypatch):
    base = {
        "PATH": "/bin",
        "TINKER_SUBPROCESS_SAMPLING": "1",
        "OMP_NUM_THREADS": "8",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    env = worker_environment(base, startup_budget=300, diag_path="/x.res.diag")
    assert env["PATH"] == "/bin" and "TINKER_SUBPROCESS_SAMPLING" not in env
    assert env["TINKER_TELEMETRY"] == "0" and env["TOKENIZERS_PARALLELISM"] == "false"
    assert all(env[f"{n}_NUM_THREADS"] == "1" for n in ("OMP", "MKL", "OPENBLAS", "NUMEXPR"))
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
    assert env["PLATOON_TINKER_ROLLOUT_WORKER"] == "1"
    assert env["PLATOON_ROLLOUT_WORKER_STARTUP_BUDGET"] == "300.0"
    assert env["PLATOON_ROLLOUT_WORKER_DIAG"] == "/x.res.diag"


# ---------------------------------------------------------------------------------------------------------------
# Sweeps


def _dead_process() -> tuple[int, int]:
    """(pid, start time) of a process that has exited."""
    process = subprocess.Popen(["sleep", "0.2"])
    start = ipc.start_time_of(process.pid)
    process.wait()
    assert start is not None
    return process.pid, start


def _record(kind: str, pid: int, trainer: tuple[int, int | None], request_id: str) -> ipc.RegistryRecord:
    return ipc.RegistryRecord(
        kind=kind,
        pid=pid,
        pgid=pid,
        start_time=ipc.start_time_of(pid),
        trainer_pid=trainer[0],
        trainer_start_time=trainer[1],
        request_id=request_id,
        host=socket.gethostname(),
    )


def test_the_orphan_sweep_stops_workers_of_a_dead_trainer_only(tmp_path):
    scratch = scratch_dir({"PLATOON_NODE_SCRATCH": str(tmp_path)})
    dead_trainer = _dead_process()
    live_trainer = (os.getpid(), ipc.start_time_of(os.getpid()))
    # An orphan that ignores SIGTERM (so only the SIGKILL after the grace ends it), with a child in its group.
    orphan = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen(['sleep', '600']); time.sleep(600)",
        ],
        start_new_session=True,
    )
    kept = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        assert wait_for(lambda: len(ipc.group_members(orphan.pid)) == 2)
        member = next(pid for pid in ipc.group_members(orphan.pid) if pid != orphan.pid)
        ipc.register(scratch, _record("worker", orphan.pid, dead_trainer, "orphan"))
        ipc.register(scratch, _record("worker", kept.pid, live_trainer, "kept"))
        dead_worker = _dead_process()[0]
        gone_worker = _record("worker", kept.pid, dead_trainer, "gone")
        ipc.register(
            scratch, ipc.RegistryRecord(**{**gone_worker.__dict__, "pid": dead_worker, "pgid": dead_worker})
        )
        (scratch / "workers" / "junk.json").write_text("{not json")
        started = time.monotonic()
        assert ipc.sweep_orphans(scratch, grace_seconds=0.5) == 1
        assert time.monotonic() - started >= 0.5  # it waited the grace before the SIGKILL
        assert orphan.wait(timeout=5) == -9
        assert wait_for(lambda: gone(member))
        assert kept.poll() is None
        names = sorted(p.name for p in (scratch / "workers").iterdir())
        assert len(names) == 1 and names[0].endswith("-kept.json")
    finally:
        for process in (orphan, kept):
            process.kill()
            process.wait()


def test_the_stale_sweep_removes_day_old_files_of_gone_supervisors(tmp_path):
    scratch = scratch_dir({"PLATOON_NODE_SCRATCH": str(tmp_path)})
    day_ago = time.time() - 25 * 3600
    dead_pid, dead_start = _dead_process()
    dead = scratch / "sessions" / f"{dead_pid}-{dead_start}-abcd1234"
    live = ipc.new_session_dir(scratch)
    for session in (dead, live):
        session.mkdir(exist_ok=True)
        for name, mtime in (("old.res", day_ago), ("new.res", time.time())):
            (session / name).write_text("x")
            os.utime(session / name, (mtime, mtime))
    (scratch / "stray.log").write_text("x")
    os.utime(scratch / "stray.log", (day_ago, day_ago))
    assert ipc.sweep_stale_files(scratch) == 2
    assert sorted(p.name for p in dead.iterdir()) == ["new.res"]
    assert sorted(p.name for p in live.iterdir()) == [
        "new.res",
        "old.res",
    ]  # a live supervisor keeps its files
    assert not (scratch / "stray.log").exists()


# ---------------------------------------------------------------------------------------------------------------
# The binding


class _Recorder:
    def __init__(self, name: str) -> None:
        self.name = name

    async def sample_async(self, **kwargs: object) -> str:
        return self.name


def test_the_following_sampler_reloads_on_change_keeps_a_client_over_a_corrupt_file_and_reports_the_oldest(
    tmp_path,
):
    import asyncio

    path = tmp_path / "model_binding.pkl"
    publish_binding(path, _Recorder("v1"), 1)
    now = [0.0]
    following = FollowingSampler(
        path, client=_Recorder("v1"), version=1, poll_seconds=5, clock=lambda: now[0]
    )

    def sample() -> str:
        return asyncio.run(following.sample_async(prompt=None))

    assert sample() == "v1" and following.oldest_version() == 1
    publish_binding(path, _Recorder("v2"), 2)
    now[0] = 1.0
    assert sample() == "v1"  # within the poll interval the file is not looked at
    now[0] = 5.0
    assert sample() == "v2" and following.version == 2
    assert following.versions_sampled == (1, 2) and following.oldest_version() == 1
    path.write_bytes(b"corrupt")
    now[0] = 10.0
    assert sample() == "v2" and following.version == 2  # a corrupt file keeps the previous client
    fresh = FollowingSampler(path, client=_Recorder("v3"), version=3, poll_seconds=0)
    assert fresh.oldest_version() == 3  # nothing sampled: the current version
    assert pickle.loads(binding_blob(_Recorder("x"), 7))["version"] == 7


# ---------------------------------------------------------------------------------------------------------------
# Budgets and classification


def test_the_rollout_budget_rule():
    workflow = WorkflowConfig(
        worker_finalize_grace_seconds=120, worker_unbounded_rollout_budget_seconds=86400
    )
    assert rollout_budget_seconds(RolloutConfig(timeout=600), workflow) == 720
    assert (
        rollout_budget_seconds(RolloutConfig(timeout=600), workflow, environment_overhead_seconds=30) == 750
    )
    assert rollout_budget_seconds(RolloutConfig(), workflow) == 86400
    # a harness limit counts only when the environment says what it needs beyond the harness
    assert rollout_budget_seconds(RolloutConfig(), workflow, harness_limit_seconds=900) == 86400
    assert (
        rollout_budget_seconds(
            RolloutConfig(), workflow, harness_limit_seconds=900, environment_overhead_seconds=60
        )
        == 1080
    )


@pytest.mark.parametrize(
    ("returncode", "phase", "deadline", "disposition"),
    [
        (87, None, False, "rollout_worker_oom"),
        (-9, "rss", False, "rollout_worker_oom"),
        (-9, "startup", False, "hard_timeout"),
        (-9, "rollout", True, "hard_timeout"),
        (143, "terminated", True, "hard_timeout"),
        (143, "terminated", False, "worker_crashed"),
        (-9, None, True, "hard_timeout"),
        (-11, None, False, "worker_crashed"),
        (None, None, False, "worker_crashed"),
        (2, "launch", False, "worker_launch_failed"),
        (0, None, False, "worker_launch_failed"),
    ],
)
def test_a_worker_without_a_response_is_classified_as_train_md_4_5_lists(
    returncode, phase, deadline, disposition
):
    assert classify_exit(returncode=returncode, phase=phase, deadline_fired=deadline) == disposition


def test_registry_records_round_trip(tmp_path):
    record = _record("worker", os.getpid(), (1, None), "r")
    path = ipc.register(scratch_dir({"PLATOON_NODE_SCRATCH": str(tmp_path)}), record)
    assert ipc.RegistryRecord.from_json(json.loads(path.read_text())) == record
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ipc.RegistryRecord.from_json({"kind": "worker"}) is None


def test_the_fork_server_sees_threads_it_must_not_fork_under():
    import threading

    from platoon.rollouts.workers.forkserver import _foreign_threads

    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="busy-helper")
    thread.start()
    try:
        assert "busy-helper" in _foreign_threads(())
        assert "busy-helper" not in _foreign_threads(("busy-helper",))
    finally:
        release.set()
        thread.join()


def test_the_first_publication_failing_is_fatal_and_a_later_one_keeps_the_last(tmp_path, monkeypatch, caplog):
    import asyncio

    from platoon.errors import PlatoonError
    from platoon.rollouts.workers import RolloutWorkers

    monkeypatch.setenv("PLATOON_NODE_SCRATCH", str(tmp_path))
    workers = RolloutWorkers(
        run_dir=tmp_path / "run",
        workflow=WorkflowConfig(rollout_isolation="process", worker_start_method="exec"),
        model_name="platoon/toy",
        renderer_name="qwen3_instruct",
        renderer_kwargs={},
        context_window_length=None,
        sample_timeout_seconds=60,
        environment_packages=[],
        labels={},
    )
    asyncio.run(workers.start())
    try:
        with pytest.raises(PlatoonError, match="the sampling client cannot be handed to rollout workers"):
            workers.publish(lambda: None, 1)  # a closure cannot be pickled
        workers.publish(_Recorder("v1"), 1)
        workers.publish(lambda: None, 2)
        assert "publishing policy version 2 to the rollout workers failed" in caplog.text
        assert pickle.loads(workers.binding_path.read_bytes())["version"] == 1
    finally:
        asyncio.run(workers.close())
    assert not workers.binding_path.exists()  # the session's files go with close()


def test_python_env_isolation_is_refused_in_one_line(tmp_path):
    from platoon.rollouts.workers import RolloutWorkers

    workflow = WorkflowConfig(rollout_isolation="process", worker_python_env_isolation=True)
    with pytest.raises(WorkerSetupError, match="worker_python_env_isolation is not available in this build"):
        RolloutWorkers(
            run_dir=tmp_path,
            workflow=workflow,
            model_name="platoon/toy",
            renderer_name="qwen3_instruct",
            renderer_kwargs={},
            context_window_length=None,
            sample_timeout_seconds=60,
            environment_packages=[],
            labels={},
        )


def test_a_fork_server_whose_log_cannot_be_opened_is_unavailable_in_one_line(tmp_path):
    """Not a traceback: the trainer falls back to exec starts on ForkServerUnavailable."""
    import asyncio

    from platoon.rollouts.workers.forkserver import ForkServer, ForkServerUnavailable

    start = ForkServer.start(
        config={}, env=dict(os.environ), cwd=str(tmp_path), log_path=tmp_path / "missing" / "log", timeout=5
    )
    with pytest.raises(ForkServerUnavailable) as refused:
        asyncio.run(start)
    assert str(refused.value) == (
        "the fork server did not start: opening the fork server log failed: No such file or directory"
    )
