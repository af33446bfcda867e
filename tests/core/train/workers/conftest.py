"""Rollout-worker fixtures: a real local Tinker server, its SDK sampling client, one event loop per module and
`RolloutWorkers` on it, with this directory importable in the workers (their harnesses live in
`worker_harnesses`) and a private scratch dir.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon.config.environments import EnvironmentConfig
from platoon.config.training import WorkflowConfig
from platoon.config_defs import RolloutConfig
from platoon.rollouts.one_rollout import MemberRequest
from platoon.rollouts.workers import RolloutWorkers
from platoon.rollouts.workers.ipc import is_running
from platoon.task import Task

HERE = Path(__file__).resolve().parent
MODEL = "platoon/toy"
RENDERER = "qwen3_instruct"
BANDIT_SERVICE = "python://platoon.envs.bandit.env:BanditEnvironment"


@pytest.fixture(scope="module")
def worker_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This directory on the workers' import path, a scratch dir of the module's own, SDK telemetry off."""
    scratch = tmp_path_factory.mktemp("scratch")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(HERE))
        previous = os.environ.get("PYTHONPATH")
        patch.setenv("PYTHONPATH", str(HERE) + (os.pathsep + previous if previous else ""))
        patch.setenv("PLATOON_NODE_SCRATCH", str(scratch))
        patch.setenv("TINKER_TELEMETRY", "0")
        patch.setenv("HF_HUB_OFFLINE", "1")
        yield scratch


@pytest.fixture(scope="module")
def tinker_server(worker_env: Path) -> Iterator[Any]:
    from platoon.testing import local_tinker_server

    with local_tinker_server() as server:
        yield server


@pytest.fixture(scope="module")
def service_client(tinker_server: Any) -> Iterator[Any]:
    """An SDK client of the module's server; its session stops heartbeating when the module is done."""
    import tinker

    from platoon.gateway.tinker_service import close_session

    client = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.api_key)
    # SDK 0.38 opens the session at its first use: here, so that no test is taken for its opener
    assert client.holder is not None
    yield client
    close_session(client)


@pytest.fixture(scope="module")
def sampler(service_client: Any) -> Any:
    """The trainer's `SamplingClient` of the base model, which the binding pickles."""
    from platoon.gateway import tinker_sdk

    return tinker_sdk.made(service_client.create_sampling_client(base_model=MODEL))


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for the module: a `RolloutWorkers` (and its fork server's socket) belongs to the loop it
    started on."""
    running = asyncio.new_event_loop()
    yield running
    running.close()


def make_workers(run_dir: Path, *, services: tuple[str, ...] = (), **workflow: Any) -> RolloutWorkers:
    config = WorkflowConfig(rollout_isolation="process", **workflow)
    return RolloutWorkers(
        run_dir=run_dir,
        workflow=config,
        model_name=MODEL,
        renderer_name=RENDERER,
        renderer_kwargs={},
        context_window_length=None,
        sample_timeout_seconds=60.0,
        environment_packages=["platoon.envs.bandit.env"],
        labels={"platoon.run": str(run_dir)},
        services=services,
        monitor_interval_seconds=0.2,
    )


@pytest.fixture(scope="module")
def forked(
    loop: asyncio.AbstractEventLoop, tmp_path_factory: pytest.TempPathFactory, sampler: Any
) -> Iterator[RolloutWorkers]:
    """Fork-server workers shared by the module's tests: bindings re-checked on every sample, a 768 MiB RSS
    limit, short graces."""
    workers = make_workers(
        tmp_path_factory.mktemp("run"),
        services=("table", BANDIT_SERVICE),
        worker_binding_poll_seconds=0,
        worker_rss_soft_limit_bytes=768 << 20,
        worker_termination_grace_seconds=2,
        worker_parent_grace_seconds=5,
    )
    loop.run_until_complete(workers.start())
    workers.publish(sampler, 1)
    yield workers
    loop.run_until_complete(workers.close())


def member(
    entry: EnvironmentConfig,
    task: Task,
    *,
    task_id: str = "t",
    rollout_number: int = 0,
    output_dir: Path | None = None,
    **rollout: Any,
) -> MemberRequest:
    config = RolloutConfig(verbose=False, model_name=MODEL, return_dict=True, train=True, **rollout)
    return MemberRequest(
        task=task,
        task_id=task_id,
        label="test",
        entry=entry,
        split="train",
        rollout_number=rollout_number,
        rollout_config=config,
        output_dir=None if output_dir is None else str(output_dir),
    )


def table_entry(harness: str, **options: Any) -> EnvironmentConfig:
    return EnvironmentConfig(
        service="table",
        service_kwargs={"rows": ["say hi"]},
        harness=f"worker_harnesses:{harness}",
        harness_options=options,
    )


def table_task() -> Task:
    return Task(goal="say hi", id="0")


def bandit_entry() -> EnvironmentConfig:
    return EnvironmentConfig(service=BANDIT_SERVICE, harness="platoon-bandit-answer", agents={"max_depth": 0})


def wait_for(condition: Callable[[], bool], seconds: float = 60.0) -> bool:
    """Poll until `condition()` holds; False after `seconds` (a hang guard, generous for a busy machine)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def gone(pid: int) -> bool:
    return not is_running(pid, None)
