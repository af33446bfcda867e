"""A Hugging Face Qwen3 checkpoint as the local server's base model: a directory with `config.json` and safetensors.

A base model that names such a directory (as `hf download Qwen/Qwen3-0.6B --local-dir DIR` or transformers'
`save_pretrained` leave it) starts from its weights, on either engine. A base model without weights (platoon/toy,
a directory holding only a tokenizer, a hub name) starts from the toy model's seeded random weights, as before.

Only plain Qwen3 decoders load: `model_type: qwen3`, SiLU, no attention bias, no sliding window, default RoPE. Any
other checkpoint is refused in one line rather than trained as something it is not. Weights are read as float32
whatever they were stored as (bfloat16, float16, float32), since both engines train in float32. This module
imports numpy only when it reads weights, so a config check can ask `checkpoint_problem` cheaply.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from platoon.local_server.qwen3_numpy import Qwen3Dims

__all__ = ["CheckpointError", "checkpoint_directory", "checkpoint_problem", "load_checkpoint"]

CONFIG_FILE = "config.json"
#: one file of weights, or an index naming the shards (`weight_map`: weight name -> file)
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint directory the local server cannot load; the message is one line naming what and why."""


def checkpoint_directory(base_model: str) -> Path | None:
    """The directory `base_model` names when it holds a checkpoint (`config.json` and safetensors weights)."""
    directory = Path(base_model).expanduser()
    if not directory.is_dir() or not (directory / CONFIG_FILE).is_file():
        return None
    if (directory / WEIGHTS_FILE).is_file() or (directory / INDEX_FILE).is_file():
        return directory
    return None


def checkpoint_problem(base_model: str) -> str | None:
    """Why the local server would refuse `base_model`'s checkpoint (its config, not yet its weights); None when
    it names no checkpoint or one it loads."""
    directory = checkpoint_directory(base_model)
    if directory is None:
        return None
    try:
        read_dims(directory)
    except CheckpointError as exc:
        return str(exc)
    return None


def load_checkpoint(directory: Path) -> tuple[Qwen3Dims, dict[str, np.ndarray]]:
    """The checkpoint's dims and float32 weights under transformers' names, checked against each other."""
    import numpy as np

    from platoon.local_server.qwen3_numpy import checked_weights

    dims = read_dims(directory)
    weights: dict[str, np.ndarray] = {}
    for file in _weight_files(directory):
        weights.update(read_safetensors(file))
    try:
        return dims, checked_weights(dims, weights, np.dtype(np.float32))
    except ValueError as exc:
        raise CheckpointError(f"{directory}: {exc}") from None


def read_dims(directory: Path) -> Qwen3Dims:
    """The model's sizes from its `config.json`, refusing what the local model does not compute."""
    from platoon.local_server.qwen3_numpy import DEFAULT_RMS_NORM_EPS, DEFAULT_ROPE_THETA, Qwen3Dims

    path = directory / CONFIG_FILE
    try:
        config = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable JSON config ({exc})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    model_type = config.get("model_type")
    if model_type != "qwen3":
        raise CheckpointError(
            f"{path}: model_type {model_type!r}; the local server loads Qwen3 checkpoints (model_type 'qwen3') "
            "only: serve this model elsewhere, or train platoon/toy"
        )
    unsupported = _unsupported_features(config)
    if unsupported:
        raise CheckpointError(f"{path}: {unsupported}, which the local server's Qwen3 does not compute")
    rope = config.get("rope_parameters") or {}
    try:
        heads = int(config["num_attention_heads"])
        return Qwen3Dims(
            vocab_size=int(config["vocab_size"]),
            hidden_size=int(config["hidden_size"]),
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            intermediate_size=int(config["intermediate_size"]),
            rms_norm_eps=float(config.get("rms_norm_eps", DEFAULT_RMS_NORM_EPS)),
            # transformers 4 writes `rope_theta`; 5 writes `rope_parameters: {rope_theta: ...}`
            rope_theta=float(config.get("rope_theta") or rope.get("rope_theta") or DEFAULT_ROPE_THETA),
            max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
            pad_token_id=config.get("pad_token_id"),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    except KeyError as exc:
        raise CheckpointError(f"{path}: {exc.args[0]!r} is missing") from None
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def _unsupported_features(config: dict[str, Any]) -> str | None:
    """The first setting of a Qwen3 config that departs from the plain decoder both engines compute."""
    if config.get("hidden_act", "silu") != "silu":
        return f"hidden_act {config['hidden_act']!r} (only 'silu')"
    if config.get("attention_bias"):
        return "attention_bias true"
    if config.get("use_sliding_window"):
        return "use_sliding_window true"
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else scaling
    if kind not in (None, "default"):
        return f"RoPE scaling {kind!r}"
    return None


def _weight_files(directory: Path) -> list[Path]:
    single = directory / WEIGHTS_FILE
    if single.is_file():
        return [single]
    index = directory / INDEX_FILE
    try:
        weight_map = json.loads(index.read_text("utf-8"))["weight_map"]
        files = sorted(set(weight_map.values()), key=str)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index}: not a safetensors index with a weight_map ({exc})") from None
    for name in files:
        # a shard is a file beside the index, never a path elsewhere
        if not isinstance(name, str) or Path(name).name != name or not (directory / name).is_file():
            raise CheckpointError(f"{index}: names {name!r}, which is not a file beside it")
    return [directory / name for name in files]


#: safetensors dtypes a checkpoint's weights may come in; bfloat16 has no numpy dtype and is widened by hand
_FLOAT_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2"}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file as float32 (the library parses the file; numpy, which has no bfloat16,
    cannot take bfloat16 from `safetensors.numpy`, so the raw bytes are converted here)."""
    import numpy as np
    from safetensors import SafetensorError, deserialize

    try:
        tensors = deserialize(path.read_bytes())
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    weights: dict[str, np.ndarray] = {}
    for name, tensor in tensors:
        dtype, raw = str(tensor["dtype"]).upper(), tensor["data"]
        if dtype == "BF16":
            # bfloat16 is the top half of a float32: shift it back into place
            array = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dtype in _FLOAT_DTYPES:
            array = np.frombuffer(raw, dtype=_FLOAT_DTYPES[dtype]).astype(np.float32)
        else:
            raise CheckpointError(
                f"{path}: tensor {name!r} is {dtype}, not a float type the local server reads"
            )
        weights[name] = array.reshape(tensor["shape"])
    return weights
