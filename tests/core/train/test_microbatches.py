"""The step's optimizer metrics on action tokens, checked against a hand computation."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import tinker

from platoon.train.tinker.microbatches import optim_metrics


def _datum(logprobs: list[float], mask: list[float]) -> tinker.Datum:
    n = len(logprobs)
    return tinker.Datum(
        model_input=tinker.ModelInput(chunks=[tinker.EncodedTextChunk(tokens=list(range(n)))]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData(data=list(range(n)), dtype="int64", shape=[n]),
            "logprobs": tinker.TensorData(data=logprobs, dtype="float32", shape=[n]),
            "mask": tinker.TensorData(data=mask, dtype="float32", shape=[n]),
        },
    )


def test_kl_entropy_importance_weights_and_clip_fractions_by_hand() -> None:
    # two datums; the masked-out positions (prompt tokens) must not count
    datums = [_datum([0.0, -1.0, -2.0], [0.0, 1.0, 1.0]), _datum([-0.5, 0.0], [1.0, 0.0])]
    trained = [{"logprobs": [9.0, -1.5, -1.0]}, {"logprobs": [-0.5, 9.0]}]
    config = SimpleNamespace(
        loss_fn="cispo", loss_fn_config={"clip_low_threshold": 0.9, "clip_high_threshold": 2.0}
    )
    metrics = optim_metrics(datums, trained, config)
    diffs = [-1.0 - -1.5, -2.0 - -1.0, -0.5 - -0.5]  # sampling - training: 0.5, -1.0, 0.0
    weights = [math.exp(-d) for d in diffs]  # 0.607, 2.718, 1.0
    mean_w = sum(weights) / 3
    assert metrics["optim/kl_sample_train_v1"] == pytest.approx(sum(diffs) / 3)
    assert metrics["optim/kl_sample_train_v2"] == pytest.approx(0.5 * sum(d * d for d in diffs) / 3)
    assert metrics["optim/entropy"] == pytest.approx((1.5 + 1.0 + 0.5) / 3)
    assert metrics["optim/importance_weight_mean"] == pytest.approx(mean_w)
    assert metrics["optim/importance_weight_std"] == pytest.approx(
        math.sqrt(sum((w - mean_w) ** 2 for w in weights) / 3)
    )
    assert (metrics["optim/importance_weight_min"], metrics["optim/importance_weight_max"]) == pytest.approx(
        (math.exp(-0.5), math.e)
    )
    assert metrics["optim/clip_frac_low"] == pytest.approx(1 / 3)  # 0.607 < 0.9
    assert metrics["optim/clip_frac_high"] == pytest.approx(1 / 3)  # 2.718 > 2.0
    assert metrics["optim/clip_frac_total"] == pytest.approx(2 / 3)


def test_no_action_tokens_no_metrics_and_no_clip_fractions_for_other_losses() -> None:
    assert (
        optim_metrics([_datum([0.0, -1.0], [0.0, 0.0])], [{"logprobs": [0.0, -1.0]}], SimpleNamespace()) == {}
    )
    config = SimpleNamespace(loss_fn="importance_sampling", loss_fn_config={})
    metrics = optim_metrics([_datum([-1.0], [1.0])], [{"logprobs": [-1.0]}], config)
    assert metrics["optim/importance_weight_mean"] == pytest.approx(1.0)  # on-policy: ratios are 1
    assert not any(key.startswith("optim/clip_frac") for key in metrics)
