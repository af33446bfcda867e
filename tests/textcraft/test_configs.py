"""The RAO recipes and platoon-textcraft's own configs are checked on the CPU: each
passes `platoon config validate --strict` as a run would check it, its training tasks are the expected ones (852
`train-medium` tasks for RAO, 1,000 for TextCraft) and its evaluation lists 100 tasks; the settings are those
docs/textcraft.md, "Configs: the RAO recipes and the extension's own", gives. (One training step per arm: tests/platoon/train/test_rao_recipes.py.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.config import load_config

REPO = Path(__file__).resolve().parents[2]
RAO = ["recipes/rao/single.yaml", "recipes/rao/recursive.yaml", "recipes/rao/recursive_sparse.yaml"]
CONFIGS = REPO / "packages" / "platoon-textcraft" / "configs"


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, with_published_prompts) -> None:
    """Run from the repository with well-formed keys: the configs train on hosted Tinker and log to W&B online,
    which validation checks for (nothing is sent anywhere); the site's cache holds the published RAO prompts,
    which the recipes ask for."""
    (tmp_path / "site.yaml").write_text(f"cache: {with_published_prompts(tmp_path / 'cache')}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    monkeypatch.setenv("TINKER_API_KEY", "tml-textcraft-config-check")
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)


def _validate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main(["config", "validate", "--strict", *argv])
    return code, capsys.readouterr().out.splitlines()


def _resolved(path: str | Path) -> Any:
    return load_config(str(path)).config


def _eval_tasks(path: str | Path) -> list[Any]:
    from platoon.eval.tasks import list_tasks

    return asyncio.run(list_tasks(_resolved(path), split="eval", base_dir=REPO)).tasks


@pytest.mark.parametrize("arm", RAO)
def test_each_rao_arm_validates_strictly_on_the_852_train_medium_tasks(arm: str, capsys) -> None:
    assert _validate(capsys, "--tasks", arm) == (
        0,
        [
            f"ok   {arm} (PlatoonTinkerRLTrainerConfig)",
            "  training tasks: 852, drawn in epochs of 848 (53 batches of 16), 100 steps planned",
            "  environments[default]: share 100.0% (weight tasks, 852 tasks), each task drawn about 1.9 times over "
            "the run's 100 steps",
        ],
    )


@pytest.mark.parametrize("arm", RAO)
def test_each_rao_arm_evaluates_the_first_100_val_tasks(arm: str) -> None:
    from platoon.train.tinker.evaluation import list_eval_tasks

    found = asyncio.run(list_eval_tasks(_resolved(arm), base_dir=REPO))
    assert [task.id for _, task in found] == [f"val:{i}" for i in range(100)]
    assert {label for label, _ in found} == {"default"}
    # "the first 100 val tasks of every difficulty", in file order
    assert {task.misc["difficulty"] for _, task in found} == {"easy", "medium", "hard", "extreme"}


def test_the_rao_settings_are_the_research_codes() -> None:
    config = _resolved("recipes/rao/single.yaml")
    train, workflow = config.train, config.train.workflow_config
    assert (train.model_name, train.renderer_name) == ("Qwen/Qwen3.5-4B", "qwen3_5_disable_thinking")
    assert (train.batch_size, workflow.group_size) == (16, 8)
    assert (train.max_training_steps, train.num_epochs, train.context_window_length) == (100, 30, 8192)
    assert (train.lora_rank, train.loss_fn) == (32, "cispo")
    assert train.loss_fn_config == {"clip_low_threshold": 0.0, "clip_high_threshold": 5.0}
    optimizer = train.optimizer
    assert (optimizer.learning_rate, optimizer.beta1, optimizer.beta2, optimizer.eps) == (
        3e-5,
        0.9,
        0.95,
        1e-8,
    )
    assert optimizer.grad_clip_norm == 1e12
    assert (train.max_staleness, train.num_minibatches, train.num_microbatches) == (3, 1, 2)
    assert (train.max_concurrent_rollouts, config.eval.max_concurrent_rollouts) == (128, 32)
    rollout = workflow.rollout_config
    assert (rollout.max_steps, rollout.timeout, rollout.inference_params.temperature) == (200, 7200, 1.0)
    assert workflow.leave_one_out_baseline is True
    assert (config.eval.every, config.eval.workflow_config.group_size) == (5, 1)
    assert (config.checkpoint.every, config.watchdog.timeout_seconds) == (1, 7200)
    assert config.stats.experiment_name == "recursive-agents"
    assert (config.stats.wandb.project, config.stats.wandb.tags) == (
        "recursive-agents",
        ["textcraft-synth", "tinker"],
    )
    [entry] = config.environments
    assert (entry.env, entry.harness) == ("textcraft-synth@1", "platoon-codeact")
    assert entry.dataset_kwargs == {"split_name": "train-medium"}
    assert entry.eval_dataset_kwargs == {"split_name": "val", "limit": 100}
    assert entry.reward_processor == "platoon-delegation"  # from the named entry


def test_the_arms_differ_only_in_their_agent() -> None:
    single, dense, sparse = (_resolved(arm) for arm in RAO)
    [one], [many], [sparse_entry] = single.environments, dense.environments, sparse.environments
    # the entry's prompt-builder options merge under the config's, key by key; every arm asks for the RAO prompts
    # as published
    assert one.harness_options["prompt_builder_options"] == {
        "synth": True,
        "variant": "linear",
        "prompts": "rao",
    }
    assert one.harness_options["subagents"] is False and one.agents.max_depth == 0
    assert many.harness_options["prompt_builder_options"] == {
        "synth": True,
        "variant": "recursive",
        "prompts": "rao",
    }
    assert (many.harness_options["subagents"], many.harness_options["subagent_budget"]) == (True, "argument")
    assert (many.agents.max_depth, many.agents.budget, many.agents.child_grading) == (None, "linear", "env")
    assert dense.train.workflow_config.depth_level_weighting is True
    assert single.train.workflow_config.depth_level_weighting is False
    assert not dense.train.workflow_config.rollout_config.propagate_root_success
    # Sparse = Dense + propagate_root_success (and its own trial name), nothing else
    assert sparse.train.workflow_config.rollout_config.propagate_root_success is True
    assert sparse_entry == many
    dense_data = load_config(RAO[1]).data
    sparse_data = load_config(RAO[2]).data
    dense_data["train"]["workflow_config"]["rollout_config"]["propagate_root_success"] = True
    dense_data["stats"]["trial_name"] = "recursive-sparse"
    assert sparse_data == dense_data


def test_the_extension_configs_validate_strictly(capsys) -> None:
    names = ["textcraft_train.yaml", "textcraft_eval.yaml", "textcraft_synth_eval.yaml"]
    paths = [str((CONFIGS / name).relative_to(REPO)) for name in names]
    code, lines = _validate(capsys, "--tasks", *paths)
    assert code == 0, lines
    assert [line for line in lines if not line.startswith(" ")] == [
        f"ok   {paths[0]} (PlatoonTinkerRLTrainerConfig)",
        f"ok   {paths[1]} (PlatoonEvalConfig)",
        f"ok   {paths[2]} (PlatoonEvalConfig)",
    ]
    # textcraft_train: all 1,000 TextCraft train tasks
    assert lines[1] == "  training tasks: 1000, drawn in epochs of 992 (62 batches of 16), 100 steps planned"


def test_textcraft_train_trains_the_recursive_agent_for_50_steps() -> None:
    config = _resolved(CONFIGS / "textcraft_train.yaml")
    [entry] = config.environments
    assert entry.env == "textcraft@1" and entry.harness == "platoon-codeact"
    assert entry.harness_options["prompt_builder_options"] == {"synth": False, "variant": "recursive"}
    assert entry.agents.child_grading == "env"
    assert config.train.workflow_config.rollout_config.max_steps == 50


def test_textcraft_eval_evaluates_the_recursive_agent_on_the_100_val_tasks() -> None:
    config = _resolved(CONFIGS / "textcraft_eval.yaml")
    [entry] = config.environments
    assert entry.harness_options["prompt_builder_options"] == {"synth": False, "variant": "recursive"}
    tasks = _eval_tasks(CONFIGS / "textcraft_eval.yaml")
    assert [t.task_id for t in tasks] == [f"val:{i}" for i in range(100)]


def test_textcraft_synth_eval_is_the_greedy_linear_agent_on_100_easy_to_hard_val_tasks() -> None:
    config = _resolved(CONFIGS / "textcraft_synth_eval.yaml")
    [entry] = config.environments
    assert entry.harness_options["prompt_builder_options"] == {"synth": True, "variant": "linear"}
    rollout = config.inference.workflow.rollout_config
    assert (rollout.max_steps, rollout.inference_params.temperature) == (800, 0.0)
    assert entry.eval_dataset_kwargs == {
        "split_name": ["val-easy", "val-medium", "val-hard"],
        "shuffle_seed": 42,
        "limit": 100,
    }
    tasks = _eval_tasks(CONFIGS / "textcraft_synth_eval.yaml")
    assert len(tasks) == len({t.task_id for t in tasks}) == 100
    assert {t.task.misc["difficulty"] for t in tasks} == {"easy", "medium", "hard"}
    assert tasks[0].task_id != "val-easy:0"  # shuffled
