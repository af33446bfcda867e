"""The numpy Qwen3: its backward against finite differences, cached decoding against the full forward, weight
loading, initialisation and the optimizer (numpy only; the comparisons with transformers' model are in
test_qwen3_numpy_vs_torch.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from platoon.local_server.backend import ModelShape
from platoon.local_server.qwen3_numpy import (
    AdamW,
    Qwen3Dims,
    Qwen3Numpy,
    clip_grads,
    global_grad_norm,
    initial_weights,
    weight_shapes,
)

TINY = Qwen3Dims(
    vocab_size=11,
    hidden_size=8,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
    intermediate_size=12,
)


def lively_weights(dims: Qwen3Dims, seed: int) -> dict[str, np.ndarray]:
    """Weights far from the 0.02 initialisation (which leaves every layer nearly linear) and norm weights away
    from 1, so every nonlinearity and every weight's gradient is exercised."""
    rng = np.random.default_rng(seed + 1)
    weights = initial_weights(dims, seed)
    for name, value in weights.items():
        if value.ndim == 1:
            weights[name] = value + rng.uniform(-0.5, 0.5, value.shape).astype(np.float32)
        else:
            weights[name] = value * np.float32(20.0)
    return weights


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize(
    ("block_bytes", "dims"),
    [
        (Qwen3Numpy.attention_block_bytes, TINY),
        (1, TINY),
        (Qwen3Numpy.attention_block_bytes, dataclasses.replace(TINY, tie_word_embeddings=False)),
    ],
    ids=["one-block", "row-blocks", "own-head"],
)
def test_the_backward_matches_central_finite_differences_for_every_weight(
    block_bytes: int, dims: Qwen3Dims
) -> None:
    model = Qwen3Numpy(dims, lively_weights(dims, 0), dtype=np.float64)
    model.attention_block_bytes = block_bytes  # 1: attention runs one query row at a time
    rng = np.random.default_rng(2)
    # lengths differ, so the padded batch is part of what is checked
    sequences = [rng.integers(0, 11, n).tolist() for n in (5, 3, 7)]
    targets = [rng.integers(0, 11, len(seq)) for seq in sequences]
    coefficients = [rng.standard_normal(len(seq)) for seq in sequences]

    def loss() -> float:
        logprobs = model.logprobs(sequences, targets)
        return float(sum(np.dot(c, lp) for c, lp in zip(coefficients, logprobs, strict=True)))

    model.logprobs_backward(sequences, targets, lambda logprobs: coefficients)
    step = 1e-6
    for name, weight in model.weights.items():
        numeric = np.zeros_like(weight)
        for index in np.ndindex(weight.shape):
            saved = weight[index]
            weight[index] = saved + step
            above = loss()
            weight[index] = saved - step
            below = loss()
            weight[index] = saved
            numeric[index] = (above - below) / (2 * step)
        np.testing.assert_allclose(model.grads[name], numeric, rtol=1e-5, atol=1e-7, err_msg=name)
        assert np.abs(numeric).max() > 1e-3, f"{name}'s gradient is too small to check anything"


def test_gradients_accumulate_across_calls_until_zero_grad() -> None:
    model = Qwen3Numpy(TINY, lively_weights(TINY, 1))
    sequences, targets = [[1, 2, 3, 4]], [[2, 3, 4, 5]]
    ones = [np.ones(4, dtype=np.float32)]
    model.logprobs_backward(sequences, targets, lambda logprobs: ones)
    once = {name: grad.copy() for name, grad in model.grads.items()}
    model.logprobs_backward(sequences, targets, lambda logprobs: ones)
    for name, grad in model.grads.items():
        np.testing.assert_allclose(grad, 2 * once[name], rtol=1e-6, atol=1e-7, err_msg=name)
    model.zero_grad()
    assert all(not grad.any() for grad in model.grads.values())


def test_loss_grad_receives_the_logprobs_that_are_returned() -> None:
    model = Qwen3Numpy(TINY, lively_weights(TINY, 1))
    seen: list[list[np.ndarray]] = []

    def loss_grad(logprobs: list[np.ndarray]) -> list[np.ndarray]:
        seen.append(logprobs)
        return [np.zeros_like(lp) for lp in logprobs]

    returned = model.logprobs_backward([[1, 2, 3], [4, 5]], [[2, 3, 4], [5, 6]], loss_grad)
    assert [lp.shape for lp in returned] == [(3,), (2,)]
    for ours, theirs in zip(returned, seen[0], strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert all(not grad.any() for grad in model.grads.values())


def test_a_padded_batch_gives_each_sequence_its_own_logprobs() -> None:
    model = Qwen3Numpy(TINY, lively_weights(TINY, 3))
    sequences = [[1, 2, 3, 4, 5, 6], [7, 8], [9, 10, 0]]
    targets = [[2, 3, 4, 5, 6, 7], [8, 9], [10, 0, 1]]
    together = model.logprobs(sequences, targets)
    for seq, target, batched in zip(sequences, targets, together, strict=True):
        (alone,) = model.logprobs([seq], [target])
        np.testing.assert_allclose(batched, alone, rtol=1e-5, atol=1e-6)


def test_attention_in_blocks_of_query_rows_gives_the_same_results() -> None:
    whole = Qwen3Numpy(TINY, lively_weights(TINY, 3))
    blocked = Qwen3Numpy(TINY, lively_weights(TINY, 3))
    blocked.attention_block_bytes = 3 * 4 * 40  # three rows of 40 keys at a time
    rng = np.random.default_rng(8)
    sequences = [rng.integers(0, 11, n).tolist() for n in (40, 23)]
    targets = [rng.integers(0, 11, len(seq)) for seq in sequences]
    coefficients = [rng.standard_normal(len(seq)).astype(np.float32) for seq in sequences]
    for ours, theirs in zip(
        blocked.logprobs_backward(sequences, targets, lambda lp: coefficients),
        whole.logprobs_backward(sequences, targets, lambda lp: coefficients),
        strict=True,
    ):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    for name, grad in whole.grads.items():
        np.testing.assert_allclose(blocked.grads[name], grad, rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(blocked.prefill(sequences[0])[0], whole.prefill(sequences[0])[0], atol=1e-5)


def test_logprobs_are_the_log_softmax_of_the_prefill_logits() -> None:
    model = Qwen3Numpy(TINY, lively_weights(TINY, 4))
    tokens, targets = [3, 1, 4, 1, 5, 9, 2, 6], [1, 4, 1, 5, 9, 2, 6, 5]
    logits, _ = model.prefill(tokens)
    (logprobs,) = model.logprobs([tokens], [np.array(targets)])
    expected = log_softmax(logits.astype(np.float64))[np.arange(len(targets)), targets]
    np.testing.assert_allclose(logprobs, expected, rtol=1e-5, atol=1e-5)


def test_cached_steps_give_the_logits_of_a_full_forward_and_the_cache_grows() -> None:
    model = Qwen3Numpy(TINY, lively_weights(TINY, 5))
    rng = np.random.default_rng(6)
    prompt = rng.integers(0, 11, 60).tolist()
    _, cache = model.prefill(prompt)
    capacity = cache.capacity
    cache = cache.repeat(3)
    assert (cache.batch_size, cache.length) == (3, 60)
    rows = [list(prompt) for _ in range(3)]
    for _ in range(12):  # past the prefill's capacity of 64
        tokens = rng.integers(0, 11, 3)
        for row, token in zip(rows, tokens, strict=True):
            row.append(int(token))
        step_logits = model.step(cache, tokens)
        for row, logits_of_row in zip(rows, step_logits, strict=True):
            full, _ = model.prefill(row)
            np.testing.assert_allclose(logits_of_row, full[-1], rtol=1e-5, atol=1e-5)
    assert cache.length == 72 and cache.capacity > capacity


def test_step_refuses_a_token_count_other_than_the_cache_batch() -> None:
    model = Qwen3Numpy(TINY, initial_weights(TINY, 0))
    _, cache = model.prefill([1, 2])
    with pytest.raises(ValueError, match="step needs 1 tokens"):
        model.step(cache.repeat(1), np.array([1, 2]))
    with pytest.raises(ValueError, match="outside the vocabulary of 11"):
        model.step(cache, np.array([11]))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda w: w.pop("model.layers.1.mlp.up_proj.weight"),
            "'model.layers.1.mlp.up_proj.weight' is missing",
        ),
        (
            lambda w: w.update({"model.layers.0.self_attn.k_proj.weight": np.zeros((8, 8), np.float32)}),
            r"'model.layers.0.self_attn.k_proj.weight' has shape \(8, 8\), expected \(4, 8\)",
        ),
        (
            lambda w: w.update({"model.layers.2.mlp.up_proj.weight": np.zeros((12, 8), np.float32)}),
            "'model.layers.2.mlp.up_proj.weight' is not a weight of this model",
        ),
        (
            lambda w: w.update({"lm_head.weight": np.ones((11, 8), np.float32)}),
            "'lm_head.weight' differs from 'model.embed_tokens.weight'",
        ),
    ],
    ids=["missing", "wrong-shape", "unexpected", "untied-head"],
)
def test_bad_weights_are_refused_naming_the_key(
    edit: Callable[[dict[str, np.ndarray]], object], message: str
) -> None:
    weights = initial_weights(TINY, 0)
    edit(weights)
    with pytest.raises(ValueError, match=message):
        Qwen3Numpy(TINY, weights)


def test_a_transformers_state_dict_with_its_tied_head_loads_without_it() -> None:
    weights = initial_weights(TINY, 0)
    state_dict = {**weights, "lm_head.weight": weights["model.embed_tokens.weight"]}
    model = Qwen3Numpy(TINY, state_dict)
    assert list(model.weights) == list(weight_shapes(TINY))
    # the caller's float32 arrays are used, not copies: an in-place update reaches the model
    assert model.weights["model.norm.weight"] is weights["model.norm.weight"]


def test_initial_weights_are_seeded_and_shaped_as_transformers_names_them() -> None:
    dims = Qwen3Dims.from_shape(ModelShape(), vocab_size=265, pad_token_id=256)
    assert (dims.rms_norm_eps, dims.rope_theta, dims.max_position_embeddings) == (1e-6, 10000.0, 32768)
    np.random.seed(0)
    first = initial_weights(dims, 7)
    np.random.seed(1)
    again = initial_weights(dims, 7)
    other = initial_weights(dims, 8)
    assert list(first) == list(weight_shapes(dims))
    assert first["model.layers.0.self_attn.q_proj.weight"].shape == (128, 128)
    assert first["model.layers.0.self_attn.k_proj.weight"].shape == (64, 128)
    assert first["model.embed_tokens.weight"].shape == (265, 128)
    for name, value in first.items():
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, again[name])
    assert not np.array_equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])
    assert first["model.embed_tokens.weight"].std() == pytest.approx(0.02, rel=0.05)
    assert not first["model.embed_tokens.weight"][256].any()
    np.testing.assert_array_equal(first["model.layers.1.self_attn.q_norm.weight"], np.ones(32, np.float32))


def test_the_first_adamw_step_moves_each_weight_by_lr_against_its_gradient_sign() -> None:
    weights = {"w": np.array([1.0, -2.0, 3.0], np.float32)}
    grads = {"w": np.array([0.5, -0.25, 0.0], np.float32)}
    AdamW().step(weights, grads, lr=0.1, beta1=0.9, beta2=0.95, eps=1e-12, weight_decay=0.5)
    # decay first (x 0.95), then the bias-corrected update -lr * g / |g| (0 for a zero gradient)
    np.testing.assert_allclose(weights["w"], [0.95 - 0.1, -1.9 + 0.1, 2.85], rtol=1e-6)


def test_adamw_resumes_from_its_state_dict() -> None:
    rng = np.random.default_rng(0)
    start = {
        "a": rng.standard_normal((3, 4)).astype(np.float32),
        "b": rng.standard_normal(5).astype(np.float32),
    }
    steps = [
        {name: rng.standard_normal(w.shape).astype(np.float32) for name, w in start.items()} for _ in range(4)
    ]
    hyper = {"lr": 0.01, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}

    straight = {name: w.copy() for name, w in start.items()}
    optimizer = AdamW()
    for grads in steps:
        optimizer.step(straight, grads, **hyper)

    resumed = {name: w.copy() for name, w in start.items()}
    first = AdamW()
    for grads in steps[:2]:
        first.step(resumed, grads, **hyper)
    state = {key: np.array(value) for key, value in first.state_dict().items()}
    assert sorted(state) == ["a.exp_avg", "a.exp_avg_sq", "b.exp_avg", "b.exp_avg_sq", "step"]
    assert int(state["step"]) == 2
    second = AdamW()
    second.load_state_dict(state)
    for grads in steps[2:]:
        second.step(resumed, grads, **hyper)
    for name in start:
        np.testing.assert_array_equal(resumed[name], straight[name])


def test_clip_grads_scales_to_the_max_norm_and_returns_the_norm_before() -> None:
    grads = {"a": np.array([3.0, 0.0], np.float32), "b": np.array([[4.0]], np.float32)}
    assert global_grad_norm(grads) == pytest.approx(5.0)
    assert clip_grads(grads, 1.0) == pytest.approx(5.0)
    assert global_grad_norm(grads) == pytest.approx(1.0, rel=1e-5)
    assert clip_grads(grads, 10.0) == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(grads["a"], [0.6, 0.0], rtol=1e-5)
