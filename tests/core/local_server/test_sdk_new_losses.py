"""gspo and stable_reinforce through the real tinker SDK (from 0.38, which has them) against the local server: a
sample recorded with `record_stability_info`, a training step that moves the sampled tokens' logprobs the way the
advantage says, and an unknown sequence id refused in one line."""

from __future__ import annotations

import typing
from typing import Any

import pytest
import tinker
from tinker import types

MODEL = "platoon/toy"
PROMPT = [ord(c) for c in "Pick a letter: "]

pytestmark = pytest.mark.skipif(
    "stable_reinforce" not in typing.get_args(types.LossFnType), reason="SDKs before 0.38 have neither loss"
)


@pytest.fixture(scope="module", autouse=True)
def _open_before_the_first_test(service: Any) -> Any:
    # The module's SDK session opens (0.38 opens it with the first training client) before any test's own session
    # check takes its snapshot.
    service.create_lora_training_client(base_model=MODEL).result()
    return service


def _sample(client: tinker.TrainingClient) -> types.SampledSequence:
    sampler = client.save_weights_and_get_sampling_client(record_stability_info=True).result()
    params = types.SamplingParams(max_tokens=6, seed=7, temperature=1.0)
    response = sampler.sample(
        prompt=types.ModelInput.from_ints(PROMPT), num_samples=1, sampling_params=params
    )
    (sequence,) = response.result().sequences
    assert sequence.sequence_id and len(sequence.tokens) == 6
    return sequence


def _datum(loss_fn: str, sequence: types.SampledSequence, advantage: float) -> types.Datum:
    """The prompt and the sampled tokens, shifted by one; the sampled positions carry the advantage."""
    full = PROMPT + list(sequence.tokens)
    prompt_targets = len(PROMPT) - 1
    n = len(sequence.tokens)
    inputs: dict[str, Any] = {
        "target_tokens": full[1:],
        "logprobs": [0.0] * prompt_targets + list(sequence.logprobs or []),
        "advantages": [0.0] * prompt_targets + [advantage] * n,
    }
    if loss_fn == "gspo":
        inputs["sequence_ratio_mask"] = [0.0] * prompt_targets + [1.0] * n
    datum = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs=inputs)
    if loss_fn != "stable_reinforce":
        return datum
    sequence_id = sequence.sequence_id
    return datum.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=sequence_id, offset=0, length=len(PROMPT)),
            types.SampledProvenanceSpan(sequence_id=sequence_id, offset=0, length=n - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=sequence_id, offset=1, length=prompt_targets),
            types.SampledProvenanceSpan(sequence_id=sequence_id, offset=0, length=n),
        ],
    )


def _sampled_logprob(client: tinker.TrainingClient, datum: types.Datum, n: int) -> float:
    out = client.forward([datum], "cross_entropy").result()
    return float(sum(out.loss_fn_outputs[0]["logprobs"].tolist()[-n:]))


@pytest.mark.parametrize("loss_fn", ["gspo", "stable_reinforce"])
@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_one_step_moves_the_sampled_tokens_the_way_the_advantage_says(service, loss_fn, advantage) -> None:
    client = service.create_lora_training_client(base_model=MODEL).result()
    sequence = _sample(client)
    datum = _datum(loss_fn, sequence, advantage)
    n = len(sequence.tokens)
    before = _sampled_logprob(client, datum, n)
    # on-policy: the sampler's logprobs are this model's own
    assert before == pytest.approx(sum(sequence.logprobs or []), abs=1e-3)

    result = client.forward_backward([datum], loss_fn).result()
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()

    # at ratio 1, stable_reinforce's loss is REINFORCE's (-advantage x the sampled tokens' logprob) and gspo's
    # PPO's (-advantage per token)
    want = -advantage * (before if loss_fn == "stable_reinforce" else n)
    assert result.metrics["loss:sum"] == pytest.approx(want, rel=1e-3, abs=1e-3)
    after = _sampled_logprob(client, datum, n)
    assert (after - before) * advantage > 0.1


def test_stable_reinforce_refuses_a_sequence_the_server_never_sampled(service) -> None:
    client = service.create_lora_training_client(base_model=MODEL).result()
    sequence = _sample(client)
    made_up = types.SampledSequence(
        stop_reason=sequence.stop_reason,
        sequence_id="seq-made-up",
        tokens_np=sequence.tokens_np,
        logprobs_np=sequence.logprobs_np,
    )
    with pytest.raises(tinker.BadRequestError) as excinfo:
        client.forward_backward([_datum("stable_reinforce", made_up, 1.0)], "stable_reinforce").result()
    assert "unknown sequence_id 'seq-made-up': this server holds no stability record" in str(excinfo.value)
