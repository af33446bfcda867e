"""The Tinker settings training and evaluation configs share: which service (`tinker_base_url`), the embedded local
server's engine (`local_server`) and the form of a checkpoint path (`tinker://<run>/<weights|sampler_weights>/<name>`,
or skyrl-tx's `tinker://<run>/<name>`), checked where the config is read. What a run refuses of the service before it
starts is `platoon.startup.tinker`'s.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field

from platoon.config_defs import ConfigModel

__all__ = [
    "CHECKPOINT_KINDS",
    "SDK_LOSS_FNS",
    "LocalServerConfig",
    "check_checkpoint_path",
    "check_tinker_base_url",
]

#: the loss functions of the oldest Tinker SDK platoon allows (0.16.1, its `LossFnType`): what a start assumes when it
#: cannot read the installed SDK's own (`platoon.startup.tinker.sdk_loss_fns`), which newer SDKs extend
SDK_LOSS_FNS = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro")
#: the kinds of checkpoint a `tinker://` path names (the Tinker SDK parses the same two)
CHECKPOINT_KINDS = ("weights", "sampler_weights")
#: `tinker://<run>/<kind>/<name>`, or skyrl-tx's sampler path `tinker://<run>/<name>` (the name alone: a kind
#: without its name is refused); `<`, `>` and spaces mark a placeholder copied from the docs, never a real path
_CHECKPOINT_PATH = re.compile(
    r"tinker://[^/\s<>]+/(?:(?:weights|sampler_weights)/[^/\s<>]+|(?!(?:weights|sampler_weights)$)[^/\s<>]+)"
)


def check_tinker_base_url(value: str | None) -> str | None:
    """`tinker_base_url`: None ($TINKER_BASE_URL decides), `local` (the embedded local server) or an http(s) URL."""
    if value is None or value == "local":
        return value
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL with a host, or `local`")
    return value


def check_checkpoint_path(value: str | None) -> str | None:
    """A checkpoint to sample: None (the base model), `tinker://<run>/<weights|sampler_weights>/<name>`, or
    `tinker://<run>/<name>`, the sampler path skyrl-tx answers (it has no `sampler_weights/` segment).

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


class LocalServerConfig(ConfigModel):
    """The local Tinker-compatible server a command starts for `tinker_base_url: local`."""

    engine: Literal["numpy", "torch"] = Field(
        "numpy",
        description="what runs the model: numpy (no torch needed), or torch (the local-torch extra; for a GPU)",
    )
