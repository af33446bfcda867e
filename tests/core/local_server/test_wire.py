"""Both wires of the local server: JSON for every SDK, protobuf (zstd-compressed bodies, protobuf results) for the
SDKs from 0.25 on, which read a sample or forward_backward result in no other form.

The installed SDK (0.38 in the default environment, 0.16.1 in the oldest) trains, samples and saves over its own
wire; a result read both ways says the same; and a body neither wire can read is refused in one line.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import tinker
import zstandard
from fake_backend import BigramBackend
from tinker import types

from platoon.gateway import tinker_sdk
from platoon.local_server import LocalTinkerServer, wire_proto
from platoon.local_server.backend import ModelBackend

MODEL = "platoon/toy"
PROMPT = [ord(c) for c in "Hello, world"]
#: whether the installed SDK speaks the protobuf wire (it ships its own proto modules from 0.25 on)
SDK_SPEAKS_PROTO = importlib.util.find_spec("tinker.proto") is not None
PROTO = wire_proto.PROTO_MEDIA_TYPE
#: a hang guard only
TIMEOUT = 60


def datum(tokens: list[int] = PROMPT) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def as_json(d: types.Datum) -> dict[str, Any]:
    """A datum as the JSON wire carries it (and as the backend receives it)."""
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": d.model_input.to_ints()}]},
        "loss_fn_inputs": {
            name: {"data": list(t.data), "dtype": t.dtype, "shape": list(t.shape or [len(t.data)])}
            for name, t in d.loss_fn_inputs.items()
        },
    }


class Spy:
    """Counts the calls of a `wire_proto` function, which the server still makes (no fake)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.calls: list[Any] = []
        real: Callable[..., Any] = getattr(wire_proto, name)

        def spied(*args: Any) -> Any:
            self.calls.append(args[1] if name == "decompress" else None)
            return real(*args)

        monkeypatch.setattr(wire_proto, name, spied)


# -- the installed SDK, on its own wire


def test_the_sdk_trains_samples_and_saves_on_its_own_wire(server, monkeypatch):
    decoded = Spy(monkeypatch, "forward_backward_body")
    decompressed = Spy(monkeypatch, "decompress")
    samples = Spy(monkeypatch, "encode_sample_response")
    outputs = Spy(monkeypatch, "encode_forward_backward_output")
    d = datum()
    reference = ModelBackend.create(MODEL)
    service = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
    try:
        training = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL))
        before = training.forward([d], "cross_entropy").result()
        expected = reference.forward([as_json(d)], "cross_entropy", None)
        assert before.loss_fn_outputs[0]["logprobs"].data == pytest.approx(
            expected["loss_fn_outputs"][0]["logprobs"]["data"], abs=1e-5
        )
        stepped = training.forward_backward([d], "cross_entropy").result()
        assert stepped.metrics["loss:sum"] == pytest.approx(expected["metrics"]["loss:sum"], rel=1e-5)
        assert training.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics
        after = list(training.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data)
        assert sum(after) > sum(before.loss_fn_outputs[0]["logprobs"].data) + 1e-3  # the step made d likelier
        state = training.save_state("wire").result().path
        weights = training.save_weights_for_sampler("wire").result().path
        sampler = tinker_sdk.made(training.save_weights_and_get_sampling_client())

        params = types.SamplingParams(max_tokens=5, seed=7, temperature=1.0)
        first, again = (
            sampler.sample(types.ModelInput.from_ints(PROMPT), 2, params).result() for _ in range(2)
        )
        assert len(first.sequences) == 2
        assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]  # seeded
        for sequence in first.sequences:
            assert 1 <= len(sequence.tokens) <= 5
            assert sequence.logprobs is not None and len(sequence.logprobs) == len(sequence.tokens)
        scored = sampler.sample(
            types.ModelInput.from_ints(PROMPT),
            1,
            params,
            include_prompt_logprobs=True,
            topk_prompt_logprobs=3,
        ).result()
        assert scored.prompt_logprobs is not None and scored.topk_prompt_logprobs is not None
        assert scored.prompt_logprobs[0] is None and scored.topk_prompt_logprobs[0] is None
        assert scored.prompt_logprobs[1:] == pytest.approx(after, abs=1e-4)
        for chosen, top in zip(scored.prompt_logprobs[1:], scored.topk_prompt_logprobs[1:], strict=True):
            assert top is not None and len(top) == 3 and top[0][1] >= chosen - 1e-4

        assert sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT)).result()[1:] == pytest.approx(
            after, abs=1e-4
        )
        from_disk = tinker_sdk.made(service.create_sampling_client(model_path=weights))
        assert from_disk.compute_logprobs(types.ModelInput.from_ints(PROMPT)).result()[1:] == pytest.approx(
            after, abs=1e-4
        )
        resumed = tinker_sdk.made(service.create_training_client_from_state_with_optimizer(state))
        resumed_logprobs = resumed.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data
        assert resumed_logprobs == pytest.approx(after, abs=1e-5)
        rest = tinker_sdk.rest_client(service, api_key=server.api_key, base_url=server.base_url)
        listed = rest.list_checkpoints(training.model_id).result().checkpoints
        assert {c.tinker_path for c in listed} == {state, weights}
    finally:
        service.holder.close()

    if SDK_SPEAKS_PROTO:
        # every forward and forward_backward came as zstd-compressed protobuf, every result went back as protobuf
        assert len(decoded.calls) == 4
        assert decompressed.calls == ["zstd"] * 4
        assert len(outputs.calls) == 4
        assert len(samples.calls) == 5
    else:
        assert decoded.calls == decompressed.calls == outputs.calls == samples.calls == []


# -- one result, read both ways


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTinkerServer]:
    """A server on the bigram backend, with a small body limit."""
    with LocalTinkerServer(
        state_dir=tmp_path_factory.mktemp("wire"),
        backend_factory=BigramBackend.create,
        max_body_bytes=64 << 10,
    ) as server:
        yield server


def call(server: LocalTinkerServer, path: str, body: Any, **headers: str) -> httpx.Response:
    """A POST of a JSON body (a dict) or of raw bytes, with the server's key."""
    sent = {"X-API-Key": server.api_key, **{k.replace("_", "-"): v for k, v in headers.items()}}
    url = f"{server.base_url}/api/v1/{path}"
    if isinstance(body, bytes):
        return httpx.post(url, content=body, headers=sent, timeout=TIMEOUT)
    return httpx.post(url, json=body, headers=sent, timeout=TIMEOUT)


def retrieve(server: LocalTinkerServer, submitted: httpx.Response, **headers: str) -> httpx.Response:
    assert submitted.status_code == 200, submitted.text
    while True:
        answer = call(server, "retrieve_future", {"request_id": submitted.json()["request_id"]}, **headers)
        if answer.status_code != 408:
            assert answer.status_code == 200, answer.text
            return answer


def create_model(server: LocalTinkerServer) -> str:
    session = call(server, "create_session", {"tags": [], "sdk_version": "wire-test"}).json()["session_id"]
    created = call(server, "create_model", {"session_id": session, "model_seq_id": 0, "base_model": MODEL})
    return str(retrieve(server, created).json()["model_id"])


@pytest.fixture(scope="module")
def model_id(fake: LocalTinkerServer) -> str:
    """A model of the bigram server."""
    return create_model(fake)


@pytest.fixture(scope="module")
def real_model_id(server: LocalTinkerServer) -> str:
    """A model of the real backend's server."""
    return create_model(server)


def proto_request(model_id: str, d: dict[str, Any], *, forward_only: bool = True, seq_id: int = 1) -> Any:
    """A `ForwardBackwardRequest` of one JSON-wire datum, built with the local server's own messages."""
    request = wire_proto.message_class("ForwardBackwardRequest")(
        model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy", forward_only=forward_only
    )
    written = request.data.add()
    written.model_input.add().encoded_text.tokens = wire_proto._pack(
        "i", d["model_input"]["chunks"][0]["tokens"]
    )
    for name, tensor in d["loss_fn_inputs"].items():
        number, typecode = wire_proto._DTYPES[tensor["dtype"]]
        entry = written.loss_fn_inputs[name]
        entry.dtype = number
        entry.shape.extend(tensor["shape"])
        entry.dense = wire_proto._pack(typecode, tensor["data"])
    return request


def sdk_or_own(name: str, raw: bytes) -> Any:
    """A protobuf result as the installed SDK reads it, or (an SDK without the protobuf wire) as our message."""
    if SDK_SPEAKS_PROTO:
        from tinker.proto import response_conv

        read = {
            "SampleResponse": response_conv.deserialize_sample_response,
            "ForwardBackwardOutput": response_conv.deserialize_forward_backward_output,
        }[name]
        return read(raw)
    message = wire_proto.message_class(name)()
    message.ParseFromString(raw)
    return message


def floats(raw: bytes) -> list[float]:
    return wire_proto._unpack("f", raw, "test")


def test_a_sample_read_as_protobuf_says_what_its_json_says(server):
    fake = server  # the real backend: it gives top-k prompt logprobs
    session = call(fake, "create_session", {"tags": []}).json()["session_id"]
    sampler = call(fake, "create_sampling_session", {"session_id": session, "base_model": MODEL}).json()
    submitted = call(
        fake,
        "asample",
        {
            "sampling_session_id": sampler["sampling_session_id"],
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
            "num_samples": 3,
            "sampling_params": {"max_tokens": 6, "seed": 3},
            "prompt_logprobs": True,
            "topk_prompt_logprobs": 2,
        },
    )
    assert len(submitted.json()["sample_sequence_ids"]) == 3
    as_proto = retrieve(fake, submitted, accept=PROTO)
    assert as_proto.headers["content-type"] == PROTO
    json_answer = retrieve(fake, submitted).json()
    assert retrieve(fake, submitted, accept="application/json").json() == json_answer
    read = sdk_or_own("SampleResponse", as_proto.content)

    assert len(read.sequences) == len(json_answer["sequences"]) == 3
    for got, sent in zip(read.sequences, json_answer["sequences"], strict=True):
        if SDK_SPEAKS_PROTO:
            assert (got.tokens, got.stop_reason) == (sent["tokens"], sent["stop_reason"])
            assert got.logprobs == pytest.approx(sent["logprobs"], rel=1e-6)
        else:
            assert wire_proto._unpack("i", got.tokens, "test") == sent["tokens"]
            assert floats(got.logprobs) == pytest.approx(sent["logprobs"], rel=1e-6)
    if SDK_SPEAKS_PROTO:
        prompt_logprobs, topk = read.prompt_logprobs, read.topk_prompt_logprobs
    else:
        prompt_logprobs = [None if math.isnan(v) else v for v in floats(read.prompt_logprobs)]
        k = read.topk_prompt_logprobs.k
        ids = wire_proto._unpack("i", read.topk_prompt_logprobs.token_ids, "test")
        values = floats(read.topk_prompt_logprobs.logprobs)
        rows = [list(zip(ids[i : i + k], values[i : i + k], strict=True)) for i in range(0, len(ids), k)]
        topk = [None if row[0] == (0, wire_proto.TOPK_MASK_LOGPROB) else row for row in rows]
    assert prompt_logprobs[0] is None and json_answer["prompt_logprobs"][0] is None
    assert prompt_logprobs[1:] == pytest.approx(json_answer["prompt_logprobs"][1:], rel=1e-6)
    assert topk[0] is None and json_answer["topk_prompt_logprobs"][0] is None
    for got_row, sent_row in zip(topk[1:], json_answer["topk_prompt_logprobs"][1:], strict=True):
        assert [token for token, _ in got_row] == [token for token, _ in sent_row]
        assert [value for _, value in got_row] == pytest.approx([value for _, value in sent_row], rel=1e-6)


def test_a_forward_pass_is_the_same_on_either_wire_in_and_out(server, real_model_id):
    fake, model_id = server, real_model_id
    d = as_json(datum())
    by_json = call(
        fake, "forward", {"model_id": model_id, "forward_input": {"data": [d, d], "loss_fn": "cross_entropy"}}
    )
    request = proto_request(model_id, d)
    request.data.add().CopyFrom(request.data[0])
    by_proto = call(fake, "forward_backward", request.SerializeToString(), content_type=PROTO)
    json_answer = retrieve(fake, by_json).json()
    assert (
        retrieve(fake, by_proto).json() == json_answer
    )  # a protobuf request, a JSON answer: the same numbers

    read = sdk_or_own("ForwardBackwardOutput", retrieve(fake, by_json, accept=PROTO).content)
    assert dict(read.metrics) == pytest.approx(json_answer["metrics"])
    if SDK_SPEAKS_PROTO:
        outputs = [
            {name: (list(t.data), t.dtype, t.shape) for name, t in o.items()} for o in read.loss_fn_outputs
        ]
    else:
        [record] = read.loss_fn_outputs
        outputs = []
        for index in range(record.num_datums):
            datum_out = {}
            for name, batched in record.fields.items():
                offsets = wire_proto._unpack("q", batched.offsets, "test")
                values = floats(batched.data[offsets[index] : offsets[index + 1]])
                datum_out[name] = (values, "float32", [len(values)])
            outputs.append(datum_out)
    expected = [
        {name: (t["data"], t["dtype"], t["shape"]) for name, t in o.items()}
        for o in json_answer["loss_fn_outputs"]
    ]
    assert len(outputs) == len(expected) == 2
    for got, sent in zip(outputs, expected, strict=True):
        assert got.keys() == sent.keys() == {"logprobs", "elementwise_loss"}
        for name in got:
            assert got[name][0] == pytest.approx(sent[name][0], rel=1e-6)
            assert got[name][1:] == sent[name][1:]


def test_json_stays_the_answer_where_protobuf_carries_nothing(fake, model_id):
    """An optim_step result and a failed future have no protobuf form: JSON, whatever the client accepts."""
    stepped = call(fake, "optim_step", {"model_id": model_id, "adam_params": {"learning_rate": 1e-3}})
    assert retrieve(fake, stepped, accept=PROTO).json()["metrics"]
    bad = {
        "model_id": model_id,
        "forward_input": {"data": [as_json(datum([1, 2, 9999]))], "loss_fn": "cross_entropy"},
    }
    failed = retrieve(fake, call(fake, "forward", bad), accept=PROTO)
    assert failed.headers["content-type"].startswith("application/json")
    assert failed.json()["error"]


def test_the_client_config_asks_for_compressed_bodies(fake):
    config = call(fake, "client/config", {}).json()
    assert config["proto_compress_fwdbwd"] is True
    # the routes these flags would send an SDK to are hosted Tinker's alone
    assert not config["sample_use_retrieve_futures"] and not config["sample_join_sampling_session"]


# -- bodies neither wire reads


def _with(model_id: str, change: Callable[[Any], None]) -> bytes:
    request = proto_request(model_id, as_json(datum()))
    change(request)
    return bytes(request.SerializeToString())


def _tensor(request: Any) -> Any:
    return request.data[0].loss_fn_inputs["weights"]


def _shape(*dims: int) -> Callable[[Any], None]:
    def change(request: Any) -> None:
        del _tensor(request).shape[:]
        _tensor(request).shape.extend(dims)

    return change


def _bomb(kind: str) -> bytes:
    """A few KB that decompress far past the 64 KiB limit."""
    if kind == "declared":  # 64 MiB of zeros, saying so in the frame header
        return zstandard.ZstdCompressor().compress(bytes(64 << 20))
    if kind == "hidden":  # the same, its size left out and its window within what the server grants
        params = zstandard.ZstdCompressionParameters.from_level(3, window_log=20, write_content_size=False)
        return zstandard.ZstdCompressor(compression_params=params).compress(bytes(64 << 20))
    # frames each within the limit, together far past it
    return zstandard.ZstdCompressor().compress(bytes(60_000)) * 100


def _setting(name: str, value: Any) -> Callable[[Any], None]:
    return lambda request: setattr(_tensor(request), name, value)


MALFORMED: dict[str, tuple[Callable[[str], tuple[bytes, dict[str, str]]], int, str]] = {
    "not protobuf": (
        lambda m: (b"\xff\xff\xff\xff not a message", {"content_type": PROTO}),
        400,
        "the request body is not a protobuf ForwardBackwardRequest",
    ),
    "token bytes not whole int32s": (
        lambda m: (
            _with(
                m, lambda r: setattr(r.data[0].model_input[0].encoded_text, "tokens", b"\x01\x00\x00\x00\x02")
            ),
            {"content_type": PROTO},
        ),
        400,
        "holds 5 bytes, not a whole number of 4-byte values",
    ),
    "negative dimension": (
        lambda m: (_with(m, _shape(-11)), {"content_type": PROTO}),
        400,
        "shape must be a list of non-negative integers",
    ),
    "huge declared shape": (
        lambda m: (_with(m, _shape(1 << 62, 1 << 62, 1 << 62)), {"content_type": PROTO}),
        400,
        "which does not hold its 11 values",
    ),
    "too many dimensions": (
        lambda m: (_with(m, _shape(*[1] * 17)), {"content_type": PROTO}),
        400,
        "has 17 dimensions",
    ),
    "a dtype the wire does not carry": (
        lambda m: (_with(m, _setting("dtype", 4)), {"content_type": PROTO}),
        400,
        "has dtype number 4, not float32 (1) or int64 (2)",
    ),
    "a sparse tensor": (
        lambda m: (_with(m, lambda r: _tensor(r).sparse_csr.SetInParent()), {"content_type": PROTO}),
        400,
        "is a sparse tensor",
    ),
    "an image chunk": (
        lambda m: (
            _with(m, lambda r: r.data[0].model_input.add().image.SetInParent()),
            {"content_type": PROTO},
        ),
        400,
        "takes only encoded_text chunks, not image",
    ),
    "a NaN weight": (
        lambda m: (
            _with(m, _setting("dense", wire_proto._pack("f", [math.nan] * 11))),
            {"content_type": PROTO},
        ),
        400,
        "not a finite number",
    ),
    "not zstd": (
        lambda m: (b"\x00 not zstd", {"content_type": PROTO, "content_encoding": "zstd"}),
        400,
        "the request body is not valid zstd",
    ),
    **{
        f"a zstd bomb ({kind})": (
            lambda m, kind=kind: (_bomb(kind), {"content_type": PROTO, "content_encoding": "zstd"}),
            413,
            "over the local server's limit of 65536 bytes once decompressed",
        )
        for kind in ("declared", "hidden", "many frames")
    },
    "gzip": (
        lambda m: (b"\x1f\x8b", {"content_type": "application/json", "content_encoding": "gzip"}),
        415,
        "reads no Content-Encoding 'gzip' (only zstd)",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_body_neither_wire_reads_is_refused_in_one_line(fake, model_id, case):
    make, status, message = MALFORMED[case]
    body, headers = make(model_id)
    answer = call(fake, "forward_backward", body, **headers)
    assert answer.status_code == status
    error = answer.json()["error"]
    assert message in error
    assert "\n" not in error and "Traceback" not in error


def test_protobuf_goes_only_where_the_sdk_sends_it_and_the_model_keeps_working(fake, model_id):
    refused = call(fake, "optim_step", b"\x08\x01", content_type=PROTO)
    assert refused.status_code == 415
    assert (
        refused.json()["error"]
        == f"/api/v1/optim_step takes a JSON body; only forward_backward takes {PROTO}"
    )
    # a JSON body may come compressed too; and after every refusal the model still answers
    body = zstandard.ZstdCompressor().compress(b'{"model_id": "%s", "adam_params": {}}' % model_id.encode())
    assert retrieve(fake, call(fake, "optim_step", body, content_encoding="zstd")).json()["metrics"]
    request = proto_request(model_id, as_json(datum()), seq_id=7)
    compressed = zstandard.ZstdCompressor().compress(request.SerializeToString())
    answer = retrieve(
        fake, call(fake, "forward_backward", compressed, content_type=PROTO, content_encoding="zstd")
    )
    assert len(answer.json()["loss_fn_outputs"]) == 1


def test_protobuf_requests_without_a_seq_id_are_each_run(fake, model_id):
    """proto3 sends no seq_id as 0: such requests are distinct, not retries of the first (which would answer
    every later one with the first one's result)."""
    first, second = (
        call(fake, "forward_backward", _with(model_id, lambda r: r.ClearField("seq_id")), content_type=PROTO)
        for _ in range(2)
    )
    assert first.json()["request_id"] != second.json()["request_id"]
    assert retrieve(fake, first).json() == retrieve(fake, second).json()  # forward passes of the same weights
