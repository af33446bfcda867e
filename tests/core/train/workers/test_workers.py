"""Rollout workers as real processes: forked from a real fork server (or started by exec), sampling the trainer's
real `tinker.SamplingClient` from the local Tinker-compatible server through the pickled binding.

Harnesses that hang, crash, hog memory or die after answering live in `worker_harnesses`, imported by the
workers by name.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest

from platoon.envs.resolve import resolve_service
from platoon.gateway import tinker_sdk
from platoon.gateway.core import ModelGateway
from platoon.rollouts.one_rollout import run_member
from platoon.rollouts.workers import RolloutWorkers
from platoon.rollouts.workers.pool import MAX_FORK_SERVERS
from platoon.rollouts.workers.worker import prepared_renderer

from .conftest import (
    BANDIT_SERVICE,
    MODEL,
    RENDERER,
    bandit_entry,
    gone,
    make_workers,
    member,
    table_entry,
    table_task,
    wait_for,
)

TELEMETRY = {
    f"rollout_worker_{key}"
    for key in (
        "wall_seconds",
        "launch_seconds",
        "killed",
        "launch_retried",
        "hard_timeout",
        "crashed",
        "oom",
        "launch_failed",
        "startup_seconds",
        "peak_rss_bytes",
    )
}


def _tokens(outcome: Any) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]]:
    return [(i.prompt_tokens, i.sampled_tokens, i.logprobs) for i in outcome.interactions.values()]


def _session_files(workers: RolloutWorkers) -> list[str]:
    assert workers.session is not None
    return sorted(p.name for p in workers.session.iterdir() if not p.name.startswith("forkserver-"))


def _sleepers(where: Path) -> list[int]:
    assert wait_for(lambda: (where / "pids").exists())
    return [int(pid) for pid in (where / "pids").read_text().split()]


# ---------------------------------------------------------------------------------------------------------------
# The body, the binding, the process


def test_a_forked_worker_runs_the_member_body_on_the_pickled_sampling_client(forked, loop, sampler, tmp_path):
    """The bandit through a forked worker gives the same exact tokens as the same body run in process."""
    service = resolve_service(BANDIT_SERVICE)
    task = loop.run_until_complete(service.get_task("train:0"))
    forked.publish(sampler, 1)
    forked.sampling_defaults = {"seed": 11, "max_tokens": 4}  # the same draws in both modes
    try:
        request = member(
            bandit_entry(), task, task_id="bandit::train:0", rollout_number=2, output_dir=tmp_path / "r"
        )
        readiness: list[str] = []
        outcome = loop.run_until_complete(
            forked.run(request, scope="train", on_ready=lambda: readiness.append("ready"))
        )
    finally:
        forked.sampling_defaults = {}
    assert outcome.disposition == "completed", outcome.error
    assert outcome.status == "scored" and outcome.reward_key is not None
    assert outcome.version == 1 and readiness == ["ready"]
    assert outcome.collection is not None and outcome.observed
    steps = [s.misc["action_misc"]["completion_id"] for s in outcome.collection.root.steps]
    assert steps == list(outcome.interactions)  # every recorded step has its exact tokens

    gateway = ModelGateway(
        sampler,
        prepared_renderer(MODEL, RENDERER, {}),
        model_name=MODEL,
        seed=11,
        max_tokens=4,
        sample_timeout_seconds=60,
    )
    in_process = loop.run_until_complete(
        run_member(member(bandit_entry(), task), service=service, gateway=gateway, version=lambda: 1)
    )
    assert _tokens(outcome) == _tokens(in_process)
    assert outcome.collection.root.reward == in_process.collection.root.reward

    assert set(outcome.telemetry) >= TELEMETRY
    assert (
        outcome.telemetry["rollout_worker_killed"] == 0 and outcome.telemetry["rollout_worker_crashed"] == 0
    )
    assert (
        outcome.telemetry["rollout_worker_startup_seconds"] > 0
    )  # measured, not bounded: a busy machine is slower
    assert outcome.telemetry["rollout_worker_peak_rss_bytes"] > 0
    # the member files are the worker's; its log is under the run's rollouts; the scratch dir holds no leftovers
    assert (tmp_path / "r" / "trajectory_collection.json").is_file()
    logs = list((forked.run_dir / "rollouts" / "train" / "1" / "workers").glob("bandit_train_0-r2-*.log"))
    assert len(logs) == 1 and "started in" in logs[0].read_text()
    assert _session_files(forked) == ["model_binding.pkl"]
    assert stat.S_IMODE((forked.session / "model_binding.pkl").stat().st_mode) == 0o600
    assert not list((forked.scratch / "workers").glob("worker-*"))


def test_a_worker_follows_the_binding_and_reports_the_oldest_version_it_sampled(
    forked, loop, sampler, service_client, tmp_path
):
    forked.publish(sampler, 1)
    request = member(table_entry("follow", dir=str(tmp_path)), table_task())
    running = loop.create_task(forked.run(request, scope="train"))
    assert loop.run_until_complete(_until(lambda: (tmp_path / "first").exists()))
    assert forked.binding_path.exists()
    forked.binding_path.write_bytes(b"not a binding")  # a torn publication: the worker keeps version 1 ...
    loop.run_until_complete(asyncio.sleep(0.05))
    forked.publish(
        tinker_sdk.made(service_client.create_sampling_client(base_model=MODEL)), 2
    )  # ... and then follows version 2
    (tmp_path / "go").write_text("")
    outcome = loop.run_until_complete(running)
    assert outcome.disposition == "completed", outcome.error
    assert len(outcome.interactions) == 2
    assert outcome.version == 1  # the oldest version sampled
    log = _log_of(forked, 1, "t-r0-")
    assert "following the sampling client of policy version 2 (was 1)" in log
    # a later member samples only version 2 (its bootstrap copy is already version 2)
    later = loop.run_until_complete(forked.run(member(table_entry("chat"), table_task()), scope="train"))
    assert later.disposition == "completed" and later.version == 2
    forked.publish(sampler, 1)


async def _until(condition: Any, seconds: float = 20.0) -> bool:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return True
        await asyncio.sleep(0.02)
    return bool(condition())


def _log_of(workers: RolloutWorkers, version: int, prefix: str) -> str:
    logs = sorted(
        (workers.run_dir / "rollouts" / "train" / str(version) / "workers").glob(f"{prefix}*.log"),
        key=lambda p: p.stat().st_mtime,
    )
    return logs[-1].read_text()


def test_a_forked_worker_is_its_own_session_with_the_worker_environment(forked, loop, tmp_path, monkeypatch):
    # the trainer's environment of the moment travels with each fork (a changed cwd would start a new server)
    monkeypatch.setenv("TINKER_SUBPROCESS_SAMPLING", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    for n in (1, 2):
        outcome = loop.run_until_complete(
            forked.run(member(table_entry("inspect", dir=str(tmp_path), n=n), table_task()), scope="train")
        )
        assert outcome.disposition == "completed", outcome.error
    first, second = (json.loads((tmp_path / f"facts-{n}.json").read_text()) for n in (1, 2))
    env = first["env"]
    assert first["sid"] == first["pid"] == first["pgid"]
    assert first["stdin"] == "/dev/null" and first["stdout"].endswith(".log")
    assert first["cwd"] == os.getcwd()
    assert env["TINKER_TELEMETRY"] == "0" and env["OMP_NUM_THREADS"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["TOKENIZERS_PARALLELISM"] == "false"
    assert env["PLATOON_TINKER_ROLLOUT_WORKER"] == "1" and env["PLATOON_ROLLOUT_WORKER_DIAG"].endswith(
        ".res.diag"
    )
    assert "TINKER_SUBPROCESS_SAMPLING" not in env
    assert "PLATOON_ROLLOUT_WORKER_STARTUP_BUDGET" not in env  # consumed by the worker
    assert first["random"] != second["random"]  # each forked worker is reseeded


def test_a_forked_workers_harness_never_finds_the_tinker_key_yet_samples(forked, loop, tmp_path, monkeypatch):
    """The key travels only inside the pickled sampling client: a harness reading os.environ (or a shell it
    starts) never sees TINKER_API_KEY, and the worker still samples the trainer's client."""
    monkeypatch.setenv("TINKER_API_KEY", "tml-trainer-secret-key-0123456789")
    outcome = loop.run_until_complete(
        forked.run(member(table_entry("inspect", dir=str(tmp_path), n=7), table_task()), scope="train")
    )
    assert outcome.disposition == "completed", outcome.error
    assert outcome.interactions  # the harness's chat call was sampled
    facts = json.loads((tmp_path / "facts-7.json").read_text())
    assert "TINKER_API_KEY" not in facts["env"]
    assert not any("tml-trainer-secret" in value for value in facts["env"].values())


# ---------------------------------------------------------------------------------------------------------------
# How members fail


def test_a_hanging_harness_hits_its_budget_and_nothing_of_its_groups_survives(forked, loop, tmp_path):
    request = member(table_entry("hang", dir=str(tmp_path)), table_task())
    outcome = loop.run_until_complete(forked.run(request, scope="train", budget_seconds=1.0))
    assert outcome.disposition == "hard_timeout" and outcome.collection is None
    assert "phase rollout" in (outcome.error or "")
    assert outcome.telemetry["rollout_worker_hard_timeout"] == 1
    assert outcome.telemetry["rollout_worker_killed"] == 0  # its own alarm ended it, not the parent
    for pid in _sleepers(tmp_path):  # the sleeper in its group and the one in a session of its own
        assert wait_for(lambda pid=pid: gone(pid), 5), pid


def test_a_worker_that_cannot_act_is_ended_by_the_trainers_deadline(forked, loop, caplog):
    outcome = loop.run_until_complete(
        forked.run(member(table_entry("stop"), table_task()), scope="train", budget_seconds=0.5)
    )
    assert outcome.disposition == "hard_timeout" and "no marker" in (outcome.error or "")
    assert outcome.telemetry["rollout_worker_killed"] == 1
    assert outcome.telemetry["rollout_worker_wall_seconds"] >= 0.5 + 5  # budget + worker_parent_grace_seconds
    assert "passed its deadline without leaving a marker" in caplog.text


def test_a_crashing_worker_is_worker_crashed(forked, loop):
    outcome = loop.run_until_complete(forked.run(member(table_entry("crash"), table_task()), scope="train"))
    assert outcome.disposition == "worker_crashed"
    assert "status -11" in (outcome.error or "")
    assert outcome.telemetry["rollout_worker_crashed"] == 1
    assert outcome.version == 1


def test_a_worker_over_its_rss_limit_is_rollout_worker_oom(forked, loop):
    request = member(table_entry("hog", mebibytes=800), table_task())
    outcome = loop.run_until_complete(forked.run(request, scope="train"))
    assert outcome.disposition == "rollout_worker_oom", outcome.error
    assert "status 87 (phase rss)" in (outcome.error or "")
    assert outcome.telemetry["rollout_worker_oom"] == 1


def test_a_forked_child_sharing_the_workers_pages_is_not_counted_twice(forked, loop):
    """Worker and child each map the worker's pages (over half the 768 MiB limit together with the imported
    stack); the tree holds them once, so the rollout completes."""
    request = member(table_entry("fork_holding", mebibytes=300, seconds=1.5), table_task())
    outcome = loop.run_until_complete(forked.run(request, scope="train"))
    assert outcome.disposition == "completed", outcome.error
    assert outcome.telemetry["rollout_worker_oom"] == 0


def test_cancelling_a_member_kills_its_worker_and_every_group_it_started(forked, loop, tmp_path):
    request = member(table_entry("wait", dir=str(tmp_path)), table_task())
    running = loop.create_task(forked.run(request, scope="train"))
    assert loop.run_until_complete(_until(lambda: (tmp_path / "pids").exists()))
    (worker,) = [live.pid for live in forked._live.values()]
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        loop.run_until_complete(running)
    assert gone(worker)
    for pid in _sleepers(tmp_path):
        assert wait_for(lambda pid=pid: gone(pid), 5), pid
    assert not forked._live and not list((forked.scratch / "workers").glob("worker-*"))
    assert "stopping on request" in _log_of(forked, 1, "t-r0-")  # the graceful stop, not a plain kill


def test_a_response_wins_over_the_kill_that_followed_it(forked, loop):
    outcome = loop.run_until_complete(
        forked.run(member(table_entry("killed_after_response"), table_task()), scope="train")
    )
    assert outcome.disposition == "completed", outcome.error
    assert outcome.collection is not None and len(outcome.interactions) == 1
    assert outcome.telemetry["rollout_worker_crashed"] == 0


def test_a_rollout_that_cannot_start_is_an_error_member_with_the_reason(forked, loop):
    entry = table_entry("chat").model_copy(update={"package": "worker_harnesses_no_such_package"})
    outcome = loop.run_until_complete(forked.run(member(entry, table_task()), scope="train"))
    assert outcome.disposition == "error" and outcome.collection is None
    assert "No module named 'worker_harnesses_no_such_package'" in (outcome.error or "")


def test_plugin_counters_reach_the_outcome_from_the_response_and_from_a_killed_workers_diag(
    forked, loop, tmp_path
):
    entry = table_entry("chat").model_copy(update={"package": "worker_hook_plugin"})
    answered = loop.run_until_complete(forked.run(member(entry, table_task()), scope="train"))
    assert answered.disposition == "completed", answered.error
    assert answered.telemetry["test_hook_cells_started"] == 3.0
    entry = table_entry("hang", dir=str(tmp_path)).model_copy(update={"package": "worker_hook_plugin"})
    killed = loop.run_until_complete(
        forked.run(member(entry, table_task()), scope="train", budget_seconds=1.0)
    )
    assert killed.disposition == "hard_timeout"
    assert killed.telemetry["test_hook_cells_started"] == 3.0  # read back from the diag marker


def test_a_dead_fork_server_is_replaced(forked, loop):
    """The last test of the shared workers: it leaves them without a fork server."""
    server = forked.fork_server
    assert server is not None
    started = forked.fork_servers_started
    os.kill(server.pid, signal.SIGKILL)
    server.process.wait()
    outcome = loop.run_until_complete(forked.run(member(table_entry("chat"), table_task()), scope="train"))
    assert outcome.disposition == "completed", outcome.error
    assert forked.fork_servers_started == started + 1
    assert forked.fork_server is not None and forked.fork_server.pid != server.pid
    # past the fourth fork server, workers start by exec
    forked.fork_servers_started = MAX_FORK_SERVERS
    os.kill(forked.fork_server.pid, signal.SIGKILL)
    forked.fork_server.process.wait()
    outcome = loop.run_until_complete(forked.run(member(table_entry("chat"), table_task()), scope="train"))
    assert outcome.disposition == "completed", outcome.error
    assert forked.fork_server is None and outcome.telemetry["rollout_worker_startup_seconds"] > 0.2


# ---------------------------------------------------------------------------------------------------------------
# Exec starts


@pytest.fixture(scope="module")
def exec_workers(loop, tmp_path_factory, sampler):
    def start(**workflow: Any) -> RolloutWorkers:
        workers = make_workers(tmp_path_factory.mktemp("exec-run"), worker_start_method="exec", **workflow)
        loop.run_until_complete(workers.start())
        workers.publish(sampler, 3)
        started.append(workers)
        return workers

    started: list[RolloutWorkers] = []
    yield start
    for workers in started:
        loop.run_until_complete(workers.close())


def test_an_exec_started_worker_runs_the_member(exec_workers, loop):
    workers = exec_workers()
    assert workers.fork_server is None
    outcome = loop.run_until_complete(workers.run(member(table_entry("chat"), table_task()), scope="eval"))
    assert outcome.disposition == "completed", outcome.error
    assert outcome.version == 3 and len(outcome.interactions) == 1
    assert (
        outcome.telemetry["rollout_worker_startup_seconds"] > 0.2
    )  # an interpreter's start, imports and all
    assert list((workers.run_dir / "rollouts" / "eval" / "3" / "workers").glob("t-r0-*.log"))


def test_an_exec_worker_past_its_startup_budget_is_a_hard_timeout(exec_workers, loop):
    # the package init arms the alarm from the real process start, before tinker is imported
    workers = exec_workers(worker_startup_budget_seconds=0.3, worker_parent_grace_seconds=10)
    outcome = loop.run_until_complete(workers.run(member(table_entry("chat"), table_task()), scope="train"))
    assert outcome.disposition == "hard_timeout"
    assert "phase startup" in (outcome.error or "")
    assert outcome.telemetry["rollout_worker_killed"] == 0


def test_a_launch_refused_by_the_memory_floor_is_retried_once_then_worker_launch_failed(exec_workers, loop):
    workers = exec_workers(worker_mem_available_floor_bytes=1 << 60)
    outcome = loop.run_until_complete(workers.run(member(table_entry("chat"), table_task()), scope="train"))
    assert outcome.disposition == "worker_launch_failed"
    assert "below workflow_config.worker_mem_available_floor_bytes" in (outcome.error or "")
    assert outcome.telemetry["rollout_worker_launch_retried"] == 1
    assert outcome.telemetry["rollout_worker_launch_failed"] == 1
    assert _session_files(workers) == ["model_binding.pkl"]


def test_a_request_of_another_protocol_is_refused_by_the_worker(tmp_path):
    import pickle
    import subprocess
    import sys

    from platoon.rollouts.workers.ipc import WorkerRequest
    from platoon.rollouts.workers.startup import worker_environment

    request = tmp_path / "x.req"
    old = WorkerRequest(1, "x", None, None, None, 300, 300, 0, 2, (), {}, os.getpid(), None)  # type: ignore[arg-type]
    request.write_bytes(pickle.dumps(old))
    diag = tmp_path / "x.res.diag"
    env = worker_environment(os.environ, diag_path=str(diag))
    done = subprocess.run(
        [sys.executable, "-m", "platoon.rollouts.workers.worker", str(request)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "the request speaks worker protocol 1, this worker 2" in done.stderr
    assert not request.exists()  # unlinked on load, readable or not
    assert diag.read_text().startswith("phase=launch")


TRAINER = """
import asyncio, sys
from pathlib import Path
from platoon.config.environments import EnvironmentConfig
from platoon.config_defs import RolloutConfig
from platoon.task import Task
from platoon.config.training import WorkflowConfig
from platoon.rollouts.one_rollout import MemberRequest
from platoon.rollouts.workers import RolloutWorkers
from platoon.rollouts.workers.pool import MAX_FORK_SERVERS
from worker_harnesses import StubSampler

async def main(where):
    workers = RolloutWorkers(
        run_dir=where / "run", workflow=WorkflowConfig(rollout_isolation="process"), model_name="platoon/toy",
        renderer_name="qwen3_instruct", renderer_kwargs={}, context_window_length=None, sample_timeout_seconds=60,
        environment_packages=[], labels={}, services=["table"],
    )
    await workers.start()
    workers.publish(StubSampler(), 1)
    entry = EnvironmentConfig(
        service="table", service_kwargs={"rows": ["x"]}, harness="worker_harnesses:wait",
        harness_options={"dir": str(where)},
    )
    request = MemberRequest(
        task=Task(goal="x", id="0"), task_id="t", label="t", entry=entry, split="train", rollout_number=0,
        rollout_config=RolloutConfig(verbose=False),
    )
    await workers.run(request, scope="train")

asyncio.run(main(Path(sys.argv[1])))
"""


def test_a_trainer_killed_with_sigkill_takes_its_fork_server_workers_and_their_groups_along(
    worker_env, tmp_path
):
    import subprocess
    import sys

    from platoon.rollouts.workers.ipc import is_running, scratch_dir, start_time_of, sweep_orphans

    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(tmp_path)])
    try:
        sleepers = _sleepers_within(tmp_path, 120)
        worker = _worker_of(sleepers[0])
        server = _parent_of(worker)
        identities = [(pid, start_time_of(pid)) for pid in (server, worker, *sleepers)]
        trainer.kill()
        trainer.wait()
        for pid, start in identities:  # parent-death signals: server, then worker, which ends its groups
            assert wait_for(lambda pid=pid, start=start: not is_running(pid, start), 15), pid
    finally:
        trainer.kill()
        trainer.wait()
    scratch = scratch_dir()
    assert sweep_orphans(scratch) == 0  # nothing was left to kill: the records of the dead trainer just go
    assert not any(str(trainer.pid) in p.read_text() for p in (scratch / "workers").glob("*.json"))


def _sleepers_within(where: Path, seconds: float) -> list[int]:
    assert wait_for(lambda: (where / "pids").exists(), seconds)
    return [int(pid) for pid in (where / "pids").read_text().split()]


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[1])


def _worker_of(sleeper: int) -> int:
    return _parent_of(sleeper)
