"""The local server takes only the key it issued: anyone else who reaches its port (an agent in a sandbox, with a
made-up `tml-` key) can neither sample, nor train, nor save, load or delete weights. The real SDK is told so in
one line, and the issued key keeps working."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import tinker
from fake_backend import BigramBackend
from tinker import types

from platoon.gateway import tinker_sdk
from platoon.gateway.tinker_service import close_session
from platoon.local_server import LocalTinkerServer, check_api_key, issue_api_key
from platoon.local_server.app import build_app

MODEL = "platoon/toy"
TIMEOUT = 60  # a hang guard only


class CountingBackend(BigramBackend):
    """Records what reached the model: a refused request must never get there."""

    calls: list[str] = []

    def optim_step(self, adam_params: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("optim_step")
        return super().optim_step(adam_params)

    def sample(self, prompt_tokens: list[int], **kwargs: Any) -> dict[str, Any]:
        self.calls.append("sample")
        return super().sample(prompt_tokens, **kwargs)

    def save(self, path: str, *, with_optimizer: bool) -> None:
        self.calls.append("save")
        super().save(path, with_optimizer=with_optimizer)

    def load(self, path: str, *, with_optimizer: bool) -> None:
        self.calls.append("load")
        super().load(path, with_optimizer=with_optimizer)


@dataclass
class Served:
    server: LocalTinkerServer
    service: Any
    training: Any
    sampler_id: str
    checkpoint: str  # tinker://<run>/weights/kept

    @property
    def run_id(self) -> str:
        return self.checkpoint.removeprefix("tinker://").split("/", 1)[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server with a model, a saved checkpoint and a sampling session, all made with the issued key."""
    server = LocalTinkerServer(
        state_dir=tmp_path_factory.mktemp("keys"), backend_factory=CountingBackend.create
    )
    with server:
        service = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
        try:
            training = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL, rank=8))
            checkpoint = training.save_state("kept").result().path
            session = httpx.post(
                f"{server.base_url}/api/v1/create_sampling_session",
                json={"session_id": "s", "sampling_session_seq_id": 0, "base_model": MODEL},
                headers={"X-API-Key": server.api_key},
                timeout=TIMEOUT,
            )
            assert session.status_code == 200, session.text
            yield Served(server, service, training, session.json()["sampling_session_id"], checkpoint)
        finally:
            close_session(service)


def _rest(served: Served) -> Any:
    """A REST client of the issued key, in the form platoon makes it on the installed SDK."""
    return tinker_sdk.rest_client(
        served.service, api_key=served.server.api_key, base_url=served.server.base_url
    )


def operations(served: Served) -> dict[str, tuple[str, str, dict[str, Any] | None]]:
    """What an intruder would send, shaped as the SDK sends it: (method, path, JSON body)."""
    model_id = served.training.model_id
    checkpoint_id = served.checkpoint.split("/", 3)[3]
    return {
        "sample": (
            "POST",
            "/asample",
            {
                "sampling_session_id": served.sampler_id,
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": [72, 105]}]},
                "num_samples": 1,
                "sampling_params": {"max_tokens": 4},
            },
        ),
        "optim_step": (
            "POST",
            "/optim_step",
            {"model_id": model_id, "seq_id": 1000, "adam_params": {"learning_rate": 0.5}},
        ),
        "save": ("POST", "/save_weights", {"model_id": model_id, "seq_id": 1001, "path": "stolen"}),
        "load": (
            "POST",
            "/load_weights",
            {"model_id": model_id, "seq_id": 1002, "path": served.checkpoint, "optimizer": True},
        ),
        "delete": ("DELETE", f"/training_runs/{served.run_id}/checkpoints/{checkpoint_id}", None),
    }


REFUSED_KEYS = {
    "no key": None,
    "not a tml- key": "sk-not-a-tinker-key",
    "a made-up tml- key": "tml-made-up",
    "another server's key": issue_api_key(),
}


@pytest.mark.parametrize("key", REFUSED_KEYS.values(), ids=REFUSED_KEYS.keys())
def test_a_key_the_server_did_not_issue_is_refused_on_every_operation(served, key):
    CountingBackend.calls.clear()
    headers = {} if key is None else {"X-API-Key": key}
    for name, (method, path, body) in operations(served).items():
        answer = httpx.request(
            method, f"{served.server.base_url}/api/v1{path}", json=body, headers=headers, timeout=TIMEOUT
        )
        assert answer.status_code == 401, (name, answer.text)
        message = answer.json()["error"]
        assert "\n" not in message
        expected = "no API key" if key is None else "this API key was not issued by this local server"
        assert message.startswith(expected), (name, message)
    assert CountingBackend.calls == [], "a refused request reached the model"
    # the checkpoint is still there, and nothing was saved under the intruder's name
    rest = _rest(served)
    saved = [c.checkpoint_id for c in rest.list_checkpoints(served.run_id).result().checkpoints]
    assert saved == ["weights/kept"]


def test_the_sdk_reports_a_refused_key_in_one_line(served):
    with pytest.raises(tinker.AuthenticationError) as refused:
        # SDK 0.16 opens its session as the client is made, 0.38 at the client's first call
        service = tinker.ServiceClient(base_url=served.server.base_url, api_key="tml-made-up")
        tinker_sdk.made(service.create_sampling_client(base_model=MODEL))
    assert refused.value.status_code == 401
    assert "this API key was not issued by this local server" in str(refused.value)


def test_the_issued_key_samples_trains_saves_loads_and_deletes(served):
    CountingBackend.calls.clear()
    training, rest = served.training, _rest(served)
    sampler = tinker_sdk.made(served.service.create_sampling_client(base_model=MODEL))
    prompt = types.ModelInput.from_ints([72, 105])
    sampled = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=3)).result()
    assert len(sampled.sequences[0].tokens) <= 3
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    extra = training.save_state("extra").result().path
    tinker_sdk.made(served.service.create_training_client_from_state(extra))
    rest.delete_checkpoint_from_tinker_path(extra).result()
    assert CountingBackend.calls == ["sample", "optim_step", "save", "load"]
    saved = [c.checkpoint_id for c in rest.list_checkpoints(served.run_id).result().checkpoints]
    assert saved == ["weights/kept"]


def test_every_route_but_the_health_check_takes_only_the_issued_key(served):
    """Not only the operations above: a route added later is refused too, before its handler runs."""
    server = served.server
    assert server.state is not None
    routes = build_app(server.state).routes
    checked = 0
    for route in routes:
        path = route.path.replace("{checkpoint_id:path}", "weights/kept")  # type: ignore[attr-defined]
        path = path.replace("{run_id}", served.run_id).replace("{sampler_id}", served.sampler_id)
        for method in sorted(route.methods - {"HEAD"}):  # type: ignore[attr-defined]
            answer = httpx.request(
                method, f"{server.base_url}{path}", headers={"X-API-Key": "tml-made-up"}, timeout=TIMEOUT
            )
            if path.endswith("/healthz"):
                assert answer.status_code == 200
            else:
                assert answer.status_code == 401, (method, path, answer.text)
                checked += 1
    assert checked > 20


def test_a_given_key_must_be_long_enough_and_start_with_tml():
    assert check_api_key("tml-0123456789abcdef") == "tml-0123456789abcdef"
    for weak in ("tml-short", "sk-0123456789abcdef0123", "tml-0123456789abcdef with space"):
        with pytest.raises(Exception) as refused:
            LocalTinkerServer(api_key=weak)
        assert getattr(refused.value, "exit_code", None) == 78
    assert issue_api_key() != issue_api_key()
