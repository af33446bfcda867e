"""What a run refuses of its Tinker service before any service starts: a loss function the service does not
compute, a base model the local server cannot serve.
"""

from __future__ import annotations

import difflib

from platoon.config.tinker import SDK_LOSS_FNS
from platoon.local_server.losses import LOSS_NAMES
from platoon.renderers.tokenizers import (
    cached_hub_tokenizers,
    registered_tokenizer_names,
    tokenizer_available_offline,
)

__all__ = ["local_model_problem", "loss_fn_problem", "sampling_client_kind_problem"]


def loss_fn_problem(loss_fn: str, *, local: bool, where: str = "train.loss_fn") -> str | None:
    """The refusal of a loss function the service would not compute (the local server computes fewer than the
    SDK names), with the ones it does; None when it is known."""
    if local:
        known, who, does = LOSS_NAMES, "the local server", "computes"
    else:
        known, who, does = SDK_LOSS_FNS, "the Tinker SDK", "knows"
    if loss_fn in known:
        return None
    close = difflib.get_close_matches(loss_fn, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{where}: {who} has no loss function {loss_fn!r}{hint}; it {does} {', '.join(known)}"


def sampling_client_kind_problem(kind: str, *, where: str = "train.sampling_client_kind") -> str | None:
    """The refusal of in-flight sampling where the installed Tinker SDK cannot ask for it (0.16.1 has no `kind`
    parameter); None for snapshot samplers, which every SDK has."""
    if kind != "inflight":
        return None
    import inspect
    from importlib.metadata import version

    import tinker  # only a config that asks for in-flight sampling pays for the import

    save = tinker.TrainingClient.save_weights_and_get_sampling_client
    if "kind" in inspect.signature(save).parameters:
        return None
    return (
        f"{where}: inflight needs a Tinker SDK with in-flight sampling clients (0.38 has them); this environment "
        f"has tinker {version('tinker')}: upgrade it (pip install 'tinker>=0.38,<0.39'), or leave {where} at snapshot"
    )


def _hub_offline() -> bool:
    """Whether the Hugging Face hub is out of reach by choice (`HF_HUB_OFFLINE=1`, as huggingface_hub reads it)."""
    try:
        from huggingface_hub import constants
    except ImportError:  # without huggingface_hub no tokenizer comes from the hub
        return True
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def local_model_problem(model: str, *, where: str = "train.model_name") -> str | None:
    """The refusal of a base model the local server cannot serve, with what it can; None when it can.

    It serves a model whose tokenizer it can load: one registered with platoon, a model directory, a model whose
    tokenizer is in the Hugging Face cache, or (the hub in reach) one the hub has. Only the hub's answer needs the
    network, so a model the hub would be asked for is left to the start when the hub can be reached.
    """
    if tokenizer_available_offline(model):
        return None
    # A hub id is `name` or `owner/name`: anything else names a directory
    is_path = model.startswith(("/", ".", "~")) or model.count("/") > 1
    if not is_path and not _hub_offline():
        return None
    served = [*registered_tokenizer_names(), *cached_hub_tokenizers()]
    close = difflib.get_close_matches(model, served, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    reason = (
        "no such model directory"
        if is_path
        else "its tokenizer is not in the Hugging Face cache and HF_HUB_OFFLINE=1 keeps the hub out of reach"
    )
    return (
        f"{where}: the local server cannot serve {model!r}{hint}: {reason}; it serves {', '.join(served)}, a model "
        "directory, or a Hugging Face model whose tokenizer `platoon prepare CONFIG` fetched"
    )
