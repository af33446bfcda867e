"""The numpy engine: the local model in numpy (`platoon.local_server.qwen3_numpy`), with no torch at all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from platoon.local_server import qwen3_numpy
from platoon.local_server.engines.base import AdamParams, LossGradient, NonFiniteGradient

__all__ = ["NumpyEngine", "build", "warm_up"]


def warm_up() -> None:
    """Nothing to import beyond this module."""


def build(dims: qwen3_numpy.Qwen3Dims, weights: dict[str, np.ndarray]) -> NumpyEngine:
    return NumpyEngine(qwen3_numpy.Qwen3Numpy(dims, _own_copy(weights)))


def _own_copy(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # The model updates its arrays in place: a caller's arrays must never change under it.
    return {name: np.array(value, dtype=np.float32, copy=True) for name, value in weights.items()}


class NumpyEngine:
    """See `platoon.local_server.engines.Engine`."""

    name = "numpy"

    def __init__(self, model: qwen3_numpy.Qwen3Numpy) -> None:
        self.model = model
        self.dims = model.dims
        self._optimizer: qwen3_numpy.AdamW | None = None
        self._has_gradient = False

    def logprobs(self, sequences: Sequence[Sequence[int]], targets: Sequence[np.ndarray]) -> list[np.ndarray]:
        return list(self.model.logprobs(_lists(sequences), list(targets)))

    def logprobs_backward(
        self, sequences: Sequence[Sequence[int]], targets: Sequence[np.ndarray], loss_grad: LossGradient
    ) -> list[np.ndarray]:
        self._has_gradient = True
        return list(self.model.logprobs_backward(_lists(sequences), list(targets), loss_grad))

    def optimizer_step(self, params: AdamParams) -> float:
        if not self._has_gradient:
            # As torch's AdamW skips weights without a gradient: no decay, no moments, no step counted.
            return 0.0
        grads = self.model.grads
        if params.grad_clip_norm > 0:
            norm = float(qwen3_numpy.clip_grads(grads, params.grad_clip_norm))
        else:
            norm = float(qwen3_numpy.global_grad_norm(grads))
        if not np.isfinite(norm):
            # A step on a NaN or infinite gradient would leave every weight NaN and every later sample failing.
            self.drop_gradient()
            raise NonFiniteGradient()
        if self._optimizer is None:
            self._optimizer = qwen3_numpy.AdamW()
        self._optimizer.step(
            self.model.weights,
            grads,
            lr=params.learning_rate,
            beta1=params.beta1,
            beta2=params.beta2,
            eps=params.eps,
            weight_decay=params.weight_decay,
        )
        self.drop_gradient()
        return norm

    def drop_gradient(self) -> None:
        self.model.zero_grad()
        self._has_gradient = False

    def frozen_copy(self) -> NumpyEngine:
        return NumpyEngine(qwen3_numpy.Qwen3Numpy(self.dims, _own_copy(self.model.weights)))

    def weights(self) -> dict[str, np.ndarray]:
        return _own_copy(self.model.weights)

    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        checked = qwen3_numpy.checked_weights(self.dims, weights, np.dtype(np.float32))
        for name, current in self.model.weights.items():
            current[...] = checked[name]
        self.drop_gradient()
        self._optimizer = None

    def optimizer_state(self) -> dict[str, np.ndarray]:
        if self._optimizer is None:
            return {}
        return {name: np.array(value, copy=True) for name, value in self._optimizer.state_dict().items()}

    def load_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        self._optimizer = qwen3_numpy.AdamW()
        self._optimizer.load_state_dict(state)

    def prefill(self, tokens: Sequence[int]) -> tuple[np.ndarray, Any]:
        return self.model.prefill(list(tokens))

    def repeat(self, cache: Any, count: int) -> Any:
        return cache.repeat(count) if count > 1 else cache

    def step(self, cache: Any, tokens: np.ndarray) -> tuple[np.ndarray, Any]:
        return self.model.step(cache, np.asarray(tokens, dtype=np.int64)), cache


def _lists(sequences: Sequence[Sequence[int]]) -> list[list[int]]:
    return [list(tokens) for tokens in sequences]
