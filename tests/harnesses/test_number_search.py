"""Number search solved end to end by a scripted binary-search policy, through the real harnesses, environment,
gateway and trace: rewards, outcomes, and the exact tokens training will use."""

from __future__ import annotations

import itertools
import re

import pytest

from platoon.envs.number_search import REACT_SYSTEM_PROMPT, SERVICE
from platoon.testing import tool_call
from platoon.testing.episode import run_episode

CODEACT_OPTIONS = {
    "prompt_builder": "platoon.envs.number_search.prompts:NumberSearchPromptBuilder",
    "include_reasoning": False,
    "subagents": False,
}


def _next_guess(prompt: str, guesses: list[int]) -> int:
    """Binary search over [low, high], replaying every earlier guess against the feedback in the prompt."""
    low, high = map(int, re.search(r"between (\d+) and (\d+)", prompt).groups())  # type: ignore[union-attr]
    for guess, word in zip(guesses, re.findall(r"Too (low|high), try again\.", prompt), strict=False):
        low, high = (guess + 1, high) if word == "low" else (low, guess - 1)
    return (low + high) // 2


def react_binary_search(prompt: str) -> str:
    # "\n" before the call is what the Qwen3 format renders in history, so each prompt extends the last exactly.
    number = _next_guess(prompt, [int(n) for n in re.findall(r'"number": (\d+)', prompt)])
    return "\n" + tool_call("guess", {"number": number})


def codeact_binary_search(prompt: str) -> str:
    return (
        f"<python>\nguess({_next_guess(prompt, [int(n) for n in re.findall(r'guess\((\d+)\)', prompt)])})\n"
    )


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
