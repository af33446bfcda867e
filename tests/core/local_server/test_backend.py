"""The local server's model backend on every engine: sampling (seeds, logprobs equal to the model's own, stop
tokens, length limits, the top-k/top-p masks), frozen samplers, gradients and the optimizer step, checkpoints in the
one format every engine reads, and refusals.

Each test runs on the numpy engine, and on the torch engine where torch is installed. The model's own numbers come
from the engine (`logprobs`, `prefill`); test_torch_engine.py checks the torch engine against torch's autograd, and
test_engine_parity.py the two engines against each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from platoon.local_server.backend import ModelBackend, tensor_data
from platoon.local_server.sampling import SamplingParams, sampling_logprobs
from platoon.testing import TOY_TOKENIZER_DIR

MODEL = "platoon/toy"
PROMPT = [257, *b"user\nPick a letter.", 258, 10, 257, *b"assistant\n"]


@pytest.fixture(params=["numpy", "torch"])
def engine(request: pytest.FixtureRequest) -> str:
    if request.param == "torch":
        pytest.importorskip("torch")
    return str(request.param)


@pytest.fixture
def backend(engine: str) -> ModelBackend:
    return ModelBackend.create(MODEL, engine=engine)


def _td(values: list[Any], dtype: str) -> dict[str, Any]:
    return {"data": values, "dtype": dtype, "shape": [len(values)]}


def _datum(tokens: list[int], **inputs: list[float]) -> dict[str, Any]:
    """A 0.16 JSON datum: the input is tokens[:-1], the targets tokens[1:] (no chunk `type`, as 0.16 sends)."""
    loss_inputs = {"target_tokens": _td(tokens[1:], "int64")}
    loss_inputs.update({key: _td(values, "float32") for key, values in inputs.items()})
    return {"model_input": {"chunks": [{"tokens": tokens[:-1]}]}, "loss_fn_inputs": loss_inputs}


def _batch(seed: int = 0) -> list[tuple[list[int], dict[str, list[float]]]]:
    """Two sequences of different lengths (so the batch is padded) with sampler logprobs, advantages, weights."""
    rng = np.random.default_rng(seed)
    out = []
    for length in (23, 14):
        n = length - 1
        values = {
            "logprobs": (-5.6 + 0.4 * rng.standard_normal(n)).tolist(),
            "advantages": rng.standard_normal(n).tolist(),
            "weights": rng.random(n).tolist(),
        }
        out.append((rng.integers(0, 265, length).tolist(), values))
    return out


def _own_logprobs(backend: ModelBackend, tokens: list[int]) -> np.ndarray:
    """The logprobs of tokens[1:] given tokens[:-1], one unpadded sequence on its own."""
    return backend.engine.logprobs([tokens[:-1]], [np.asarray(tokens[1:])])[0]


def _logits(backend: ModelBackend, tokens: list[int]) -> np.ndarray:
    return backend.engine.prefill(tokens)[0]


def test_training_logprobs_are_each_sequence_s_own_and_forward_has_no_gradient(backend: ModelBackend) -> None:
    batch = _batch()
    data = [_datum(tokens, **values) for tokens, values in batch]
    before = backend.forward(data, "importance_sampling", None)
    for (tokens, values), output in zip(batch, before["loss_fn_outputs"], strict=True):
        lp = _own_logprobs(backend, tokens)
        assert output["logprobs"]["dtype"] == "float32" and output["logprobs"]["shape"] == [len(tokens) - 1]
        np.testing.assert_allclose(output["logprobs"]["data"], lp, atol=1e-5, rtol=0)
        want = -np.exp(lp - np.asarray(values["logprobs"])) * np.asarray(values["advantages"])
        np.testing.assert_allclose(output["elementwise_loss"]["data"], want, atol=1e-5, rtol=1e-4)
    assert before["metrics"]["loss:sum"] == pytest.approx(
        sum(sum(o["elementwise_loss"]["data"]) for o in before["loss_fn_outputs"]), rel=1e-5
    )
    # forward left no gradient: the optimizer step has nothing to apply
    weights = backend.engine.weights()
    assert backend.optim_step({"learning_rate": 0.1})["metrics"]["grad_norm:mean"] == 0.0
    assert all(np.array_equal(value, weights[name]) for name, value in backend.engine.weights().items())
    assert backend.forward_backward(data, "importance_sampling", None) == before


def test_gradients_accumulate_until_the_optimizer_step(engine: str) -> None:
    data = [_datum(tokens, weights=values["weights"]) for tokens, values in _batch()]
    split, whole = ModelBackend.create(MODEL, engine=engine), ModelBackend.create(MODEL, engine=engine)
    split.forward_backward(data[:1], "cross_entropy", None)
    split.forward_backward(data[1:], "cross_entropy", None)
    whole.forward_backward(data, "cross_entropy", None)
    adam = {"learning_rate": 1e-3}
    assert split.optim_step(adam)["metrics"]["grad_norm:mean"] == pytest.approx(
        whole.optim_step(adam)["metrics"]["grad_norm:mean"], rel=1e-4
    )
    # the step dropped the gradient: a second one moves nothing
    assert split.optim_step(adam)["metrics"]["grad_norm:mean"] == 0.0


def test_optim_step_defaults_and_gradient_clipping(backend: ModelBackend) -> None:
    start = backend.engine.weights()
    data = [_datum(tokens, weights=values["weights"]) for tokens, values in _batch()]
    probe = ModelBackend.create(MODEL, engine=backend.engine.name)
    probe.forward_backward(data, "cross_entropy", None)
    norm = probe.optim_step({"learning_rate": 0.0})["metrics"]["grad_norm:mean"]
    assert norm > 0
    backend.forward_backward(data, "cross_entropy", None)
    # The SDK 0.16 sends only the fields that were set: here none, so lr 1e-4 and the other defaults apply.
    metrics = backend.optim_step({"grad_clip_norm": norm / 10})["metrics"]
    assert metrics["grad_norm:mean"] == pytest.approx(norm, rel=1e-4)
    assert metrics["learning_rate:mean"] == 1e-4
    # Adam's first step moves each weight by about lr (sign of the gradient), whatever the clipping.
    delta = max(float(np.abs(value - start[name]).max()) for name, value in backend.engine.weights().items())
    assert delta == pytest.approx(1e-4, rel=0.05)


def test_a_non_finite_gradient_is_refused_and_dropped(backend: ModelBackend) -> None:
    tokens, values = _batch()[0]
    start = backend.engine.weights()
    extreme = [-1e30] * len(values["logprobs"])  # exp(lp - q) overflows: an infinite ratio
    backend.forward_backward([_datum(tokens, logprobs=extreme, advantages=values["advantages"])], "ppo", None)
    with pytest.raises(ValueError, match=r"not finite .* the step was skipped and the gradient dropped"):
        backend.optim_step({"learning_rate": 0.01})
    assert all(np.array_equal(value, start[name]) for name, value in backend.engine.weights().items())
    assert backend.optim_step({"learning_rate": 0.01})["metrics"]["grad_norm:mean"] == 0.0


def test_save_and_load_round_trip_with_the_optimizer(engine: str, tmp_path: Path) -> None:
    backend = ModelBackend.create(MODEL, engine=engine)
    data = [_datum(tokens, weights=values["weights"]) for tokens, values in _batch()]
    adam = {"learning_rate": 0.01}

    def step(b: ModelBackend) -> None:
        b.forward_backward(data, "cross_entropy", None)
        b.optim_step(adam)

    step(backend)
    backend.save(str(tmp_path / "state"), with_optimizer=True)
    backend.save(str(tmp_path / "sampler"), with_optimizer=False)
    step(backend)
    meta = ModelBackend.read_meta(str(tmp_path / "state"))
    assert meta["base_model"] == MODEL and meta["engine"] == engine
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [
        "meta.json",
        "model.safetensors",
        "optimizer.safetensors",
    ]
    assert sorted(p.name for p in (tmp_path / "sampler").iterdir()) == ["meta.json", "model.safetensors"]

    restored = ModelBackend.create(MODEL, engine=engine)
    restored.load(str(tmp_path / "state"), with_optimizer=True)
    step(restored)
    got, want = restored.engine.weights(), backend.engine.weights()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-6, rtol=1e-5, err_msg=name)

    # Weights alone: the next step starts from fresh Adam moments, so it lands elsewhere.
    fresh = ModelBackend.create(MODEL, engine=engine)
    fresh.load(str(tmp_path / "state"), with_optimizer=False)
    step(fresh)
    assert not all(np.array_equal(value, want[name]) for name, value in fresh.engine.weights().items())

    with pytest.raises(ValueError, match="no optimizer state"):
        ModelBackend.create(MODEL, engine=engine).load(str(tmp_path / "sampler"), with_optimizer=True)
    with pytest.raises(FileNotFoundError):
        ModelBackend.create(MODEL, engine=engine).load(str(tmp_path / "missing"), with_optimizer=False)


def test_a_checkpoint_of_platoon_before_the_engines_is_refused_in_one_line(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    (old / "model.pt").write_bytes(b"a torch pickle")
    with pytest.raises(ValueError) as excinfo:
        ModelBackend.create(MODEL).load(str(old), with_optimizer=False)
    message = str(excinfo.value)
    assert "\n" not in message and "model.pt" in message and "train again from the base model" in message


def test_base_weights_depend_on_the_name_only(backend: ModelBackend) -> None:
    same = ModelBackend.create(MODEL, lora_rank=8, seed=123, engine=backend.engine.name)
    other = ModelBackend.create(str(TOY_TOKENIZER_DIR), engine=backend.engine.name)
    weights, same_weights = backend.engine.weights(), same.engine.weights()
    assert all(np.array_equal(value, same_weights[name]) for name, value in weights.items())
    embedding = "model.embed_tokens.weight"
    assert not np.array_equal(weights[embedding], other.engine.weights()[embedding])
    assert weights[embedding].shape == (265, 128) and "lm_head.weight" not in weights  # tied to the embedding
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
        logits = _logits(backend, full[:-1])[len(PROMPT) - 1 :] / temperature
        log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        log_probs -= logits.max(-1, keepdims=True)
        want = np.take_along_axis(log_probs, np.asarray(seq["tokens"])[:, None], axis=-1)[:, 0]
        np.testing.assert_allclose(seq["logprobs"], want, atol=2e-5, rtol=0)
    if temperature == 1.0:
        # And equal to what training computes, so on-policy importance ratios are 1.
        seq = out["sequences"][0]
        full = PROMPT + seq["tokens"]
        n = len(PROMPT) - 1
        datum = _datum(full, logprobs=[0.0] * n + seq["logprobs"], advantages=[0.0] * n + [1.0] * 20)
        train_lp = backend.forward([datum], "importance_sampling", None)["loss_fn_outputs"][0]["logprobs"]
        ratios = np.exp(np.asarray(train_lp["data"][n:]) - np.asarray(seq["logprobs"]))
        np.testing.assert_allclose(ratios, np.ones(20), atol=1e-5, rtol=0)


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
    assert first["tokens"][0] == int(np.argmax(_logits(backend, PROMPT)[-1]))
    top1 = backend.sample(PROMPT, num_samples=1, sampling_params={"max_tokens": 5, "top_k": 1, "seed": 4})
    assert top1["sequences"][0]["tokens"] == first["tokens"]
    empty = backend.sample(PROMPT, num_samples=1, sampling_params={"max_tokens": 0})
    assert empty["sequences"] == [{"tokens": [], "logprobs": [], "stop_reason": "length"}]


def test_top_k_and_top_p_masks() -> None:
    logits = np.log(np.asarray([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32))

    def probs(params: SamplingParams) -> np.ndarray:
        return np.exp(sampling_logprobs(logits, params))

    np.testing.assert_allclose(probs(SamplingParams(top_k=2)), [[0.625, 0.375, 0.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(probs(SamplingParams(top_p=0.75)), [[0.625, 0.375, 0.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(
        probs(SamplingParams(top_p=0.9)), np.asarray([[0.5, 0.3, 0.15, 0.0]]) / 0.95, atol=1e-6
    )
    # The most likely token always stays, however small top_p is.
    assert probs(SamplingParams(top_p=0.01))[0, 0] == pytest.approx(1.0)
    # Temperature first, then the masks.
    hot = probs(SamplingParams(temperature=2.0, top_k=3))
    want = np.sqrt([0.5, 0.3, 0.15])
    np.testing.assert_allclose(hot[0, :3], want / want.sum(), atol=1e-6)


@pytest.mark.parametrize(
    "params", [{"top_k": 3}, {"top_p": 0.5}, {"top_k": 10, "top_p": 0.3, "temperature": 0.8}]
)
def test_sampled_tokens_respect_the_masks(backend: ModelBackend, params: dict[str, Any]) -> None:
    out = backend.sample(PROMPT, num_samples=4, sampling_params={**params, "max_tokens": 12, "seed": 5})
    sp = SamplingParams.parse(params, lambda text: list(text.encode()))
    for seq in out["sequences"]:
        full = PROMPT + seq["tokens"]
        allowed = sampling_logprobs(_logits(backend, full[:-1])[len(PROMPT) - 1 :], sp)
        picked = np.take_along_axis(allowed, np.asarray(seq["tokens"])[:, None], axis=-1)[:, 0]
        assert np.isfinite(picked).all()
        np.testing.assert_allclose(picked, seq["logprobs"], atol=2e-5, rtol=0)


def test_prompt_logprobs_match_training_logprobs(backend: ModelBackend) -> None:
    # compute_logprobs is a sample with max_tokens=1 and prompt_logprobs=true.
    out = backend.sample(
        PROMPT, num_samples=1, sampling_params={"max_tokens": 1}, prompt_logprobs=True, topk_prompt_logprobs=3
    )
    prompt_lp = out["prompt_logprobs"]
    assert prompt_lp[0] is None and len(prompt_lp) == len(PROMPT)
    np.testing.assert_allclose(prompt_lp[1:], _own_logprobs(backend, PROMPT), atol=1e-5, rtol=0)
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
    short["loss_fn_inputs"]["weights"] = tensor_data(np.ones(3, dtype=np.float32))
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
    # nothing was accumulated by the refused requests
    assert backend.optim_step({"learning_rate": 0.1})["metrics"]["grad_norm:mean"] == 0.0
