"""The local server's engines: what does the model's arithmetic, chosen by name.

`numpy` (the default) runs the toy Qwen3 in numpy (`platoon.local_server.qwen3_numpy`) and needs no torch; `torch`
runs the same model through transformers and torch (the `local-torch` extra), for a GPU. Both start from the same
initial weights and exchange weights and optimizer state as numpy arrays under transformers' names, so one
checkpoint format serves both. Losses and sampling live above the engines (`losses`, `sampling`), in numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from platoon.errors import ConfigError
from platoon.extras import installed
from platoon.local_server.engines.base import (
    DEFAULT_ENGINE,
    ENGINE_NAMES,
    MISSING_TORCH,
    NON_FINITE_GRADIENT,
    AdamParams,
    Engine,
    LossGradient,
    ModelShape,
    NonFiniteGradient,
)
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
    "LossGradient",
    "ModelShape",
    "NonFiniteGradient",
    "build_engine",
    "engine_problem",
    "import_engine",
    "require_engine",
    "warm_up",
]


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


def import_engine(name: str) -> Any:
    """The engine's module (`build(dims, weights)`), imported once; a missing torch is one line naming the extra."""
    require_engine(name)
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
