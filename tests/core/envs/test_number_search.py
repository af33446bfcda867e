"""`platoon-number-search@1`: task generation, texts, rewards, the named entry and its CodeAct builder."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
from typing import Any

import pytest

import platoon as pt
from platoon.envs import named
from platoon.envs.number_search import REACT_SYSTEM_PROMPT, SERVICE
from platoon.envs.number_search import env as ns
from platoon.envs.number_search.prompts import NumberSearchPromptBuilder
from platoon.envs.ors.inprocess import InProcessOrsService
from platoon.harness.codeact import CodeActCell, CodeActPromptBuilder

FIRST_TRAIN = [(6, 228, 988), (250, 563, 678), (52, 285, 978)]
FIRST_VAL = [(119, 447, 965), (29, 114, 956)]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_counts_order_and_determinism():
    triples = ns.generate_triples()
    assert len(triples["train"]) == 50_000 and len(triples["val"]) == 1_000
    assert list(triples["train"][:3]) == FIRST_TRAIN
    assert list(triples["val"][:2]) == FIRST_VAL


def test_generation_is_the_same_in_a_fresh_process():
    code = (
        "from platoon.envs.number_search import env as ns;"
        "t = ns.generate_triples(); print(list(t['train'][:3]), list(t['val'][:2]), t['train'][-1], t['val'][-1])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    triples = ns.generate_triples()
    assert out.strip() == f"{FIRST_TRAIN} {FIRST_VAL} {triples['train'][-1]} {triples['val'][-1]}"


def test_triples_are_unique_in_range_and_split_by_the_hash_rule():
    triples = ns.generate_triples()
    everything = triples["train"] + triples["val"]
    assert len(set(everything)) == len(everything)
    for split, items in triples.items():
        for low, target, high in items:
            assert 0 <= low <= target <= high <= 1024
            assert low < target or target == 0
            assert target < high or target == 1024
            digest = hashlib.sha256(f"42:{low}:{target}:{high}".encode()).hexdigest()
            assert (int(digest[:8], 16) / 0xFFFFFFFF < 1000 / 51000) == (split == "val")


def test_the_triples_are_generated_once_for_both_splits():
    # About 0.2 s of work on one core, done once per process: every spec of both splits reads the one table.
    ns.generate_triples.cache_clear()
    ns.task_specs.cache_clear()
    ns.task_specs("train")
    ns.task_specs("val")
    assert ns.generate_triples.cache_info().misses == 1


def test_task_specs_and_texts():
    assert ns.task_spec("train", 0) == {
        "goal": "Guess the correct number between 6 and 988.",
        "id": "number_search.train.0",
        "max_steps": 1,
        "misc": {"low": 6, "high": 988, "target": 228},
    }
    assert ns.task_specs("val")[1]["id"] == "number_search.val.1"
    with pytest.raises(ValueError, match="number search has no split 'test'"):
        ns.task_specs("test")


def test_the_environment_through_the_python_service():
    async def main() -> None:
        service = InProcessOrsService(SERVICE)
        assert await service.list_splits() == ["train", "val"]
        assert len(await service.list_tasks("val")) == 1000
        task = await service.get_task("train:0")
        assert task.goal == "Guess the correct number between 6 and 988."
        assert task.max_steps is None  # max_steps 1 in the spec is not read
        assert task.misc["ors"] == {"split": "train", "index": 0, "name": "number_search.train.0"}
        assert (await service.get_task("number_search.train.2")).id == "train:2"
        session = await service.open(task, rollout_id="r")
        assert session.instruction == task.goal
        [guess] = await session.tools()
        assert (guess.name, guess.terminal, guess.read_only) == ("guess", False, False)
        assert guess.input_schema == {
            "properties": {"number": {"description": "The integer to guess.", "type": "integer"}},
            "required": ["number"],
            "type": "object",
        }
        low = await session.call_tool("guess", {"number": 100})
        high = await session.call_tool("guess", {"number": 900})
        assert (low.as_text(), high.as_text()) == ("Too low, try again.", "Too high, try again.")
        assert low.reward is None and not low.finished
        right = await session.call_tool("guess", {"number": 228})
        assert (right.as_text(), right.reward, right.finished) == (
            "You guessed the number 228 correctly!",
            1.0,
            True,
        )
        outcome = await session.grade()
        assert (outcome.status, outcome.reward) == ("scored", 1.0)
        await session.close()
        never = await service.open(await service.get_task("val:0"), rollout_id="r2")
        await never.call_tool("guess", {"number": 0})
        zero = await never.grade()
        assert (zero.status, zero.reward, zero.reason, zero.metadata) == (
            "scored",
            0.0,
            "no_submit",
            {"platoon_zero": True},
        )
        await never.close()

    run(main())


def test_the_prompt_falls_back_without_a_goal():
    cls = ns.NumberSearchEnvironment
    env = cls({"misc": {"target": 3}})
    assert [b.text for b in env.get_prompt()] == ["Guess the correct number."]


def test_the_named_environment_resolves_through_its_entry_point():
    entry = named.get_environment("platoon-number-search")
    assert isinstance(entry, pt.EnvironmentEntry)
    assert entry.ref == "platoon-number-search@1"
    assert named.get_environment("platoon-number-search@1") is entry
    assert entry.entry() == {
        "service": "python://platoon.envs.number_search.env:NumberSearchEnvironment",
        "agents": {"max_depth": 0},
        "eval_dataset_kwargs": {"split_name": "val"},
    }
    assert entry.defaults_for("platoon-codeact") == {
        "prompt_builder": "platoon.envs.number_search.prompts:NumberSearchPromptBuilder",
        "include_reasoning": False,
        "subagents": False,
    }
    assert entry.defaults_for("platoon-react") == {"system_prompt": REACT_SYSTEM_PROMPT}
    assert "guess tool with one integer per turn" in REACT_SYSTEM_PROMPT


def test_the_codeact_builder_asks_for_guesses_and_has_no_action_space():
    builder = NumberSearchPromptBuilder(include_reasoning=False)
    assert isinstance(builder, CodeActPromptBuilder)
    state = builder.initial_state("Your Goal: Guess the correct number between 6 and 988.", [])
    messages = builder.build_messages(state)
    assert messages[0]["role"] == "system"
    assert "guess(number)" in messages[0]["content"] and "<python>" in messages[0]["content"]
    assert "<thought>" not in messages[0]["content"]
    assert messages[1] == {
        "role": "user",
        "content": "Your Goal: Guess the correct number between 6 and 988.\n\nProvide your next action.",
    }
    state.cells.append(CodeActCell("", "guess(500)", "Too high, try again."))
    assert builder.build_messages(state)[2] == {
        "role": "assistant",
        "content": "<python>\nguess(500)\n</python>",
    }
    assert "<thought>" in NumberSearchPromptBuilder(include_reasoning=True).system_prompt()


# -- the scripted players (platoon.testing.number_search) ------------------------------------------------------


def test_the_open_range_narrows_with_each_guess_and_its_feedback():
    from platoon.testing.number_search import codeact_guesses, open_range, react_guesses

    react = (
        "Guess the correct number between 10 and 90.\n"
        '{"name": "guess", "arguments": {"number": 50}}\nToo high, try again.\n'
        '{"name": "guess", "arguments": {"number": 30}}\nToo low, try again.\n'
    )
    assert react_guesses(react) == [50, 30]
    assert open_range(react, react_guesses(react)) == (31, 49)
    codeact = "between 1 and 9\n<python>\nguess(5)\n</python>\nToo low, try again.\n<python>guess(number=7)"
    assert codeact_guesses(codeact) == [5, 7]
    assert open_range(codeact, codeact_guesses(codeact)) == (6, 9)  # the last guess has no feedback yet
    with pytest.raises(ValueError, match="no 'between LOW and HIGH'"):
        open_range("Guess a number.", [])
