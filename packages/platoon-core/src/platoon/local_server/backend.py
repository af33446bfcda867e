"""The local server's model backend: one model's engine, tokenizer, losses, sampling and checkpoints.

The HTTP layer (`app.py`) hands it parsed 0.16.1 JSON bodies and sends back what it returns. Everything here is
engine-agnostic numpy: validation, the losses and their gradients (`losses`), sampling (`sampling`), the wire's
tensors and the checkpoint files; the arithmetic of the model is its engine's (`engines`: numpy or torch).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np

from platoon.local_server import losses, pretrained, qwen3_numpy
from platoon.local_server.engines import DEFAULT_ENGINE, AdamParams, Engine, ModelShape, build_engine
from platoon.local_server.sampling import SamplingParams, decode, log_softmax
from platoon.renderers.tokenizers import get_tokenizer
from platoon.renderers.toy import TOY_MODEL_NAME, TOY_TOKENIZER_DIR

__all__ = [
    "ADAM_DEFAULTS",
    "ModelBackend",
    "ModelShape",
    "base_seed",
    "model_input_tokens",
    "tensor_data",
    "to_tensor",
]

#: the SDK's 0.16 AdamParams defaults, for fields a request leaves out
ADAM_DEFAULTS: dict[str, float] = {
    "learning_rate": 1e-4,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-12,
    "weight_decay": 0.0,
    "grad_clip_norm": 0.0,
}

#: what `get_info` says the model is; LoRA settings are recorded but every weight trains (no adapters)
TOY_NOTE = "platoon local server: a tiny randomly initialised model"
CHECKPOINT_NOTE = "platoon local server: the Qwen3 checkpoint in {directory}"
FULL_TRAINING_NOTE = "; LoRA settings are recorded but every weight is trained (no adapters)"

#: the weights under transformers' Qwen3ForCausalLM names, which every engine reads
WEIGHTS_FILE = "model.safetensors"
#: AdamW's state: `step` and each weight's moments (`<name>.exp_avg`, `<name>.exp_avg_sq`)
OPTIMIZER_FILE = "optimizer.safetensors"
META_FILE = "meta.json"
#: what checkpoints of platoon before the engines held (torch pickles), which no engine reads
OLD_WEIGHTS_FILE = "model.pt"


def base_seed(base_model: str) -> int:
    """The seed of a base model's initial weights: a stable hash of its name (not Python's salted `hash`)."""
    return int.from_bytes(hashlib.sha256(base_model.encode("utf-8")).digest()[:8], "little") & (2**63 - 1)


def tokenizer_directory(base_model: str, tokenizer: Any) -> str:
    """A local directory the SDK's `AutoTokenizer.from_pretrained` can load for this base model."""
    if base_model == TOY_MODEL_NAME:
        return str(TOY_TOKENIZER_DIR)
    if os.path.isdir(base_model):
        return os.path.abspath(base_model)
    source = getattr(tokenizer, "name_or_path", None)
    if isinstance(source, str) and os.path.isdir(source):
        return os.path.abspath(source)
    # A hub name loaded through a seeded cache: hand the SDK the same name; its loader reads the same cache.
    return base_model


class ModelBackend:
    """One model's engine, optimizer state and tokenizer; methods take and return JSON-ready dicts.

    Calls are serialised by a lock: the HTTP layer may run training and sampling futures on different threads.
    """

    def __init__(
        self,
        base_model: str,
        engine: Engine,
        tokenizer: Any,
        *,
        lora_rank: int | None,
        seed: int | None,
        shape: ModelShape,
        trainable: bool = True,
    ) -> None:
        self.base_model = base_model
        self.engine = engine
        self.tokenizer = tokenizer
        self.lora_rank = lora_rank
        self.seed = seed
        self.shape = shape
        self.tokenizer_dir = tokenizer_directory(base_model, tokenizer)
        self.trainable = trainable
        self._lock = threading.RLock()

    # -- construction ---------------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        base_model: str,
        *,
        lora_rank: int | None = None,
        seed: int | None = None,
        shape: ModelShape | None = None,
        engine: str = DEFAULT_ENGINE,
    ) -> ModelBackend:
        """A fresh model for `base_model` on the engine named `engine`: a Hugging Face Qwen3 checkpoint's weights
        when `base_model` is its directory (`pretrained`), else the toy model of `shape` over the tokenizer's
        vocabulary, with weights seeded from the name (the same on every engine).

        `seed` (the LoRA seed of `create_model`) is recorded only: the base weights must not depend on it, so a
        training client and a base-model sampler of one name start from the same weights.
        """
        directory = pretrained.checkpoint_directory(base_model)
        # the checkpoint before the tokenizer: transformers' loader also reads its config, less clearly
        checkpoint = pretrained.load_checkpoint(directory) if directory is not None else None
        tokenizer = get_tokenizer(base_model)
        if checkpoint is not None:
            dims, weights = checkpoint
            if len(tokenizer) > dims.vocab_size:
                raise pretrained.CheckpointError(
                    f"{directory}: its tokenizer has {len(tokenizer)} tokens, more than the model's vocabulary "
                    f"of {dims.vocab_size}"
                )
            shape = ModelShape(**{field.name: getattr(dims, field.name) for field in fields(ModelShape)})
        else:
            shape = shape or ModelShape()
            dims = qwen3_numpy.Qwen3Dims.from_shape(
                shape, len(tokenizer), pad_token_id=getattr(tokenizer, "pad_token_id", None)
            )
            weights = qwen3_numpy.initial_weights(dims, base_seed(base_model))
        built = build_engine(engine, dims, weights)
        return cls(base_model, built, tokenizer, lora_rank=lora_rank, seed=seed, shape=shape)

    def sampler(self) -> ModelBackend:
        """A frozen copy of the current weights for a sampling client: later training does not change it."""
        with self._lock:
            frozen = self.engine.frozen_copy()
        return ModelBackend(
            self.base_model,
            frozen,
            self.tokenizer,
            lora_rank=self.lora_rank,
            seed=self.seed,
            shape=self.shape,
            trainable=False,
        )

    def info(self) -> dict[str, Any]:
        """The `model_data` fields of `get_info`, plus `is_lora`, `lora_rank` and a note on what is trained."""
        return {
            "arch": "qwen3",
            "model_name": self.base_model,
            "tokenizer_id": self.tokenizer_dir,
            "is_lora": self.lora_rank is not None,
            "lora_rank": self.lora_rank,
            "note": self.note,
        }

    @property
    def note(self) -> str:
        directory = pretrained.checkpoint_directory(self.base_model)
        what = TOY_NOTE if directory is None else CHECKPOINT_NOTE.format(directory=directory)
        return what + FULL_TRAINING_NOTE

    @property
    def vocab_size(self) -> int:
        return int(self.engine.dims.vocab_size)

    # -- forward and backward -------------------------------------------------------------------------------

    def forward(
        self, data: list[dict[str, Any]], loss_fn: str, loss_fn_config: dict[str, Any] | None
    ) -> dict:
        """The loss and training logprobs of `data`, with no gradient."""
        return self._run(data, loss_fn, loss_fn_config, backward=False)

    def forward_backward(
        self, data: list[dict[str, Any]], loss_fn: str, loss_fn_config: dict[str, Any] | None
    ) -> dict:
        """As `forward`, and accumulate the loss's gradient until the next `optim_step`."""
        if not self.trainable:
            raise ValueError("a sampler's weights are frozen: forward_backward needs a training model")
        return self._run(data, loss_fn, loss_fn_config, backward=True)

    def _run(
        self,
        data: list[dict[str, Any]],
        loss_fn: str,
        loss_fn_config: dict[str, Any] | None,
        *,
        backward: bool,
    ) -> dict[str, Any]:
        loss_of = losses.get_loss(loss_fn)
        config = {key: float(value) for key, value in (loss_fn_config or {}).items() if value is not None}
        inputs = [self._datum(datum, loss_fn, index) for index, datum in enumerate(data)]
        if not inputs:
            return {"loss_fn_output_type": "ArrayRecord", "loss_fn_outputs": [], "metrics": {"loss:sum": 0.0}}
        sequences = [tokens for tokens, _ in inputs]
        targets = [loss_inputs["target_tokens"] for _, loss_inputs in inputs]
        elementwise: list[np.ndarray] = []

        def loss_grad(logprobs: list[np.ndarray]) -> list[np.ndarray]:
            # The engine hands back each datum's logprobs and backpropagates the gradients returned here.
            grads = []
            elementwise.clear()
            for lp, (_, loss_inputs) in zip(logprobs, inputs, strict=True):
                loss, grad = loss_of(np.asarray(lp, dtype=np.float32), loss_inputs, config)
                elementwise.append(loss)
                grads.append(grad)
            return grads

        # An extreme input (a logprob of -1e30) overflows to an infinite loss or gradient: the optimizer step refuses
        # that in one line, so numpy's warnings would only add noise to the server's output.
        with self._lock, np.errstate(over="ignore", invalid="ignore"):
            if backward:
                logprobs = self.engine.logprobs_backward(sequences, targets, loss_grad)
            else:
                logprobs = self.engine.logprobs(sequences, targets)
                loss_grad(logprobs)
        outputs = [
            {"logprobs": tensor_data(lp), "elementwise_loss": tensor_data(loss)}
            for lp, loss in zip(logprobs, elementwise, strict=True)
        ]
        total = float(sum(np.sum(loss, dtype=np.float32) for loss in elementwise))
        return {
            "loss_fn_output_type": "ArrayRecord",
            "loss_fn_outputs": outputs,
            "metrics": {"loss:sum": total},
        }

    def _datum(
        self, datum: dict[str, Any], loss_fn: str, index: int
    ) -> tuple[list[int], dict[str, np.ndarray]]:
        tokens = model_input_tokens(datum.get("model_input") or {}, index)
        if not tokens:
            raise ValueError(f"datum {index}: the model input is empty")
        if len(tokens) > self.shape.max_position_embeddings:
            raise ValueError(
                f"datum {index}: {len(tokens)} tokens, over the context of {self.shape.max_position_embeddings}"
            )
        raw = datum.get("loss_fn_inputs") or {}
        inputs = {key: to_tensor(value, key) for key, value in raw.items()}
        losses.check_inputs(loss_fn, inputs, len(tokens), index)
        targets = inputs.pop("target_tokens").astype(np.int64)
        if any(not 0 <= t < self.vocab_size for t in [*tokens, *targets.tolist()]):
            raise ValueError(f"datum {index}: a token id is outside the vocabulary of {self.vocab_size}")
        inputs = {key: value.astype(np.float32) for key, value in inputs.items()}
        inputs["target_tokens"] = targets
        return tokens, inputs

    # -- optimizer ------------------------------------------------------------------------------------------

    def optim_step(self, adam_params: dict[str, Any] | None) -> dict[str, Any]:
        """One AdamW step on the accumulated gradients with the request's hyperparameters; gradients reset."""
        if not self.trainable:
            raise ValueError("a sampler's weights are frozen: optim_step needs a training model")
        params = {key: float(value) for key, value in ADAM_DEFAULTS.items()}
        params.update(
            {key: float(value) for key, value in (adam_params or {}).items() if key in ADAM_DEFAULTS}
        )
        if not all(map(math.isfinite, params.values())):
            raise ValueError(f"AdamW hyperparameters must be finite numbers, got {params}")
        if params["learning_rate"] < 0:
            raise ValueError(f"learning_rate must be >= 0, got {params['learning_rate']}")
        with self._lock, np.errstate(over="ignore", invalid="ignore"):
            norm = self.engine.optimizer_step(AdamParams(**params))
        return {"metrics": {"grad_norm:mean": norm, "learning_rate:mean": params["learning_rate"]}}

    # -- sampling -------------------------------------------------------------------------------------------

    def sample(
        self,
        prompt_tokens: list[int],
        *,
        num_samples: int,
        sampling_params: dict[str, Any] | None,
        prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> dict[str, Any]:
        """A `SampleResponse` body: `num_samples` sequences, and prompt logprobs when asked for."""
        params = SamplingParams.parse(sampling_params, self._encode)
        if any(not 0 <= t < self.vocab_size for t in prompt_tokens):
            raise ValueError(f"a prompt token id is outside the vocabulary of {self.vocab_size}")
        prompt: dict[str, Any] = {}

        def read_prompt(logits: np.ndarray) -> None:
            # Position i's logits predict token i+1; the first prompt token has no logprob.
            if not (prompt_logprobs or topk_prompt_logprobs > 0):
                return
            log_probs = log_softmax(np.asarray(logits[:-1], dtype=np.float32))
            if prompt_logprobs:
                targets = np.asarray(prompt_tokens[1:], dtype=np.int64)
                picked = np.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]
                prompt["prompt_logprobs"] = [None, *picked.tolist()]
            if topk_prompt_logprobs > 0:
                k = min(topk_prompt_logprobs, self.vocab_size)
                ids = np.argsort(-log_probs, axis=-1, kind="stable")[:, :k]
                values = np.take_along_axis(log_probs, ids, axis=-1)
                prompt["topk_prompt_logprobs"] = [
                    None,
                    *(
                        [[i, v] for i, v in zip(row_ids, row_values, strict=True)]
                        for row_ids, row_values in zip(ids.tolist(), values.tolist(), strict=True)
                    ),
                ]

        with self._lock:
            sequences = decode(
                self.engine,
                list(prompt_tokens),
                num_samples=num_samples,
                params=params,
                max_context=self.shape.max_position_embeddings,
                decode_text=self._decode,
                prompt_logits=read_prompt,
            )
        return {
            "sequences": [seq.body() for seq in sequences],
            "prompt_logprobs": prompt.get("prompt_logprobs"),
            **(
                {"topk_prompt_logprobs": prompt["topk_prompt_logprobs"]}
                if "topk_prompt_logprobs" in prompt
                else {}
            ),
        }

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _decode(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens))

    # -- checkpoints ----------------------------------------------------------------------------------------

    def save(self, path: str, *, with_optimizer: bool) -> None:
        """Write the weights (and the optimizer state) into the directory `path` as safetensors, with a
        `meta.json`: any engine loads what any engine saved."""
        from safetensors.numpy import save_file

        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            weights = self.engine.weights()
            optimizer = self.engine.optimizer_state() if with_optimizer else {}
        # "pt" marks tensors in torch's layout under torch's names: transformers' loaders ask for it.
        save_file(weights, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
        if with_optimizer:
            save_file(optimizer, str(directory / OPTIMIZER_FILE), metadata={"format": "pt"})
        meta = {
            "base_model": self.base_model,
            "engine": self.engine.name,
            "is_lora": self.lora_rank is not None,
            "lora_rank": self.lora_rank,
            "seed": self.seed,
            "shape": asdict(self.shape),
            "has_optimizer": with_optimizer,
        }
        (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", "utf-8")

    def load(self, path: str, *, with_optimizer: bool) -> None:
        """Replace the weights (and the optimizer state) with a checkpoint written by `save` on any engine;
        gradients reset."""
        from safetensors.numpy import load_file

        directory = Path(path)
        weights_file = directory / WEIGHTS_FILE
        if not weights_file.is_file():
            if (directory / OLD_WEIGHTS_FILE).is_file():
                raise ValueError(
                    f"the checkpoint at {path} is in the torch-only format ({OLD_WEIGHTS_FILE}) of local servers "
                    "before the numpy engine, which this server does not read: train again from the base model"
                )
            raise FileNotFoundError(f"no checkpoint at {path}")
        optimizer_file = directory / OPTIMIZER_FILE
        if with_optimizer and not optimizer_file.is_file():
            raise ValueError(f"the checkpoint at {path} has no optimizer state (a sampler checkpoint?)")
        weights = load_file(str(weights_file))
        optimizer = load_file(str(optimizer_file)) if with_optimizer else {}
        with self._lock:
            # Without the saved state, fresh moments: stale ones belong to other weights.
            self.engine.load_weights(weights)
            if optimizer:
                self.engine.load_optimizer_state(optimizer)

    @staticmethod
    def read_meta(path: str) -> dict[str, Any]:
        """A checkpoint's `meta.json` (base model, engine, LoRA settings), for `weights_info`."""
        meta: dict[str, Any] = json.loads((Path(path) / META_FILE).read_text("utf-8"))
        return meta


# -- wire helpers -----------------------------------------------------------------------------------------------


def model_input_tokens(model_input: dict[str, Any], index: int = 0) -> list[int]:
    """The tokens of a `ModelInput`; a chunk without `type` is `encoded_text` (0.16 omits the discriminator)."""
    tokens: list[int] = []
    for chunk in model_input.get("chunks") or []:
        kind = chunk.get("type") or "encoded_text"
        if kind != "encoded_text":
            raise ValueError(
                f"datum {index}: the local server supports only encoded_text chunks, not {kind!r}"
            )
        tokens.extend(int(t) for t in chunk.get("tokens") or [])
    return tokens


def to_tensor(value: Any, key: str = "") -> np.ndarray:
    """A 0.16 `TensorData` dict (`data`, `dtype`, `shape`), or a plain list, as a numpy array."""
    if isinstance(value, dict):
        dtype = np.int64 if value.get("dtype") == "int64" else np.float32
        array = np.asarray(value.get("data") or [], dtype=dtype)
        shape = value.get("shape")
        return array.reshape(shape) if shape else array
    if isinstance(value, list):
        return np.asarray(value, dtype=np.int64 if key == "target_tokens" else np.float32)
    raise ValueError(f"loss_fn_inputs[{key!r}] is not TensorData: {type(value).__name__}")


def tensor_data(array: Any) -> dict[str, Any]:
    """An array as 0.16 JSON `TensorData`."""
    array = np.asarray(array)
    dtype = "int64" if np.issubdtype(array.dtype, np.integer) else "float32"
    return {"data": array.ravel().tolist(), "dtype": dtype, "shape": list(array.shape)}
