"""Per-microbatch processing and the step's optimizer metrics: consumed groups split into
minibatches (one optimizer step each) of microbatches (one `forward_backward` each); depth weighting, the
zero-advantage filter, the zero-objective skip and normalization per microbatch; KL, entropy, importance-weight and
clip metrics from the returned training logprobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from platoon.train.tinker.advantages import apply_depth_weighting
from platoon.train.tinker.datums import filter_zero_advantage_datums, loss_datums, zero_objective

if TYPE_CHECKING:
    import tinker

    from platoon.config.training import PlatoonTinkerRLTrainerConfig

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
    advantages normalized; None when nothing is sent. Adds the transforms' metrics."""
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
        return None  # under a zero-objective loss an all-zero microbatch is never sent
    return Microbatch(kept=kept, sent=loss_datums(kept, train_cfg.loss_fn))


def optim_metrics(datums: Sequence[tinker.Datum], outputs: Sequence[Any], config: Any) -> dict[str, float]:
    """KL, entropy, importance-weight and clip metrics on action tokens from the returned training logprobs
    against the sampling logprobs; `datums` still carry their masks."""
    import numpy as np

    sampled_parts: list[Any] = []
    trained_parts: list[Any] = []
    for datum, output in zip(datums, outputs, strict=False):
        trained = output["logprobs"]
        values = np.asarray(getattr(trained, "data", trained), dtype=np.float64)
        sampled = np.asarray(_data(datum, "logprobs"), dtype=np.float64)
        action = np.asarray(_data(datum, "mask"), dtype=np.float64) > 0
        n = min(len(values), len(sampled), len(action))
        sampled_parts.append(sampled[:n][action[:n]])
        trained_parts.append(values[:n][action[:n]])
    if not sampled_parts:
        return {}
    train_lps = np.concatenate(trained_parts)
    if not train_lps.size:
        return {}
    diffs = np.concatenate(sampled_parts) - train_lps
    weights = np.exp(-diffs)  # exp(train - sample)
    out = {
        "optim/kl_sample_train_v1": float(diffs.mean()),
        "optim/kl_sample_train_v2": float(0.5 * (diffs * diffs).mean()),
        "optim/entropy": float(-train_lps.mean()),
        "optim/importance_weight_mean": float(weights.mean()),
        "optim/importance_weight_std": float(weights.std()),
        "optim/importance_weight_min": float(weights.min()),
        "optim/importance_weight_max": float(weights.max()),
    }
    if config.loss_fn in ("cispo", "ppo"):
        low = float(config.loss_fn_config.get("clip_low_threshold", 0.0))
        high = float(config.loss_fn_config.get("clip_high_threshold", 5.0))
        below = float((weights < low).mean())
        above = float((weights > high).mean())
        out["optim/clip_frac_low"] = below
        out["optim/clip_frac_high"] = above
        out["optim/clip_frac_total"] = below + above
    return out


def split_batch(groups: Sequence[Any], minibatches: int, microbatches: int) -> list[list[list[Any]]]:
    """Consumed groups split into M minibatches of m microbatches each, in order."""
    per_mini = len(groups) // minibatches
    per_micro = per_mini // microbatches
    return [
        [
            list(groups[i * per_mini + j * per_micro : i * per_mini + (j + 1) * per_micro])
            for j in range(microbatches)
        ]
        for i in range(minibatches)
    ]
