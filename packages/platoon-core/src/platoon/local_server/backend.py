"""The local server's model backend: a tiny Qwen3 built from a config, Tinker's losses, AdamW, sampling, checkpoints.

The HTTP layer (`app.py`) hands it parsed 0.16.1 JSON bodies and sends back what it returns; everything here is
plain torch on the CPU, with torch and transformers imported only when a backend is created.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.local_server import losses
from platoon.local_server.sampling import SamplingParams, decode
from platoon.renderers.tokenizers import get_tokenizer
from platoon.renderers.toy import TOY_MODEL_NAME, TOY_TOKENIZER_DIR

if TYPE_CHECKING:
    import torch

TORCH_MISSING = "the local Tinker server needs torch and transformers: pip install 'platoon-core[local]'"

#: the SDK's 0.16 AdamParams defaults, for fields a request leaves out
ADAM_DEFAULTS: dict[str, float] = {
    "learning_rate": 1e-4,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-12,
    "weight_decay": 0.0,
    "grad_clip_norm": 0.0,
}

LORA_NOTE = (
    "platoon local server: a tiny randomly initialised model; LoRA settings are recorded but every weight is "
    "trained (no adapters)"
)

WEIGHTS_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
META_FILE = "meta.json"


@dataclass(frozen=True)
class ModelShape:
    """The Qwen3 configuration of the local model; the vocabulary comes from the tokenizer."""

    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 32768


#: held while torch and the model's classes are imported: a request arriving during the warm-up waits for it
#: instead of importing the same modules from a second thread (half-initialised modules across threads)
_IMPORTING = threading.Lock()


def import_torch() -> Any:
    """torch, with the thread count set once for a small model; a missing torch is one line naming the extra."""
    with _IMPORTING:
        try:
            import torch
            import transformers  # noqa: F401
        except ImportError:
            raise ImportError(TORCH_MISSING) from None
    _configure_threads(torch)
    return torch


def _model_classes() -> tuple[Any, Any]:
    """transformers' Qwen3 config and model classes (their import is most of a first `create`)."""
    import_torch()
    with _IMPORTING:
        from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3Config, Qwen3ForCausalLM


def warm_up(base_model: str) -> None:
    """Import what a first backend needs (torch, transformers' Qwen3 classes) and load `base_model`'s tokenizer,
    so the first `create_model` pays only for building the weights. A failure is left for that request to report.
    """
    try:
        _model_classes()

        get_tokenizer(base_model)
    except Exception:  # e.g. an unknown tokenizer: create_model says so in its answer
        return


@functools.cache
def _configure_threads(torch: Any) -> None:
    # Matrices of a 128-wide model are too small to use many cores well, and oversubscribing a small CI
    # machine (the HTTP thread, the SDK's thread) makes every step slower.
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 4)))


#: held while a model's weights are drawn from the seeded global generator
_SEEDED_INIT = threading.Lock()


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
    """One model's weights, optimizer state and tokenizer; methods take and return JSON-ready dicts.

    Calls are serialised by a lock: the HTTP layer may run training and sampling futures on different threads.
    """

    def __init__(
        self,
        base_model: str,
        model: Any,
        tokenizer: Any,
        *,
        lora_rank: int | None,
        seed: int | None,
        shape: ModelShape,
        trainable: bool = True,
    ) -> None:
        self.base_model = base_model
        self.model = model
        self.tokenizer = tokenizer
        self.lora_rank = lora_rank
        self.seed = seed
        self.shape = shape
        self.tokenizer_dir = tokenizer_directory(base_model, tokenizer)
        self.trainable = trainable
        self._lock = threading.RLock()
        self._optimizer: Any = None
        self._steps = 0

    # -- construction ---------------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        base_model: str,
        *,
        lora_rank: int | None = None,
        seed: int | None = None,
        shape: ModelShape | None = None,
    ) -> ModelBackend:
        """A fresh model for `base_model`: its tokenizer's vocabulary, weights seeded from the name.

        `seed` (the LoRA seed of `create_model`) is recorded only: the base weights must not depend on it, so a
        training client and a base-model sampler of one name start from the same weights.
        """
        torch = import_torch()
        Qwen3Config, Qwen3ForCausalLM = _model_classes()

        shape = shape or ModelShape()
        tokenizer = get_tokenizer(base_model)
        config = Qwen3Config(
            vocab_size=len(tokenizer),
            tie_word_embeddings=True,
            bos_token_id=getattr(tokenizer, "bos_token_id", None),
            eos_token_id=getattr(tokenizer, "eos_token_id", None),
            pad_token_id=getattr(tokenizer, "pad_token_id", None),
            **asdict(shape),
        )
        config._attn_implementation = "sdpa"
        # Initialisation draws from torch's one global generator: two models built at once (SDK 0.38 creates a
        # training and a sampling client concurrently) would interleave their draws and both lose their seed.
        with _SEEDED_INIT, torch.random.fork_rng(devices=[]):
            torch.manual_seed(base_seed(base_model))
            model = Qwen3ForCausalLM(config)
        model.float().train()
        return cls(base_model, model, tokenizer, lora_rank=lora_rank, seed=seed, shape=shape)

    def sampler(self) -> ModelBackend:
        """A frozen copy of the current weights for a sampling client: later training does not change it."""
        with self._lock:
            model = copy.deepcopy(self.model)
        model.eval().requires_grad_(False)
        return ModelBackend(
            self.base_model,
            model,
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
            "note": LORA_NOTE,
        }

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

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
        torch = import_torch()
        loss_of = losses.get_loss(loss_fn)
        config = {key: float(value) for key, value in (loss_fn_config or {}).items() if value is not None}
        inputs = [self._datum(datum, loss_fn, index) for index, datum in enumerate(data)]
        if not inputs:
            return {"loss_fn_output_type": "ArrayRecord", "loss_fn_outputs": [], "metrics": {"loss:sum": 0.0}}
        with self._lock, torch.set_grad_enabled(backward):
            logprobs = self.target_logprobs(
                [tokens for tokens, _ in inputs], [loss_inputs["target_tokens"] for _, loss_inputs in inputs]
            )
            total = torch.zeros(())
            outputs = []
            for lp, (_, loss_inputs) in zip(logprobs, inputs, strict=True):
                elementwise = loss_of(lp, loss_inputs, config)
                total = total + elementwise.sum()
                outputs.append(
                    {
                        "logprobs": tensor_data(lp.detach()),
                        "elementwise_loss": tensor_data(elementwise.detach()),
                    }
                )
            if backward:
                total.backward()
        return {
            "loss_fn_output_type": "ArrayRecord",
            "loss_fn_outputs": outputs,
            "metrics": {"loss:sum": float(total.detach())},
        }

    def target_logprobs(self, sequences: list[list[int]], targets: list[torch.Tensor]) -> list[torch.Tensor]:
        """For each input sequence, the logprob of its target token at every position (length = input length).

        Inputs are right-padded into one batch: under causal attention a position never sees the padding after
        it, so no attention mask is needed and every row's logits equal its unpadded ones.
        """
        torch = import_torch()
        length = max(len(tokens) for tokens in sequences)
        batch = torch.zeros((len(sequences), length), dtype=torch.long)
        target_batch = torch.zeros((len(sequences), length), dtype=torch.long)
        for row, (tokens, target) in enumerate(zip(sequences, targets, strict=True)):
            batch[row, : len(tokens)] = torch.tensor(tokens)
            target_batch[row, : len(tokens)] = target
        logits = self.model(input_ids=batch, use_cache=False).logits.float()
        # logit(target) - logsumexp(logits) is log_softmax gathered, without a second (B, L, V) tensor.
        picked = logits.gather(-1, target_batch[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        return [picked[row, : len(tokens)] for row, tokens in enumerate(sequences)]

    def _datum(
        self, datum: dict[str, Any], loss_fn: str, index: int
    ) -> tuple[list[int], dict[str, torch.Tensor]]:
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
        targets = inputs.pop("target_tokens").long()
        if any(not 0 <= t < self.vocab_size for t in [*tokens, *targets.tolist()]):
            raise ValueError(f"datum {index}: a token id is outside the vocabulary of {self.vocab_size}")
        inputs = {key: value.float() for key, value in inputs.items()}
        inputs["target_tokens"] = targets
        return tokens, inputs

    # -- optimizer ------------------------------------------------------------------------------------------

    def optim_step(self, adam_params: dict[str, Any] | None) -> dict[str, Any]:
        """One AdamW step on the accumulated gradients with the request's hyperparameters; gradients reset."""
        torch = import_torch()
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
        with self._lock, torch.no_grad():
            optimizer = self.optimizer
            for group in optimizer.param_groups:
                group["lr"] = params["learning_rate"]
                group["betas"] = (params["beta1"], params["beta2"])
                group["eps"] = params["eps"]
                group["weight_decay"] = params["weight_decay"]
            with_grad = [p for p in self.model.parameters() if p.grad is not None]
            if params["grad_clip_norm"] > 0:
                norm = torch.nn.utils.clip_grad_norm_(with_grad, params["grad_clip_norm"])
            elif with_grad:
                norm = torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(p.grad) for p in with_grad])
                )
            else:
                norm = torch.zeros(())
            if not math.isfinite(float(norm)):
                # A step on a NaN or infinite gradient would leave every weight NaN and every later sample failing.
                optimizer.zero_grad(set_to_none=True)
                raise ValueError(
                    "the accumulated gradient is not finite (a loss input such as a logprob or advantage is "
                    "extreme): the step was skipped and the gradient dropped"
                )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            self._steps += 1
        return {"metrics": {"grad_norm:mean": float(norm), "learning_rate:mean": params["learning_rate"]}}

    @property
    def optimizer(self) -> Any:
        """The AdamW optimizer over all weights (created on first use; hyperparameters are set per step)."""
        if self._optimizer is None:
            torch = import_torch()
            self._optimizer = torch.optim.AdamW(self.model.parameters(), lr=ADAM_DEFAULTS["learning_rate"])
        return self._optimizer

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
        torch = import_torch()
        params = SamplingParams.parse(sampling_params, self._encode)
        if any(not 0 <= t < self.vocab_size for t in prompt_tokens):
            raise ValueError(f"a prompt token id is outside the vocabulary of {self.vocab_size}")
        prompt: dict[str, Any] = {}

        def read_prompt(logits: Any) -> None:
            # Position i's logits predict token i+1; the first prompt token has no logprob.
            if not (prompt_logprobs or topk_prompt_logprobs > 0):
                return
            log_probs = torch.log_softmax(logits[:-1].float(), dim=-1)
            if prompt_logprobs:
                targets = torch.tensor(prompt_tokens[1:], dtype=torch.long)
                prompt["prompt_logprobs"] = [
                    None,
                    *log_probs.gather(-1, targets[:, None]).squeeze(-1).tolist(),
                ]
            if topk_prompt_logprobs > 0:
                k = min(topk_prompt_logprobs, self.vocab_size)
                values, ids = torch.topk(log_probs, k, dim=-1)
                prompt["topk_prompt_logprobs"] = [
                    None,
                    *(
                        [[i, v] for i, v in zip(row_ids, row_values, strict=True)]
                        for row_ids, row_values in zip(ids.tolist(), values.tolist(), strict=True)
                    ),
                ]

        with self._lock, torch.inference_mode():
            was_training = self.model.training
            self.model.eval()
            try:
                sequences = decode(
                    self.model,
                    list(prompt_tokens),
                    num_samples=num_samples,
                    params=params,
                    max_context=self.shape.max_position_embeddings,
                    decode_text=self._decode,
                    prompt_logits=read_prompt,
                )
            finally:
                self.model.train(was_training)
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
        """Write the weights (and the optimizer state) into the directory `path`, with a `meta.json`."""
        torch = import_torch()
        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            torch.save(self.model.state_dict(), directory / WEIGHTS_FILE)
            if with_optimizer:
                torch.save(
                    {"state": self.optimizer.state_dict(), "steps": self._steps}, directory / OPTIMIZER_FILE
                )
        meta = {
            "base_model": self.base_model,
            "is_lora": self.lora_rank is not None,
            "lora_rank": self.lora_rank,
            "seed": self.seed,
            "shape": asdict(self.shape),
            "has_optimizer": with_optimizer,
        }
        (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", "utf-8")

    def load(self, path: str, *, with_optimizer: bool) -> None:
        """Replace the weights (and the optimizer state) with a checkpoint written by `save`; gradients reset."""
        torch = import_torch()
        directory = Path(path)
        weights = directory / WEIGHTS_FILE
        if not weights.is_file():
            raise FileNotFoundError(f"no checkpoint at {path}")
        optimizer_file = directory / OPTIMIZER_FILE
        if with_optimizer and not optimizer_file.is_file():
            raise ValueError(f"the checkpoint at {path} has no optimizer state (a sampler checkpoint?)")
        state = torch.load(weights, map_location="cpu", weights_only=True)
        with self._lock:
            self.model.load_state_dict(state)
            self.model.zero_grad(set_to_none=True)
            if with_optimizer:
                saved = torch.load(optimizer_file, map_location="cpu", weights_only=True)
                self.optimizer.load_state_dict(saved["state"])
                self._steps = int(saved.get("steps", 0))
            else:
                # Fresh moments: stale ones belong to other weights.
                self._optimizer = None
                self._steps = 0

    @staticmethod
    def read_meta(path: str) -> dict[str, Any]:
        """A checkpoint's `meta.json` (base model, LoRA settings), for `weights_info`."""
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


def to_tensor(value: Any, key: str = "") -> torch.Tensor:
    """A 0.16 `TensorData` dict (`data`, `dtype`, `shape`), or a plain list, as a torch tensor."""
    torch = import_torch()
    if isinstance(value, dict):
        dtype = torch.long if value.get("dtype") == "int64" else torch.float32
        tensor = torch.tensor(value.get("data") or [], dtype=dtype)
        shape = value.get("shape")
        return tensor.reshape(shape) if shape else tensor
    if isinstance(value, list):
        return torch.tensor(value, dtype=torch.long if key == "target_tokens" else torch.float32)
    raise ValueError(f"loss_fn_inputs[{key!r}] is not TensorData: {type(value).__name__}")


def tensor_data(tensor: torch.Tensor) -> dict[str, Any]:
    """A tensor as 0.16 JSON `TensorData`."""
    torch = import_torch()
    dtype = "int64" if tensor.dtype in (torch.int64, torch.int32) else "float32"
    return {"data": tensor.flatten().tolist(), "dtype": dtype, "shape": list(tensor.shape)}
