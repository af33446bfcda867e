"""The local server's built-in Tinker losses: cross_entropy, importance_sampling, ppo, cispo.

Each loss maps one datum's training logprobs and its `loss_fn_inputs` to an elementwise loss whose sum is the
datum's loss; the server sums over datums (clients normalise advantages themselves).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: the service's clip thresholds for ppo and cispo when `loss_fn_config` leaves them out
DEFAULT_CLIP_LOW = 0.8
DEFAULT_CLIP_HIGH = 1.2

#: loss name -> the loss_fn_inputs it reads besides `target_tokens`
REQUIRED_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": (),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
}

LOSS_NAMES: tuple[str, ...] = tuple(REQUIRED_INPUTS)

LossFn = Callable[["torch.Tensor", Mapping[str, "torch.Tensor"], Mapping[str, float]], "torch.Tensor"]


def _clip(config: Mapping[str, float]) -> tuple[float, float]:
    low = config.get("clip_low_threshold")
    high = config.get("clip_high_threshold")
    return (
        DEFAULT_CLIP_LOW if low is None else float(low),
        DEFAULT_CLIP_HIGH if high is None else float(high),
    )


def cross_entropy(
    lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, float]
) -> torch.Tensor:
    # A missing `weights` counts every target (the SDK's custom-loss forward sends explicit zeros instead).
    weights = inputs.get("weights")
    return -lp if weights is None else -(lp * weights)


def _ratio(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    import torch

    return torch.exp(lp - inputs["logprobs"])


def importance_sampling(
    lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, float]
) -> torch.Tensor:
    return -(_ratio(lp, inputs) * inputs["advantages"])


def ppo(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, float]) -> torch.Tensor:
    import torch

    low, high = _clip(config)
    ratio = _ratio(lp, inputs)
    advantages = inputs["advantages"]
    return -torch.minimum(ratio * advantages, torch.clamp(ratio, low, high) * advantages)


def cispo(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, float]) -> torch.Tensor:
    import torch

    low, high = _clip(config)
    # The clipped ratio is a constant weight: the gradient flows through lp alone (REINFORCE with IS weights).
    weight = torch.clamp(_ratio(lp, inputs), low, high).detach()
    return -(weight * lp * inputs["advantages"])


LOSSES: dict[str, LossFn] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
}


def get_loss(name: str) -> LossFn:
    """The elementwise loss for a Tinker loss name; an unknown name is a ValueError listing the supported ones."""
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(
            f"unsupported loss function {name!r}; the local server supports {', '.join(LOSS_NAMES)}"
        ) from None


def check_inputs(name: str, inputs: Mapping[str, Any], length: int, index: int) -> None:
    """Refuse a datum whose loss_fn_inputs lack a key the loss reads or do not match the input length."""
    for key in ("target_tokens", *REQUIRED_INPUTS[name]):
        if key not in inputs:
            raise ValueError(f"datum {index}: loss {name!r} needs loss_fn_inputs[{key!r}]")
    for key, value in inputs.items():
        if key in LOSS_INPUT_KEYS and value.shape[0] != length:
            raise ValueError(
                f"datum {index}: loss_fn_inputs[{key!r}] has {value.shape[0]} entries for a model input of "
                f"{length} tokens (they must be equal: target i is predicted from input tokens 0..i)"
            )


#: the per-token inputs whose length must equal the model input's
LOSS_INPUT_KEYS = frozenset({"target_tokens", "weights", "logprobs", "advantages"})
