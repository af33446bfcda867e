"""The unmodified tinker 0.16.1 SDK against the local server with the real backend: training, sampling, checkpoints."""

from __future__ import annotations

import functools
from typing import Any

import httpx
import pytest
import tinker
from tinker import types

from platoon.gateway import tinker_sdk
from platoon.gateway.tinker_service import close_session
from platoon.local_server import LocalTinkerServer
from platoon.local_server.backend import ModelBackend

MODEL = "platoon/toy"
PROMPT = [ord(c) for c in "Hello, world"]


def datum(loss_fn: str, tokens: list[int] = PROMPT) -> types.Datum:
    n = len(tokens) - 1
    inputs: dict[str, list[int] | list[float]] = {"target_tokens": tokens[1:]}
    if loss_fn == "cross_entropy":
        inputs["weights"] = [1.0] * n
    else:
        inputs["logprobs"] = [-5.0 + 0.1 * i for i in range(n)]
        inputs["advantages"] = [1.0 if i % 2 else -0.5 for i in range(n)]
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def wire(d: types.Datum) -> dict:
    """A datum as the backend receives it (the parsed JSON the SDK sends)."""
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": d.model_input.to_ints()}]},
        "loss_fn_inputs": {
            k: {"data": v.data, "dtype": v.dtype, "shape": v.shape} for k, v in d.loss_fn_inputs.items()
        },
    }


def logprobs(client: tinker.TrainingClient, d: types.Datum) -> list[float]:
    out = client.forward([d], "cross_entropy").result()
    return list(out.loss_fn_outputs[0]["logprobs"].data)


def test_training_client_reports_the_model_and_a_local_tokenizer(server, service):
    client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL, rank=8))
    info = client.get_info()
    assert info.model_id.endswith(":train:0") or ":train:" in info.model_id
    assert info.model_data.model_name == MODEL
    assert info.model_data.arch == "qwen3"
    assert info.is_lora and info.lora_rank == 8
    tokenizer = client.get_tokenizer()  # the SDK's own loader, offline, from model_data.tokenizer_id
    assert tokenizer.encode("Hi", add_special_tokens=False) == [ord("H"), ord("i")]
    if tinker_sdk.futures_sdk():  # 0.38 asks it of a RestClient, which needs no session
        rest = tinker_sdk.rest_client(service, api_key=server.api_key, base_url=server.base_url)
        caps = rest.get_server_capabilities().result()
    else:
        caps = service.get_server_capabilities()
    assert [m.model_name for m in caps.supported_models] == [MODEL]


def test_get_info_reports_the_recorded_lora_settings_as_docs_local_server_md_says(service):
    # LoRA is recorded, not applied (every weight trains: test_backend's AdamW test), yet get_info reports it as
    # the SDK expects of a LoRA client; the note saying so does not survive the SDK's GetInfoResponse.
    info = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL)).get_info()
    assert (info.is_lora, info.lora_rank) == (True, 32)
    assert getattr(info.model_data, "note", None) is None


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling", "ppo", "cispo"])
def test_forward_backward_matches_the_backend(service, loss_fn):
    client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL))
    config = {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5} if loss_fn in ("ppo", "cispo") else None
    d = datum(loss_fn)
    out = client.forward_backward([d, d], loss_fn, config).result()
    # a fresh backend of the same name has the same weights (seeded from the name)
    reference = ModelBackend.create(MODEL).forward_backward([wire(d), wire(d)], loss_fn, config)
    assert out.loss_fn_output_type == "ArrayRecord"
    assert out.metrics["loss:sum"] == pytest.approx(reference["metrics"]["loss:sum"], rel=1e-5, abs=1e-5)
    got = out.loss_fn_outputs[1]["logprobs"].data
    assert got == pytest.approx(reference["loss_fn_outputs"][1]["logprobs"]["data"], abs=1e-5)
    assert len(got) == len(PROMPT) - 1


def test_optim_step_changes_the_weights(service):
    client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL))
    d = datum("cross_entropy")
    before = logprobs(client, d)
    client.forward_backward([d], "cross_entropy").result()
    result = client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert isinstance(result, types.OptimStepResponse)
    after = logprobs(client, d)
    assert sum(after) > sum(before) + 1e-3  # one step of cross-entropy on d makes d likelier


def test_sampling_is_deterministic_under_a_seed_and_returns_logprobs(service):
    client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL))
    sampler = tinker_sdk.made(client.save_weights_and_get_sampling_client())
    prompt = types.ModelInput.from_ints(PROMPT)
    params = types.SamplingParams(max_tokens=8, seed=1234, temperature=1.0)
    first = sampler.sample(prompt, num_samples=3, sampling_params=params).result()
    second = sampler.sample(prompt, num_samples=3, sampling_params=params).result()
    assert [s.tokens for s in first.sequences] == [s.tokens for s in second.sequences]
    assert [s.logprobs for s in first.sequences] == [s.logprobs for s in second.sequences]
    for seq in first.sequences:
        assert seq.logprobs is not None and len(seq.logprobs) == len(seq.tokens)
        assert all(lp <= 0 for lp in seq.logprobs)
    computed = sampler.compute_logprobs(prompt).result()
    assert computed[0] is None and len(computed) == len(PROMPT)
    # the sampler's logprobs agree with the trainer's (on-policy ratios of 1)
    trained = logprobs(client, datum("cross_entropy", PROMPT))
    assert computed[1:] == pytest.approx(trained, abs=1e-4)
    assert sampler.get_base_model() == MODEL


def test_base_model_sampler_shares_the_initial_weights(service):
    client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL))
    base = tinker_sdk.made(service.create_sampling_client(base_model=MODEL))
    computed = base.compute_logprobs(types.ModelInput.from_ints(PROMPT)).result()
    assert computed[1:] == pytest.approx(logprobs(client, datum("cross_entropy")), abs=1e-4)


def test_checkpoints_survive_a_restart_and_can_be_deleted(tmp_path, request):
    d = datum("cross_entropy")
    with LocalTinkerServer(state_dir=tmp_path) as first:
        service = tinker.ServiceClient(base_url=first.base_url, api_key=first.api_key)
        request.addfinalizer(functools.partial(close_session, service))
        client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL))
        client.forward_backward([d], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        state = client.save_state("step-1").result().path
        weights = client.save_weights_for_sampler("step-1").result().path
        trained = logprobs(client, d)
        client.forward_backward([d], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        stepped = logprobs(client, d)
        assert stepped != pytest.approx(trained, abs=1e-6)
        # round trip in one process
        reloaded = tinker_sdk.made(service.create_training_client_from_state(state))
        assert logprobs(reloaded, d) == pytest.approx(trained, abs=1e-6)
    assert state == f"tinker://{client.model_id}/weights/step-1"
    assert weights == f"tinker://{client.model_id}/sampler_weights/step-1"

    with LocalTinkerServer(state_dir=tmp_path) as second:
        service = tinker.ServiceClient(base_url=second.base_url, api_key=second.api_key)
        request.addfinalizer(functools.partial(close_session, service))
        resumed = tinker_sdk.made(service.create_training_client_from_state_with_optimizer(state))
        assert logprobs(resumed, d) == pytest.approx(trained, abs=1e-6)
        # the optimizer moments came back too: the next step is the one the first server took
        resumed.forward_backward([d], "cross_entropy").result()
        resumed.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        assert logprobs(resumed, d) == pytest.approx(stepped, abs=1e-5)
        sampler = tinker_sdk.made(service.create_sampling_client(model_path=weights))
        computed = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT)).result()
        assert computed[1:] == pytest.approx(trained, abs=1e-4)

        rest = tinker_sdk.rest_client(service, api_key=second.api_key, base_url=second.base_url)
        listed = rest.list_checkpoints(client.model_id).result().checkpoints
        assert {c.tinker_path for c in listed} == {state, weights}
        rest.delete_checkpoint_from_tinker_path(weights).result()
        assert [c.tinker_path for c in rest.list_checkpoints(client.model_id).result().checkpoints] == [state]
        with pytest.raises(tinker.NotFoundError):
            rest.delete_checkpoint_from_tinker_path(weights).result()
        with pytest.raises(tinker.NotFoundError):
            tinker_sdk.made(service.create_sampling_client(model_path=weights))


def test_bad_requests_get_the_sdk_error_without_retries(service, monkeypatch):
    client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL))
    # Every request the SDK sends from here on, by its last path segment (the SDK sends on its own thread).
    sent: list[str] = []
    send = httpx.AsyncClient.send

    async def counting(self: httpx.AsyncClient, request: httpx.Request, *args: Any, **kwargs: Any) -> Any:
        sent.append(request.url.path.rsplit("/", 1)[-1])
        return await send(self, request, *args, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "send", counting)
    with pytest.raises(tinker.BadRequestError, match="unknown loss_fn 'dro'"):
        client.forward_backward([datum("cross_entropy")], "dro").result()
    with pytest.raises(tinker.RequestFailedError, match="outside the vocabulary"):
        client.forward_backward([datum("cross_entropy", [1, 2, 99999])], "cross_entropy").result()
    with pytest.raises(tinker.NotFoundError, match=r"unknown base model 'platoon/nothing'"):
        tinker_sdk.made(service.create_lora_training_client(base_model="platoon/nothing"))
    with pytest.raises(tinker.NotFoundError):
        absent = f"tinker://{client.model_id}/sampler_weights/absent"
        tinker_sdk.made(service.create_sampling_client(model_path=absent))
    # each bad request was sent once: its error is one the SDK does not retry (polls of a future and heartbeats aside)
    submitted = [name for name in sent if name not in ("retrieve_future", "session_heartbeat")]
    assert submitted == ["forward_backward", "forward_backward", "create_model", "create_sampling_session"]
    # the model still works after its bad requests
    assert logprobs(client, datum("cross_entropy"))
