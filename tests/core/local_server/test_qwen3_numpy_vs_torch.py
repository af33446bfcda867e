"""The numpy Qwen3 against transformers' `Qwen3ForCausalLM` with the same weights, at the local server's shape:
logits, gradients, cached decoding, a greedy decode and AdamW.

Tolerances (float32 in both, different summation orders): logits and logprobs within 1e-4 absolute (observed
~1e-5); gradients within rtol 1e-4 plus 1e-5 of the largest gradient; AdamW weights within 1e-6.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import numpy as np  # noqa: E402

from platoon.local_server.backend import ModelShape  # noqa: E402
from platoon.local_server.qwen3_numpy import (  # noqa: E402
    AdamW,
    Qwen3Dims,
    Qwen3Numpy,
    clip_grads,
    initial_weights,
)

VOCAB, PAD = 265, 256  # the toy tokenizer's vocabulary and pad token (the embedding's padding_idx)
DIMS = Qwen3Dims.from_shape(ModelShape(), VOCAB, pad_token_id=PAD)


def reference_model(weights: dict[str, np.ndarray]) -> Any:
    """transformers' model as the torch backend builds it, holding `weights`."""
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, tie_word_embeddings=True, pad_token_id=PAD, **vars(ModelShape())
    )
    config._attn_implementation = "sdpa"
    model = transformers.Qwen3ForCausalLM(config).float()
    result = model.load_state_dict(
        {name: torch.from_numpy(w.copy()) for name, w in weights.items()}, strict=False
    )
    assert result.missing_keys == ["lm_head.weight"] and not result.unexpected_keys  # tied: the embedding
    return model


def scaled_weights(seed: int, scale: float = 10.0) -> dict[str, np.ndarray]:
    """Initial weights with the matrices scaled up: the logits spread out, so argmax and gradients are decisive."""
    weights = initial_weights(DIMS, seed)
    for name, value in weights.items():
        if value.ndim == 2:
            weights[name] = value * np.float32(scale)
    return weights


def torch_logprobs(model: Any, sequence: list[int], targets: np.ndarray) -> Any:
    logits = model(input_ids=torch.tensor([sequence])).logits[0]
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.from_numpy(targets)[:, None])[:, 0]


def test_the_state_dict_of_transformers_model_loads_and_gives_its_logits() -> None:
    reference = reference_model(scaled_weights(0))
    state_dict = {name: tensor.numpy() for name, tensor in reference.state_dict().items()}
    assert "lm_head.weight" in state_dict  # transformers lists the tied head; the numpy model drops it
    model = Qwen3Numpy(DIMS, state_dict)
    tokens = np.random.default_rng(1).integers(0, VOCAB, 40).tolist()
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor([tokens])).logits[0].numpy()
    logits, _ = model.prefill(tokens)
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


def test_logprobs_and_gradients_of_a_padded_batch_match_transformers() -> None:
    weights = scaled_weights(1)
    reference = reference_model(weights)
    model = Qwen3Numpy(DIMS, weights)
    rng = np.random.default_rng(2)
    sequences = [rng.integers(0, VOCAB, n).tolist() for n in (33, 17, 64, 5)]
    sequences[1][3] = PAD  # the embedding's padding_idx: its lookup gets no gradient in either
    targets = [rng.integers(0, VOCAB, len(seq)) for seq in sequences]
    coefficients = [rng.standard_normal(len(seq)).astype(np.float32) for seq in sequences]

    ours = model.logprobs_backward(sequences, targets, lambda logprobs: coefficients)
    total = torch.zeros(())
    for seq, target, coefficient, logprobs in zip(sequences, targets, coefficients, ours, strict=True):
        theirs = torch_logprobs(reference, seq, target)
        np.testing.assert_allclose(logprobs, theirs.detach().numpy(), atol=1e-4, rtol=0)
        total = total + (theirs * torch.from_numpy(coefficient)).sum()
    total.backward()
    for name, parameter in reference.named_parameters():
        expected = parameter.grad.numpy()
        np.testing.assert_allclose(
            model.grads[name], expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max(), err_msg=name
        )


def test_cached_decoding_gives_the_logits_of_transformers_full_forward() -> None:
    weights = scaled_weights(3)
    reference = reference_model(weights)
    model = Qwen3Numpy(DIMS, weights)
    rng = np.random.default_rng(4)
    prompt = rng.integers(0, VOCAB, 20).tolist()
    _, cache = model.prefill(prompt)
    cache = cache.repeat(2)
    rows = [list(prompt), list(prompt)]
    for _ in range(8):
        tokens = rng.integers(0, VOCAB, 2)
        for row, token in zip(rows, tokens, strict=True):
            row.append(int(token))
        logits = model.step(cache, tokens)
        with torch.no_grad():
            expected = reference(input_ids=torch.tensor(rows)).logits[:, -1].numpy()
        np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


def test_a_greedy_decode_of_20_tokens_is_the_same_as_transformers() -> None:
    weights = scaled_weights(5)
    reference = reference_model(weights)
    model = Qwen3Numpy(DIMS, weights)
    prompt = [257, *b"user\nhello", 258, 10, 257, *b"assistant\n"]

    logits, cache = model.prefill(prompt)
    ours: list[int] = []
    next_logits = logits[-1]
    for _ in range(20):
        top_two = np.sort(next_logits)[-2:]
        assert top_two[1] - top_two[0] > 1e-3, "a near tie: float rounding could pick either token"
        ours.append(int(np.argmax(next_logits)))
        next_logits = model.step(cache, np.array(ours[-1:]))[0]

    with torch.no_grad():
        generated = reference.generate(
            torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=PAD
        )
    assert ours == generated[0, len(prompt) :].tolist()


def test_three_adamw_steps_with_clipping_equal_torchs() -> None:
    weights = initial_weights(DIMS, 6)
    reference = reference_model(weights)
    parameters = dict(reference.named_parameters())
    rng = np.random.default_rng(7)
    hyper = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
    optimizer = torch.optim.AdamW(
        parameters.values(),
        lr=hyper["lr"],
        betas=(hyper["beta1"], hyper["beta2"]),
        eps=hyper["eps"],
        weight_decay=hyper["weight_decay"],
    )
    ours = AdamW()
    for step in range(3):
        grads = {name: rng.standard_normal(w.shape).astype(np.float32) for name, w in weights.items()}
        for name, parameter in parameters.items():
            parameter.grad = torch.from_numpy(grads[name].copy())
        expected_norm = float(torch.nn.utils.clip_grad_norm_(list(parameters.values()), 50.0))
        assert clip_grads(grads, 50.0) == pytest.approx(expected_norm, rel=1e-5)
        optimizer.step()
        ours.step(weights, grads, **hyper)
        for name, parameter in parameters.items():
            np.testing.assert_allclose(
                weights[name], parameter.detach().numpy(), atol=1e-6, rtol=0, err_msg=f"step {step}: {name}"
            )
    assert int(ours.state_dict()["step"]) == 3
