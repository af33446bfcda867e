"""The local server's built-in Tinker losses: cross_entropy, importance_sampling, ppo, cispo, gspo and
stable_reinforce.

Each loss maps one datum's training logprobs and its `loss_fn_inputs` (numpy arrays) to an elementwise loss whose sum
is the datum's loss, and to that loss's gradient with respect to the logprobs, which every engine backpropagates the
same way; the server sums over datums (clients normalise advantages themselves). stable_reinforce also reads the
sampler's own logprobs, which the server recorded when it sampled (`platoon.local_server.stability`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

#: the service's clip thresholds for ppo and cispo when `loss_fn_config` leaves them out (gspo takes the same)
DEFAULT_CLIP_LOW = 0.8
DEFAULT_CLIP_HIGH = 1.2
#: stable_reinforce's pull towards the sampler when `loss_fn_config` has no `kl_coeff`: none, as the service's
#: default is not published
DEFAULT_KL_COEFF = 0.0

#: the sampler's recorded logprob of each target and whether the target has one (1.0) or not (0.0): the server
#: sets them from its stability records, over any input of that name a request sent
RECORDED_LOGPROBS = "@recorded_logprobs"
RECORDED_MASK = "@recorded_mask"

#: loss name -> the loss_fn_inputs it reads besides `target_tokens`
REQUIRED_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": (),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "gspo": ("logprobs", "advantages"),
    "stable_reinforce": ("advantages",),
}
#: the losses whose datums must name the sampled sequence behind each trained token (`loss_fn_input_spans`)
NEEDS_STABILITY_RECORDS = frozenset({"stable_reinforce"})

#: every loss the local server computes, in one place (the HTTP layer and platoon's start checks read it)
LOSS_NAMES: tuple[str, ...] = tuple(REQUIRED_INPUTS)

#: (one datum's logprobs, its loss_fn_inputs, loss_fn_config) -> (elementwise loss, d loss / d logprobs)
LossFn = Callable[
    ["np.ndarray", Mapping[str, "np.ndarray"], Mapping[str, float]], tuple["np.ndarray", "np.ndarray"]
]


def _clip(config: Mapping[str, float]) -> tuple[float, float]:
    low = config.get("clip_low_threshold")
    high = config.get("clip_high_threshold")
    return (
        DEFAULT_CLIP_LOW if low is None else float(low),
        DEFAULT_CLIP_HIGH if high is None else float(high),
    )


def cross_entropy(
    lp: np.ndarray, inputs: Mapping[str, np.ndarray], config: Mapping[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    # A missing `weights` counts every target (the SDK's custom-loss forward sends explicit zeros instead).
    weights = inputs.get("weights")
    if weights is None:
        weights = np.ones_like(lp)
    return -(lp * weights), -weights


def _ratio(lp: np.ndarray, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    import numpy as np

    return np.exp(lp - inputs["logprobs"])


def importance_sampling(
    lp: np.ndarray, inputs: Mapping[str, np.ndarray], config: Mapping[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    weighted = _ratio(lp, inputs) * inputs["advantages"]
    return -weighted, -weighted


def _clipped_objective(
    ratio: np.ndarray, advantages: np.ndarray, low: float, high: float
) -> tuple[np.ndarray, np.ndarray]:
    """PPO's `-min(r A, clip(r) A)` and its gradient with respect to log r.

    The gradient flows through the unclipped term where it is the smaller (or they tie: inside the clip range they
    are equal and clip passes the gradient), and not at all where the clipped term is smaller (clip is flat there).
    """
    import numpy as np

    unclipped = ratio * advantages
    clipped = np.clip(ratio, low, high) * advantages
    return -np.minimum(unclipped, clipped), -np.where(unclipped <= clipped, unclipped, 0.0).astype(
        ratio.dtype
    )


def ppo(
    lp: np.ndarray, inputs: Mapping[str, np.ndarray], config: Mapping[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    low, high = _clip(config)
    return _clipped_objective(_ratio(lp, inputs), inputs["advantages"], low, high)


def cispo(
    lp: np.ndarray, inputs: Mapping[str, np.ndarray], config: Mapping[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    low, high = _clip(config)
    # The clipped ratio is a constant weight: the gradient flows through lp alone (REINFORCE with IS weights).
    weight = np.clip(_ratio(lp, inputs), low, high) * inputs["advantages"]
    return -(weight * lp), -weight


def gspo(
    lp: np.ndarray, inputs: Mapping[str, np.ndarray], config: Mapping[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    """GSPO-token (Zheng et al. 2025, as Tinker's GSPO page writes it): every token carries the sequence's ratio,
    the geometric mean of the token ratios over `sequence_ratio_mask`, with its own logprob's gradient; then PPO's
    clipped objective on that ratio."""
    import numpy as np

    low, high = _clip(config)
    mask = inputs.get("sequence_ratio_mask")
    marked = np.ones(lp.shape, dtype=bool) if mask is None else mask != 0
    token_log_ratios = (lp - inputs["logprobs"])[marked]
    # No marked token leaves nothing to compare: the sequence counts as on-policy (ratio 1).
    sequence_log_ratio = token_log_ratios.mean(dtype=np.float32) if token_log_ratios.size else np.float32(0.0)
    # Each token's ratio has the sequence's value, and d ratio / d lp = ratio through its own logprob.
    ratio = np.full(lp.shape, np.exp(sequence_log_ratio), dtype=np.float32)
    return _clipped_objective(ratio, inputs["advantages"], low, high)


def stable_reinforce(
    lp: np.ndarray, inputs: Mapping[str, np.ndarray], config: Mapping[str, float]
) -> tuple[np.ndarray, np.ndarray]:
    """The local server's stand-in for hosted Tinker's StableReinforce, whose objective is not published.

    On each token whose sampled sequence the server recorded: REINFORCE weighted by the truncated importance ratio
    min(1, p/q) against the sampler's own recorded logprob q (a constant weight, as cispo's), plus
    `kl_coeff` x (log p - log q)^2 / 2, which pulls the trained policy back towards what was sampled. Tokens without
    a record (prompts) add nothing.
    """
    import numpy as np

    kl_coeff = float(config.get("kl_coeff", DEFAULT_KL_COEFF))
    has_record = inputs[RECORDED_MASK]
    drift = lp - inputs[RECORDED_LOGPROBS]
    # Truncated at 1: a token the trained policy now likes more than the sampler did is not up-weighted.
    weight = np.exp(np.minimum(drift, 0.0)) * inputs["advantages"]
    loss = has_record * (-(weight * lp) + 0.5 * kl_coeff * drift * drift)
    return loss, has_record * (-weight + kl_coeff * drift)


LOSSES: dict[str, LossFn] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
    "gspo": gspo,
    "stable_reinforce": stable_reinforce,
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
LOSS_INPUT_KEYS = frozenset(
    {
        "target_tokens",
        "weights",
        "logprobs",
        "advantages",
        "sequence_ratio_mask",
        RECORDED_LOGPROBS,
        RECORDED_MASK,
    }
)
