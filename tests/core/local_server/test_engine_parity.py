"""The numpy and torch engines from the same initial weights: the same tokens for seeded samples, the same losses,
logprobs and gradients for every loss the server computes, and checkpoints each engine reads from the other.

Tolerances: logprobs and elementwise losses within 1e-5 (float32 arithmetic in a different order), the gradient
norm within a relative 1e-4, and the weights after an AdamW step within 1e-5: Adam moves each weight by about the
learning rate (here 1e-3) times the sign of its gradient, so any gradient that differed in more than float noise
would move a weight by about 2e-3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from platoon.local_server.backend import ModelBackend
from platoon.local_server.losses import LOSS_NAMES, RECORDED_LOGPROBS, RECORDED_MASK

pytest.importorskip("torch")

MODEL = "platoon/toy"
PROMPT = [257, *b"user\nPick a letter.", 258, 10, 257, *b"assistant\n"]
ENGINES = ("numpy", "torch")
ADAM = {"learning_rate": 1e-3, "weight_decay": 0.01}


def _td(values: list[Any], dtype: str) -> dict[str, Any]:
    return {"data": values, "dtype": dtype, "shape": [len(values)]}


def _data(seed: int = 0) -> list[dict[str, Any]]:
    """Two datums of different lengths carrying every input any loss reads, the recorded sampler logprobs of
    stable_reinforce among them (the server sets those from its stability records)."""
    rng = np.random.default_rng(seed)
    out = []
    for length in (23, 14):
        tokens = rng.integers(0, 265, length).tolist()
        n = length - 1
        sampled = (-5.6 + 0.4 * rng.standard_normal(n)).tolist()
        inputs = {
            "weights": rng.random(n).tolist(),
            "logprobs": sampled,
            "advantages": rng.standard_normal(n).tolist(),
            "sequence_ratio_mask": [0.0] * 3 + [1.0] * (n - 3),
            RECORDED_LOGPROBS: sampled,
            RECORDED_MASK: [0.0] * 3 + [1.0] * (n - 3),
        }
        loss_inputs = {"target_tokens": _td(tokens[1:], "int64")}
        loss_inputs |= {key: _td(values, "float32") for key, values in inputs.items()}
        out.append({"model_input": {"chunks": [{"tokens": tokens[:-1]}]}, "loss_fn_inputs": loss_inputs})
    return out


def _both() -> dict[str, ModelBackend]:
    return {engine: ModelBackend.create(MODEL, engine=engine) for engine in ENGINES}


def _assert_same_weights(a: ModelBackend, b: ModelBackend, atol: float = 1e-5) -> None:
    got, want = a.engine.weights(), b.engine.weights()
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=atol, rtol=0, err_msg=name)


def test_both_engines_start_from_the_same_weights() -> None:
    backends = _both()
    _assert_same_weights(backends["numpy"], backends["torch"], atol=0.0)


@pytest.mark.parametrize(
    "params",
    [
        {"max_tokens": 24, "temperature": 0.0},
        {"max_tokens": 24, "seed": 5},
        {"max_tokens": 24, "seed": 9, "temperature": 0.8, "top_k": 20, "top_p": 0.9},
    ],
)
def test_a_seeded_sample_gives_the_same_tokens_on_both_engines(params: dict[str, Any]) -> None:
    backends = _both()
    outs = {
        engine: backend.sample(PROMPT, num_samples=4, sampling_params=params, prompt_logprobs=True)
        for engine, backend in backends.items()
    }
    for mine, theirs in zip(outs["numpy"]["sequences"], outs["torch"]["sequences"], strict=True):
        assert mine["tokens"] == theirs["tokens"] and len(mine["tokens"]) == 24
        np.testing.assert_allclose(mine["logprobs"], theirs["logprobs"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(
        outs["numpy"]["prompt_logprobs"][1:], outs["torch"]["prompt_logprobs"][1:], atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("loss_fn", LOSS_NAMES)
def test_losses_and_gradients_agree_for_every_loss(loss_fn: str) -> None:
    backends = _both()
    config = {"kl_coeff": 0.3} if loss_fn == "stable_reinforce" else {"clip_low_threshold": 0.9}
    outs = {engine: b.forward_backward(_data(), loss_fn, config) for engine, b in backends.items()}
    for mine, theirs in zip(outs["numpy"]["loss_fn_outputs"], outs["torch"]["loss_fn_outputs"], strict=True):
        for key in ("logprobs", "elementwise_loss"):
            assert mine[key]["shape"] == theirs[key]["shape"]
            np.testing.assert_allclose(mine[key]["data"], theirs[key]["data"], atol=1e-5, rtol=0, err_msg=key)
    assert outs["numpy"]["metrics"]["loss:sum"] == pytest.approx(
        outs["torch"]["metrics"]["loss:sum"], abs=1e-4
    )
    norms = {engine: b.optim_step(ADAM)["metrics"]["grad_norm:mean"] for engine, b in backends.items()}
    assert norms["numpy"] > 0 and norms["numpy"] == pytest.approx(norms["torch"], rel=1e-4)
    _assert_same_weights(backends["numpy"], backends["torch"])


@pytest.mark.parametrize(("writer", "reader"), [("numpy", "torch"), ("torch", "numpy")])
def test_a_checkpoint_of_one_engine_loads_into_the_other(writer: str, reader: str, tmp_path: Path) -> None:
    data = _data(1)
    trained = ModelBackend.create(MODEL, engine=writer)
    for _ in range(2):
        trained.forward_backward(data, "cross_entropy", None)
        trained.optim_step(ADAM)
    trained.save(str(tmp_path / "state"), with_optimizer=True)
    assert ModelBackend.read_meta(str(tmp_path / "state"))["engine"] == writer

    loaded = ModelBackend.create(MODEL, engine=reader)
    loaded.load(str(tmp_path / "state"), with_optimizer=True)
    _assert_same_weights(loaded, trained, atol=0.0)
    # The optimizer's moments and step count came along: one more step lands in the same place on both.
    for backend in (trained, loaded):
        backend.forward_backward(data, "cross_entropy", None)
        backend.optim_step(ADAM)
    _assert_same_weights(loaded, trained)
    greedy = {"max_tokens": 12, "temperature": 0.0}
    assert (
        loaded.sample(PROMPT, num_samples=1, sampling_params=greedy)["sequences"]
        == trained.sample(PROMPT, num_samples=1, sampling_params=greedy)["sequences"]
    )
