"""Routing ids in process isolation: the local server sends none (it has no expert routing to replay), which is
not a warning; a worker that loses the ids a service does send is one `platoon:` line, once.

Real rollout workers forked from a real fork server sample the local server through the pickled SamplingClient.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tinker

from platoon.config.environments import EnvironmentConfig
from platoon.config.training import WorkflowConfig
from platoon.config_defs import RolloutConfig
from platoon.envs.resolve import resolve_service
from platoon.gateway import tinker_sdk
from platoon.local_server import LocalTinkerServer
from platoon.local_server.backend import ModelBackend
from platoon.rollouts.one_rollout import MemberRequest
from platoon.rollouts.workers import RolloutWorkers

MODEL = "platoon/toy"
BANDIT_SERVICE = "python://platoon.envs.bandit.env:BanditEnvironment"


class RoutingIdBackend(ModelBackend):
    """The real backend; while `send_ids` is set its samples carry a routing id, as a mixture-of-experts service's."""

    send_ids = False

    def sampler(self) -> ModelBackend:
        frozen = super().sampler()
        frozen.__class__ = RoutingIdBackend
        return frozen

    def sample(self, prompt_tokens: list[int], **kwargs: Any) -> dict[str, Any]:
        out = super().sample(prompt_tokens, **kwargs)
        if RoutingIdBackend.send_ids:
            for number, sequence in enumerate(out["sequences"]):
                sequence["routing_id"] = str(7000 + number)
        return out


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    running = asyncio.new_event_loop()
    yield running
    running.close()


@pytest.fixture(scope="module")
def workers(
    tmp_path_factory: pytest.TempPathFactory, loop: asyncio.AbstractEventLoop
) -> Iterator[RolloutWorkers]:
    """Fork-server workers on a local server with the routing-id backend."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PLATOON_NODE_SCRATCH", str(tmp_path_factory.mktemp("scratch")))
        patch.setenv("TINKER_TELEMETRY", "0")
        patch.setenv("HF_HUB_OFFLINE", "1")
        server = LocalTinkerServer(
            state_dir=tmp_path_factory.mktemp("state"), backend_factory=RoutingIdBackend.create
        )
        with server:
            service = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
            pool = RolloutWorkers(
                run_dir=tmp_path_factory.mktemp("run"),
                workflow=WorkflowConfig(rollout_isolation="process"),
                model_name=MODEL,
                renderer_name="qwen3_instruct",
                renderer_kwargs={},
                context_window_length=None,
                sample_timeout_seconds=60.0,
                environment_packages=["platoon.envs.bandit.env"],
                labels={},
                services=(BANDIT_SERVICE,),
            )
            try:
                loop.run_until_complete(pool.start())
                pool.publish(tinker_sdk.made(service.create_sampling_client(base_model=MODEL)), 1)
                yield pool
            finally:
                loop.run_until_complete(pool.close())
                service.holder.close()
                RoutingIdBackend.send_ids = False


def rollout(workers: RolloutWorkers, loop: asyncio.AbstractEventLoop, output: Path) -> Any:
    task = loop.run_until_complete(resolve_service(BANDIT_SERVICE).get_task("train:0"))
    request = MemberRequest(
        task=task,
        task_id="bandit::train:0",
        label="test",
        entry=EnvironmentConfig(
            service=BANDIT_SERVICE, harness="platoon-bandit-answer", agents={"max_depth": 0}
        ),
        split="train",
        rollout_number=0,
        rollout_config=RolloutConfig(verbose=False, model_name=MODEL, return_dict=True, train=True),
        output_dir=str(output),
    )
    outcome = loop.run_until_complete(workers.run(request, scope="train"))
    assert outcome.disposition == "completed", outcome.error
    return outcome


def routing_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "routing ids" in r.getMessage()]


def test_a_service_that_sends_no_routing_ids_is_not_warned_about(workers, loop, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    outcome = rollout(workers, loop, tmp_path / "a")
    assert outcome.telemetry["rollout_worker_routing_id_coverage"] == 0  # recorded, not warned
    assert routing_warnings(caplog) == []
    unprefixed = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("platoon") and not r.getMessage().startswith("platoon: ")
    ]
    assert unprefixed == []


def _responses_keep_undeclared_fields() -> bool:
    from pydantic import BaseModel

    return issubclass(tinker.SampleResponse, BaseModel)


@pytest.mark.skipif(
    not _responses_keep_undeclared_fields(),
    reason="this SDK decodes samples into dataclasses, which carry no routing id (CI runs this with SDK 0.16.1)",
)
def test_routing_ids_lost_by_a_worker_are_one_prefixed_line_once(workers, loop, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    RoutingIdBackend.send_ids = True
    with_ids = rollout(workers, loop, tmp_path / "a")
    assert with_ids.telemetry["rollout_worker_routing_id_coverage"] == 1
    assert {i.routing_id for i in with_ids.interactions.values()} == {"7000"}
    # the service goes on sending ids, but these workers' samples arrive without (as with the patch not in effect)
    RoutingIdBackend.send_ids = False
    for attempt in range(2):
        assert (
            rollout(workers, loop, tmp_path / f"b{attempt}").telemetry["rollout_worker_routing_id_coverage"]
            == 0
        )
    [warning] = routing_warnings(caplog)
    assert warning.startswith("platoon: routing ids are missing from 100% of a rollout worker's samples")
    assert "\n" not in warning
