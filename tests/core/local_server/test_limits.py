"""What a client can send the local server that would poison it: bad numbers and shapes are 400s naming the field,
bodies are capped (413) and must keep arriving (408), and the server keeps working after each."""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import tinker
from fake_backend import BigramBackend
from tinker import types

from platoon.gateway import tinker_sdk
from platoon.local_server import LocalTinkerServer

MODEL = "platoon/toy"
#: a hang guard only: every answer here comes at once or after the 0.5 s idle limit
HANG_GUARD_SECONDS = 60


class CountingBackend(BigramBackend):
    """Counts what reached the model: a refused request must never get there."""

    def __init__(self, base_model: str, seed: int) -> None:
        super().__init__(base_model, seed)
        self.calls: list[str] = []

    def forward_backward(self, data: list[dict[str, Any]], loss_fn: str, config: Any) -> dict[str, Any]:
        self.calls.append("forward_backward")
        return super().forward_backward(data, loss_fn, config)

    def optim_step(self, adam_params: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("optim_step")
        return super().optim_step(adam_params)

    def sample(self, prompt_tokens: list[int], **kwargs: Any) -> dict[str, Any]:
        self.calls.append("sample")
        return super().sample(prompt_tokens, **kwargs)


@pytest.fixture
def fake(tmp_path) -> Iterator[LocalTinkerServer]:
    server = LocalTinkerServer(
        state_dir=tmp_path,
        backend_factory=CountingBackend.create,
        long_poll_seconds=0.3,
        max_body_bytes=64 << 10,
        body_idle_seconds=0.5,
    )
    with server:
        yield server


@pytest.fixture(scope="module")
def service(server: LocalTinkerServer) -> Iterator[tinker.ServiceClient]:
    """The SDK on the real backend, closed at the end (its session heartbeats until then)."""
    client = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
    # SDK 0.38 opens the session at its first use: here, so that no test is taken for its opener
    assert client.holder is not None
    yield client
    client.holder.close()


def key(server: LocalTinkerServer) -> dict[str, str]:
    """The header carrying the key the server issued (it takes no other)."""
    return {"X-API-Key": server.api_key}


def post(server: LocalTinkerServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/api/v1/{path}", json=body, headers=key(server), timeout=HANG_GUARD_SECONDS
    )


def result(server: LocalTinkerServer, request_id: str) -> dict[str, Any]:
    for _ in range(100):
        response = post(server, "retrieve_future", {"request_id": request_id})
        if response.status_code != 408:
            assert response.status_code == 200, response.text
            return response.json()
    raise AssertionError("no result")


def new_model(server: LocalTinkerServer) -> str:
    session = post(server, "create_session", {"tags": []}).json()["session_id"]
    future = post(server, "create_model", {"session_id": session, "model_seq_id": 0, "base_model": MODEL})
    return result(server, future.json()["request_id"])["model_id"]


def datum(**inputs: Any) -> dict[str, Any]:
    loss_inputs = {
        "target_tokens": {"data": [105, 33, 10], "dtype": "int64"},
        "weights": {"data": [1.0, 1.0, 1.0], "dtype": "float32"},
    }
    loss_inputs.update(inputs)
    return {"model_input": {"chunks": [{"tokens": [72, 105, 33]}]}, "loss_fn_inputs": loss_inputs}


def fb(d: dict[str, Any], loss_fn: str = "cross_entropy") -> dict[str, Any]:
    return {"forward_backward_input": {"data": [d], "loss_fn": loss_fn}}


def raw(server: LocalTinkerServer, request: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.settimeout(HANG_GUARD_SECONDS)
    sock.sendall(request)
    return sock


def read_reply(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    return reply


# -- numbers and shapes


BAD_REQUESTS = [
    ("optim_step", {"adam_params": {"learning_rate": "NaN"}}, "adam_params.learning_rate must be a finite"),
    ("optim_step", {"adam_params": {"learning_rate": 1e30}}, "adam_params.learning_rate must be in [0, 1]"),
    ("optim_step", {"adam_params": {"beta2": 1.0}}, "adam_params.beta2 must be in [0, 1)"),
    ("optim_step", {"adam_params": {"eps": 0}}, "adam_params.eps must be > 0"),
    ("optim_step", {"adam_params": {"weight_decay": -0.1}}, "adam_params.weight_decay must be >= 0"),
    ("optim_step", {"adam_params": {"grad_clip_norm": True}}, "adam_params.grad_clip_norm must be a finite"),
    (
        "forward_backward",
        fb(datum(target_tokens={"data": [105, 33, 10], "dtype": "int64", "shape": [2]})),
        "forward_backward_input.data[0].loss_fn_inputs['target_tokens'].shape is [2]",
    ),
    (
        "forward_backward",
        fb(datum(weights={"data": [1.0, 1.0], "dtype": "float32"})),
        "forward_backward_input.data[0].loss_fn_inputs['weights'] has shape [2], not [3]",
    ),
    (
        "forward_backward",
        fb(datum(weights={"data": [1.0, "x", 1.0], "dtype": "float32"})),
        "loss_fn_inputs['weights'] holds a value that is not a finite number",
    ),
    (
        "forward_backward",
        fb(datum(target_tokens={"data": [105, 33.5, 10], "dtype": "int64"})),
        "loss_fn_inputs['target_tokens'] has dtype int64 but holds a value that is not an integer",
    ),
    (
        "forward_backward",
        fb(datum(), loss_fn="ppo"),
        "forward_backward_input.data[0].loss_fn_inputs lacks 'logprobs'",
    ),
    (
        "forward_backward",
        {"forward_backward_input": {**fb(datum())["forward_backward_input"], "loss_fn_config": {"a": "1"}}},
        "forward_backward_input.loss_fn_config['a'] must be a finite number",
    ),
]

BAD_SAMPLING = [
    ({"max_tokens": "x"}, "sampling_params.max_tokens must be a non-negative integer, got 'x'"),
    ({"max_tokens": -1}, "sampling_params.max_tokens must be a non-negative integer"),
    (
        {"max_tokens": 10_000_000},
        "sampling_params.max_tokens asks for 10000000 tokens, over the local model's context of 32768 tokens",
    ),
    ({"temperature": "NaN"}, "sampling_params.temperature must be a finite number"),
    ({"temperature": -0.5}, "sampling_params.temperature must be >= 0"),
    ({"top_p": 0}, "sampling_params.top_p must be in (0, 1]"),
    ({"top_k": 2.5}, "sampling_params.top_k must be an integer"),
    ({"seed": "s"}, "sampling_params.seed must be an integer"),
    ({"stop": [1, None]}, "sampling_params.stop must be token ids or strings"),
]


def test_bad_numbers_and_shapes_are_400s_naming_the_field_and_never_reach_the_model(fake):
    model_id = new_model(fake)
    backend = fake.state.runs[model_id].backend
    for seq_id, (path, body, message) in enumerate(BAD_REQUESTS, start=1):
        answer = post(fake, path, {"model_id": model_id, "seq_id": seq_id, **body})
        assert answer.status_code == 400, (path, body, answer.text)
        assert message in answer.json()["error"], answer.json()["error"]
    prompt = {"chunks": [{"tokens": [72, 105]}]}
    for params, message in BAD_SAMPLING:
        answer = post(fake, "asample", {"base_model": MODEL, "prompt": prompt, "sampling_params": params})
        assert answer.status_code == 400, (params, answer.text)
        assert message in answer.json()["error"], answer.json()["error"]
    many = post(fake, "asample", {"base_model": MODEL, "prompt": prompt, "num_samples": 1_000_000})
    assert many.status_code == 400, many.text
    assert "num_samples asks for 1000000 sequences; one request may ask for 1024" in many.json()["error"]
    assert backend.calls == []
    # the model and sampling go on as if nothing had been sent
    assert result(
        fake,
        post(fake, "forward_backward", {"model_id": model_id, "seq_id": 99, **fb(datum())}).json()[
            "request_id"
        ],
    )["metrics"]
    sampled = post(
        fake, "asample", {"base_model": MODEL, "prompt": prompt, "sampling_params": {"max_tokens": 2}}
    )
    assert len(result(fake, sampled.json()["request_id"])["sequences"][0]["tokens"]) == 2


def test_a_nan_learning_rate_on_the_wire_is_a_400(fake):
    """JSON has no NaN, but Python's reader takes the bare word: the server refuses it like the string."""
    model_id = new_model(fake)
    body = b'{"model_id": "%s", "seq_id": 1, "adam_params": {"learning_rate": NaN}}' % model_id.encode()
    answer = httpx.post(
        f"{fake.base_url}/api/v1/optim_step",
        content=body,
        headers={**key(fake), "Content-Type": "application/json"},
        timeout=HANG_GUARD_SECONDS,
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == "adam_params.learning_rate must be a finite number, got nan"


@pytest.mark.guarantee(
    "A request that would poison the local server (an out-of-range number)",
    "local server, the tinker SDK",
    "a 400 naming the field; the model keeps training and sampling",
)
def test_an_out_of_range_learning_rate_through_the_sdk_is_refused_and_the_model_still_samples(service):
    """With the real backend: the refused step leaves the weights as they were, so sampling still works."""
    client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL))
    tokens = [ord(c) for c in "Hello, world"]
    example = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    client.forward_backward([example], "cross_entropy").result()
    with pytest.raises(tinker.BadRequestError, match=r"adam_params.learning_rate must be in \[0, 1\]"):
        client.optim_step(types.AdamParams(learning_rate=1e30)).result()
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    sampler = tinker_sdk.made(client.save_weights_and_get_sampling_client())
    out = sampler.sample(
        types.ModelInput.from_ints(tokens[:4]), 2, types.SamplingParams(max_tokens=4, seed=3)
    ).result()
    assert [len(s.tokens) for s in out.sequences] == [4, 4]
    assert all(math.isfinite(lp) for s in out.sequences for lp in s.logprobs or [])


def test_a_non_finite_gradient_is_not_applied(service):
    """Finite but extreme loss inputs can still make the gradient NaN: the step is refused, the weights kept."""
    client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL))
    tokens = [ord(c) for c in "Hello"]
    n = len(tokens) - 1
    extreme = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        # exp(logprob - (-1e30)) overflows: an infinite importance ratio
        loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": [-1e30] * n, "advantages": [1.0] * n},
    )
    before = client.forward([_ce(tokens)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data
    client.forward_backward([extreme], "importance_sampling").result()
    with pytest.raises(tinker.RequestFailedError, match="the accumulated gradient is not finite"):
        client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = client.forward([_ce(tokens)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data
    assert after == before
    # the dropped gradient does not come back in the next step
    client.forward_backward([_ce(tokens)], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    trained = client.forward([_ce(tokens)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data
    assert all(math.isfinite(x) for x in trained) and sum(trained) > sum(before)


def _ce(tokens: list[int]) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


# -- bodies


def test_a_declared_body_over_the_limit_is_413_before_a_byte_of_it_is_read(fake):
    """A 300 MB Content-Length with nothing sent after the headers: the answer cannot have waited for the body."""
    sock = raw(
        fake,
        b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\n" % fake.api_key.encode()
        + b"Content-Type: application/json\r\nContent-Length: 300000000\r\n\r\n",
    )
    with sock:
        reply = read_reply(sock)  # the server closes the connection after its answer
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ")
    assert b"the request body is 300000000 bytes, over the local server's limit of 65536 bytes" in body
    assert fake.state.sessions == {}


def test_a_chunked_body_is_cut_off_at_the_limit(fake):
    """Without a Content-Length the server reads up to the limit and answers then, not at the body's end."""
    piece = b"x" * (16 << 10)
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    sock = raw(
        fake,
        b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\n" % fake.api_key.encode()
        + b"Transfer-Encoding: chunked\r\n\r\n"
        + chunk * 5,  # 80 KiB of an endless body, then silence
    )
    with sock:
        reply = read_reply(sock)
    assert reply.startswith(b"HTTP/1.1 413 ")
    assert b"the request body is over the local server's limit of 65536 bytes" in reply
    assert fake.state.sessions == {}


@pytest.mark.guarantee(
    "A request body over the cap",
    "local server, the tinker SDK",
    "one 413 error; the model keeps working",
)
def test_the_sdk_gets_a_body_over_the_limit_as_one_error_and_the_model_keeps_working(tmp_path):
    server = LocalTinkerServer(
        state_dir=tmp_path, backend_factory=CountingBackend.create, max_body_bytes=32 << 10
    )
    with server:
        service = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
        try:
            client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL))
            tokens = [72, 105] * 2000  # ~50 KB of JSON
            with pytest.raises(
                tinker.APIStatusError, match="over the local server's limit of 32768 bytes"
            ) as caught:
                client.forward_backward([_ce(tokens)], "cross_entropy").result()
            assert caught.value.status_code == 413
            assert client.forward_backward([_ce([72, 105, 33])], "cross_entropy").result().metrics
        finally:
            service.holder.close()


def test_the_sdk_gets_its_413_even_for_a_body_far_past_what_the_socket_buffers_hold(tmp_path):
    """The SDK sends its whole body before it reads the answer: the server keeps its answer for it (dropping the
    rest of the body) rather than closing on the unread body, which the SDK would see as a reset and retry."""
    server = LocalTinkerServer(
        state_dir=tmp_path, backend_factory=CountingBackend.create, max_body_bytes=32 << 10
    )
    with server:
        service = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
        try:
            client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL))
            tokens = [72, 105] * 400_000  # ~8 MB of JSON
            with pytest.raises(tinker.APIStatusError, match="over the local server's limit") as caught:
                client.forward_backward([_ce(tokens)], "cross_entropy").result()
            assert caught.value.status_code == 413
        finally:
            service.holder.close()


def test_a_body_that_stops_arriving_is_answered_408_and_closed(fake):
    """A Content-Length that promises more than is sent: a reply and a closed connection, not a request held forever."""
    sock = raw(
        fake,
        b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\n" % fake.api_key.encode()
        + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    )
    with sock:
        reply = read_reply(sock)
    assert reply.startswith(b"HTTP/1.1 408 ")
    assert b"the request body stopped arriving" in reply
    assert post(fake, "create_session", {}).status_code == 200


# -- nesting, context and base models


def create_session_with_tags(server: LocalTinkerServer, tags: bytes) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/api/v1/create_session",
        content=b'{"tags": ' + tags + b"}",
        headers={**key(server), "Content-Type": "application/json"},
        timeout=HANG_GUARD_SECONDS,
    )


def test_json_nested_past_the_cap_is_one_400_line_with_no_traceback(fake, caplog):
    """64 levels are taken; one more is refused, and so is nesting past the interpreter's own recursion limit,
    which once made the reader raise a RecursionError."""
    assert (
        create_session_with_tags(fake, b"[" * 63 + b"]" * 63).status_code == 200
    )  # 64 levels with the object
    for depth in (64, 30_000):
        answer = create_session_with_tags(fake, b"[" * depth + b"]" * depth)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"] == (
            "the request body's JSON is nested more than 64 levels deep, the local server's limit "
            "(platoon tinker serve --max-json-depth or LocalTinkerServer(max_json_depth=...) raises it)"
        )
    assert not [record for record in caplog.records if record.exc_info], "a traceback was logged"
    assert post(fake, "create_session", {}).status_code == 200


def test_a_prompt_or_a_max_tokens_past_the_model_context_is_refused_before_sampling(service):
    """The real model's context is 32768 tokens: asking for more is a 400 at once, not minutes of sampling."""
    sampler = tinker_sdk.made(service.create_sampling_client(base_model=MODEL))
    with pytest.raises(tinker.BadRequestError, match=r"sampling_params\.max_tokens asks for 10000000 tokens"):
        sampler.sample(
            types.ModelInput.from_ints([72, 105]), 1, types.SamplingParams(max_tokens=10_000_000)
        ).result()
    with pytest.raises(
        tinker.BadRequestError, match="the prompt is 32769 tokens, over the local model's context of 32768"
    ):
        sampler.sample(
            types.ModelInput.from_ints([72] * 32769), 1, types.SamplingParams(max_tokens=1)
        ).result()
    # a sample that fits is answered as before
    sampled = sampler.sample(types.ModelInput.from_ints([72, 105]), 1, types.SamplingParams(max_tokens=2))
    assert len(sampled.result().sequences[0].tokens) <= 2


def test_an_unknown_base_model_is_refused_without_looking_for_it(fake):
    """Neither a training nor a sampling client of a made-up model gets as far as building one (which would ask
    the Hugging Face hub, retrying for about a minute without a network)."""
    assert fake.state is not None
    built: list[str] = []
    factory = fake.state.backend_factory

    def recording(base_model: str, **kwargs: Any) -> Any:
        built.append(base_model)
        return factory(base_model, **kwargs)

    fake.state.backend_factory = recording
    service = tinker.ServiceClient(base_url=fake.base_url, api_key=fake.api_key)
    try:
        with pytest.raises(tinker.NotFoundError, match="unknown base model 'made-up/model'"):
            tinker_sdk.made(service.create_lora_training_client(base_model="made-up/model"))
        with pytest.raises(tinker.NotFoundError, match="unknown base model 'made-up/model'"):
            tinker_sdk.made(service.create_sampling_client(base_model="made-up/model"))
        assert built == []
        tinker_sdk.made(
            service.create_lora_training_client(base_model=MODEL)
        )  # the server's own model still builds
        assert built == [MODEL]
    finally:
        service.holder.close()
