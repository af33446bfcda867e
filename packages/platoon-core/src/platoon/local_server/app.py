"""The local Tinker server's HTTP surface: every route the unmodified Tinker SDK (0.16.1 through 0.38) calls.

`ServerState` keeps sessions, training runs, samplers, futures and checkpoints; `build_app(state)` is the starlette
app. Every route but the health check takes only the key the server issued (`ServerState.api_key`), and every
request is bounded: its body's size and nesting, a sample's prompt and `max_tokens`, and the base models it may name.
Bodies and results travel as JSON, or as protobuf where the client sends or asks for it (`wire_proto`).
starlette is imported inside `build_app`, so importing this module stays cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from platoon.local_server import checkpoints as ckpt
from platoon.local_server import wire_proto
from platoon.local_server.engines import ModelShape
from platoon.local_server.futures import FutureStore, UserError
from platoon.local_server.inflight import InflightSampler, InflightTarget, SampleVersions
from platoon.local_server.limits import DEFAULT_MAX_BODY_BYTES
from platoon.local_server.losses import LOSS_INPUT_KEYS, LOSS_NAMES, REQUIRED_INPUTS
from platoon.local_server.stability import StabilityStore
from platoon.renderers.tokenizers import tokenizer_available_offline
from platoon.request_limits import DEFAULT_MAX_JSON_DEPTH, JSONTooDeep, loads_within_depth

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

logger = logging.getLogger(__name__)

API = "/api/v1"
#: the SDK's default LoRA rank; recorded when a request names none (weights_info must answer one)
DEFAULT_LORA_RANK = 32
#: what 0.16 leaves out of a request when the caller kept a default
SAMPLING_DEFAULTS: dict[str, Any] = {
    "max_tokens": None,
    "seed": None,
    "stop": None,
    "temperature": 1.0,
    "top_k": -1,
    "top_p": 1.0,
}
ADAM_DEFAULTS: dict[str, float] = {
    "learning_rate": 1e-4,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-12,
    "weight_decay": 0.0,
    "grad_clip_norm": 0.0,
}
LOSS_FNS = LOSS_NAMES
#: the largest AdamW learning rate taken
MAX_LEARNING_RATE = 1.0
#: the largest request body read (`platoon tinker serve --max-body-mib`, `LocalTinkerServer(max_body_bytes=...)`)
MAX_BODY_BYTES = DEFAULT_MAX_BODY_BYTES
#: seconds a request body may go without a byte arriving before the server answers 408 and closes the connection
BODY_IDLE_SECONDS = 30.0
#: the most sequences one sample request may ask for: a group of 1024 is far past any real run's, and a request
#: for millions would hold the one model for hours
MAX_NUM_SAMPLES = 1024
#: the local model's context in tokens: a sample's prompt and its `max_tokens` may each be at most this long
MODEL_CONTEXT_TOKENS = ModelShape().max_position_embeddings
#: more values than a tensor in any accepted body could hold (one per byte of the largest); a shape past it is refused
MAX_TENSOR_VALUES = 1 << 40


class Backend(Protocol):
    """What the server needs of a model (`platoon.local_server.backend.ModelBackend`)."""

    tokenizer_dir: str

    def info(self) -> dict[str, Any]: ...
    def forward(
        self, data: list[dict[str, Any]], loss_fn: str, loss_fn_config: dict[str, Any] | None
    ) -> dict[str, Any]: ...
    def forward_backward(
        self, data: list[dict[str, Any]], loss_fn: str, loss_fn_config: dict[str, Any] | None
    ) -> dict[str, Any]: ...
    def optim_step(self, adam_params: dict[str, Any]) -> dict[str, Any]: ...
    def sample(
        self,
        prompt_tokens: list[int],
        *,
        num_samples: int,
        sampling_params: dict[str, Any],
        prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> dict[str, Any]: ...
    def save(self, path: str, *, with_optimizer: bool) -> None: ...
    def load(self, path: str, *, with_optimizer: bool) -> None: ...
    def sampler(self) -> Backend: ...


#: `ModelBackend.create`: (base_model, *, lora_rank, seed) -> a backend
BackendFactory = Callable[..., Backend]


class HTTPError(Exception):
    """A submission refused before it is queued; the SDK raises its status error (no retry for 4xx but 408/409/429).

    `close` ends the connection after the answer: the body was not read to its end, so the connection cannot serve
    another request.
    """

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.close = close


class ClientGone(Exception):
    """The client closed its connection before its request body arrived: there is nobody to answer."""


@dataclass
class TrainingRun:
    """A training model (`create_model`); its backend is touched only on its own lane."""

    model_id: str
    session_id: str
    base_model: str
    lora_rank: int
    seed: int | None
    lora_config: dict[str, Any]
    user_metadata: dict[str, Any] | None
    backend: Backend | None = None


@dataclass
class Sampler:
    """A sampling session: a frozen copy of some weights, or a training model's in-flight target."""

    sampler_id: str
    base_model: str
    model_path: str | None
    backend: Backend | InflightSampler


@dataclass
class ServerState:
    """Everything the routes share."""

    model: str
    state_dir: Path
    backend_factory: BackendFactory
    #: the one key every route but the health check takes (`X-API-Key`)
    api_key: str = field(repr=False)
    futures: FutureStore = field(default_factory=FutureStore)
    max_body_bytes: int = MAX_BODY_BYTES
    body_idle_seconds: float = BODY_IDLE_SECONDS
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    context_tokens: int = MODEL_CONTEXT_TOKENS
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: dict[str, TrainingRun] = field(default_factory=dict)
    samplers: dict[str, Sampler] = field(default_factory=dict)
    #: what samples with `record_stability_info` drew, for stable_reinforce
    stability: StabilityStore = field(default_factory=StabilityStore)
    #: each training model's in-flight weights target, by model id
    inflight: dict[str, InflightTarget] = field(default_factory=dict)
    #: the weights versions in-flight samples ran on, by sequence id
    sample_versions: SampleVersions = field(default_factory=SampleVersions)
    checkpoints: ckpt.CheckpointStore = field(init=False)

    def __post_init__(self) -> None:
        self.checkpoints = ckpt.CheckpointStore(self.state_dir)
        self._base_lock = threading.Lock()
        self._base: dict[str, Backend] = {}
        self._close_lock = threading.Lock()
        self._on_close: list[Callable[[], None]] = []
        self.closed = False

    def run(self, model_id: Any) -> TrainingRun:
        run = self.runs.get(model_id) if isinstance(model_id, str) else None
        if run is None:
            raise HTTPError(404, f"unknown model_id {model_id!r} (the server may have restarted)")
        return run

    def check_base_model(self, base_model: str) -> None:
        """Refuse (404, at once) a base model this server would have to look for on the Hugging Face hub.

        The server's own model may come from the hub (it was named when the server started); any other must be
        one of platoon's models, a local tokenizer directory, or a hub model whose tokenizer is already in the
        Hugging Face cache. A made-up name would otherwise hold its request for the hub's retries (about a minute
        without a network) before failing.
        """
        if base_model == self.model or tokenizer_available_offline(base_model):
            return
        raise HTTPError(
            404,
            f"unknown base model {base_model!r}: this local server serves {self.model!r}, platoon's own models, "
            "local tokenizer directories and models whose tokenizer is in the Hugging Face cache",
        )

    def base_backend(self, base_model: str) -> Backend:
        """One shared backend per base model, created once, for base-model samplers."""
        with self._base_lock:
            backend = self._base.get(base_model)
            if backend is None:
                backend = self._base[base_model] = _build(self, base_model, lora_rank=None, seed=None)
            return backend

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from the stopping thread) when the server stops; at once if it has stopped."""
        with self._close_lock:
            if not self.closed:
                self._on_close.append(callback)
                return
        callback()

    def close(self) -> None:
        with self._close_lock:
            self.closed = True
            callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()
        self.futures.close()


def _build(state: ServerState, base_model: str, *, lora_rank: int | None, seed: int | None) -> Backend:
    try:
        return state.backend_factory(base_model, lora_rank=lora_rank, seed=seed)
    except Exception as exc:
        # Mostly a base model whose tokenizer cannot be found: the caller's to fix, said in one line.
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UserError(f"cannot build base model {base_model!r}: {type(exc).__name__}: {first}") from exc


# -- request parsing (0.16 omits defaults and discriminators; the server fills them in)


def _require(body: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise HTTPError(400, f"request field {key!r} is missing or not {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _chunks(model_input: Any) -> list[dict[str, Any]]:
    if not isinstance(model_input, dict) or not isinstance(model_input.get("chunks"), list):
        raise HTTPError(400, "model_input must be {'chunks': [...]}")
    out = []
    for chunk in model_input["chunks"]:
        if not isinstance(chunk, dict):
            raise HTTPError(400, "a model_input chunk must be an object")
        kind = chunk.get("type", "encoded_text")
        if kind != "encoded_text":
            raise HTTPError(400, f"the local server takes only encoded_text chunks, got {kind!r}")
        tokens = chunk.get("tokens")
        if not isinstance(tokens, list) or not all(_is_int(t) for t in tokens):
            raise HTTPError(400, "an encoded_text chunk needs 'tokens', a list of integers")
        out.append({**chunk, "type": "encoded_text"})
    return out


def _tokens(model_input: Any) -> list[int]:
    return [t for chunk in _chunks(model_input) for t in chunk["tokens"]]


def _tensor(where: str, value: Any) -> dict[str, Any]:
    """A `TensorData` whose values fit its dtype (finite floats) and whose shape holds exactly its data."""
    if not isinstance(value, dict) or not isinstance(value.get("data"), list):
        raise HTTPError(400, f"{where} must be TensorData {{'data', 'dtype', 'shape'}}")
    data = value["data"]
    dtype = value.get("dtype")
    if dtype == "int64":
        if not all(_is_int(x) for x in data):
            raise HTTPError(400, f"{where} has dtype int64 but holds a value that is not an integer")
    elif dtype == "float32":
        if not all(_is_number(x) and math.isfinite(x) for x in data):
            raise HTTPError(400, f"{where} holds a value that is not a finite number (NaN, infinity or text)")
    else:
        raise HTTPError(400, f"{where} has dtype {dtype!r}, not int64 or float32")
    shape = value.get("shape")
    if shape is None:
        shape = [len(data)]
    elif not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
        raise HTTPError(400, f"{where}.shape must be a list of non-negative integers, got {_clipped(shape)}")
    elif _holds(shape) != len(data):
        raise HTTPError(
            400, f"{where}.shape is {_clipped(shape)}, which does not hold its {len(data)} values"
        )
    return {**value, "shape": shape}


def _holds(shape: list[int]) -> int:
    """How many values `shape` holds, or -1 once past any body's size: a shape of huge dimensions is refused
    without multiplying them out."""
    if 0 in shape:
        return 0
    product = 1
    for size in shape:
        product *= size
        if product > MAX_TENSOR_VALUES:
            return -1
    return product


def _clipped(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _datums(container: Any, key: str) -> tuple[list[dict[str, Any]], str, dict[str, Any] | None]:
    if not isinstance(container, dict):
        raise HTTPError(400, f"request field {key!r} is missing")
    data = container.get("data")
    if not isinstance(data, list):
        raise HTTPError(400, f"{key}.data must be a list of datums")
    loss_fn = container.get("loss_fn")
    if loss_fn not in LOSS_FNS:
        raise HTTPError(400, f"unknown loss_fn {loss_fn!r}; the local server knows {', '.join(LOSS_FNS)}")
    config = container.get("loss_fn_config")
    if config is not None and not isinstance(config, dict):
        raise HTTPError(400, "loss_fn_config must be an object of numbers or null")
    for name, number in (config or {}).items():
        if number is not None:
            _finite(f"{key}.loss_fn_config[{name!r}]", number)
    datums = []
    for index, datum in enumerate(data):
        where = f"{key}.data[{index}]"
        if not isinstance(datum, dict):
            raise HTTPError(400, f"{where} must be an object")
        inputs = datum.get("loss_fn_inputs") or {}
        if not isinstance(inputs, dict):
            raise HTTPError(400, f"{where}.loss_fn_inputs must be an object")
        chunks = _chunks(datum.get("model_input"))
        length = sum(len(chunk["tokens"]) for chunk in chunks)
        if not length:
            raise HTTPError(400, f"{where}.model_input is empty")
        tensors = {
            name: _tensor(f"{where}.loss_fn_inputs[{name!r}]", value) for name, value in inputs.items()
        }
        for name in ("target_tokens", *REQUIRED_INPUTS[loss_fn]):
            if name not in tensors:
                raise HTTPError(400, f"{where}.loss_fn_inputs lacks {name!r}, which loss {loss_fn!r} needs")
        for name, tensor in tensors.items():
            if name in LOSS_INPUT_KEYS and tensor["shape"] != [length]:
                raise HTTPError(
                    400,
                    f"{where}.loss_fn_inputs[{name!r}] has shape {tensor['shape']}, not [{length}] (one entry per "
                    "model input token: target i is predicted from input tokens 0..i)",
                )
        datums.append(
            {
                "model_input": {"chunks": chunks},
                "loss_fn_inputs": tensors,
                "loss_fn_input_spans": datum.get("loss_fn_input_spans"),
            }
        )
    return datums, loss_fn, config


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(where: str, value: Any) -> float:
    """A finite JSON number; NaN, infinity, text and booleans are refused (one bad value poisons the weights)."""
    if not _is_number(value) or not math.isfinite(value):
        raise HTTPError(400, f"{where} must be a finite number, got {value!r}")
    return float(value)


def _adam_params(given: Any) -> dict[str, float]:
    """The request's AdamW hyperparameters over the defaults, each finite and in AdamW's range."""
    if not isinstance(given, dict):
        raise HTTPError(400, "adam_params must be an object")
    params = dict(ADAM_DEFAULTS)
    for name, value in given.items():
        if name in ADAM_DEFAULTS and value is not None:
            params[name] = _finite(f"adam_params.{name}", value)
    if not 0 <= params["learning_rate"] <= MAX_LEARNING_RATE:
        # AdamW moves every weight by about the learning rate each step: far above 1 the weights overflow.
        raise HTTPError(
            400,
            f"adam_params.learning_rate must be in [0, {MAX_LEARNING_RATE:g}], got {params['learning_rate']!r}",
        )
    for name in ("weight_decay", "grad_clip_norm"):
        if params[name] < 0:
            raise HTTPError(400, f"adam_params.{name} must be >= 0, got {params[name]!r}")
    for name in ("beta1", "beta2"):
        if not 0 <= params[name] < 1:
            raise HTTPError(400, f"adam_params.{name} must be in [0, 1), got {params[name]!r}")
    if params["eps"] <= 0:
        raise HTTPError(400, f"adam_params.eps must be > 0, got {params['eps']!r}")
    return params


def _sampling_params(given: Any) -> dict[str, Any]:
    """`sampling_params` over the 0.16 defaults, each of its type and in range (an explicit null is the default)."""
    if not isinstance(given, dict):
        raise HTTPError(400, "sampling_params must be an object")
    params = {**SAMPLING_DEFAULTS, **{k: v for k, v in given.items() if v is not None}}
    max_tokens, seed, top_k = params["max_tokens"], params["seed"], params["top_k"]
    if max_tokens is not None and not (_is_int(max_tokens) and max_tokens >= 0):
        raise HTTPError(400, f"sampling_params.max_tokens must be a non-negative integer, got {max_tokens!r}")
    if seed is not None and not _is_int(seed):
        raise HTTPError(400, f"sampling_params.seed must be an integer, got {seed!r}")
    if not (_is_int(top_k) and top_k >= -1):
        raise HTTPError(400, f"sampling_params.top_k must be an integer >= -1 (-1: no limit), got {top_k!r}")
    temperature = _finite("sampling_params.temperature", params["temperature"])
    if temperature < 0:
        raise HTTPError(400, f"sampling_params.temperature must be >= 0, got {temperature!r}")
    top_p = _finite("sampling_params.top_p", params["top_p"])
    if not 0 < top_p <= 1:
        raise HTTPError(400, f"sampling_params.top_p must be in (0, 1], got {top_p!r}")
    stop = params["stop"]
    entries = [stop] if isinstance(stop, str | int) else stop
    if entries is not None and not (
        isinstance(entries, list) and all(isinstance(e, str) or _is_int(e) for e in entries)
    ):
        raise HTTPError(400, f"sampling_params.stop must be token ids or strings, got {stop!r}")
    return params


def _colon_metrics(output: dict[str, Any]) -> dict[str, Any]:
    # The SDK's chunk merger splits every metric key on ':' and crashes without one.
    metrics = output.get("metrics")
    if isinstance(metrics, dict) and any(":" not in k for k in metrics):
        output = {
            **output,
            "metrics": {
                k if ":" in k else f"{k}:{'sum' if k == 'loss' else 'mean'}": v for k, v in metrics.items()
            },
        }
    return output


# -- operations (each returns the result body; they run on a lane)


class Operations:
    """The route handlers' logic, independent of starlette so that it reads top to bottom."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def _submit(
        self,
        lane: str,
        fn: Callable[[], dict[str, Any]],
        *,
        model_id: str | None,
        keys: list[Any],
        cancellable: bool = False,
    ) -> dict[str, Any]:
        try:
            record, _ = self.state.futures.submit(
                lane, fn, model_id=model_id, keys=keys, cancellable=cancellable
            )
        except RuntimeError as exc:  # stopping
            raise HTTPError(503, str(exc)) from None
        return record.body()

    def _train_submit(
        self,
        body: dict[str, Any],
        idempotency: str | None,
        op: str,
        fn: Callable[[TrainingRun], dict[str, Any]],
    ) -> dict[str, Any]:
        run = self.state.run(body.get("model_id"))
        seq_id = body.get("seq_id")

        def job() -> dict[str, Any]:
            if run.backend is None:
                raise UserError(f"model {run.model_id} was not created (its create_model failed)")
            return fn(run)

        # A retried submission carries the same seq_id (and, within one HTTP retry loop, the same key).
        keys = [("seq", run.model_id, seq_id) if isinstance(seq_id, int) else None, _idem(op, idempotency)]
        return self._submit(run.model_id, job, model_id=run.model_id, keys=keys)

    def _within_context(self, what: str, tokens: int, *, asked: bool = False) -> None:
        """400 when `tokens` is past the model's context, which no prompt or sample can outgrow."""
        context = self.state.context_tokens
        if tokens > context:
            size = f"asks for {tokens} tokens" if asked else f"is {tokens} tokens"
            raise HTTPError(
                400,
                f"{what} {size}, over the local model's context of {context} tokens (the most one sequence can hold)",
            )

    # session

    def create_session(self, body: dict[str, Any]) -> dict[str, Any]:
        session_id = f"session-{uuid.uuid4().hex[:16]}"
        version = body.get("sdk_version")
        # Only what is small: nothing reads a session's tags or metadata, and a session lives as long as the server.
        self.state.sessions[session_id] = {
            "sdk_version": version if isinstance(version, str) and len(version) <= 64 else None,
            "created": datetime.now(UTC).isoformat(),
        }
        return {"type": "create_session", "session_id": session_id}

    # training models

    def create_model(self, body: dict[str, Any], idempotency: str | None) -> dict[str, Any]:
        session_id = _require(body, "session_id", str)
        model_seq_id = _require(body, "model_seq_id", int)
        base_model = _require(body, "base_model", str)
        self.state.check_base_model(base_model)
        lora = body.get("lora_config") or {}
        if not isinstance(lora, dict):
            raise HTTPError(400, "lora_config must be an object")
        run = self._register_run(session_id, model_seq_id, base_model, lora, body.get("user_metadata"))

        def job() -> dict[str, Any]:
            self._build_run(run)
            return {"type": "create_model", "model_id": run.model_id}

        return self._submit(run.model_id, job, model_id=run.model_id, keys=[("create", run.model_id)])

    def _register_run(
        self, session_id: str, model_seq_id: int, base_model: str, lora: dict[str, Any], user_metadata: Any
    ) -> TrainingRun:
        given_rank, given_seed = lora.get("rank"), lora.get("seed")
        rank: int = given_rank if isinstance(given_rank, int) else DEFAULT_LORA_RANK
        seed: int | None = given_seed if isinstance(given_seed, int) else None
        model_id = f"{session_id}:train:{model_seq_id}"
        run = self.state.runs.get(model_id)
        if run is None:
            # Registered before the submission is answered, so the model's next requests find it.
            run = TrainingRun(
                model_id=model_id,
                session_id=session_id,
                base_model=base_model,
                lora_rank=rank,
                seed=seed,
                lora_config={**lora, "rank": rank},
                user_metadata=user_metadata,
            )
            self.state.runs[model_id] = run
        return run

    def _build_run(self, run: TrainingRun) -> Backend:
        """The run's backend, built (and its run recorded) on its lane by the first request that needs it."""
        if run.backend is None:
            run.backend = _build(self.state, run.base_model, lora_rank=run.lora_rank, seed=run.seed)
            self.state.checkpoints.write_run(run.model_id, _run_meta(run))
        return run.backend

    async def get_info(self, body: dict[str, Any]) -> dict[str, Any]:
        run = self.state.run(body.get("model_id"))

        def job() -> dict[str, Any]:
            if run.backend is None:
                raise UserError(f"model {run.model_id} was not created (its create_model failed)")
            info = dict(run.backend.info())
            model_data = {
                "arch": info.get("arch"),
                "model_name": info.get("model_name") or run.base_model,
                "tokenizer_id": run.backend.tokenizer_dir,
                **{k: v for k, v in info.items() if k not in ("arch", "model_name", "tokenizer_id")},
            }
            return {
                "type": "get_info",
                "model_id": run.model_id,
                "model_data": model_data,
                "is_lora": info.get("is_lora", False),
                "lora_rank": info.get("lora_rank"),
                "model_name": model_data["model_name"],
            }

        # On the model's lane: get_info sees the model after everything submitted before it (its creation).
        record, _ = self.state.futures.submit(run.model_id, job, model_id=run.model_id)
        result = await asyncio.wrap_future(record.future)
        if "error" in result:
            raise HTTPError(400, result["error"])
        return result

    def unload_model(self, body: dict[str, Any], idempotency: str | None) -> dict[str, Any]:
        run = self.state.run(body.get("model_id"))
        state = self.state

        def job() -> dict[str, Any]:
            run.backend = None
            state.runs.pop(run.model_id, None)
            return {"type": "unload_model", "model_id": run.model_id}

        out = self._submit(run.model_id, job, model_id=run.model_id, keys=[("unload", run.model_id)])
        state.futures.drop_lane(run.model_id)
        return out

    # forward / backward / optimizer

    def forward(self, body: dict[str, Any], idempotency: str | None, *, backward: bool) -> dict[str, Any]:
        key = "forward_backward_input" if backward else "forward_input"
        datums, loss_fn, config = _datums(body.get(key), key)
        for index, datum in enumerate(datums):
            length = sum(len(chunk["tokens"]) for chunk in datum["model_input"]["chunks"])
            self._within_context(f"{key}.data[{index}].model_input", length)
        run = self.state.run(body.get("model_id"))
        try:
            self.state.stability.attach(datums, loss_fn, session_id=run.session_id, where=key)
        except ValueError as exc:
            raise HTTPError(400, str(exc)) from None

        def fn(run: TrainingRun) -> dict[str, Any]:
            assert run.backend is not None
            call = run.backend.forward_backward if backward else run.backend.forward
            return _colon_metrics(call(datums, loss_fn, config))

        return self._train_submit(body, idempotency, key, fn)

    def optim_step(self, body: dict[str, Any], idempotency: str | None) -> dict[str, Any]:
        params = _adam_params(body.get("adam_params") or {})

        def fn(run: TrainingRun) -> dict[str, Any]:
            assert run.backend is not None
            out = run.backend.optim_step(params)
            return {"metrics": out.get("metrics") if isinstance(out, dict) else None}

        return self._train_submit(body, idempotency, "optim_step", fn)

    # weights and checkpoints

    def save_weights(self, body: dict[str, Any], idempotency: str | None) -> dict[str, Any]:
        name = _checked_name(body.get("path"))
        store = self.state.checkpoints

        def fn(run: TrainingRun) -> dict[str, Any]:
            backend = run.backend
            assert backend is not None
            ref = ckpt.CheckpointRef(run=run.model_id, kind="weights", name=name)
            store.save(
                ref,
                {**_run_meta(run), "with_optimizer": True},
                lambda path: backend.save(path, with_optimizer=True),
            )
            return {"type": "save_weights", "path": ref.tinker_path}

        return self._train_submit(body, idempotency, "save_weights", fn)

    def save_weights_for_sampler(self, body: dict[str, Any], idempotency: str | None) -> dict[str, Any]:
        raw_name = body.get("path")
        name = None if raw_name is None else _checked_name(raw_name)
        seq = body.get("sampling_session_seq_id")
        state = self.state

        def fn(run: TrainingRun) -> dict[str, Any]:
            backend = run.backend
            assert backend is not None
            if name is None:
                # Unnamed: a sampling session on a frozen copy, or on the in-flight target; the SDK asserts `path`
                # is null.
                sampler_id = _sampler_id(state, run.session_id, seq)
                weights = backend.sampler()
                if body.get("kind") == "inflight":
                    sampling: Backend | InflightSampler = _publish_inflight(state, run.model_id, weights)
                else:
                    sampling = weights
                state.samplers[sampler_id] = Sampler(sampler_id, run.base_model, None, sampling)
                return {"type": "save_weights_for_sampler", "path": None, "sampling_session_id": sampler_id}
            ref = ckpt.CheckpointRef(run=run.model_id, kind="sampler_weights", name=name)
            state.checkpoints.save(
                ref,
                {**_run_meta(run), "with_optimizer": False},
                lambda path: backend.save(path, with_optimizer=False),
            )
            return {"type": "save_weights_for_sampler", "path": ref.tinker_path}

        return self._train_submit(body, idempotency, "save_weights_for_sampler", fn)

    def load_weights(self, body: dict[str, Any], idempotency: str | None) -> dict[str, Any]:
        path = body.get("path")
        optimizer = bool(body.get("optimizer", False))
        store = self.state.checkpoints
        try:
            ref, data, meta = store.locate(path)
        except UserError as exc:
            raise HTTPError(
                404 if isinstance(path, str) and path.startswith(ckpt.PREFIX) else 400, str(exc)
            ) from None
        if optimizer and not meta.get("with_optimizer"):
            raise HTTPError(400, f"{ref.tinker_path} holds no optimizer state (it is a sampler checkpoint)")
        if body.get("model_id") is None and body.get("session_id") is not None:
            return self._create_by_loading(body, ref, data, meta, optimizer=optimizer)

        def fn(run: TrainingRun) -> dict[str, Any]:
            assert run.backend is not None
            if meta.get("base_model") != run.base_model:
                raise UserError(
                    f"{ref.tinker_path} is a checkpoint of {meta.get('base_model')!r}, not of {run.base_model!r}"
                )
            run.backend.load(str(data), with_optimizer=optimizer)
            return {"type": "load_weights", "path": ref.tinker_path}

        return self._train_submit(body, idempotency, "load_weights", fn)

    def _create_by_loading(
        self,
        body: dict[str, Any],
        ref: ckpt.CheckpointRef,
        data: Path,
        meta: dict[str, Any],
        *,
        optimizer: bool,
    ) -> dict[str, Any]:
        """A new training model whose first request is this load (SDK 0.38's `create_training_client_from_state`):
        addressed by `session_id` and `model_seq_id` as `create_model` is, with the checkpoint's base model and
        LoRA settings."""
        session_id = _require(body, "session_id", str)
        model_seq_id = _require(body, "model_seq_id", int)
        saved_base = meta.get("base_model")
        base_model = body.get("base_model") or saved_base
        if not isinstance(base_model, str) or base_model != saved_base:
            raise HTTPError(
                400, f"{ref.tinker_path} is a checkpoint of {saved_base!r}, not of {base_model!r}"
            )
        self.state.check_base_model(base_model)
        lora = meta.get("lora_config")
        lora = dict(lora) if isinstance(lora, dict) else {"rank": meta.get("lora_rank")}
        run = self._register_run(session_id, model_seq_id, base_model, lora, body.get("user_metadata"))

        def job() -> dict[str, Any]:
            self._build_run(run).load(str(data), with_optimizer=optimizer)
            return {"type": "load_weights", "path": ref.tinker_path}

        # A retried creation gets the first one's future: the weights are loaded once.
        return self._submit(run.model_id, job, model_id=run.model_id, keys=[("create", run.model_id)])

    def weights_info(self, body: dict[str, Any]) -> dict[str, Any]:
        meta = self._checkpoint_meta(body.get("tinker_path"))
        lora = meta.get("lora_config") or {}
        # The SDK's create_training_client_from_state asserts is_lora and a rank: the recorded LoRA settings.
        return {
            "base_model": meta.get("base_model"),
            "is_lora": True,
            "lora_rank": meta.get("lora_rank") or DEFAULT_LORA_RANK,
            "train_unembed": lora.get("train_unembed"),
            "train_mlp": lora.get("train_mlp"),
            "train_attn": lora.get("train_attn"),
        }

    def _checkpoint_meta(self, path: Any) -> dict[str, Any]:
        try:
            return self.state.checkpoints.locate(path)[2]
        except UserError as exc:
            raise HTTPError(
                404 if isinstance(path, str) and path.startswith(ckpt.PREFIX) else 400, str(exc)
            ) from None

    # sampling

    def create_sampling_session(self, body: dict[str, Any]) -> dict[str, Any]:
        given = body.get("session_id")
        session_id = given if isinstance(given, str) else "anonymous"
        sampler = self._new_sampler(body.get("base_model"), body.get("model_path"))
        sampler.sampler_id = _sampler_id(self.state, session_id, body.get("sampling_session_seq_id"))
        self.state.samplers[sampler.sampler_id] = sampler
        return {"type": "create_sampling_session", "sampling_session_id": sampler.sampler_id}

    def _new_sampler(self, base_model: Any, model_path: Any) -> Sampler:
        if model_path is not None:
            meta = self._checkpoint_meta(model_path)
            _, data, _ = self.state.checkpoints.locate(model_path)
            backend = self.state.backend_factory(
                meta["base_model"], lora_rank=meta.get("lora_rank"), seed=None
            )
            backend.load(str(data), with_optimizer=False)
            return Sampler("", meta["base_model"], model_path, backend.sampler())
        if not isinstance(base_model, str) or not base_model:
            raise HTTPError(400, "a sampling session needs base_model or model_path")
        self.state.check_base_model(base_model)
        try:
            backend = self.state.base_backend(base_model)
        except UserError as exc:
            raise HTTPError(400, str(exc)) from None
        return Sampler("", base_model, None, backend.sampler())

    def get_sampler(self, sampler_id: str) -> dict[str, Any]:
        sampler = self.state.samplers.get(sampler_id)
        if sampler is None:
            raise HTTPError(404, f"unknown sampling session {sampler_id!r}")
        return {
            "sampler_id": sampler.sampler_id,
            "base_model": sampler.base_model,
            "model_path": sampler.model_path,
        }

    def asample(self, body: dict[str, Any], idempotency: str | None) -> dict[str, Any]:
        sampler_id = body.get("sampling_session_id")
        if sampler_id is not None:
            sampler = self.state.samplers.get(sampler_id) if isinstance(sampler_id, str) else None
            if sampler is None:
                raise HTTPError(
                    404, f"unknown sampling session {sampler_id!r} (the server may have restarted)"
                )
        else:  # the older form: the weights named in the request itself
            sampler = self._new_sampler(body.get("base_model"), body.get("model_path"))
        tokens = _tokens(body.get("prompt"))
        if not tokens:
            raise HTTPError(400, "the prompt is empty")
        self._within_context("the prompt", len(tokens))
        num_samples = body.get("num_samples", 1)
        if not (_is_int(num_samples) and num_samples >= 1):
            raise HTTPError(400, f"num_samples must be a positive integer, got {num_samples!r}")
        if num_samples > MAX_NUM_SAMPLES:
            raise HTTPError(
                400,
                f"num_samples asks for {num_samples} sequences; one request may ask for {MAX_NUM_SAMPLES}",
            )
        params = _sampling_params(body.get("sampling_params") or {})
        if params["max_tokens"] is not None:
            self._within_context("sampling_params.max_tokens", params["max_tokens"], asked=True)
        prompt_logprobs = bool(body.get("prompt_logprobs") or False)
        topk = body.get("topk_prompt_logprobs") or 0
        if not (_is_int(topk) and topk >= 0):
            raise HTTPError(400, f"topk_prompt_logprobs must be a non-negative integer, got {topk!r}")
        backend = sampler.backend
        # Fixed at submission: the SDK reads each sequence's id from this answer, before the sample is drawn.
        sequence_ids = self.state.stability.new_ids(num_samples)
        recording = body.get("record_stability_info") is True
        stability = self.state.stability
        session_id = sampler.sampler_id.partition(":sample:")[0] or None

        def job() -> dict[str, Any]:
            out = backend.sample(
                tokens,
                num_samples=num_samples,
                sampling_params=params,
                prompt_logprobs=prompt_logprobs,
                topk_prompt_logprobs=topk,
            )
            if recording:
                for sequence_id, sequence in zip(sequence_ids, out["sequences"], strict=True):
                    stability.record(
                        sequence_id,
                        session_id=session_id,
                        tokens=sequence["tokens"],
                        logprobs=sequence["logprobs"],
                    )
            return {"type": "sample", **out}

        # No de-duplication on seq_id: an unpickled sampling client in another process restarts its counter on the
        # same session; only the HTTP retry's idempotency key marks a true duplicate. A sample can be cancelled.
        try:
            record, _ = self.state.futures.submit(
                "sample",
                job,
                keys=[_idem("asample", idempotency)],
                extra={"sample_sequence_ids": sequence_ids},
                cancellable=True,
            )
        except RuntimeError as exc:  # stopping
            raise HTTPError(503, str(exc)) from None
        # an in-flight sample's weights versions are kept by its request: each of its sequence ids names it
        self.state.sample_versions.name(record.request_id, sequence_ids)
        return record.body()

    def sample_versions(self, body: dict[str, Any]) -> dict[str, Any]:
        """platoon's own route: the weights versions in-flight samples ran on, by the sequence ids they answered."""
        ids = _require(body, "sequence_ids", list)
        if not all(isinstance(item, str) for item in ids):
            raise HTTPError(400, "sequence_ids must be a list of strings")
        return {"versions": self.state.sample_versions.lookup(ids)}

    # REST

    def training_run(self, run_id: str) -> dict[str, Any]:
        meta = self.state.checkpoints.read_run(run_id)
        if meta is None:
            raise HTTPError(404, f"unknown training run {run_id!r}")
        return self._run_record(meta)

    def _run_record(self, meta: dict[str, Any]) -> dict[str, Any]:
        run_id = meta["training_run_id"]
        saved = self.state.checkpoints.list_checkpoints(run_id)
        last = {t: [c for c in saved if c["checkpoint_type"] == t] for t in ("training", "sampler")}
        metadata = meta.get("user_metadata")
        return {
            "training_run_id": run_id,
            "base_model": meta.get("base_model"),
            "model_owner": "local",
            "is_lora": True,
            "corrupted": False,
            "lora_rank": meta.get("lora_rank"),
            "last_request_time": meta.get("created") or datetime.now(UTC).isoformat(),
            "last_checkpoint": last["training"][-1] if last["training"] else None,
            "last_sampler_checkpoint": last["sampler"][-1] if last["sampler"] else None,
            "user_metadata": metadata if isinstance(metadata, dict) else None,
        }

    def training_runs(self, limit: int, offset: int) -> dict[str, Any]:
        runs = self.state.checkpoints.runs()
        page = runs[offset : offset + limit]
        return {
            "training_runs": [self._run_record(m) for m in page],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)},
        }

    def checkpoints(self, run_id: str | None) -> dict[str, Any]:
        if run_id is not None and self.state.checkpoints.read_run(run_id) is None:
            raise HTTPError(404, f"unknown training run {run_id!r}")
        saved = self.state.checkpoints.list_checkpoints(run_id)
        return {"checkpoints": saved, "cursor": {"offset": 0, "limit": len(saved), "total_count": len(saved)}}

    def delete_checkpoint(self, run_id: str, checkpoint_id: str) -> None:
        try:
            deleted = self.state.checkpoints.delete(run_id, checkpoint_id)
        except UserError as exc:
            raise HTTPError(400, str(exc)) from None
        if not deleted:
            raise HTTPError(404, f"no checkpoint tinker://{run_id}/{checkpoint_id}")


def _idem(op: str, key: str | None) -> tuple[str, str, str] | None:
    return ("idem", op, key) if key else None


def _publish_inflight(state: ServerState, model_id: str, weights: Backend) -> InflightSampler:
    """A `kind: inflight` save: `weights` become the training model's in-flight target (existing in-flight sessions
    sample them from their next request on), and a new session on that target."""
    target = state.inflight.setdefault(model_id, InflightTarget())
    target.publish(weights)
    return InflightSampler(target, state.sample_versions)


def _checked_name(name: Any) -> str:
    try:
        return ckpt.check_name(name)
    except UserError as exc:
        raise HTTPError(400, str(exc)) from None


def _sampler_id(state: ServerState, session_id: str, seq: Any) -> str:
    base = f"{session_id}:sample:{seq if isinstance(seq, int) else uuid.uuid4().hex[:8]}"
    # a retried creation may reuse its id; anything else that collides gets a fresh suffix
    return base if base not in state.samplers else f"{base}-{uuid.uuid4().hex[:8]}"


def _run_meta(run: TrainingRun) -> dict[str, Any]:
    return {
        "base_model": run.base_model,
        "lora_rank": run.lora_rank,
        "lora_config": run.lora_config,
        "user_metadata": run.user_metadata,
        "session_id": run.session_id,
        "created": datetime.now(UTC).isoformat(),
    }


# -- the starlette app


def build_app(state: ServerState) -> Starlette:
    """The ASGI app; every route but the health check takes only the server's own API key."""
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    class JSON(JSONResponse):
        def render(self, content: Any) -> bytes:
            # Logprobs may be -inf; Python's json (which httpx uses to read) takes it, starlette's default refuses.
            return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    ops = Operations(state)
    reader = BodyReader(state)

    def error(status: int, message: str, *, close: bool = False) -> Response:
        headers = {"Connection": "close"} if close else None
        return JSON(
            {"error": message, "category": "user", "detail": message}, status_code=status, headers=headers
        )

    async def body_bytes(request: Request) -> bytes:
        """The request body, read within the limits and decoded by its Content-Encoding (none or zstd)."""
        raw = await reader.read(request)
        encoding = request.headers.get("content-encoding")
        if encoding is None:
            return raw
        return await asyncio.to_thread(decoded, raw, encoding)

    def decoded(raw: bytes, encoding: str) -> bytes:
        try:
            return wire_proto.decompress(raw, encoding, state.max_body_bytes)
        except wire_proto.WireError as exc:
            raise HTTPError(exc.status, str(exc)) from None

    def sends_proto(request: Request) -> bool:
        return _media_type(request.headers.get("content-type")) == wire_proto.PROTO_MEDIA_TYPE

    async def parse(request: Request) -> dict[str, Any]:
        raw = await body_bytes(request)
        if sends_proto(request):
            raise HTTPError(
                415,
                f"{request.url.path} takes a JSON body; only forward_backward takes {wire_proto.PROTO_MEDIA_TYPE}",
            )
        return json_body(raw)

    def json_body(raw: bytes) -> dict[str, Any]:
        if not raw:
            return {}
        try:
            body = loads_within_depth(raw, state.max_json_depth)
        except JSONTooDeep as exc:
            raise HTTPError(
                400,
                f"{exc}, the local server's limit (platoon tinker serve --max-json-depth or "
                "LocalTinkerServer(max_json_depth=...) raises it)",
            ) from None
        except ValueError:
            raise HTTPError(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise HTTPError(400, "the request body must be a JSON object")
        return body

    Handler = Callable[["Request"], Awaitable[Any]]

    issued = state.api_key.encode()

    def refusal(request: Request) -> str | None:
        """Why the request's key is refused, or None for the key this server issued."""
        given = request.headers.get("x-api-key")
        if not given:
            return (
                "no API key: send the key this local server issued as X-API-Key (TINKER_API_KEY for the SDK)"
            )
        # Compared in constant time; starlette reads headers as latin-1, so this gives back the bytes sent.
        if not hmac.compare_digest(given.encode("latin-1"), issued):
            return (
                "this API key was not issued by this local server: use the key it printed when it started "
                "(platoon tinker serve) or its api_key (LocalTinkerServer)"
            )
        return None

    def route(path: str, handler: Handler, method: str = "POST", *, auth: bool = True) -> Route:
        async def endpoint(request: Request) -> Response:
            refused = refusal(request) if auth else None
            if refused is not None:
                # The body is not read for a caller without the key, so the connection cannot serve another.
                return error(401, refused, close=True)
            try:
                result = await handler(request)
            except HTTPError as exc:
                return error(exc.status, str(exc), close=exc.close)
            except (ClientGone, ClientDisconnect):
                # Nobody to answer (a client that exited mid-request): uvicorn drops what is sent.
                return Response(status_code=400)
            except asyncio.CancelledError:
                if not state.closed:
                    raise
                # uvicorn cancels what outlives its graceful shutdown: an answer, not a traceback.
                return error(503, "the local Tinker server stopped", close=True)
            except Exception as exc:
                # Not a 500: the SDK retries 5xx for minutes, and a bug should surface at once.
                logger.exception("local Tinker server: %s %s failed", method, path)
                return error(400, f"{type(exc).__name__}: {exc}")
            if isinstance(result, Response):
                return result
            return JSON(result)

        return Route(API + path, endpoint, methods=[method])

    def idem(request: Request) -> str | None:
        return request.headers.get("x-idempotency-key")

    async def healthz(request: Request) -> Any:
        return {"status": "ok"}

    async def capabilities(request: Request) -> Any:
        model = {
            "model_name": state.model,
            "max_context_length": state.context_tokens,
            "trainable": True,
            "sampleable": True,
        }
        # `supported_loss_fns` is platoon's own field (the Tinker API lists no losses): a client that reads it
        # knows at start which losses forward_backward takes, without a forward to find out.
        return {"supported_models": [model], "supported_loss_fns": list(LOSS_FNS)}

    async def create_session(request: Request) -> Any:
        return ops.create_session(await parse(request))

    async def heartbeat(request: Request) -> Any:
        return {"type": "session_heartbeat"}

    async def telemetry(request: Request) -> Any:
        return {"status": "accepted"}

    async def client_config(request: Request) -> Any:
        return {
            "pjwt_auth_enabled": False,
            "use_pyqwest_transport": False,
            # forward_backward bodies come zstd-compressed, as hosted Tinker asks (the server caps what they
            # decompress to at its body limit)
            "proto_compress_fwdbwd": True,
            # Said outright, though they are an SDK's defaults: the routes these would send requests to
            # (retrieve_futures, join_sampling_session, create_custom_loss) are hosted Tinker's alone.
            "sample_use_retrieve_futures": False,
            "sample_join_sampling_session": False,
            "custom_loss_server_side": False,
        }

    async def dynamic_config(request: Request) -> Any:
        return {
            "refresh_interval_sec": 300,
            # an abandoned sample (a dropped straggler's) is cancelled here, and its generation stops
            "sample_cancel_enabled": True,
            "sample_cancel_max_batch_size": 64,
        }

    async def null(request: Request) -> Any:
        return JSON(None)

    async def cancel_future(request: Request) -> Any:
        # The SDK sends it for an abandoned sample and ignores the answer; an unknown or finished id is no error.
        body = await parse(request)
        state.futures.cancel(_require(body, "request_id", str))
        return JSON(None)

    async def sample_versions(request: Request) -> Any:
        return ops.sample_versions(await parse(request))

    def submission(op: Callable[[dict[str, Any], str | None], dict[str, Any]]) -> Handler:
        async def handler(request: Request) -> Any:
            return op(await parse(request), idem(request))

        return handler

    def threaded(op: Callable[[dict[str, Any], str | None], dict[str, Any]]) -> Handler:
        # Submissions that load weights before answering run off the event loop, which serves the long-polls.
        async def handler(request: Request) -> Any:
            body = await parse(request)
            return await asyncio.to_thread(op, body, idem(request))

        return handler

    async def forward_backward(request: Request) -> Any:
        # SDKs from 0.25 send a protobuf body here, forward-only passes included; older ones send JSON.
        raw = await body_bytes(request)
        if sends_proto(request):
            body, forward_only = await asyncio.to_thread(proto_training_body, raw)
            return ops.forward(body, idem(request), backward=not forward_only)
        return ops.forward(json_body(raw), idem(request), backward=True)

    def proto_training_body(raw: bytes) -> tuple[dict[str, Any], bool]:
        try:
            return wire_proto.forward_backward_body(raw)
        except wire_proto.WireError as exc:
            raise HTTPError(exc.status, str(exc)) from None

    async def get_info(request: Request) -> Any:
        return await ops.get_info(await parse(request))

    async def weights_info(request: Request) -> Any:
        return ops.weights_info(await parse(request))

    async def create_sampling_session(request: Request) -> Any:
        body = await parse(request)
        return await asyncio.to_thread(ops.create_sampling_session, body)

    async def get_sampler(request: Request) -> Any:
        return ops.get_sampler(request.path_params["sampler_id"])

    async def retrieve_future(request: Request) -> Any:
        body = await parse(request)
        request_id = _require(body, "request_id", str)
        status, result = await state.futures.retrieve(request_id)
        # A result the protobuf wire carries goes as protobuf to a client that asks for it (SDK 0.25 on, which
        # reads a sample or forward_backward result in no other form); everything else stays JSON.
        encode = wire_proto.encoder_for(result) if status == 200 and _accepts_proto(request) else None
        if encode is not None:
            return Response(await asyncio.to_thread(encode, result), media_type=wire_proto.PROTO_MEDIA_TYPE)
        return JSON(result, status_code=status)

    async def training_runs(request: Request) -> Any:
        limit = _int_param(request, "limit", 20)
        offset = _int_param(request, "offset", 0)
        return ops.training_runs(limit, offset)

    async def training_run(request: Request) -> Any:
        return ops.training_run(request.path_params["run_id"])

    async def run_checkpoints(request: Request) -> Any:
        return ops.checkpoints(request.path_params["run_id"])

    async def all_checkpoints(request: Request) -> Any:
        return ops.checkpoints(None)

    async def delete_checkpoint(request: Request) -> Any:
        ops.delete_checkpoint(request.path_params["run_id"], request.path_params["checkpoint_id"])
        return JSON(None)

    routes = [
        route("/healthz", healthz, "GET", auth=False),
        route("/get_server_capabilities", capabilities, "GET"),
        route("/create_session", create_session),
        route("/session_heartbeat", heartbeat),
        route("/telemetry", telemetry),
        route("/client/config", client_config),
        route("/client/dynamic_config", dynamic_config),
        route("/cancel_future", cancel_future),
        route("/platoon/sample_versions", sample_versions),
        route("/sessions/{session_id}/finish", null),
        route("/create_model", submission(ops.create_model)),
        route("/get_info", get_info),
        route("/unload_model", submission(ops.unload_model)),
        route("/forward", submission(lambda b, k: ops.forward(b, k, backward=False))),
        route("/forward_backward", forward_backward),
        route("/optim_step", submission(ops.optim_step)),
        route("/save_weights", submission(ops.save_weights)),
        route("/save_weights_for_sampler", submission(ops.save_weights_for_sampler)),
        route("/load_weights", submission(ops.load_weights)),
        route("/weights_info", weights_info),
        route("/create_sampling_session", create_sampling_session),
        route("/samplers/{sampler_id}", get_sampler, "GET"),
        route("/asample", threaded(ops.asample)),
        route("/retrieve_future", retrieve_future),
        route("/training_runs", training_runs, "GET"),
        route("/training_runs/{run_id}", training_run, "GET"),
        route("/training_runs/{run_id}/checkpoints", run_checkpoints, "GET"),
        route("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}", delete_checkpoint, "DELETE"),
        route("/checkpoints", all_checkpoints, "GET"),
    ]
    app = Starlette(routes=routes)
    app.state.server = state
    return app


class BodyReader:
    """Reads request bodies within the server's limits: at most `max_body_bytes` (413 by Content-Length before
    reading, or as soon as a body without one passes it), with at most `body_idle_seconds` between two pieces
    (408), and never past the server's stop (503). A refused body's connection is closed after the answer."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._stopped: asyncio.Future[None] | None = None

    async def read(self, request: Request) -> bytes:
        limit = self.state.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                raise HTTPError(
                    400, f"the Content-Length header {declared!r} is not a number", close=True
                ) from None
            if size > limit:
                raise HTTPError(413, _too_large(size, limit), close=True)
        pieces: list[bytes] = []
        received = 0
        more = True
        while more:
            message = await self._next(request)
            if message["type"] == "http.disconnect":
                raise ClientGone
            piece = message.get("body", b"")
            received += len(piece)
            if received > limit:
                # a chunked body has no Content-Length: stop reading it here, keeping nothing
                raise HTTPError(413, _too_large(None, limit), close=True)
            pieces.append(piece)
            more = message.get("more_body", False)
        return b"".join(pieces)

    async def _next(self, request: Request) -> Any:
        receiving = asyncio.ensure_future(request.receive())
        waiting: set[asyncio.Future[Any]] = {receiving, self._stop_signal()}
        await asyncio.wait(
            waiting,
            timeout=self.state.body_idle_seconds,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if receiving.done():
            return receiving.result()
        receiving.cancel()
        if self.state.closed:
            raise HTTPError(
                503, "the local Tinker server stopped while the request body was arriving", close=True
            )
        raise HTTPError(
            408,
            f"the request body stopped arriving (nothing for {self.state.body_idle_seconds:g} s); "
            "the connection is closed",
            close=True,
        )

    def _stop_signal(self) -> asyncio.Future[None]:
        # One future on the server's loop, made at the first body, resolved by the stopping thread; every body
        # read waits on it (waiting on a future never consumes or cancels it).
        if self._stopped is None:
            stopped = self._stopped = asyncio.get_running_loop().create_future()

            def resolve() -> None:
                if not stopped.done():
                    stopped.set_result(None)

            def wake() -> None:
                with contextlib.suppress(RuntimeError):  # the loop already ended
                    stopped.get_loop().call_soon_threadsafe(resolve)

            self.state.on_close(wake)
        return self._stopped


def _too_large(size: int | None, limit: int) -> str:
    what = "is over" if size is None else f"is {size} bytes, over"
    return (
        f"the request body {what} the local server's limit of {limit} bytes "
        "(platoon tinker serve --max-body-mib or LocalTinkerServer(max_body_bytes=...) raises it)"
    )


def _media_type(header: str | None) -> str:
    return (header or "").split(";", 1)[0].strip().lower()


def _accepts_proto(request: Request) -> bool:
    """Whether the request's Accept header names protobuf (with a quality above 0)."""
    for accepted in request.headers.get("accept", "").split(","):
        media_type, *params = accepted.split(";")
        if media_type.strip().lower() != wire_proto.PROTO_MEDIA_TYPE:
            continue
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def _int_param(request: Request, name: str, default: int) -> int:
    try:
        return max(0, int(request.query_params.get(name, default)))
    except ValueError:
        raise HTTPError(400, f"query parameter {name!r} must be an integer") from None
