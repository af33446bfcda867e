"""The local server's torch engine against direct torch computations on the same model.

Losses, their gradients and AdamW are recomputed here by hand with torch's autograd and `torch.optim.AdamW`. The
numpy engine is held to the same numbers by test_engine_parity.py; what every engine shares is test_backend.py's.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from platoon.local_server.backend import ModelBackend

torch = pytest.importorskip("torch")

MODEL = "platoon/toy"
PROMPT = [257, *b"user\nPick a letter.", 258, 10, 257, *b"assistant\n"]


def _create() -> ModelBackend:
    return ModelBackend.create(MODEL, engine="torch")


@pytest.fixture
def backend() -> ModelBackend:
    return _create()


def _td(values: list[Any], dtype: str) -> dict[str, Any]:
    return {"data": values, "dtype": dtype, "shape": [len(values)]}


def _datum(tokens: list[int], **inputs: list[float]) -> dict[str, Any]:
    """A 0.16 JSON datum: the input is tokens[:-1], the targets tokens[1:] (no chunk `type`, as 0.16 sends)."""
    loss_inputs = {"target_tokens": _td(tokens[1:], "int64")}
    loss_inputs.update({key: _td(values, "float32") for key, values in inputs.items()})
    return {"model_input": {"chunks": [{"tokens": tokens[:-1]}]}, "loss_fn_inputs": loss_inputs}


def _batch(seed: int = 0) -> list[tuple[list[int], dict[str, list[float]]]]:
    """Two sequences of different lengths (so the batch is padded) with sampler logprobs, advantages, weights."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for length in (23, 14):
        tokens = torch.randint(0, 265, (length,), generator=gen).tolist()
        n = length - 1
        out.append(
            (
                tokens,
                {
                    # logprobs near the model's (about -log 265) so ratios fall on both sides of the clip range
                    "logprobs": (-5.6 + 0.4 * torch.randn(n, generator=gen)).tolist(),
                    "advantages": torch.randn(n, generator=gen).tolist(),
                    "weights": torch.rand(n, generator=gen).tolist(),
                },
            )
        )
    return out


def _direct_loss(name: str, lp: Any, inputs: dict[str, Any], low: float, high: float) -> Any:
    """The losses, written out independently of the backend's losses module."""
    if name == "cross_entropy":
        return -(lp * inputs["weights"]).sum()
    ratio = torch.exp(lp - inputs["logprobs"])
    adv = inputs["advantages"]
    if name == "importance_sampling":
        return -(ratio * adv).sum()
    if name == "ppo":
        return -torch.min(ratio * adv, torch.clamp(ratio, low, high) * adv).sum()
    assert name == "cispo"
    return -(torch.clamp(ratio, low, high).detach() * lp * adv).sum()


def _direct(model: Any, tokens: list[int]) -> Any:
    """The training logprobs of tokens[1:] given tokens[:-1], one unpadded sequence at a time."""
    logits = model(input_ids=torch.tensor([tokens[:-1]])).logits[0].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(tokens[1:])[:, None]).squeeze(-1)


def _grads(model: Any) -> dict[str, Any]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("loss_fn", "config"),
    [
        ("cross_entropy", None),
        ("importance_sampling", None),
        ("ppo", None),  # the service defaults 0.8 / 1.2
        ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
        ("cispo", {"clip_low_threshold": 0.0, "clip_high_threshold": 5.0}),  # platoon's defaults
        ("cispo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
    ],
)
def test_loss_logprobs_and_gradients_match_a_direct_computation(
    backend: ModelBackend, loss_fn: str, config: dict[str, float] | None
) -> None:
    reference = copy.deepcopy(backend.engine.model)
    batch = _batch()
    inputs = {"cross_entropy": ["weights"]}.get(loss_fn, ["logprobs", "advantages"])
    data = [_datum(tokens, **{k: v[k] for k in inputs}) for tokens, v in batch]

    out = backend.forward_backward(data, loss_fn, config)

    low, high = (config or {}).get("clip_low_threshold", 0.8), (config or {}).get("clip_high_threshold", 1.2)
    total = torch.zeros(())
    for (tokens, values), output in zip(batch, out["loss_fn_outputs"], strict=True):
        lp = _direct(reference, tokens)
        loss = _direct_loss(loss_fn, lp, {k: torch.tensor(v) for k, v in values.items()}, low, high)
        total = total + loss
        assert output["logprobs"]["dtype"] == "float32"
        assert output["logprobs"]["shape"] == [len(tokens) - 1]
        torch.testing.assert_close(torch.tensor(output["logprobs"]["data"]), lp.detach(), atol=1e-5, rtol=0)
        assert sum(output["elementwise_loss"]["data"]) == pytest.approx(loss.item(), abs=1e-4)
    total.backward()
    assert out["loss_fn_output_type"] == "ArrayRecord"
    assert set(out["metrics"]) == {"loss:sum"}
    assert out["metrics"]["loss:sum"] == pytest.approx(total.item(), rel=1e-5, abs=1e-4)

    got, want = _grads(backend.engine.model), _grads(reference)
    assert got.keys() == want.keys() and len(got) > 10
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=name)


def test_clipping_is_active_in_the_loss_test_data(backend: ModelBackend) -> None:
    # Guards the test above: the ratios straddle the 0.9..1.1 clip range, so clipping changes ppo and cispo.
    tokens, values = _batch()[0]
    ratio = torch.exp(_direct(backend.engine.model, tokens) - torch.tensor(values["logprobs"]))
    assert (ratio < 0.9).any() and (ratio > 1.1).any()


def test_forward_matches_forward_backward_without_gradients(backend: ModelBackend) -> None:
    data = [_datum(tokens, **values) for tokens, values in _batch()]
    before = backend.forward(data, "importance_sampling", None)
    assert all(p.grad is None for p in backend.engine.model.parameters())
    after = backend.forward_backward(data, "importance_sampling", None)
    assert before == after


def test_gradients_accumulate_until_the_optimizer_step(backend: ModelBackend) -> None:
    data = [_datum(tokens, weights=values["weights"]) for tokens, values in _batch()]
    backend.forward_backward(data[:1], "cross_entropy", None)
    backend.forward_backward(data[1:], "cross_entropy", None)
    accumulated = _grads(backend.engine.model)
    backend.engine.model.zero_grad()
    backend.forward_backward(data, "cross_entropy", None)
    for name, grad in _grads(backend.engine.model).items():
        torch.testing.assert_close(accumulated[name], grad, atol=1e-5, rtol=1e-4)
    backend.optim_step({"learning_rate": 1e-3})
    assert all(p.grad is None for p in backend.engine.model.parameters())


def test_optim_step_is_adamw_with_the_request_hyperparameters(backend: ModelBackend) -> None:
    params = {"learning_rate": 0.01, "beta1": 0.8, "beta2": 0.9, "eps": 1e-6, "weight_decay": 0.1}
    reference = copy.deepcopy(backend.engine.model)
    optimizer = torch.optim.AdamW(
        reference.parameters(), lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1
    )
    data = [_datum(tokens, weights=values["weights"]) for tokens, values in _batch()]
    for _ in range(2):
        backend.forward_backward(data, "cross_entropy", None)
        # Adam turns float noise in near-zero gradients into whole steps, so the reference gets the same
        # gradients (their values are checked against torch in the loss test) and only the update is compared.
        for got, ref in zip(backend.engine.model.parameters(), reference.parameters(), strict=True):
            ref.grad = got.grad.clone()
        metrics = backend.optim_step(params)["metrics"]
        optimizer.step()
        optimizer.zero_grad()
    assert all(":" in key for key in metrics) and metrics["grad_norm:mean"] > 0
    initial = _create().engine.model
    for (name, got), want in zip(
        backend.engine.model.named_parameters(), reference.parameters(), strict=True
    ):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5, msg=name)
        assert not torch.equal(got, initial.get_parameter(name)), name


def test_optim_step_defaults_and_gradient_clipping(backend: ModelBackend) -> None:
    start = {name: p.detach().clone() for name, p in backend.engine.model.named_parameters()}
    data = [_datum(tokens, weights=values["weights"]) for tokens, values in _batch()]
    backend.forward_backward(data, "cross_entropy", None)
    grads = _grads(backend.engine.model)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
    # The SDK 0.16 sends only the fields that were set: here none, so lr 1e-4 and the other defaults apply.
    metrics = backend.optim_step({"grad_clip_norm": float(norm) / 10})["metrics"]
    assert metrics["grad_norm:mean"] == pytest.approx(float(norm), rel=1e-4)
    # Adam's first step moves each weight by about lr (sign of the gradient), whatever the clipping.
    delta = max(
        float((p.detach() - start[n]).abs().max()) for n, p in backend.engine.model.named_parameters()
    )
    assert delta == pytest.approx(1e-4, rel=0.05)


def test_save_and_load_round_trip_with_the_optimizer(backend: ModelBackend, tmp_path: Path) -> None:
    data = [_datum(tokens, weights=values["weights"]) for tokens, values in _batch()]
    adam = {"learning_rate": 0.01}

    def step(b: ModelBackend) -> None:
        b.forward_backward(data, "cross_entropy", None)
        b.optim_step(adam)

    step(backend)
    backend.save(str(tmp_path / "state"), with_optimizer=True)
    backend.save(str(tmp_path / "sampler"), with_optimizer=False)
    step(backend)
    assert ModelBackend.read_meta(str(tmp_path / "state"))["base_model"] == MODEL

    restored = _create()
    restored.load(str(tmp_path / "state"), with_optimizer=True)
    step(restored)
    for got, want in zip(restored.engine.model.parameters(), backend.engine.model.parameters(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)

    # Weights alone: the next step starts from fresh Adam moments, so it lands elsewhere.
    fresh = _create()
    fresh.load(str(tmp_path / "state"), with_optimizer=False)
    step(fresh)
    assert not all(
        torch.equal(a, b)
        for a, b in zip(fresh.engine.model.parameters(), backend.engine.model.parameters(), strict=True)
    )

    with pytest.raises(ValueError, match="no optimizer state"):
        _create().load(str(tmp_path / "sampler"), with_optimizer=True)
    with pytest.raises(FileNotFoundError):
        _create().load(str(tmp_path / "missing"), with_optimizer=False)
