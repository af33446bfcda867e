"""The Tinker settings training and evaluation configs share: which service (`tinker_base_url`) and the form of a
checkpoint path (`tinker://<run>/<weights|sampler_weights>/<name>`), checked where the config is read; and what a
run refuses before any service starts: a loss function the service does not compute, a model the local server
cannot serve.
"""

from __future__ import annotations

import difflib
import re
from urllib.parse import urlsplit

__all__ = [
    "CHECKPOINT_KINDS",
    "SDK_LOSS_FNS",
    "check_checkpoint_path",
    "check_tinker_base_url",
    "local_model_problem",
    "loss_fn_problem",
]

#: the loss functions of the Tinker SDK platoon installs (`tinker>=0.16.1,<0.17`, its `LossFnType`): the SDK refuses
#: any other name only once the first step's batch is built (a test compares this with the installed SDK's)
SDK_LOSS_FNS = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro")
#: the kinds of checkpoint a `tinker://` path names (the Tinker SDK parses the same two)
CHECKPOINT_KINDS = ("weights", "sampler_weights")
#: `tinker://<run>/<kind>/<name>`; `<`, `>` and spaces mark a placeholder copied from the docs, never a real path
_CHECKPOINT_PATH = re.compile(r"tinker://[^/\s<>]+/(?:weights|sampler_weights)/[^/\s<>]+")


def check_tinker_base_url(value: str | None) -> str | None:
    """`tinker_base_url`: None ($TINKER_BASE_URL decides), `local` (the embedded local server) or an http(s) URL."""
    if value is None or value == "local":
        return value
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL with a host, or `local`")
    return value


def check_checkpoint_path(value: str | None) -> str | None:
    """A checkpoint to sample: None (the base model) or `tinker://<run>/<weights|sampler_weights>/<name>`.

    Checked before any service starts: a placeholder such as `tinker://...` would otherwise fail only once the
    service answers that it has no such checkpoint.
    """
    if value is None:
        return value
    if not _CHECKPOINT_PATH.fullmatch(value) or "..." in value:
        raise ValueError(
            f"{value!r} is not a checkpoint path: write tinker://<run>/sampler_weights/<name> (a sampler_path "
            "of the training run's checkpoints.jsonl), or leave it unset for the base model"
        )
    return value


def loss_fn_problem(loss_fn: str, *, local: bool, where: str = "train.loss_fn") -> str | None:
    """The refusal of a loss function the service would not compute (the local server computes fewer than the
    SDK names), with the ones it does; None when it is known."""
    if local:
        from platoon.local_server.losses import LOSS_NAMES

        known, who, does = LOSS_NAMES, "the local server", "computes"
    else:
        known, who, does = SDK_LOSS_FNS, "the Tinker SDK", "knows"
    if loss_fn in known:
        return None
    close = difflib.get_close_matches(loss_fn, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{where}: {who} has no loss function {loss_fn!r}{hint}; it {does} {', '.join(known)}"


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
    from platoon.renderers.tokenizers import (
        cached_hub_tokenizers,
        registered_tokenizer_names,
        tokenizer_available_offline,
    )

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
