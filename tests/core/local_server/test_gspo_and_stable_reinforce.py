"""gspo and stable_reinforce on the local server: the loss math and its gradient by hand on small arrays, the torch
engine against a direct autograd computation, and the stability records (sequence ids, recording, refusals) over
HTTP.

The math follows Tinker's GSPO page (GSPO-token) and, for stable_reinforce, the local server's documented stand-in
(docs/training.md, "Loss functions"): hosted Tinker does not publish that objective.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from platoon.local_server import LocalTinkerServer
from platoon.local_server.backend import ModelBackend
from platoon.local_server.losses import RECORDED_LOGPROBS, RECORDED_MASK, gspo, ppo, stable_reinforce
from platoon.local_server.stability import Span, StabilityStore

MODEL = "platoon/toy"
PROMPT = [72, 105, 44, 32, 119, 111, 114, 108, 100]


def _t(values: list[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def _loss_and_grad(fn: Any, lp: list[float], inputs: dict[str, list[float]], config: dict[str, float]):
    """A loss's elementwise values and its gradient with respect to the logprobs, as the engines backpropagate it."""
    loss, grad = fn(_t(lp), {key: _t(value) for key, value in inputs.items()}, config)
    assert loss.shape == grad.shape == (len(lp),)
    return loss.tolist(), grad.tolist()


# -- gspo: the sequence's ratio, clipped as one -----------------------------------------------------------------


def test_gspo_clips_the_whole_sequence_on_its_geometric_mean_ratio() -> None:
    # The marked tokens' log ratios are 0.2 and 0.2: the sequence ratio is e^0.2 = 1.2214, past the high threshold
    # 1.2, so every token carries 1.2214 although token 0 alone is on-policy (ratio 1).
    lp = [-1.0, -2.0, -0.5]
    inputs = {
        "logprobs": [-1.0, -2.2, -0.7],
        "advantages": [1.0, 1.0, -1.0],
        "sequence_ratio_mask": [0.0, 1.0, 1.0],
    }
    loss, grad = _loss_and_grad(gspo, lp, inputs, {})
    s = math.exp(0.2)
    # A > 0: min(s, clip(s)) = 1.2, a constant (no gradient); A < 0: min(-s, -1.2) = -s, gradient s on the token
    assert loss == pytest.approx([-1.2, -1.2, s], abs=1e-6)
    assert grad == pytest.approx([0.0, 0.0, s], abs=1e-6)
    # ppo, token by token, would have trained token 0 (its own ratio is 1)
    _, ppo_grad = _loss_and_grad(ppo, lp, inputs, {})
    assert ppo_grad[0] == pytest.approx(-1.0)


def test_gspo_inside_the_clip_range_is_reinforce_weighted_by_the_sequence_ratio() -> None:
    lp = [-1.0, -2.0]
    inputs = {"logprobs": [-1.1, -1.95], "advantages": [2.0, -1.0]}  # no mask: every token is in the ratio
    loss, grad = _loss_and_grad(gspo, lp, inputs, {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5})
    s = math.exp((0.1 - 0.05) / 2)
    assert loss == pytest.approx([-2.0 * s, s], abs=1e-6)
    # each token's gradient is its own: the advantage's sign raises (A > 0) or lowers (A < 0) its logprob
    assert grad == pytest.approx([-2.0 * s, s], abs=1e-6)


def test_gspo_without_marked_tokens_counts_the_sequence_as_on_policy() -> None:
    loss, grad = _loss_and_grad(
        gspo, [-1.0], {"logprobs": [-3.0], "advantages": [1.0], "sequence_ratio_mask": [0.0]}, {}
    )
    assert loss == pytest.approx([-1.0]) and grad == pytest.approx([-1.0])


# -- stable_reinforce: truncated REINFORCE against the recorded sampler logprobs ------------------------------


def _stable_inputs() -> dict[str, list[float]]:
    return {
        "advantages": [5.0, 1.0, 1.0, -2.0],
        RECORDED_LOGPROBS: [0.0, -1.5, -0.5, -3.5],
        RECORDED_MASK: [0.0, 1.0, 1.0, 1.0],  # token 0 is a prompt token: no record, no loss
    }


def test_stable_reinforce_weights_reinforce_by_the_truncated_ratio_to_the_sampler() -> None:
    lp = [-1.0, -2.0, -0.5, -3.0]
    loss, grad = _loss_and_grad(stable_reinforce, lp, _stable_inputs(), {})
    w = math.exp(-0.5)  # token 1: the trained policy likes it less than the sampler did (ratio e^-0.5)
    # token 2 is on-policy (weight 1); token 3's ratio e^0.5 is truncated to 1
    assert loss == pytest.approx([0.0, 2.0 * w, 0.5, -6.0], abs=1e-6)
    assert grad == pytest.approx([0.0, -w, -1.0, 2.0], abs=1e-6)


def test_stable_reinforce_kl_coeff_pulls_the_policy_back_to_the_sampler() -> None:
    lp = [-1.0, -2.0, -0.5, -3.0]
    base_loss, base_grad = _loss_and_grad(stable_reinforce, lp, _stable_inputs(), {})
    loss, grad = _loss_and_grad(stable_reinforce, lp, _stable_inputs(), {"kl_coeff": 0.1})
    # + kl_coeff * drift^2 / 2 on recorded tokens; its gradient kl_coeff * drift points back towards the sampler
    assert [a - b for a, b in zip(loss, base_loss, strict=True)] == pytest.approx(
        [0, 0.0125, 0, 0.0125], abs=1e-6
    )
    assert [a - b for a, b in zip(grad, base_grad, strict=True)] == pytest.approx(
        [0, -0.05, 0, 0.05], abs=1e-6
    )


# -- the backend against a direct computation -------------------------------------------------------------------


def _td(values: list[Any], dtype: str) -> dict[str, Any]:
    return {"data": values, "dtype": dtype, "shape": [len(values)]}


def _torch_gspo(lp: Any, inputs: dict[str, Any], config: dict[str, float]) -> Any:
    """GSPO-token written with torch's autograd (the sequence ratio detached, each token's own logprob live)."""
    import torch

    low, high = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
    marked = inputs["sequence_ratio_mask"] != 0
    sequence_log_ratio = (lp.detach() - inputs["logprobs"])[marked].mean()
    ratio = torch.exp(sequence_log_ratio + lp - lp.detach())
    advantages = inputs["advantages"]
    return -torch.minimum(ratio * advantages, torch.clamp(ratio, low, high) * advantages)


def _torch_stable_reinforce(lp: Any, inputs: dict[str, Any], config: dict[str, float]) -> Any:
    import torch

    drift = lp - inputs[RECORDED_LOGPROBS]
    weight = torch.exp(torch.clamp(drift.detach(), max=0.0))
    reinforce = -(weight * lp * inputs["advantages"])
    return inputs[RECORDED_MASK] * (reinforce + 0.5 * config.get("kl_coeff", 0.0) * drift * drift)


@pytest.mark.parametrize("loss_fn", ["gspo", "stable_reinforce"])
def test_the_torch_engine_s_losses_and_gradients_match_a_direct_autograd_computation(loss_fn: str) -> None:
    torch = pytest.importorskip("torch")
    backend = ModelBackend.create(MODEL, engine="torch")
    model = backend.engine.model  # type: ignore[attr-defined]
    reference = copy.deepcopy(model)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 265, 17).tolist()
    n = len(tokens) - 1
    sampled = (-5.6 + 0.4 * rng.standard_normal(n)).tolist()
    values = {
        "logprobs": sampled,
        "advantages": rng.standard_normal(n).tolist(),
        "sequence_ratio_mask": [0.0] * 4 + [1.0] * (n - 4),
        RECORDED_LOGPROBS: sampled,
        RECORDED_MASK: [0.0] * 4 + [1.0] * (n - 4),
    }
    datum = {
        "model_input": {"chunks": [{"tokens": tokens[:-1]}]},
        "loss_fn_inputs": {"target_tokens": _td(tokens[1:], "int64")}
        | {key: _td(value, "float32") for key, value in values.items()},
    }
    config = {"kl_coeff": 0.3} if loss_fn == "stable_reinforce" else {"clip_low_threshold": 0.95}

    out = backend.forward_backward([datum], loss_fn, config)

    logits = reference(input_ids=torch.tensor([tokens[:-1]])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(tokens[1:])[:, None]).squeeze(-1)
    fn = _torch_gspo if loss_fn == "gspo" else _torch_stable_reinforce
    want = fn(lp, {key: torch.tensor(value) for key, value in values.items()}, config).sum()
    want.backward()
    assert out["metrics"]["loss:sum"] == pytest.approx(want.item(), rel=1e-5, abs=1e-5)
    for (name, got), (_, expected) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        assert got.grad is not None and expected.grad is not None
        torch.testing.assert_close(got.grad, expected.grad, atol=1e-5, rtol=1e-4, msg=name)


# -- the stability store ----------------------------------------------------------------------------------------


def test_records_expire_a_day_after_their_last_use_and_the_oldest_go_first() -> None:
    now = [0.0]
    store = StabilityStore(max_records=2, clock=lambda: now[0])
    store.record("a", session_id="s", tokens=[1, 2], logprobs=[-0.1, -0.2])
    now[0] = 80000.0
    assert store.lookup("a") is not None  # a use restarts its day
    store.record("b", session_id="s", tokens=[3], logprobs=[-0.3])
    now[0] = 80000.0 + 86400.0 + 1
    assert store.lookup("a") is None and store.lookup("b") is None
    for name in "cde":
        store.record(name, session_id="s", tokens=[1], logprobs=[-1.0])
    assert len(store) == 2 and store.lookup("c") is None


def test_recorded_inputs_follow_the_spans() -> None:
    store = StabilityStore()
    store.record("seq-1", session_id="s", tokens=[7, 8, 9], logprobs=[-0.7, -0.8, -0.9])
    spans = [Span("prompt", "seq-1", 0, 2), Span("sampled", "seq-1", 1, 2)]
    logprobs, mask = store.recorded_inputs(spans, [4, 5, 8, 9], session_id="s", where="d")
    assert logprobs == [0.0, 0.0, -0.8, -0.9] and mask == [0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("spans", "targets", "session", "message"),
    [
        ([Span("sampled", "seq-9", 0, 1)], [7], "s", "d: unknown sequence_id 'seq-9': this server holds no"),
        (
            [Span("sampled", "seq-1", 0, 1)],
            [7, 8],
            "s",
            "the provenance spans cover 1 positions but the datum has 2",
        ),
        (
            [Span("sampled", "seq-1", 0, 2)],
            [7, 6],
            "s",
            "target 1 is token 6, but sequence 'seq-1' sampled token 8",
        ),
        (
            [Span("sampled", "seq-1", 2, 2)],
            [9, 1],
            "s",
            "covers sampled tokens 2..4 of sequence 'seq-1', which",
        ),
        ([Span("sampled", "seq-1", 0, 1)], [7], "other", "was sampled in session 's'; a training request of"),
    ],
)
def test_recorded_inputs_refuse_in_one_line(spans, targets, session, message) -> None:
    store = StabilityStore()
    store.record("seq-1", session_id="s", tokens=[7, 8, 9], logprobs=[-0.7, -0.8, -0.9])
    with pytest.raises(ValueError) as excinfo:
        store.recorded_inputs(spans, targets, session_id=session, where="d")
    assert message in str(excinfo.value) and "\n" not in str(excinfo.value)


# -- over HTTP: sequence ids, recording, refusals ----------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTinkerServer]:
    with LocalTinkerServer(state_dir=tmp_path_factory.mktemp("stability")) as running:
        yield running


def post(server: LocalTinkerServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/api/v1/{path}", json=body, headers={"X-API-Key": server.api_key}, timeout=60
    )


def result(server: LocalTinkerServer, submitted: httpx.Response) -> dict[str, Any]:
    assert submitted.status_code == 200, submitted.text
    for _ in range(100):
        answer = post(server, "retrieve_future", {"request_id": submitted.json()["request_id"]})
        if answer.status_code != 408:
            assert answer.status_code == 200, answer.text
            return answer.json()
    raise AssertionError("no result")


def session_and_model(server: LocalTinkerServer) -> tuple[str, str]:
    session = post(server, "create_session", {"tags": [], "sdk_version": "0.38.0"}).json()["session_id"]
    created = post(server, "create_model", {"session_id": session, "model_seq_id": 0, "base_model": MODEL})
    return session, result(server, created)["model_id"]


def sample(
    server: LocalTinkerServer, model_id: str, *, record: bool
) -> tuple[list[str], list[dict[str, Any]]]:
    saved = post(server, "save_weights_for_sampler", {"model_id": model_id, "path": None})
    sampler = result(server, saved)["sampling_session_id"]
    submitted = post(
        server,
        "asample",
        {
            "sampling_session_id": sampler,
            "seq_id": 0,
            "num_samples": 2,
            "prompt": {"chunks": [{"tokens": PROMPT}]},
            "sampling_params": {"max_tokens": 5, "seed": 11},
            "record_stability_info": record,
        },
    )
    ids = submitted.json()["sample_sequence_ids"]
    return ids, result(server, submitted)["sequences"]


def stable_datum(sequence_id: str, tokens: list[int], advantage: float) -> dict[str, Any]:
    """The prompt and one sampled sequence, shifted; the spans tile the targets (prompt run, then sampled run)."""
    full = PROMPT + tokens
    n = len(full) - 1
    return {
        "model_input": {"chunks": [{"tokens": full[:-1]}]},
        "loss_fn_inputs": {
            "target_tokens": _td(full[1:], "int64"),
            "advantages": _td([0.0] * (len(PROMPT) - 1) + [advantage] * len(tokens), "float32"),
        },
        "loss_fn_input_spans": [
            {"prompt_tokens": {"sequence_id": sequence_id, "offset": 1, "length": len(PROMPT) - 1}},
            {"sampled_tokens": {"sequence_id": sequence_id, "offset": 0, "length": len(tokens)}},
        ],
        "n": n,
    }


def forward(
    server: LocalTinkerServer, model_id: str, datums: list[dict[str, Any]], loss_fn: str
) -> httpx.Response:
    data = [{k: v for k, v in d.items() if k != "n"} for d in datums]
    return post(
        server,
        "forward",
        {"model_id": model_id, "forward_input": {"data": data, "loss_fn": loss_fn, "loss_fn_config": None}},
    )


def test_every_sample_gets_sequence_ids_and_recorded_ones_train(server: LocalTinkerServer) -> None:
    _, model_id = session_and_model(server)
    ids, sequences = sample(server, model_id, record=True)
    assert len(ids) == len(set(ids)) == len(sequences) == 2
    datums = [stable_datum(i, s["tokens"], a) for i, s, a in zip(ids, sequences, (1.0, -1.0), strict=True)]
    out = result(server, forward(server, model_id, datums, "stable_reinforce"))
    # on-policy (the sampler is this model's copy): the loss is plain REINFORCE, -sum(A * logprob of sampled)
    want = 0.0
    for datum, output in zip(datums, out["loss_fn_outputs"], strict=True):
        lp = output["logprobs"]["data"]
        adv = datum["loss_fn_inputs"]["advantages"]["data"]
        want -= sum(a * p for a, p in zip(adv, lp, strict=True))
    assert out["metrics"]["loss:sum"] == pytest.approx(want, rel=1e-4, abs=1e-4)


def test_a_sequence_sampled_without_recording_is_refused_in_one_line(server: LocalTinkerServer) -> None:
    _, model_id = session_and_model(server)
    ids, sequences = sample(server, model_id, record=False)
    datum = stable_datum(ids[0], sequences[0]["tokens"], 1.0)
    answer = forward(server, model_id, [datum], "stable_reinforce")
    assert answer.status_code == 400
    message = answer.json()["error"]
    assert (
        message.startswith(f"forward_input.data[0]: unknown sequence_id {ids[0]!r}") and "\n" not in message
    )
    # a loss that reads no stability records leaves the provenance unread
    datum["loss_fn_inputs"]["logprobs"] = _td([0.0] * datum["n"], "float32")
    assert "loss_fn_outputs" in result(server, forward(server, model_id, [datum], "cispo"))


def test_stable_reinforce_without_spans_and_with_a_made_up_id_is_refused(server: LocalTinkerServer) -> None:
    _, model_id = session_and_model(server)
    ids, sequences = sample(server, model_id, record=True)
    datum = stable_datum(ids[0], sequences[0]["tokens"], 1.0)
    bare = {k: v for k, v in datum.items() if k != "loss_fn_input_spans"}
    answer = forward(server, model_id, [bare], "stable_reinforce")
    assert answer.status_code == 400 and "needs loss_fn_input_spans" in answer.json()["error"]
    made_up = stable_datum("seq-made-up", sequences[0]["tokens"], 1.0)
    answer = forward(server, model_id, [made_up], "stable_reinforce")
    assert answer.status_code == 400 and "unknown sequence_id 'seq-made-up'" in answer.json()["error"]


def test_another_session_cannot_train_on_a_recorded_sequence(server: LocalTinkerServer) -> None:
    _, model_id = session_and_model(server)
    ids, sequences = sample(server, model_id, record=True)
    _, other_model = session_and_model(server)
    answer = forward(
        server, other_model, [stable_datum(ids[0], sequences[0]["tokens"], 1.0)], "stable_reinforce"
    )
    assert answer.status_code == 400 and "can name only its own session's sequences" in answer.json()["error"]
