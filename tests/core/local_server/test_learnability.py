"""The local server can learn: a plain RL loop with the Tinker SDK alone raises a bandit's reward to near 1.

One prompt, an answer of one token scored 1 for `C` and 0 for `A`, `B`, `D`. A few cross-entropy steps first make
the random model answer with one of the four letters (chance = 1/4); then `importance_sampling` or `cispo` updates
with a group baseline must make it answer `C`. Seeds make every run identical.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator

import pytest
import tinker
from tinker import types

from platoon.gateway import tinker_sdk
from platoon.local_server import LocalTinkerServer, local_tinker_server

MODEL = "platoon/toy"
# The toy tokenizer is byte-level with the ChatML markers: 257 <|im_start|>, 258 <|im_end|>.
PROMPT = [257, *b"user\nPick one letter: A, B, C or D.", 258, 10, 257, *b"assistant\n"]
CANDIDATES = [ord(letter) for letter in "ABCD"]
ANSWER = ord("C")
GROUP = 16
RL_STEPS = 24
LEARNING_RATE = 0.01


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tinker.ServiceClient]:
    from platoon.gateway.tinker_service import close_session

    with local_tinker_server(state_dir=tmp_path_factory.mktemp("learnability")) as server:
        assert isinstance(server, LocalTinkerServer)
        client = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
        # SDK 0.38 opens the session at its first use: here, so that no test is taken for its opener
        assert client.holder is not None
        yield client
        close_session(client)  # its session stops heartbeating with the module


def _datum(answer: int, **inputs: float) -> types.Datum:
    """The prompt as model input; the loss reads only the last position, which predicts the answer."""
    n = len(PROMPT)
    loss_inputs: dict[str, list[int] | list[float]] = {"target_tokens": [*PROMPT[1:], answer]}
    for key, value in inputs.items():
        loss_inputs[key] = [0.0] * (n - 1) + [value]
    return types.Datum(model_input=types.ModelInput.from_ints(PROMPT), loss_fn_inputs=loss_inputs)


def _warm_up(client: tinker.TrainingClient) -> None:
    """Cross-entropy on the four letters alike: the policy answers with a letter, each about equally often."""
    data = [_datum(letter, weights=1.0) for letter in CANDIDATES]
    for _ in range(10):
        client.forward_backward(data, "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=LEARNING_RATE)).result()


def _answer_probability(client: tinker.TrainingClient) -> float:
    """The current policy's probability of answering C (through the SDK's `compute_logprobs`)."""
    sampler = tinker_sdk.made(client.save_weights_and_get_sampling_client())
    logprobs = sampler.compute_logprobs(types.ModelInput.from_ints([*PROMPT, ANSWER])).result()
    return math.exp(logprobs[-1])  # type: ignore[arg-type]


def _rl(
    client: tinker.TrainingClient, loss_fn: types.LossFnType, config: dict[str, float] | None
) -> list[float]:
    """Sample a group, score it, update with group-baseline advantages; the mean reward of each step."""
    rewards_per_step = []
    for step in range(RL_STEPS):
        sampler = tinker_sdk.made(client.save_weights_and_get_sampling_client())
        result = sampler.sample(
            types.ModelInput.from_ints(PROMPT),
            num_samples=GROUP,
            sampling_params=types.SamplingParams(max_tokens=1, seed=1000 + step, temperature=1.0),
        ).result()
        answers = [seq.tokens[0] for seq in result.sequences]
        rewards = [1.0 if token == ANSWER else 0.0 for token in answers]
        baseline = statistics.fmean(rewards)
        rewards_per_step.append(baseline)
        data = [
            _datum(token, logprobs=seq.logprobs[0], advantages=(reward - baseline) / GROUP)  # type: ignore[index]
            for token, seq, reward in zip(answers, result.sequences, rewards, strict=True)
        ]
        out = client.forward_backward(data, loss_fn, config).result()
        # On-policy: the trainer's logprobs are the sampler's, so every importance ratio is 1.
        for datum, output in zip(data, out.loss_fn_outputs, strict=True):
            sampled = datum.loss_fn_inputs["logprobs"].data[-1]
            assert output["logprobs"].data[-1] == pytest.approx(sampled, abs=1e-5)
        client.optim_step(types.AdamParams(learning_rate=LEARNING_RATE)).result()
    return rewards_per_step


@pytest.mark.slow
@pytest.mark.parametrize(
    ("loss_fn", "config"),
    [
        ("importance_sampling", None),
        ("cispo", {"clip_low_threshold": 0.0, "clip_high_threshold": 5.0}),
    ],
)
def test_rl_raises_the_reward_from_chance_to_near_one(
    service: tinker.ServiceClient, loss_fn: types.LossFnType, config: dict[str, float] | None
) -> None:
    started = time.monotonic()
    client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL, rank=8))
    _warm_up(client)
    start = _answer_probability(client)
    assert 0.15 < start < 0.35, f"after the warm-up, C should be one of four equal answers: p = {start:.3f}"
    rewards = _rl(client, loss_fn, config)
    end = _answer_probability(client)
    curve = " ".join(f"{r:.2f}" for r in rewards)
    print(
        f"{loss_fn}: {time.monotonic() - started:.1f} s; p(C) {start:.3f} -> {end:.3f}; reward per step: {curve}"
    )
    assert statistics.fmean(rewards[:3]) < 0.5, f"the start is not near chance (1/4): {curve}"
    assert statistics.fmean(rewards[-5:]) >= 0.9, f"the reward did not reach near 1: {curve}"
    assert end > 0.9
