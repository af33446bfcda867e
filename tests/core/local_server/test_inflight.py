"""In-flight sampling and sample cancellation on the local server (real torch backend), at the HTTP level the SDK
speaks: a `kind: inflight` save moves every in-flight session of the model to the new weights, each sample's
version is read back by its sequence ids, and `/cancel_future` stops a queued or running sample."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from platoon.local_server import LocalTinkerServer

#: a sample that runs long enough to be cancelled while it runs: no stop token, thousands of tokens
LONG = {"max_tokens": 20000, "temperature": 1.0, "seed": 3}
SHORT = {"max_tokens": 8, "temperature": 1.0, "seed": 11}
PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [72, 105, 33]}]}


def post(server: LocalTinkerServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/api/v1/{path}", json=body, headers={"X-API-Key": server.api_key}, timeout=60
    )


def result(server: LocalTinkerServer, request_id: str) -> dict[str, Any]:
    for _ in range(200):
        response = post(server, "retrieve_future", {"request_id": request_id})
        if response.status_code != 408:
            assert response.status_code == 200, response.text
            return response.json()
    raise AssertionError("no result")


def new_model(server: LocalTinkerServer) -> tuple[str, str]:
    session = post(server, "create_session", {"tags": [], "sdk_version": "0.38.0"}).json()["session_id"]
    future = post(
        server, "create_model", {"session_id": session, "model_seq_id": 0, "base_model": "platoon/toy"}
    )
    return session, result(server, future.json()["request_id"])["model_id"]


def save_for_sampler(server: LocalTinkerServer, model_id: str, seq: int, **extra: Any) -> str:
    body = {"model_id": model_id, "sampling_session_seq_id": seq, "type": "save_weights_for_sampler", **extra}
    return result(server, post(server, "save_weights_for_sampler", body).json()["request_id"])[
        "sampling_session_id"
    ]


def train_a_step(server: LocalTinkerServer, model_id: str) -> None:
    datum = {
        "model_input": {"chunks": [{"tokens": [72, 105, 33]}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": [105, 33, 10], "dtype": "int64"},
            "weights": {"data": [1.0, 1.0, 1.0], "dtype": "float32"},
        },
    }
    body = {"model_id": model_id, "forward_backward_input": {"data": [datum], "loss_fn": "cross_entropy"}}
    result(server, post(server, "forward_backward", body).json()["request_id"])
    step = {"model_id": model_id, "adam_params": {"learning_rate": 0.05}}
    result(server, post(server, "optim_step", step).json()["request_id"])


def submit_sample(server: LocalTinkerServer, session: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"sampling_session_id": session, "prompt": PROMPT, "num_samples": 1, "sampling_params": params}
    response = post(server, "asample", body)
    assert response.status_code == 200, response.text
    return response.json()


def sample(server: LocalTinkerServer, session: str) -> tuple[list[int], list[int] | None]:
    """(the tokens, the weights versions the server says the sample ran on)."""
    submitted = submit_sample(server, session, SHORT)
    out = result(server, submitted["request_id"])
    (sequence_id,) = submitted["sample_sequence_ids"]
    versions = post(server, "platoon/sample_versions", {"sequence_ids": [sequence_id]}).json()["versions"]
    return out["sequences"][0]["tokens"], versions[sequence_id]


def test_inflight_sessions_follow_every_inflight_save(server):
    _, model_id = new_model(server)
    first = save_for_sampler(server, model_id, 0, kind="inflight")
    snapshot = save_for_sampler(server, model_id, 1)  # the service's default: fixed weights
    before, versions = sample(server, first)
    assert versions == [1]
    snapshot_tokens, snapshot_versions = sample(server, snapshot)
    assert snapshot_tokens == before and snapshot_versions is None  # a snapshot sample has no version

    train_a_step(server, model_id)
    second = save_for_sampler(server, model_id, 2, kind="inflight")

    # The first session was not saved again, yet it samples the new weights, as the second one does.
    after_first, versions_first = sample(server, first)
    after_second, versions_second = sample(server, second)
    assert versions_first == versions_second == [2]
    assert after_first == after_second != before
    # The snapshot session keeps the weights it was saved with.
    assert sample(server, snapshot) == (before, None)


def test_unknown_sequence_ids_have_no_versions(server):
    answer = post(server, "platoon/sample_versions", {"sequence_ids": ["seq-nobody"]})
    assert answer.json() == {"versions": {"seq-nobody": None}}
    assert post(server, "platoon/sample_versions", {"sequence_ids": "seq-1"}).status_code == 400


def wait_running(server: LocalTinkerServer, request_id: str) -> None:
    record = server.state.futures.get(request_id)
    assert record is not None
    for _ in range(2000):
        if record.state != "queued":
            break
        time.sleep(0.01)
    assert record.state == "running"


def test_cancel_future_stops_a_running_sample_and_skips_a_queued_one(server):
    _, model_id = new_model(server)
    session = save_for_sampler(server, model_id, 0, kind="inflight")
    running = submit_sample(server, session, LONG)["request_id"]
    queued = submit_sample(server, session, LONG)["request_id"]
    wait_running(server, running)  # the sample lane runs one request at a time: the second one waits
    assert server.state.futures.get(queued).state == "queued"

    for request_id in (queued, running):  # as the SDK sends it for an abandoned sample
        assert post(server, "cancel_future", {"request_id": request_id}).status_code == 200

    assert result(server, running) == {"error": "the request was cancelled", "category": "user"}
    assert result(server, queued) == {"error": "the request was cancelled", "category": "user"}
    assert server.state.futures.cancelled[-2:] == [queued, running]
    assert server.state.futures.get(running).state == "cancelled"
    assert server.state.futures.get(queued).state == "cancelled"
    # The engine is free: the next sample runs at once (behind nothing), and a cancelled one has no versions.
    tokens, versions = sample(server, session)
    assert len(tokens) == SHORT["max_tokens"] and versions == [1]
    # Cancelling a finished or unknown request changes nothing.
    assert post(server, "cancel_future", {"request_id": running}).status_code == 200
    assert post(server, "cancel_future", {"request_id": "req-unknown"}).status_code == 200
    assert server.state.futures.cancelled[-2:] == [queued, running]


def test_the_sdk_inflight_save_makes_an_inflight_session(server):
    import inspect

    import tinker

    if "kind" not in inspect.signature(tinker.TrainingClient.save_weights_and_get_sampling_client).parameters:
        pytest.skip("this Tinker SDK has no in-flight sampling clients (platoon refuses the option with it)")
    service = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
    try:
        training = service.create_lora_training_client(base_model="platoon/toy", rank=4).result()
        first = training.save_weights_and_get_sampling_client(kind="inflight").result()
        second = training.save_weights_and_get_sampling_client(kind="inflight").result()
        target = server.state.inflight[training.model_id]
        assert target.version == 2
        sessions = [server.state.samplers[client._sampling_session_id] for client in (first, second)]
        assert [session.backend.target for session in sessions] == [target, target]
    finally:
        # SDK 0.38's close() only schedules the session's end; wait for it, so no heartbeat outlives the test.
        holder = service.holder
        asyncio.run_coroutine_threadsafe(holder.aclose(), holder.get_loop()).result(30)
