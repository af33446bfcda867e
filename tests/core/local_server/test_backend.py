"""The local server's model backend against direct torch computations on the same model.

Losses, their gradients and AdamW are recomputed here by hand; sampling is checked for determinism, for logprobs
equal to the model's own, for stop tokens and length limits, and for the top-k/top-p masks.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from platoon.local_server import backend as backend_module
from platoon.local_server.backend import ModelBackend, tensor_data
from platoon.local_server.sampling import SamplingParams, sampling_logprobs
from platoon.testing import TOY_TOKENIZER_DIR

MODEL = "platoon/toy"
PROMPT = [257, *b"user\nPick a letter.", 258, 10, 257, *b"assistant\n"]


@pytest.fixture
def backend() -> ModelBackend:
    return ModelBackend.create(MODEL)


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


def _direct_loss(name: str, lp: torch.Tensor, inputs: dict[str, torch.Tensor], low: float, high: float):
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


def _direct(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """The training logprobs of tokens[1:] given tokens[:-1], one unpadded sequence at a time."""
    logits = model(input_ids=torch.tensor([tokens[:-1]])).logits[0].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(tokens[1:])[:, None]).squeeze(-1)


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
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
    reference = copy.deepcopy(backend.model)
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

    got, want = _grads(backend.model), _grads(reference)
    assert got.keys() == want.keys() and len(got) > 10
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=name)


def test_clipping_is_active_in_the_loss_test_data(backend: ModelBackend) -> None:
    # Guards the test above: the ratios straddle the 0.9..1.1 clip range, so clipping changes ppo and cispo.
    tokens, values = _batch()[0]
    ratio = torch.exp(_direct(backend.model, tokens) - torch.tensor(values["logprobs"]))
    assert (ratio < 0.9).any() and (ratio > 1.1).any()


def test_forward_matches_forward_backward_without_gradients(backend: ModelBackend) -> None:
    data = [_datum(tokens, **values) for tokens, values in _batch()]
    before = backend.forward(data, "importance_sampling", None)
    assert all(p.grad is None for p in backend.model.parameters())
    after = backend.forward_backward(data, "importance_sampling", None)
    assert before == after


def test_gradients_accumulate_until_the_optimizer_step(backend: ModelBackend) -> None:
    data = [_datum(tokens, weights=values["weights"]) for tokens, values in _batch()]
    backend.forward_backward(data[:1], "cross_entropy", None)
    backend.forward_backward(data[1:], "cross_entropy", None)
    accumulated = _grads(backend.model)
    backend.model.zero_grad()
    backend.forward_backward(data, "cross_entropy", None)
    for name, grad in _grads(backend.model).items():
        torch.testing.assert_close(accumulated[name], grad, atol=1e-5, rtol=1e-4)
    backend.optim_step({"learning_rate": 1e-3})
    assert all(p.grad is None for p in backend.model.parameters())


def test_optim_step_is_adamw_with_the_request_hyperparameters(backend: ModelBackend) -> None:
    params = {"learning_rate": 0.01, "beta1": 0.8, "beta2": 0.9, "eps": 1e-6, "weight_decay": 0.1}
    reference = copy.deepcopy(backend.model)
    optimizer = torch.optim.AdamW(
        reference.parameters(), lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1
    )
    data = [_datum(tokens, weights=values["weights"]) for tokens, values in _batch()]
    for _ in range(2):
        backend.forward_backward(data, "cross_entropy", None)
        # Adam turns float noise in near-zero gradients into whole steps, so the reference gets the same
        # gradients (their values are checked against torch in the loss test) and only the update is compared.
        for got, ref in zip(backend.model.parameters(), reference.parameters(), strict=True):
            ref.grad = got.grad.clone()
        metrics = backend.optim_step(params)["metrics"]
        optimizer.step()
        optimizer.zero_grad()
    assert all(":" in key for key in metrics) and metrics["grad_norm:mean"] > 0
    initial = ModelBackend.create(MODEL).model
    for (name, got), want in zip(backend.model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5, msg=name)
        assert not torch.equal(got, initial.get_parameter(name)), name


def test_optim_step_defaults_and_gradient_clipping(backend: ModelBackend) -> None:
    start = {name: p.detach().clone() for name, p in backend.model.named_parameters()}
    data = [_datum(tokens, weights=values["weights"]) for tokens, values in _batch()]
    backend.forward_backward(data, "cross_entropy", None)
    grads = _grads(backend.model)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
    # The SDK 0.16 sends only the fields that were set: here none, so lr 1e-4 and the other defaults apply.
    metrics = backend.optim_step({"grad_clip_norm": float(norm) / 10})["metrics"]
    assert metrics["grad_norm:mean"] == pytest.approx(float(norm), rel=1e-4)
    # Adam's first step moves each weight by about lr (sign of the gradient), whatever the clipping.
    delta = max(float((p.detach() - start[n]).abs().max()) for n, p in backend.model.named_parameters())
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

    restored = ModelBackend.create(MODEL)
    restored.load(str(tmp_path / "state"), with_optimizer=True)
    step(restored)
    for got, want in zip(restored.model.parameters(), backend.model.parameters(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)

    # Weights alone: the next step starts from fresh Adam moments, so it lands elsewhere.
    fresh = ModelBackend.create(MODEL)
    fresh.load(str(tmp_path / "state"), with_optimizer=False)
    step(fresh)
    assert not all(
        torch.equal(a, b) for a, b in zip(fresh.model.parameters(), backend.model.parameters(), strict=True)
    )

    with pytest.raises(ValueError, match="no optimizer state"):
        ModelBackend.create(MODEL).load(str(tmp_path / "sampler"), with_optimizer=True)
    with pytest.raises(FileNotFoundError):
        ModelBackend.create(MODEL).load(str(tmp_path / "missing"), with_optimizer=False)


def test_base_weights_depend_on_the_name_only(backend: ModelBackend) -> None:
    same = ModelBackend.create(MODEL, lora_rank=8, seed=123)
    other = ModelBackend.create(str(TOY_TOKENIZER_DIR))
    assert all(
        torch.equal(a, b) for a, b in zip(backend.model.parameters(), same.model.parameters(), strict=True)
    )
    assert not torch.equal(backend.model.model.embed_tokens.weight, other.model.model.embed_tokens.weight)
    assert backend.model.config.vocab_size == 265 and backend.model.config.tie_word_embeddings
    info = same.info()
    assert info["tokenizer_id"] == backend.tokenizer_dir == str(TOY_TOKENIZER_DIR)
    assert info["model_name"] == MODEL and info["is_lora"] is True and info["lora_rank"] == 8
    assert "every weight is trained" in info["note"]
    assert other.tokenizer_dir == str(TOY_TOKENIZER_DIR)


def test_a_sampler_is_a_frozen_copy(backend: ModelBackend) -> None:
    sampler = backend.sampler()
    params = {"max_tokens": 8, "seed": 3}
    before = sampler.sample(PROMPT, num_samples=2, sampling_params=params)
    data = [_datum(tokens, weights=values["weights"]) for tokens, values in _batch()]
    backend.forward_backward(data, "cross_entropy", None)
    backend.optim_step({"learning_rate": 0.05})
    assert sampler.sample(PROMPT, num_samples=2, sampling_params=params) == before
    assert backend.sample(PROMPT, num_samples=2, sampling_params=params) != before
    with pytest.raises(ValueError, match="frozen"):
        sampler.forward_backward(data, "cross_entropy", None)


def test_sampling_is_deterministic_under_a_seed(backend: ModelBackend) -> None:
    params = {"max_tokens": 16, "seed": 7, "temperature": 1.0}
    first = backend.sample(PROMPT, num_samples=4, sampling_params=params)
    assert backend.sample(PROMPT, num_samples=4, sampling_params=params) == first
    other = backend.sample(PROMPT, num_samples=4, sampling_params={**params, "seed": 8})
    assert other["sequences"] != first["sequences"]
    tokens = [tuple(s["tokens"]) for s in first["sequences"]]
    assert len(set(tokens)) == 4, "the samples of one batch differ"
    for seq in first["sequences"]:
        assert len(seq["tokens"]) == len(seq["logprobs"]) == 16 and seq["stop_reason"] == "length"
    assert first["prompt_logprobs"] is None


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_are_the_model_s_own(backend: ModelBackend, temperature: float) -> None:
    out = backend.sample(
        PROMPT, num_samples=3, sampling_params={"max_tokens": 20, "seed": 1, "temperature": temperature}
    )
    for seq in out["sequences"]:
        full = PROMPT + seq["tokens"]
        logits = backend.model(input_ids=torch.tensor([full[:-1]])).logits[0].detach()
        want = torch.log_softmax(logits / temperature, dim=-1)
        want = want.gather(-1, torch.tensor(full[1:])[:, None]).squeeze(-1)[len(PROMPT) - 1 :]
        torch.testing.assert_close(torch.tensor(seq["logprobs"]), want, atol=2e-5, rtol=0)
    if temperature == 1.0:
        # And equal to what training computes, so on-policy importance ratios are 1.
        seq = out["sequences"][0]
        full = PROMPT + seq["tokens"]
        n = len(PROMPT) - 1
        datum = _datum(full, logprobs=[0.0] * n + seq["logprobs"], advantages=[0.0] * n + [1.0] * 20)
        train_lp = backend.forward([datum], "importance_sampling", None)["loss_fn_outputs"][0]["logprobs"]
        ratios = torch.exp(torch.tensor(train_lp["data"][n:]) - torch.tensor(seq["logprobs"]))
        torch.testing.assert_close(ratios, torch.ones(20), atol=1e-5, rtol=0)


def test_stop_tokens_end_a_sequence_and_are_included(backend: ModelBackend) -> None:
    params: dict[str, Any] = {"max_tokens": 24, "seed": 11}
    free = backend.sample(PROMPT, num_samples=3, sampling_params=params)["sequences"]
    stop = free[0]["tokens"][5]
    stopped = backend.sample(PROMPT, num_samples=3, sampling_params={**params, "stop": [stop]})["sequences"]
    for unstopped, seq in zip(free, stopped, strict=True):
        if stop in unstopped["tokens"]:
            end = unstopped["tokens"].index(stop) + 1
            assert seq["tokens"] == unstopped["tokens"][:end] and seq["stop_reason"] == "stop"
            assert seq["logprobs"] == unstopped["logprobs"][:end]
        else:
            assert seq == unstopped
    assert len(stopped[0]["tokens"]) <= 6 and stopped[0]["stop_reason"] == "stop"
    # A stop string of one token is that token (here the character's byte).
    as_text = backend.sample(PROMPT, num_samples=3, sampling_params={**params, "stop": [chr(stop)]})
    if stop < 128:
        assert as_text["sequences"] == stopped


def test_max_tokens_and_greedy_sampling(backend: ModelBackend) -> None:
    out = backend.sample(PROMPT, num_samples=2, sampling_params={"max_tokens": 5, "temperature": 0.0})
    first, second = out["sequences"]
    assert first == second and len(first["tokens"]) == 5 and first["stop_reason"] == "length"
    assert first["logprobs"] == [0.0] * 5
    top1 = backend.sample(PROMPT, num_samples=1, sampling_params={"max_tokens": 5, "top_k": 1, "seed": 4})
    assert top1["sequences"][0]["tokens"] == first["tokens"]
    empty = backend.sample(PROMPT, num_samples=1, sampling_params={"max_tokens": 0})
    assert empty["sequences"] == [{"tokens": [], "logprobs": [], "stop_reason": "length"}]


def test_top_k_and_top_p_masks() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top_k = sampling_logprobs(logits, SamplingParams(top_k=2)).exp()
    torch.testing.assert_close(top_k, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    top_p = sampling_logprobs(logits, SamplingParams(top_p=0.75)).exp()
    torch.testing.assert_close(top_p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    top_p = sampling_logprobs(logits, SamplingParams(top_p=0.9)).exp()
    torch.testing.assert_close(top_p, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    # The most likely token always stays, however small top_p is.
    torch.testing.assert_close(
        sampling_logprobs(logits, SamplingParams(top_p=0.01)).exp()[0, 0], torch.tensor(1.0)
    )
    # Temperature first, then the masks.
    hot = sampling_logprobs(logits, SamplingParams(temperature=2.0, top_k=3)).exp()
    want = torch.tensor([0.5, 0.3, 0.15]).sqrt()
    torch.testing.assert_close(hot[0, :3], want / want.sum())


@pytest.mark.parametrize(
    "params", [{"top_k": 3}, {"top_p": 0.5}, {"top_k": 10, "top_p": 0.3, "temperature": 0.8}]
)
def test_sampled_tokens_respect_the_masks(backend: ModelBackend, params: dict[str, Any]) -> None:
    out = backend.sample(PROMPT, num_samples=4, sampling_params={**params, "max_tokens": 12, "seed": 5})
    sp = SamplingParams.parse(params, lambda text: list(text.encode()))
    for seq in out["sequences"]:
        full = PROMPT + seq["tokens"]
        logits = backend.model(input_ids=torch.tensor([full[:-1]])).logits[0, len(PROMPT) - 1 :].detach()
        allowed = sampling_logprobs(logits, sp)
        picked = allowed.gather(-1, torch.tensor(seq["tokens"])[:, None]).squeeze(-1)
        assert torch.isfinite(picked).all()
        torch.testing.assert_close(picked, torch.tensor(seq["logprobs"]), atol=2e-5, rtol=0)


def test_prompt_logprobs_match_training_logprobs(backend: ModelBackend) -> None:
    # compute_logprobs is a sample with max_tokens=1 and prompt_logprobs=true.
    out = backend.sample(
        PROMPT, num_samples=1, sampling_params={"max_tokens": 1}, prompt_logprobs=True, topk_prompt_logprobs=3
    )
    prompt_lp = out["prompt_logprobs"]
    assert prompt_lp[0] is None and len(prompt_lp) == len(PROMPT)
    want = _direct(backend.model, PROMPT).detach()
    torch.testing.assert_close(torch.tensor(prompt_lp[1:]), want, atol=1e-5, rtol=0)
    topk = out["topk_prompt_logprobs"]
    assert topk[0] is None and len(topk) == len(PROMPT)
    for row, own in zip(topk[1:], prompt_lp[1:], strict=True):
        assert len(row) == 3 and row[0][1] >= row[1][1] >= row[2][1]
        assert own <= row[0][1] + 1e-5


def test_bad_requests_are_value_errors(backend: ModelBackend) -> None:
    tokens, values = _batch()[0]
    with pytest.raises(ValueError, match="unsupported loss function 'dro'"):
        backend.forward_backward([_datum(tokens, **values)], "dro", None)
    with pytest.raises(ValueError, match="needs loss_fn_inputs\\['advantages'\\]"):
        backend.forward_backward([_datum(tokens, logprobs=values["logprobs"])], "cispo", None)
    short = _datum(tokens, **values)
    short["loss_fn_inputs"]["weights"] = tensor_data(torch.ones(3))
    with pytest.raises(ValueError, match="has 3 entries"):
        backend.forward_backward([short], "cross_entropy", None)
    image = {
        "model_input": {"chunks": [{"type": "image", "data": "", "format": "png"}]},
        "loss_fn_inputs": {},
    }
    with pytest.raises(ValueError, match="encoded_text"):
        backend.forward([image], "cross_entropy", None)
    with pytest.raises(ValueError, match="vocabulary"):
        backend.sample([9999], num_samples=1, sampling_params={})
    with pytest.raises(ValueError, match="empty"):
        backend.sample([], num_samples=1, sampling_params={})
    assert all(p.grad is None for p in backend.model.parameters())


def test_a_missing_torch_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError) as excinfo:
        backend_module.import_torch()
    assert str(excinfo.value) == backend_module.TORCH_MISSING
    assert "pip install 'platoon-core[local]'" in str(excinfo.value) and "\n" not in str(excinfo.value)
