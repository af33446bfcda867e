"""What every engine shares: the `Engine` protocol, the optimizer step's hyperparameters, and the lines an engine
refuses with. Engines import this module, never the package (which imports them by name)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from platoon.local_server.qwen3_numpy import Qwen3Dims

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
