"""The torch engine: the local model as transformers' Qwen3ForCausalLM on torch (CPU, or a GPU when present).

torch and transformers are imported when an engine is built (never with this module), and the model is built from
the numpy weights every engine shares (the toy model's seeded ones, or a Hugging Face checkpoint's read by
`platoon.local_server.pretrained`), so it computes what the numpy engine computes.
"""

from __future__ import annotations

import copy
import functools
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from platoon.local_server.engines.base import MISSING_TORCH, AdamParams, LossGradient, NonFiniteGradient
from platoon.local_server.qwen3_numpy import checked_weights

if TYPE_CHECKING:
    from platoon.local_server.qwen3_numpy import Qwen3Dims

__all__ = ["TorchEngine", "build", "import_torch", "warm_up"]


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
            raise ImportError(MISSING_TORCH) from None
    _configure_threads(torch)
    return torch


def _model_classes() -> tuple[Any, Any]:
    """transformers' Qwen3 config and model classes (their import is most of a first build)."""
    import_torch()
    with _IMPORTING:
        from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3Config, Qwen3ForCausalLM


@functools.cache
def _configure_threads(torch: Any) -> None:
    # Matrices of a 128-wide model are too small to use many cores well, and oversubscribing a small CI machine
    # (the HTTP thread, the SDK's thread) makes every step slower.
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 4)))


def warm_up() -> None:
    """Import torch and transformers' Qwen3 classes (most of a first build's time)."""
    _model_classes()


def build(dims: Qwen3Dims, weights: dict[str, np.ndarray]) -> TorchEngine:
    torch = import_torch()
    Qwen3Config, Qwen3ForCausalLM = _model_classes()
    # transformers 4 reads `rope_theta`; 5 takes it as the old spelling of `rope_parameters`
    rope: dict[str, Any] = {"rope_theta": dims.rope_theta}
    config = Qwen3Config(
        vocab_size=dims.vocab_size,
        hidden_size=dims.hidden_size,
        num_hidden_layers=dims.num_hidden_layers,
        num_attention_heads=dims.num_attention_heads,
        num_key_value_heads=dims.num_key_value_heads,
        head_dim=dims.head_dim,
        intermediate_size=dims.intermediate_size,
        rms_norm_eps=dims.rms_norm_eps,
        max_position_embeddings=dims.max_position_embeddings,
        pad_token_id=dims.pad_token_id,
        tie_word_embeddings=dims.tie_word_embeddings,
        **rope,
    )
    config._attn_implementation = "sdpa"
    # Its own random initialisation is overwritten at once by the weights given (the toy's or a checkpoint's).
    model = Qwen3ForCausalLM(config).float().to(_device(torch))
    engine = TorchEngine(dims, model)
    engine.load_weights(weights)
    model.train()
    return engine


def _device(torch: Any) -> Any:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TorchEngine:
    """See `platoon.local_server.engines.Engine`."""

    name = "torch"

    def __init__(self, dims: Qwen3Dims, model: Any) -> None:
        self.dims = dims
        self.model = model
        self._optimizer: Any = None

    @property
    def _device(self) -> Any:
        return next(self.model.parameters()).device

    # -- logprobs and gradients

    def _logprobs(self, sequences: Sequence[Sequence[int]], targets: Sequence[np.ndarray]) -> list[Any]:
        """Inputs are right-padded into one batch: under causal attention a position never sees the padding after
        it, so no attention mask is needed and every row's logits equal its unpadded ones."""
        torch = import_torch()
        length = max(len(tokens) for tokens in sequences)
        batch = np.zeros((len(sequences), length), dtype=np.int64)
        target_batch = np.zeros((len(sequences), length), dtype=np.int64)
        for row, (tokens, target) in enumerate(zip(sequences, targets, strict=True)):
            batch[row, : len(tokens)] = tokens
            target_batch[row, : len(tokens)] = target
        device = self._device
        inputs = torch.from_numpy(batch).to(device)
        picked_targets = torch.from_numpy(target_batch).to(device)
        logits = self.model(input_ids=inputs, use_cache=False).logits.float()
        # logit(target) - logsumexp(logits) is log_softmax gathered, without a second (B, L, V) tensor.
        picked = logits.gather(-1, picked_targets[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        return [picked[row, : len(tokens)] for row, tokens in enumerate(sequences)]

    def logprobs(self, sequences: Sequence[Sequence[int]], targets: Sequence[np.ndarray]) -> list[np.ndarray]:
        torch = import_torch()
        with torch.no_grad():
            return [_numpy(lp) for lp in self._logprobs(sequences, targets)]

    def logprobs_backward(
        self, sequences: Sequence[Sequence[int]], targets: Sequence[np.ndarray], loss_grad: LossGradient
    ) -> list[np.ndarray]:
        torch = import_torch()
        with torch.enable_grad():
            logprobs = self._logprobs(sequences, targets)
            values = [_numpy(lp) for lp in logprobs]
            grads = [torch.from_numpy(np.ascontiguousarray(g, dtype=np.float32)) for g in loss_grad(values)]
            torch.autograd.backward(
                logprobs, [g.to(lp.device) for g, lp in zip(grads, logprobs, strict=True)]
            )
        return values

    # -- optimizer

    @property
    def optimizer(self) -> Any:
        """AdamW over all weights, made on first use (its hyperparameters are set at each step)."""
        if self._optimizer is None:
            torch = import_torch()
            self._optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        return self._optimizer

    def optimizer_step(self, params: AdamParams) -> float:
        torch = import_torch()
        with torch.no_grad():
            optimizer = self.optimizer
            for group in optimizer.param_groups:
                group["lr"] = params.learning_rate
                group["betas"] = (params.beta1, params.beta2)
                group["eps"] = params.eps
                group["weight_decay"] = params.weight_decay
            with_grad = [p for p in self.model.parameters() if p.grad is not None]
            if params.grad_clip_norm > 0:
                norm = float(torch.nn.utils.clip_grad_norm_(with_grad, params.grad_clip_norm))
            elif with_grad:
                norm = float(
                    torch.linalg.vector_norm(
                        torch.stack([torch.linalg.vector_norm(p.grad) for p in with_grad])
                    )
                )
            else:
                norm = 0.0
            if not np.isfinite(norm):
                # A step on a NaN or infinite gradient would leave every weight NaN and every later sample failing.
                self.drop_gradient()
                raise NonFiniteGradient()
            optimizer.step()
            self.drop_gradient()
        return norm

    def drop_gradient(self) -> None:
        self.model.zero_grad(set_to_none=True)

    # -- weights and state

    def frozen_copy(self) -> TorchEngine:
        model = copy.deepcopy(self.model)
        model.eval().requires_grad_(False)
        return TorchEngine(self.dims, model)

    def weights(self) -> dict[str, np.ndarray]:
        # named_parameters lists a tied head once (under embed_tokens), as the numpy engine keeps it.
        return {name: _numpy(p.detach()) for name, p in self.model.named_parameters()}

    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        torch = import_torch()
        checked = checked_weights(self.dims, weights, np.dtype(np.float32))
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                param.copy_(torch.from_numpy(np.ascontiguousarray(checked[name])))
        self.drop_gradient()
        self._optimizer = None

    def optimizer_state(self) -> dict[str, np.ndarray]:
        if self._optimizer is None:
            return {}
        state: dict[str, np.ndarray] = {}
        for name, param in self.model.named_parameters():
            moments = self._optimizer.state.get(param)
            if moments:
                state["step"] = np.asarray(int(moments["step"]), dtype=np.int64)
                state[f"{name}.exp_avg"] = _numpy(moments["exp_avg"])
                state[f"{name}.exp_avg_sq"] = _numpy(moments["exp_avg_sq"])
        return state

    def load_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        torch = import_torch()
        self._optimizer = None
        optimizer = self.optimizer
        step = float(np.asarray(state.get("step", 0)))
        for name, param in self.model.named_parameters():
            if f"{name}.exp_avg" not in state:
                continue
            optimizer.state[param] = {
                "step": torch.tensor(step),
                "exp_avg": torch.from_numpy(state[f"{name}.exp_avg"].copy()).to(param.device),
                "exp_avg_sq": torch.from_numpy(state[f"{name}.exp_avg_sq"].copy()).to(param.device),
            }

    # -- decoding

    def prefill(self, tokens: Sequence[int]) -> tuple[np.ndarray, Any]:
        torch = import_torch()
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([list(tokens)], device=self._device), use_cache=True)
        return _numpy(out.logits[0]), _output_cache(out)

    def repeat(self, cache: Any, count: int) -> Any:
        if count > 1:
            cache.batch_repeat_interleave(count)
        return cache

    def step(self, cache: Any, tokens: np.ndarray) -> tuple[np.ndarray, Any]:
        torch = import_torch()
        with torch.inference_mode():
            ids = torch.from_numpy(np.asarray(tokens, dtype=np.int64)[:, None]).to(self._device)
            out = self.model(input_ids=ids, use_cache=True, **{_cache_kwarg(self.model): cache})
        return _numpy(out.logits[:, -1]), _output_cache(out)


def _numpy(tensor: Any) -> np.ndarray:
    # A copy: a CPU tensor's numpy view would change with the weights.
    return np.array(tensor.detach().float().cpu().numpy(), dtype=np.float32, copy=True)


def _cache_kwarg(model: Any) -> str:
    import inspect

    # transformers 5.x renamed `past_key_values` to `cache` (the old name warns); 4.x knows only the old one.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _output_cache(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return out.past_key_values if cache is None else cache
