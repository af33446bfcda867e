"""Number search solved end to end by a scripted binary-search policy, through the real harnesses, environment,
gateway and trace: rewards, outcomes, and the exact tokens training will use."""

from __future__ import annotations

import itertools

import pytest

from platoon.envs.number_search import REACT_SYSTEM_PROMPT, SERVICE
from platoon.testing.episode import run_episode
from platoon.testing.number_search import codeact_guesses, open_range, react_binary_search

CODEACT_OPTIONS = {
    "prompt_builder": "platoon.envs.number_search.prompts:NumberSearchPromptBuilder",
    "include_reasoning": False,
    "subagents": False,
}


def codeact_binary_search(prompt: str) -> str:
    low, high = open_range(prompt, codeact_guesses(prompt))
    return f"<python>\nguess({(low + high) // 2})\n"


@pytest.mark.parametrize("task", ["train:0", "train:1", "val:0", "val:7"])
def test_react_solves_number_search_by_binary_search(task):
    run = run_episode(
        task,
        service=SERVICE,
        harness="platoon-react",
        policy=react_binary_search,
        harness_options={"system_prompt": REACT_SYSTEM_PROMPT},
    )
    assert run.outcome["status"] == "scored" and run.outcome["reward_key"] == "reward"
    assert run.reward == 1.0
    assert run.root.finish_message.endswith("correctly!")
    assert 1 <= len(run.root.steps) <= 11  # log2 of the range
    assert run.root.steps[-1].misc["reward_misc"]["reward/success"] == 1.0


def test_codeact_solves_number_search_by_binary_search():
    run = run_episode(
        "train:3",
        service=SERVICE,
        harness="platoon-codeact",
        policy=codeact_binary_search,
        harness_options=CODEACT_OPTIONS,
    )
    assert run.outcome["status"] == "scored" and run.reward == 1.0
    assert run.root.finish_message.endswith("correctly!")
    outputs = [step.misc["output"] for step in run.root.steps]
    # the cell's last expression is shown as a notebook shows it: its repr
    assert all(o.startswith("'Too ") for o in outputs[:-1]) and outputs[-1].endswith("correctly!'\n")


def test_an_agent_that_never_submits_scores_a_zero_platoon_gave_itself():
    run = run_episode(
        "train:0",
        service=SERVICE,
        harness="platoon-react",
        policy=["I think the number is probably 500."],
        harness_options={"system_prompt": REACT_SYSTEM_PROMPT},
    )
    assert run.outcome["status"] == "scored" and run.outcome["reason"] == "no_submit"
    assert run.reward == 0.0
    assert run.outcome["reward_key"] is None  # platoon scored the zero itself: no reward key trained
    assert not run.root.misc.get("trajectory_invalid")


def test_every_recorded_call_holds_the_exact_tokens_and_each_prompt_extends_the_last():
    run = run_episode(
        "train:2",
        service=SERVICE,
        harness="platoon-react",
        policy=react_binary_search,
        harness_options={"system_prompt": REACT_SYSTEM_PROMPT},
    )
    tokenizer = run.gateway.tokenizer
    call_ids = [step.misc["action_misc"]["completion_id"] for step in run.root.steps]
    assert len(call_ids) >= 3
    interactions = [run.interactions[call_id] for call_id in call_ids]
    for policy_call, interaction in zip(run.policy.calls, interactions, strict=True):
        # what the policy saw and sampled is what the gateway recorded for training
        assert tokenizer.decode(list(interaction.prompt_tokens)) == policy_call.prompt
        assert list(interaction.sampled_tokens) == list(policy_call.tokens)
        assert len(interaction.logprobs) == len(interaction.sampled_tokens)
    for before, after in itertools.pairwise(interactions):
        prefix = before.prompt_tokens + before.sampled_tokens
        assert after.prompt_tokens[: len(prefix)] == prefix  # the prefix property training relies on
    first_prompt = tokenizer.decode(list(interactions[0].prompt_tokens))
    assert first_prompt.startswith("<|im_start|>system\n" + REACT_SYSTEM_PROMPT)
    assert first_prompt.endswith("<|im_start|>assistant\n")
