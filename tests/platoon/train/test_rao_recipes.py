"""The RAO recipes and platoon-textcraft's configs run on the CPU: one training
step of each arm of recipes/rao (and of the extension's textcraft_train.yaml) with CPU overrides, on the local Tinker-compatible server (the real Tinker SDK), rollouts sampled
in process from a scripted CodeAct policy (`platoon.testing.serve_policy`):

- single: the root plays its task's gold trajectory and finishes (root reward 1);
- recursive (Dense): the root delegates its first gold step's item to a child that crafts it and finishes, then the
  root finishes short of its target (child 1, root 0);
- recursive_sparse: the same script; the root's failure reaches the child (both 0).

Each step must produce datums and complete. The extension's two evaluation configs evaluate two tasks each with
the gold-playing script (success 1). These tests need platoon-textcraft beside platoon's tinker and local
extras (the workspace's full suite has them), so they are `slow` and import platoon_textcraft only when they run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.testing import serve_policy

RECIPES = Path(__file__).resolve().parents[3] / "recipes" / "rao"
CONFIGS = Path(__file__).resolve().parents[3] / "packages" / "platoon-textcraft" / "configs"
GOAL = re.compile(r"Craft the following items: [^\n<]*")
USER = "<|im_start|>user\n"

#: the CPU overrides (num_microbatches follows batch_size 1: the recipe's 2 cannot split one task)
CPU = [
    "tinker_base_url=local",
    "train.model_name=platoon/toy",
    "train.batch_size=1",
    "train.num_microbatches=1",
    "train.workflow_config.group_size=2",
    "train.max_training_steps=1",
    "eval.every=0",
    "stats.wandb.mode=disabled",
]


def _craft(step: dict[str, Any]) -> str:
    """A CodeAct cell replaying one gold step: the craft's count is the total produced (`result_count`)."""
    item, total = step["target"][0], step["result_count"]
    return f"<python>\ncraft({json.dumps(step['ingredients'])}, ({item!r}, {total}))\n"


def _goal_and_turn(prompt: str) -> tuple[str, int]:
    """The agent's goal (its first user message) and how many cells it already wrote."""
    first_user = prompt[prompt.find(USER) + len(USER) :]
    found = GOAL.search(first_user)
    assert found, f"no goal in the prompt's first user message: {first_user[:300]!r}"
    return found.group(0), prompt.count("<|im_start|>assistant") - 1


def _policy(
    arm: str, world: str = "TextCraftSynthEnvironment", split: str = "train-medium"
) -> Callable[[str], str]:
    """The scripted CodeAct player of `arm` ("single" plays the gold trajectory, else the recursive script),
    answering any task of `world`'s `split` by its goal. (A child's goal never names a root's: its item is the
    first gold step's, a craft from base items only, and every task's targets lie deeper.)"""
    from platoon_textcraft import env

    tasks: dict[str, dict[str, Any]] = {}
    for task in getattr(env, world).list_tasks(split):
        tasks.setdefault(task["goal"], task)  # TextCraft's files repeat a few goals
    # a child's goal names its parent's first gold step: "Craft the following items: <total>x <item>"
    first_steps = {}
    for task in tasks.values():
        step = task["misc"]["gold_trajectory"][0]
        first_steps[f"Craft the following items: {step['result_count']}x {step['target'][0]}"] = step

    def single(prompt: str) -> str:
        goal, turn = _goal_and_turn(prompt)
        gold = tasks[goal]["misc"]["gold_trajectory"]
        return _craft(gold[turn]) if turn < len(gold) else "<python>\nfinish('Crafted every target.')\n"

    def recursive(prompt: str) -> str:
        goal, turn = _goal_and_turn(prompt)
        if goal in tasks:  # the root: delegate the first intermediate, then give up short of the target
            if turn == 0:
                step = tasks[goal]["misc"]["gold_trajectory"][0]
                targets = {step["target"][0]: step["result_count"]}
                return f"<python>\nprint(await launch_subagent({targets!r}, 5))\n"
            return "<python>\nfinish('I stop here')\n"
        step = first_steps[goal]  # the child: craft its target, then finish
        if turn == 0:
            return _craft(step)
        return f"<python>\nfinish('Crafted {step['result_count']}x {step['target'][0]}')\n"

    return single if arm == "single" else recursive


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rewards(run: Path) -> list[tuple[float, list[float]]]:
    """Per rollout: the root's reward and its children's, from the training events the run wrote."""
    from platoon.trajectory_events import by_collection, read_events

    found = []
    events = sorted((run / "rollouts" / "train").glob("*/events/*.jsonl"))
    for records in by_collection(read_events(events)).values():
        parents = {
            r["trajectory_id"]: r["trajectory"]["parent_info"]
            for r in records
            if r["type"] == "trajectory_created"
        }
        rewards = {r["trajectory_id"]: r["reward"] for r in records if r["type"] == "trajectory_finished"}
        [root] = [t for t, parent in parents.items() if parent is None]
        found.append((rewards[root], [rewards[t] for t, parent in parents.items() if parent is not None]))
    return found


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_published_prompts) -> Path:
    """A site profile whose cache holds the published RAO prompts (the recipes ask for them) and the local server's
    checkpoints; returns the log path."""
    for variable in ("TINKER_API_KEY", "TINKER_BASE_URL", "WANDB_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "site.yaml").write_text(f"cache: {with_published_prompts(tmp_path / 'cache')}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    return tmp_path / "logs"


def _train_one_step(
    arm: str,
    trial: str,
    logs: Path,
    capsys: pytest.CaptureFixture[str],
    config: Path | None = None,
    policy: Callable[[str], str] | None = None,
    experiment: str = "recursive-agents",
) -> tuple[Path, dict]:
    config = config or RECIPES / f"{arm}.yaml"
    with serve_policy(policy or _policy(arm)):
        status = main(["train", str(config), f"log_path={logs}", *CPU])
    assert status == 0, capsys.readouterr().err[-3000:]
    run = logs / experiment / trial
    [step] = [row for row in _rows(run / "metrics.jsonl") if "train/step" in row]
    # the step produced datums and completed: its metrics row and the run's final checkpoint
    assert step["step"] == 1
    assert step["train/datums/postmerge_datums"] > 0 and step["train/total_datums_per_batch"] > 0
    final = _rows(run / "checkpoints.jsonl")[-1]
    assert final["name"] == "final" and final["batch"] == 1
    return run, step


@pytest.mark.slow
def test_single_arm_plays_the_gold_trajectory_for_root_reward_one(site: Path, capsys) -> None:
    run, step = _train_one_step("single", "single", site, capsys)
    assert _rewards(run) == [(1.0, []), (1.0, [])]
    assert step["train/batch/task_reward/avg"] == 1.0
    # both roots score 1, so under the leave-one-out baseline every advantage is 0: no optimizer step
    assert step["train/zero_advantage_filter/eligible_datums"] == step["train/total_datums_per_batch"]
    assert step["train/batch/skipped_optimizer"] == 1.0


@pytest.mark.slow
def test_recursive_dense_arm_grades_the_child_one_and_the_root_zero(site: Path, capsys) -> None:
    run, step = _train_one_step("recursive", "recursive", site, capsys)
    assert _rewards(run) == [(0.0, [1.0]), (0.0, [1.0])]
    # the child's advantage is its own reward minus the group's root baseline (0): the step trains
    assert step["train/credit/depth1/datums"] > 0
    assert step["train/batch/optimizer_updates"] == 1.0


@pytest.mark.slow
def test_recursive_sparse_arm_gives_both_the_roots_zero(site: Path, capsys) -> None:
    run, step = _train_one_step("recursive_sparse", "recursive-sparse", site, capsys)
    assert _rewards(run) == [(0.0, [0.0]), (0.0, [0.0])]
    assert step["train/credit/depth1/datums"] > 0
    assert step["train/batch/skipped_optimizer"] == 1.0  # every reward 0: nothing to learn from


@pytest.mark.slow
def test_the_extensions_textcraft_train_config_trains_the_dense_recursive_agent(site: Path, capsys) -> None:
    run, step = _train_one_step(
        "recursive",
        "recursive",
        site,
        capsys,
        config=CONFIGS / "textcraft_train.yaml",
        policy=_policy("recursive", "TextCraftEnvironment", "train"),
        experiment="textcraft",
    )
    assert _rewards(run) == [(0.0, [1.0]), (0.0, [1.0])]
    assert step["train/batch/optimizer_updates"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "world"),
    [
        ("textcraft_eval.yaml", "TextCraftEnvironment"),
        ("textcraft_synth_eval.yaml", "TextCraftSynthEnvironment"),
    ],
)
def test_the_extensions_eval_configs_score_gold_play_as_successes(
    config: str, world: str, site: Path, tmp_path: Path, capsys
) -> None:
    out_dir = tmp_path / "eval"
    # the served policy samples in process: no Tinker service is reached
    overrides = [
        "inference.model_name=platoon/toy",
        f"inference.output_dir={out_dir}",
        "environments.0.eval_dataset_kwargs.limit=2",
    ]
    with serve_policy(_policy("single", world, "val")):
        status = main(["eval", str(CONFIGS / config), *overrides])
    assert status == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((out_dir / "reports" / "final_report.json").read_text())["summary"]
    assert (summary["total_tasks"], summary["successful_rollouts"], summary["success_rate"]) == (2, 2, 1.0)


def test_a_recipe_whose_prompts_are_not_fetched_stops_before_any_rollout_naming_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    logs = tmp_path / "logs"
    assert main(["train", str(RECIPES / "single.yaml"), f"log_path={logs}", *CPU]) == 78
    [line] = [line for line in capsys.readouterr().err.splitlines() if "environments.0" in line]
    assert line == (
        "platoon: environments.0.harness_options: prompt_builder_options: the RAO prompts (platoon-textcraft "
        "0.1.0's prompts.py) are not fetched on this site (no "
        f"{tmp_path / 'cache' / 'textcraft' / 'published-0.1.0' / 'prompts.py'}): run `platoon prepare CONFIG` for "
        "this config, or `python -m platoon_textcraft.published_prompts fetch`"
    )
    assert not logs.exists()  # nothing started: no run directory, no rollout
