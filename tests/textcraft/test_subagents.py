"""Recursive TextCraft-Synth agents: a child crafts an intermediate on the root's inventory
and is graded by its own forked session (Dense, `child_grading: env`); the Sparse ablation gives every trajectory
the root's success; `platoon-delegation` pays nothing for delegating."""

from __future__ import annotations

import json

from platoon.testing.episode import run_episode
from platoon_textcraft.env import TextCraftSynthEnvironment

SYNTH = "python://platoon_textcraft.env:TextCraftSynthEnvironment"
OPTIONS = {
    "prompt_builder": "platoon_textcraft.prompts:TextCraftPromptBuilder",
    "prompt_builder_options": {"synth": True, "variant": "recursive"},
    "include_reasoning": False,
    "subagents": True,
    "subagent_budget": "argument",
}


def _script() -> list[str]:
    """Root delegates the first gold step's item; the child crafts it and finishes; the root finishes short."""
    step = TextCraftSynthEnvironment.list_tasks("train")[0]["misc"]["gold_trajectory"][0]
    item, total = step["target"][0], step["result_count"]
    return [
        f"<python>\nprint(await launch_subagent({{{item!r}: {total}}}, 5))\n",
        f"<python>\ncraft({json.dumps(step['ingredients'])}, ({item!r}, {total}))\n",
        f"<python>\nfinish('Crafted {total}x {item}')\n",
        "<python>\nfinish('I stop here')\n",
    ]


def _run(*, sparse: bool, reward_processor: str | None = None, child_grading: str = "env"):
    return run_episode(
        "train:0",
        service=SYNTH,
        harness="platoon-codeact",
        policy=_script(),
        harness_options=OPTIONS,
        agents={"max_depth": None, "budget": "linear", "child_grading": child_grading},
        rollout={"max_steps": 10, "propagate_root_success": sparse},
        reward_processor=reward_processor,
    )


def test_dense_the_child_scores_its_own_targets_and_the_root_scores_zero():
    run = _run(sparse=False)
    root, child = run.trajectories
    assert child.task.goal == "Craft the following items: 12x a9_i1"
    assert child.reward == 1.0 and root.reward == 0.0
    assert root.steps[0].misc["reward_misc"]["reward/subagent_launched"] == 1


def test_sparse_gives_every_trajectory_the_roots_failure():
    run = _run(sparse=True)
    assert [t.reward for t in run.trajectories] == [0.0, 0.0]


def test_platoon_delegation_pays_nothing_for_delegating():
    run = _run(sparse=False, reward_processor="platoon-delegation")
    assert run.reward == 0.0
    score, components = run.scores[run.root.id]
    assert score == 0.0  # a successful child adds 0 x its success rate
    assert components == {
        "reward/success": 0.0,
        "reward/subagent_launched": 1.0,
        "reward/subagent_succeeded": 1.0,
    }


def test_without_child_grading_env_children_share_the_episode_outcome():
    # Dense needs `child_grading: env`; the named entries leave core's default `none`
    run = _run(sparse=False, child_grading="none")
    assert [t.reward for t in run.trajectories] == [0.0, 0.0]
