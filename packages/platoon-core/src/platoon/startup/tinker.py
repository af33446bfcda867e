"""What a run refuses of its Tinker service before any service starts: a loss function the installed Tinker SDK
does not know or the local server does not compute, a base model the local server cannot serve, a local server
engine that cannot start here.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
from pathlib import Path

from platoon.config.tinker import SDK_LOSS_FNS
from platoon.gateway.tinker_sdk import installed_release
from platoon.local_server.engines import engine_problem
from platoon.local_server.losses import LOSS_NAMES
from platoon.local_server.pretrained import checkpoint_problem
from platoon.renderers.tokenizers import (
    cached_hub_tokenizers,
    registered_tokenizer_names,
    tokenizer_available_offline,
)

__all__ = [
    "NEWEST_SDK",
    "local_engine_problem",
    "local_model_problem",
    "loss_fn_problem",
    "sampling_client_kind_problem",
    "sdk_loss_fns",
]

#: the newest Tinker SDK release platoon allows (`tinker>=0.16.1,<0.39`)
NEWEST_SDK = "0.38"


@functools.cache
def sdk_loss_fns() -> tuple[str, ...]:
    """The loss functions of the installed Tinker SDK: the names of its `tinker.types.LossFnType` literal, which the
    SDK checks each request against (a newer SDK names more). Read from the module's source, so a start that never
    talks to the service does not import the SDK; without an SDK, the oldest one platoon allows (`SDK_LOSS_FNS`)."""
    spec = importlib.util.find_spec("tinker")  # a top-level name: finding it imports nothing
    if spec is None or spec.origin is None:
        return SDK_LOSS_FNS
    source = Path(spec.origin).parent / "types" / "loss_fn_type.py"
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return _imported_loss_fns()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Literal":
            names = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            found = tuple(name.value for name in names if isinstance(name, ast.Constant))
            if found and all(isinstance(name, str) for name in found):
                return found  # type: ignore[return-value]  # checked just above
    return _imported_loss_fns()


def _imported_loss_fns() -> tuple[str, ...]:
    """`LossFnType`'s names from the imported SDK, where its source could not be read."""
    import typing

    from tinker.types import LossFnType

    return tuple(typing.get_args(LossFnType))


def loss_fn_problem(loss_fn: str, *, local: bool, where: str = "train.loss_fn") -> str | None:
    """The refusal of a loss function the installed SDK would not send, or the local server would not compute (it
    computes fewer than the SDK names), with the ones they do; None when both take it."""
    known = sdk_loss_fns()
    if local and loss_fn not in LOSS_NAMES:
        return (
            f"{where}: the local server has no loss function {loss_fn!r}{_did_you_mean(loss_fn, LOSS_NAMES)}; it "
            f"computes {', '.join(LOSS_NAMES)}"
        )
    if loss_fn not in known:
        version = installed_release()
        who = f"the installed Tinker SDK (tinker {version})" if version else "the Tinker SDK"
        # platoon allows SDKs up to 0.38: an older one may lack a loss a newer one has
        newest = version is not None and version.startswith(NEWEST_SDK)
        upgrade = "" if newest else f", or install a newer tinker (platoon allows up to {NEWEST_SDK})"
        return (
            f"{where}: {who} has no loss function {loss_fn!r}{_did_you_mean(loss_fn, known)}; it knows "
            f"{', '.join(known)}: set {where} to one of them{upgrade}"
        )
    return None


def _did_you_mean(name: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def sampling_client_kind_problem(kind: str, *, where: str = "train.sampling_client_kind") -> str | None:
    """The refusal of in-flight sampling where the installed Tinker SDK cannot ask for it (0.16.1 has no `kind`
    parameter); None for snapshot samplers, which every SDK has."""
    if kind != "inflight":
        return None
    import inspect

    import tinker  # only a config that asks for in-flight sampling pays for the import

    save = tinker.TrainingClient.save_weights_and_get_sampling_client
    if "kind" in inspect.signature(save).parameters:
        return None
    return (
        f"{where}: inflight needs a Tinker SDK with in-flight sampling clients (0.38 has them); this environment "
        f"has tinker {installed_release()}: upgrade it (pip install 'tinker>=0.38,<0.39'), or leave {where} at snapshot"
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

    It serves a model whose tokenizer it can load: one registered with platoon, a model directory (a Qwen3
    checkpoint's, if it holds weights), a model whose tokenizer is in the Hugging Face cache, or (the hub in reach)
    one the hub has. Only the hub's answer needs the network, so a model the hub would be asked for is left to the
    start when the hub can be reached.
    """
    if tokenizer_available_offline(model):
        # a checkpoint directory must also hold a model the local server computes
        problem = checkpoint_problem(model)
        return None if problem is None else f"{where}: {problem}"
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


def local_engine_problem(engine: str) -> str | None:
    """The refusal of a local server engine whose packages are not installed (torch without torch), naming the
    extra that installs them; None when it can start."""
    return engine_problem(engine, where="local_server.engine")
