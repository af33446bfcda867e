"""The local server's engines: what does the model's arithmetic, chosen by name.

`numpy` (the default) runs the toy Qwen3 in numpy (`platoon.local_server.qwen3_numpy`) and needs no torch; `torch`
runs the same model through transformers and torch (the `local-torch` extra), for a GPU. Both start from the same
initial weights and exchange weights and optimizer state as numpy arrays under transformers' names, so one
checkpoint format serves both. Losses and sampling live above the engines (`losses`, `sampling`), in numpy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from platoon.errors import ConfigError
from platoon.extras import installed
from platoon.renderers.tokenizers import get_tokenizer

if TYPE_CHECKING:
    import numpy as np

    from platoon.local_server.qwen3_numpy import Qwen3Dims

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINE_NAMES",
    "MISSING_TORCH",
    "NON_FINITE_GRADIENT",
    "AdamParams",
    "Engine",
    "ModelShape",
    "build_engine",
    "engine_problem",
    "import_engine",
    "require_engine",
    "warm_up",
]

ENGINE_NAMES = ("numpy", "torch")
DEFAULT_ENGINE = "numpy"
#: the extra that installs the torch engine's packages
TORCH_EXTRA = "platoon-core[local-torch]"
MISSING_TORCH = (
    "the local server's torch engine needs torch and transformers, which are not installed: "
    f"pip install '{TORCH_EXTRA}' (or use the numpy engine)"
)
NON_FINITE_GRADIENT = (
    "the accumulated gradient is not finite (a loss input such as a logprob or advantage is extreme): the step "
    "was skipped and the gradient dropped"
)

#: per-sequence logprobs -> d(total loss)/d(each logprob), the same shapes
LossGradient = Callable[[list["np.ndarray"]], list["np.ndarray"]]


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


@dataclass(frozen=True)
class AdamParams:
    """One optimizer step's AdamW hyperparameters (`grad_clip_norm` 0: no clipping)."""

    learning_rate: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip_norm: float


class NonFiniteGradient(ValueError):
    """The accumulated gradient holds NaN or infinity: the step was skipped and the gradient dropped."""

    def __init__(self) -> None:
        super().__init__(NON_FINITE_GRADIENT)


class Engine(Protocol):
    """One model's weights, gradients and optimizer state, and the arithmetic on them.

    Arrays cross this boundary as numpy (float32 weights, int64 tokens); weights and optimizer state are flat dicts
    under transformers' Qwen3ForCausalLM parameter names (the tied `lm_head.weight` left out).
    """

    name: str
    dims: Qwen3Dims

    def logprobs(self, sequences: Sequence[Sequence[int]], targets: Sequence[np.ndarray]) -> list[np.ndarray]:
        """For each sequence, the logprob of its target token at every position; no gradient."""
        ...

    def logprobs_backward(
        self, sequences: Sequence[Sequence[int]], targets: Sequence[np.ndarray], loss_grad: LossGradient
    ) -> list[np.ndarray]:
        """As `logprobs`, and add the gradient of the loss `loss_grad` describes to the accumulated one."""
        ...

    def optimizer_step(self, params: AdamParams) -> float:
        """One AdamW step on the accumulated gradient (clipped to `grad_clip_norm` when > 0), which is then
        dropped; returns the gradient's norm before clipping. A non-finite gradient raises `NonFiniteGradient`,
        dropped, with the weights unchanged."""
        ...

    def drop_gradient(self) -> None: ...

    def frozen_copy(self) -> Engine:
        """A copy of the current weights that later training does not change, for sampling."""
        ...

    def weights(self) -> dict[str, np.ndarray]: ...

    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Replace every weight; the gradient and the optimizer state are dropped."""
        ...

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """AdamW's state: `step` (the steps taken) and each weight's moments, `<name>.exp_avg` and
        `<name>.exp_avg_sq` (empty before the first step)."""
        ...

    def load_optimizer_state(self, state: dict[str, np.ndarray]) -> None: ...

    def prefill(self, tokens: Sequence[int]) -> tuple[np.ndarray, Any]:
        """Run one prompt: its logits at every position (L, V) and the key-value cache after it."""
        ...

    def repeat(self, cache: Any, count: int) -> Any:
        """The cache of one sequence made `count` rows of a batch."""
        ...

    def step(self, cache: Any, tokens: np.ndarray) -> tuple[np.ndarray, Any]:
        """Feed one token per batch row: the next logits (B, V) and the cache after them."""
        ...


def engine_problem(name: str, *, where: str = "local_server.engine") -> str | None:
    """The one line a run refuses an engine with (unknown, or its packages missing); None when it can start."""
    if name not in ENGINE_NAMES:
        return f"{where}: unknown engine {name!r}; the local server has {', '.join(ENGINE_NAMES)}"
    if name == "torch" and not (installed("torch") and installed("transformers")):
        return f"{where}: {MISSING_TORCH}"
    return None


def require_engine(name: str, *, where: str = "local_server.engine") -> None:
    """Raise `engine_problem`'s line as a ConfigError (exit 78)."""
    problem = engine_problem(name, where=where)
    if problem is not None:
        raise ConfigError(problem)


#: held while an engine's modules are imported: a request arriving during the warm-up waits for it instead of
#: importing the same modules from a second thread (half-initialised modules across threads)
_IMPORTING = threading.Lock()


def import_engine(name: str) -> Any:
    """The engine's module (`build(dims, weights)`), imported once; a missing torch is one line naming the extra."""
    require_engine(name)
    with _IMPORTING:
        if name == "torch":
            from platoon.local_server.engines import torch_engine

            return torch_engine
        from platoon.local_server.engines import numpy_engine

        return numpy_engine


def build_engine(name: str, dims: Qwen3Dims, weights: dict[str, np.ndarray]) -> Engine:
    """A trainable engine `name` holding `weights` (float32, transformers' names)."""
    engine: Engine = import_engine(name).build(dims, weights)
    return engine


def warm_up(base_model: str, engine: str) -> None:
    """Import what a first model needs (the engine's modules: torch and transformers' Qwen3 for `torch`) and load
    `base_model`'s tokenizer, so the first `create_model` pays only for building the weights. A failure is left for
    that request to report."""
    try:
        import_engine(engine).warm_up()
        get_tokenizer(base_model)
    except Exception:  # e.g. an unknown tokenizer: create_model says so in its answer
        return
