"""Every Tinker SDK call the trainer and the evaluation make, in the form `platoon.gateway.tinker_sdk` gives it, on
the installed SDK (CI runs this file with both ends of the range, 0.16.1 and 0.38) against the local server: each
one works, and none warns that it is deprecated."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path
from typing import Any

import pytest

from platoon.gateway import tinker_sdk
from platoon.gateway.tinker_service import close_session

MODEL = "platoon/toy"


def _deprecations(caught: list[warnings.WarningMessage]) -> list[str]:
    # The SDK's deprecations are FutureWarnings (0.38: "DEPRECATED: ..."); pydantic's own notes on 0.16's models
    # are the SDK's business, not a call platoon makes.
    return [
        f"{w.category.__name__}: {w.message}"
        for w in caught
        if issubclass(w.category, FutureWarning) or str(w.message).startswith("DEPRECATED")
    ]


async def _every_call(base_url: str, api_key: str) -> dict[str, Any]:
    import tinker

    seen: dict[str, Any] = {}
    service = await asyncio.to_thread(lambda: tinker_sdk.service_client(api_key=api_key, base_url=base_url))
    try:
        training = await tinker_sdk.call(service, "create_lora_training_client", base_model=MODEL, rank=8)
        state = await training.save_state("start").result_async()
        weights = await training.save_weights_for_sampler("start").result_async()
        sampler = await tinker_sdk.call(training, "create_sampling_client", weights.path)
        prompt = tinker.ModelInput.from_ints([1, 2, 3])
        params = tinker.SamplingParams(max_tokens=4, temperature=1.0)
        sampled = await tinker_sdk.sample(sampler, prompt=prompt, num_samples=1, sampling_params=params)
        seen["sampled"] = list(sampled.sequences[0].tokens)
        tokens = [1, 2, 3, *seen["sampled"]]
        datum = tinker.Datum(
            model_input=tinker.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={
                "target_tokens": tinker.TensorData(data=tokens[1:], dtype="int64", shape=[len(tokens) - 1]),
                "weights": tinker.TensorData(
                    data=[1.0] * (len(tokens) - 1), dtype="float32", shape=[len(tokens) - 1]
                ),
            },
        )
        backward = training.forward_backward([datum], "cross_entropy")
        step = training.optim_step(tinker.AdamParams(learning_rate=1e-3))
        seen["loss_outputs"] = len((await backward.result_async()).loss_fn_outputs)
        await step.result_async()
        seen["next_sampler"] = await tinker_sdk.call(training, "save_weights_and_get_sampling_client")
        resumed = await tinker_sdk.call(
            service, "create_training_client_from_state_with_optimizer", state.path
        )
        loaded = await tinker_sdk.call(service, "create_training_client_from_state", state.path)
        seen["resumed"] = (resumed.model_id, loaded.model_id)
        seen["base_sampler"] = await tinker_sdk.call(service, "create_sampling_client", base_model=MODEL)
        delete = tinker_sdk.checkpoint_deleter(service, api_key=api_key, base_url=base_url)
        await delete(weights.path)
        with pytest.raises(Exception) as gone:
            await tinker_sdk.call(training, "create_sampling_client", weights.path)
        seen["deleted"] = gone.value
    finally:
        close_session(service)
    return seen


def test_every_sdk_call_platoon_makes_works_without_a_deprecation_warning(tmp_path: Path) -> None:
    import tinker

    from platoon.testing import local_tinker_server

    with (
        local_tinker_server(state_dir=tmp_path / "state") as server,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        seen = asyncio.run(_every_call(server.base_url, server.api_key))
    assert _deprecations(caught) == [], f"tinker {tinker.__version__}"
    assert 1 <= len(seen["sampled"]) <= 4
    assert seen["loss_outputs"] == 1
    assert isinstance(seen["next_sampler"], tinker.SamplingClient)
    assert isinstance(seen["base_sampler"], tinker.SamplingClient)
    assert all(seen["resumed"])
    # a deleted checkpoint is gone from the server: no sampler can be made of it
    assert "404" in str(seen["deleted"]) or "not found" in str(seen["deleted"]).lower(), seen["deleted"]


def test_the_sdk_release_decides_the_call_form() -> None:
    import tinker

    version = tinker_sdk.sdk_version()
    assert ".".join(map(str, version)) == tinker.__version__
    # the two ends of the range CI installs: 0.16.1 awaits the `_async` twins, 0.38 the plain calls
    assert tinker_sdk.futures_sdk() == (version >= (0, 38))
