"""The wire rules at the HTTP level, with a bigram fake backend that counts its calls."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fake_backend import BigramBackend

from platoon.local_server import LocalTinkerServer


class CountingBackend(BigramBackend):
    """Counts gradient applications; `gate`, when set, holds forward_backward until released."""

    gate: threading.Event | None = None

    def __init__(self, base_model: str, seed: int) -> None:
        super().__init__(base_model, seed)
        self.calls = {"forward_backward": 0, "optim_step": 0}

    def forward_backward(
        self, data: list[dict[str, Any]], loss_fn: str, loss_fn_config: dict[str, Any] | None
    ) -> dict[str, Any]:
        if CountingBackend.gate is not None:
            CountingBackend.gate.wait(10)
        self.calls["forward_backward"] += 1
        out = super().forward_backward(data, loss_fn, loss_fn_config)
        return {
            **out,
            "metrics": {**out["metrics"], "tokens": 3.0},
        }  # a key without ':' (repaired by the server)

    def optim_step(self, adam_params: dict[str, Any]) -> dict[str, Any]:
        self.calls["optim_step"] += 1
        self.last_adam = adam_params
        return super().optim_step(adam_params)


@pytest.fixture
def fake(tmp_path) -> Iterator[LocalTinkerServer]:
    server = LocalTinkerServer(
        state_dir=tmp_path, backend_factory=CountingBackend.create, long_poll_seconds=0.3
    )
    with server:
        yield server
    CountingBackend.gate = None


def post(server: LocalTinkerServer, path: str, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/api/v1/{path}",
        json=body,
        headers={"X-API-Key": server.api_key, **headers},
        timeout=30,
    )


def result(server: LocalTinkerServer, request_id: str) -> dict[str, Any]:
    for _ in range(100):
        response = post(server, "retrieve_future", {"request_id": request_id, "allow_metadata_only": True})
        if response.status_code != 408:
            assert response.status_code == 200, response.text
            return response.json()
    raise AssertionError("no result")


def new_model(server: LocalTinkerServer) -> str:
    session = post(server, "create_session", {"tags": [], "sdk_version": "0.16.1"}).json()["session_id"]
    future = post(
        server, "create_model", {"session_id": session, "model_seq_id": 0, "base_model": "platoon/toy"}
    )
    return result(server, future.json()["request_id"])["model_id"]


# 0.16 leaves out the chunk type and every default
FB: dict[str, Any] = {
    "forward_backward_input": {
        "data": [
            {
                "model_input": {"chunks": [{"tokens": [72, 105, 33]}]},
                "loss_fn_inputs": {
                    "target_tokens": {"data": [105, 33, 10], "dtype": "int64"},
                    "weights": {"data": [1.0, 1.0, 1.0], "dtype": "float32"},
                },
            }
        ],
        "loss_fn": "cross_entropy",
    }
}


def test_a_retried_submission_is_applied_once(fake):
    model_id = new_model(fake)
    backend = fake.state.runs[model_id].backend
    body = {"model_id": model_id, "seq_id": 1, **FB}
    first = post(fake, "forward_backward", body, **{"X-Idempotency-Key": "stainless-python-retry-a"})
    again = post(fake, "forward_backward", body, **{"X-Idempotency-Key": "stainless-python-retry-a"})
    # a retry through execute_with_retries has a new key but the same (model_id, seq_id)
    other_key = post(fake, "forward_backward", body, **{"X-Idempotency-Key": "stainless-python-retry-b"})
    assert first.json()["request_id"] == again.json()["request_id"] == other_key.json()["request_id"]
    out = result(fake, first.json()["request_id"])
    assert set(out["metrics"]) == {"loss:sum", "tokens:mean"}
    step = {"model_id": model_id, "seq_id": 2, "adam_params": {"learning_rate": 0.5}}
    ids = {
        post(fake, "optim_step", step, **{"X-Idempotency-Key": "k"}).json()["request_id"] for _ in range(3)
    }
    assert len(ids) == 1
    assert result(fake, ids.pop()) == {"metrics": {"lr:mean": 0.5}}
    assert backend.calls == {"forward_backward": 1, "optim_step": 1}
    assert backend.last_adam == {
        "learning_rate": 0.5,
        "beta1": 0.9,
        "beta2": 0.95,
        "eps": 1e-12,
        "weight_decay": 0.0,
        "grad_clip_norm": 0.0,
    }
    # the next seq_id is new work
    post(fake, "forward_backward", {**body, "seq_id": 3})
    post(fake, "optim_step", {**step, "seq_id": 4})
    result(fake, post(fake, "optim_step", {**step, "seq_id": 4}).json()["request_id"])
    assert backend.calls == {"forward_backward": 2, "optim_step": 2}


def test_not_ready_is_408_after_a_long_poll_and_order_is_kept(fake):
    model_id = new_model(fake)
    CountingBackend.gate = threading.Event()
    fb = post(fake, "forward_backward", {"model_id": model_id, "seq_id": 1, **FB}).json()["request_id"]
    step = post(fake, "optim_step", {"model_id": model_id, "seq_id": 2, "adam_params": {}}).json()[
        "request_id"
    ]
    started = time.monotonic()
    pending = post(fake, "retrieve_future", {"request_id": step})
    assert pending.status_code == 408 and pending.json()["queue_state"] == "active"
    assert (
        time.monotonic() - started > 0.25
    )  # the poll was held (long_poll_seconds 0.3), not answered at once
    CountingBackend.gate.set()
    assert "metrics" in result(fake, step)
    assert result(fake, fb)["metrics"]["loss:sum"] > 0
    assert post(fake, "retrieve_future", {"request_id": "req-nothing"}).status_code == 410


def test_failures_are_error_bodies_not_500s(fake):
    model_id = new_model(fake)
    bad: dict[str, Any] = {"model_id": model_id, "seq_id": 1, **FB}
    bad["forward_backward_input"] = {
        **FB["forward_backward_input"],
        "data": [
            {**FB["forward_backward_input"]["data"][0], "model_input": {"chunks": [{"tokens": [1, 2, 9999]}]}}
        ],
    }
    answer = result(fake, post(fake, "forward_backward", bad).json()["request_id"])
    assert answer["category"] == "user" and "outside the vocabulary" in answer["error"]
    assert (
        post(fake, "forward_backward", {"model_id": "nobody:train:0", "seq_id": 1, **FB}).status_code == 404
    )
    assert post(fake, "forward_backward", {"model_id": model_id, "seq_id": 2}).status_code == 400
    assert post(fake, "save_weights", {"model_id": model_id, "seq_id": 2, "path": "a/b"}).status_code == 400
    image = {"chunks": [{"type": "image", "data": "", "format": "png"}]}
    assert post(fake, "asample", {"sampling_session_id": "x", "prompt": image}).status_code == 404
    assert httpx.post(f"{fake.base_url}/api/v1/create_session", json={}).status_code == 401
    assert httpx.get(f"{fake.base_url}/api/v1/healthz").json() == {"status": "ok"}


def test_session_stubs_and_0_38_bootstrap_answer(fake):
    session = post(fake, "create_session", {"tags": []}).json()["session_id"]
    assert post(fake, "session_heartbeat", {"session_id": session}).json() == {"type": "session_heartbeat"}
    assert post(fake, "telemetry", {"events": []}).json() == {"status": "accepted"}
    assert post(fake, "client/config", {"sdk_version": "0.38.0"}).json()["pjwt_auth_enabled"] is False
    # an abandoned sample is cancelled on the server (tests/core/local_server/test_inflight.py)
    assert post(fake, "client/dynamic_config", {}).json()["sample_cancel_enabled"] is True
