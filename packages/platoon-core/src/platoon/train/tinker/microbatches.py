"""Per-microbatch processing and the step's optimizer metrics (train.md 2.5, 2.11): consumed groups split into
minibatches (one optimizer step each) of microbatches (one `forward_backward` each); depth weighting, the
zero-advantage filter, the zero-objective skip and normalization per microbatch; KL, entropy, importance-weight and
clip metrics from the returned training logprobs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tinker

    from platoon.train.tinker.config_defs import PlatoonTinkerRLTrainerConfig

__all__ = ["Microbatch", "action_tokens", "optim_metrics", "prepare_microbatch", "split_batch"]


def _data(datum: tinker.Datum, key: str) -> list[float]:
    tensor = datum.loss_fn_inputs.get(key)
    return [] if tensor is None else [float(x) for x in tensor.data]


def action_tokens(datums: Sequence[tinker.Datum]) -> int:
    return int(sum(sum(1 for m in _data(d, "mask") if m > 0) for d in datums))


@dataclass
class Microbatch:
    """One microbatch ready to send: `sent` (the loss inputs) and `kept` (the same datums with their masks)."""

    kept: list[tinker.Datum]
    sent: list[tinker.Datum]


def prepare_microbatch(
    datums: Sequence[tinker.Datum], config: PlatoonTinkerRLTrainerConfig, metrics: dict[str, float]
) -> Microbatch | None:
    """Depth weighting, the zero-advantage filter, the zero-objective skip, then private keys stripped and
    advantages normalized (train.md 2.11 steps 1-6); None when nothing is sent. Adds the transforms' metrics."""
    from platoon.train.tinker.advantages import apply_depth_weighting
    from platoon.train.tinker.datums import filter_zero_advantage_datums, loss_datums, zero_objective

    train_cfg = config.train
    workflow = train_cfg.workflow_config
    if not datums:
        metrics["empty_microbatches"] = metrics.get("empty_microbatches", 0.0) + 1.0
        return None
    weighted, depth_metrics = apply_depth_weighting(
        datums,
        depth_level_weighting=workflow.depth_level_weighting,
        depth_level_discount_gamma=workflow.depth_level_discount_gamma,
    )
    for key, value in depth_metrics.items():
        metrics[key] = value  # per microbatch; the last one wins (one microbatch by default)
    kept, filter_metrics = filter_zero_advantage_datums(
        weighted,
        enabled=workflow.filter_zero_advantage_datums,
        loss_fn=train_cfg.loss_fn,
        loss_fn_config=train_cfg.loss_fn_config,
    )
    for key, value in filter_metrics.items():
        metrics[key] = metrics.get(key, 0.0) + value
    all_zero = all(
        a == 0.0 for d in kept for a, m in zip(_data(d, "advantages"), _data(d, "mask"), strict=True) if m > 0
    )
    if not kept or (zero_objective(train_cfg.loss_fn, train_cfg.loss_fn_config) and all_zero):
        return None  # under a zero-objective loss an all-zero microbatch is never sent (step 4)
    return Microbatch(kept=kept, sent=loss_datums(kept))


def optim_metrics(datums: Sequence[tinker.Datum], outputs: Sequence[Any], config: Any) -> dict[str, float]:
    """KL, entropy, importance-weight and clip metrics on action tokens from the returned training logprobs
    against the sampling logprobs (train.md 2.11); `datums` still carry their masks."""
    diffs: list[float] = []
    train_lps: list[float] = []
    for datum, output in zip(datums, outputs, strict=False):
        trained = output["logprobs"]
        values = list(getattr(trained, "data", trained))
        for sampled, lp, m in zip(_data(datum, "logprobs"), values, _data(datum, "mask"), strict=False):
            if m > 0:
                diffs.append(sampled - float(lp))
                train_lps.append(float(lp))
    if not diffs:
        return {}
    weights = [math.exp(-d) for d in diffs]  # exp(train - sample)
    out = {
        "optim/kl_sample_train_v1": statistics.fmean(diffs),
        "optim/kl_sample_train_v2": 0.5 * statistics.fmean(d * d for d in diffs),
        "optim/entropy": -statistics.fmean(train_lps),
        "optim/importance_weight_mean": statistics.fmean(weights),
        "optim/importance_weight_std": statistics.pstdev(weights),
        "optim/importance_weight_min": min(weights),
        "optim/importance_weight_max": max(weights),
    }
    if config.loss_fn in ("cispo", "ppo"):
        low = float(config.loss_fn_config.get("clip_low_threshold", 0.0))
        high = float(config.loss_fn_config.get("clip_high_threshold", 5.0))
        below = sum(1 for w in weights if w < low)
        above = sum(1 for w in weights if w > high)
        out["optim/clip_frac_low"] = below / len(weights)
        out["optim/clip_frac_high"] = above / len(weights)
        out["optim/clip_frac_total"] = (below + above) / len(weights)
    return out


def split_batch(groups: Sequence[Any], minibatches: int, microbatches: int) -> list[list[list[Any]]]:
    """Consumed groups split into M minibatches of m microbatches each, in order (train.md 2.5)."""
    per_mini = len(groups) // minibatches
    per_micro = per_mini // microbatches
    return [
        [
            list(groups[i * per_mini + j * per_micro : i * per_mini + (j + 1) * per_micro])
            for j in range(microbatches)
        ]
        for i in range(minibatches)
    ]
