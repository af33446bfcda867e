"""TextCraft episodes end to end: the named environments through platoon-codeact with a scripted policy that
plays each task's gold trajectory (reward 1), and the ways an episode scores 0."""

from __future__ import annotations

import json

import pytest

from platoon.envs.named import get_environment
from platoon.testing.episode import run_episode

SYNTH = "python://platoon_textcraft.env:TextCraftSynthEnvironment"
MINECRAFT = "python://platoon_textcraft.env:TextCraftEnvironment"


def _gold_cells(spec: dict) -> list[str]:
    """One CodeAct cell per gold step (the craft's total is `result_count`), then finish."""
    cells = []
    for step in spec["misc"]["gold_trajectory"]:
        item = step["target"][0]
        cells.append(
            f"<python>\ncraft({json.dumps(step['ingredients'])}, ({item!r}, {step['result_count']}))\n"
        )
    cells.append("<python>\nfinish('Crafted every target.')\n")
    return cells


def _spec(env_class: str, split: str, index: int) -> dict:
    from platoon_textcraft import env

    return getattr(env, env_class).list_tasks(split)[index]


@pytest.mark.parametrize(
    ("service", "env_class", "split", "index", "synth"),
    [
        (SYNTH, "TextCraftSynthEnvironment", "train", 0, True),
        (SYNTH, "TextCraftSynthEnvironment", "val-easy", 3, True),
        (SYNTH, "TextCraftSynthEnvironment", "train-medium", 5, True),
        (MINECRAFT, "TextCraftEnvironment", "train", 0, False),
        (MINECRAFT, "TextCraftEnvironment", "val", 7, False),
    ],
)
def test_a_gold_trajectory_scores_one(service, env_class, split, index, synth):
    spec = _spec(env_class, split, index)
    cells = _gold_cells(spec)
    run = run_episode(
        f"{split}:{index}",
        service=service,
        harness="platoon-codeact",
        policy=cells,
        max_steps=len(cells) + 2,
        harness_options={
            "prompt_builder": "platoon_textcraft.prompts:TextCraftPromptBuilder",
            "prompt_builder_options": {"synth": synth},
            "include_reasoning": False,
            "subagents": False,
        },
    )
    assert run.outcome["status"] == "scored"
    assert run.reward == 1.0
    assert run.root.steps[-1].misc["reward_misc"]["reward/success"] == 1.0
    outputs = [step.misc["output"] for step in run.root.steps[:-1]]
    assert all("Successfully crafted" in output for output in outputs)


def test_an_episode_that_never_finishes_scores_zero_as_no_submit():
    run = run_episode(
        "train:0",
        service=SYNTH,
        harness="platoon-codeact",
        policy=["<python>\nview_inventory()\n"] * 3,
        max_steps=3,
        harness_options={"include_reasoning": False, "subagents": False},
    )
    assert run.reward == 0.0 and run.outcome["reason"] == "no_submit"


def test_finishing_without_crafting_scores_zero_with_the_shortfall():
    run = run_episode(
        "train:0",
        service=SYNTH,
        harness="platoon-codeact",
        policy=["<python>\nfinish('done')\n"],
        max_steps=2,
        harness_options={"include_reasoning": False, "subagents": False},
    )
    assert run.outcome["status"] == "scored" and run.reward == 0.0
    assert run.root.steps[-1].misc["reward_misc"]["reward/success"] == 0.0


def test_the_named_environments_resolve_through_their_entry_points():
    textcraft = get_environment("textcraft@1")
    synth = get_environment("textcraft-synth")
    assert textcraft.entry()["service"] == MINECRAFT
    assert synth.entry()["service"] == SYNTH
    assert synth.entry()["reward_processor"] == "platoon-delegation"
    assert "reward_processor" not in textcraft.entry()
    for entry, synth_flag in ((textcraft, False), (synth, True)):
        assert entry.entry()["eval_dataset_kwargs"] == {"split_name": "val"}
        assert not {"agents", "dataset_kwargs", "program"} & set(entry.entry())
        assert entry.defaults_for("platoon-codeact") == {
            "prompt_builder": "platoon_textcraft.prompts:TextCraftPromptBuilder",
            "prompt_builder_options": {"synth": synth_flag},
        }
        assert entry.defaults_for("platoon-react") == {}
    assert textcraft.description.startswith("crafting Minecraft items by recipe")
