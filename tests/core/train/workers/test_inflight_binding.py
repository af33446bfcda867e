"""A rollout worker's sampler under in-flight sampling, with the real SDK against the local server: it keeps the
in-flight client its rollout started with while the trainer publishes new weights, and records each sample's range
of versions, up to the newest the trainer announced when the sample came back."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

from platoon.rollouts.inflight import SampledCall
from platoon.rollouts.workers.binding import FollowingSampler, binding_newest, publish_binding

MODEL = "platoon/toy"


def _prompt() -> Any:
    import tinker

    return tinker.ModelInput.from_ints([72, 105, 33])


def _params() -> Any:
    import tinker

    return tinker.SamplingParams(max_tokens=2, temperature=1.0, seed=5)


def test_an_inflight_worker_keeps_its_client_and_records_what_each_sample_may_have_run_on(
    tinker_server: Any, tmp_path: Path
) -> None:
    import tinker

    if "kind" not in inspect.signature(tinker.TrainingClient.save_weights_and_get_sampling_client).parameters:
        pytest.skip("this Tinker SDK has no in-flight sampling (the trainer refuses the option with it)")
    service = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.api_key)
    try:
        _check(tinker_server, service, tmp_path)
    finally:
        # SDK 0.38's close() only schedules the session's end; wait for it, so no heartbeat outlives the test.
        holder = service.holder
        asyncio.run_coroutine_threadsafe(holder.aclose(), holder.get_loop()).result(30)


def _check(tinker_server: Any, service: Any, tmp_path: Path) -> None:
    from platoon.gateway import tinker_sdk
    from platoon.local_server.inflight import InflightSampler

    training = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL, rank=4))
    started_with = tinker_sdk.made(training.save_weights_and_get_sampling_client(kind="inflight"))
    path = tmp_path / "model_binding.pkl"
    blob = publish_binding(path, started_with, 0, inflight=True)
    sampler = FollowingSampler(path, client=started_with, version=0, poll_seconds=0.0)
    sampler.follow_inflight(binding_newest(blob))

    async def sample() -> Any:
        return await sampler.sample_async(prompt=_prompt(), num_samples=1, sampling_params=_params())

    first = asyncio.run(sample())
    # The trainer announces version 1, publishes its weights in flight, and hands out the newer client.
    publish_binding(path, started_with, 0, newest=1, inflight=True)
    newer = tinker_sdk.made(training.save_weights_and_get_sampling_client(kind="inflight"))
    publish_binding(path, newer, 1, inflight=True)
    second = asyncio.run(sample())

    ids = [tuple(seq.sequence_id for seq in response.sequences) for response in (first, second)]
    assert sampler.calls == [SampledCall(0, 0, ids[0]), SampledCall(0, 1, ids[1])]
    assert sampler.version == 0 and sampler.reloads == 0  # the rollout kept its client
    # On the server, the session the rollout started with answered both, on the first and then the second weights.
    session = tinker_server.state.samplers[started_with._sampling_session_id].backend
    assert isinstance(session, InflightSampler)
    assert session.served == [1, 2]
    found = tinker_server.state.sample_versions.lookup([ids[0][0], ids[1][0]])
    assert found == {ids[0][0]: [1], ids[1][0]: [2]}
