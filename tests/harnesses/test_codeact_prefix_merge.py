"""A scripted CodeAct episode trains as one sequence: every prompt extends the previous prompt and the exact tokens
the model sampled (docs/gateway.md, "Token-in history"), so the trainer merges its calls into one datum.

The model here writes its cells in its own layout (`<thought>` on the same line, no newline before `</python>`),
which is not how the prompt builder would re-render them: the harness must send each reply back as it came. Two
ways a turn ends are covered: on the chat format's end token (a scripted policy, a model that closes its turn), and
on the stop string `</python>` with no end token (what a sampler given that stop string returns), there with the
real Qwen3 tokenizer and the closing tag sampled in tokens a re-tokenization would not give.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon.envs.number_search import SERVICE
from platoon.testing import make_gateway
from platoon.testing.episode import EpisodeRun, run_episode
from platoon.testing.number_search import codeact_guesses, open_range
from platoon.testing.policy import Completion, ScriptedPolicy, sample_response
from platoon.train.tinker.datums import DatumStats, trajectory_datums

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = {
    "prompt_builder": "platoon.envs.number_search.prompts:NumberSearchPromptBuilder",
    "subagents": False,
}


def next_guess(prompt: str) -> int:
    """Binary search, replaying the guesses and the feedback the prompt shows."""
    low, high = open_range(prompt, codeact_guesses(prompt))
    return (low + high) // 2


def cell(prompt: str) -> str:
    # Not the builder's layout, which puts the thought and the code on lines of their own.
    return f"<thought>Halve the range.</thought>\n<python>guess({next_guess(prompt)})"


class StopStringPolicy(ScriptedPolicy):
    """Stops on the text `</python>` as a sampler given that stop string does: the tag's tokens are the last
    sampled, no end token follows. `split_tag` samples the tag one character a token."""

    def __init__(self, script: Any, *, split_tag: bool = False, **kwargs: Any) -> None:
        super().__init__(script, **kwargs)
        self.split_tag = split_tag

    def _answer(self, prompt: Any, num_samples: int, sampling_params: Any) -> tuple[Completion, Any]:
        completion, response = super()._answer(prompt, num_samples, sampling_params)
        (sequence,) = response.sequences
        tokens = list(sequence.tokens[:-1])  # the end token ScriptedPolicy appended
        if self.split_tag:
            body = self.tokenizer.encode(completion.text.removesuffix("</python>"), add_special_tokens=False)
            tag = [self.tokenizer.encode(c, add_special_tokens=False)[0] for c in "</python>"]
            tokens = [*body, *tag]
        self.calls[-1].tokens[:] = tokens
        return completion, sample_response(tokens, stop_reason="stop")


def play(policy: Any) -> EpisodeRun:
    run = run_episode(
        "train:3", service=SERVICE, harness="platoon-codeact", policy=policy, harness_options=OPTIONS
    )
    assert run.reward == 1.0
    return run


def assert_one_sequence(run: EpisodeRun) -> None:
    histories = [g["history"] for g in run.root.misc["model_generations"].values()]
    assert len(histories) >= 3
    assert histories[0]["segment"] == "first_call"
    # every later call reuses the previous call's prompt and sampled tokens, not a re-render of them
    assert all(h["segment"] is None and h["reused_tokens"] > 0 for h in histories[1:]), histories
    stats = DatumStats()
    datums = trajectory_datums(run.root, run.interactions, 1.0, checkpoint_version=0, stats=stats)
    assert len(datums) == 1
    assert stats.merged_calls == stats.calls - 1
    assert stats.tokens_after_merge < stats.tokens_before_merge
    # the datum trains on exactly the sampled tokens: those and only those carry the loss mask
    calls = [run.interactions[step.misc["action_misc"]["completion_id"]] for step in run.root.steps]
    sequence = [*datums[0].model_input.to_ints(), datums[0].loss_fn_inputs["target_tokens"].data[-1]]
    mask = [0.0, *datums[0].loss_fn_inputs["mask"].data]
    assert [t for t, m in zip(sequence, mask, strict=True) if m] == [
        t for c in calls for t in c.sampled_tokens
    ]


def test_turns_ending_on_the_end_token_merge_into_one_datum():
    assert_one_sequence(play(cell))


def test_turns_stopped_on_the_stop_string_merge_into_one_datum():
    assert_one_sequence(play(StopStringPolicy(lambda prompt: cell(prompt) + "\n</python>")))


@pytest.fixture(scope="module")
def qwen3_tokenizer() -> Iterator[Any]:
    from platoon.renderers.tokenizers import TokenizersTokenizer

    base = Path(os.environ.get("PLATOON_TEST_TOKENIZERS") or ROOT / ".cache" / "test-tokenizers")
    path = base / "qwen3"
    if not (path / "tokenizer.json").is_file():
        pytest.fail(
            f"the real Qwen3 tokenizer is not at {path}: run `uv run python scripts/fetch_test_tokenizers.py`"
        )
    yield TokenizersTokenizer.from_directory(path, name_or_path="Qwen/Qwen3-8B")
    # Collected now, not in some later test's gc.collect() (tests/core/renderers/test_encode_table.py counts).
    gc.collect()


def test_a_stop_string_sampled_in_unusual_tokens_still_merges(qwen3_tokenizer):
    # A plain render re-tokenizes `</python>` its own way, so only the sampled tokens themselves can extend.
    policy = StopStringPolicy(
        lambda prompt: cell(prompt) + "\n</python>", tokenizer=qwen3_tokenizer, split_tag=True
    )
    run = play(make_gateway(policy, tokenizer=qwen3_tokenizer))
    tag = qwen3_tokenizer.encode("\n</python>", add_special_tokens=False)
    assert all(list(c.sampled_tokens[-len(tag) :]) != tag for c in run.interactions.values())
    assert_one_sequence(run)
