"""One config, one reward: an entry's reward processor scores `platoon rollout` as it scores training and
`platoon eval` (the bandit answered wrong, raw reward 0, processed 0.25 everywhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_support import only_dir

from platoon.cli import main
from platoon.testing import serve_policy

REPO = Path(__file__).resolve().parents[3]
TRAIN = REPO / "examples" / "bandit" / "train.yaml"
EVAL = REPO / "examples" / "bandit" / "eval.yaml"

SCORING = '''
def bonus(trajectory):
    """A quarter point for answering at all: the bandit's wrong answer scores 0.25."""
    return 0.5 * float(trajectory["reward"]) + 0.25, {"reward/bonus": 0.25}


def strict(trajectory):
    return trajectory["score"], {}
'''


@pytest.fixture
def processor(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The override naming the entry's reward processor (importable from the working directory)."""
    (workdir / "rollout_rewards_scoring.py").write_text(SCORING)
    monkeypatch.syspath_prepend(str(workdir))
    return "environments.0.reward_processor=rollout_rewards_scoring:bonus"


def wrong(prompt: str) -> str:
    return "A"  # the bandit scores only C


def test_rollout_reports_the_processed_reward_and_keeps_the_trajectory_as_it_ran(workdir, processor, capsys):
    with serve_policy(wrong):
        status = main(["rollout", str(TRAIN), "--task", "train:0", "--json-output", processor])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["reward"] == 0.25 and summary["agents"][0]["reward"] == 0.25
    assert summary["outcome"]["status"] == "scored" and summary["outcome"]["rewards"] == {"reward": 0.0}
    # the written trajectory keeps the environment's reward; the processor's is applied where it is used
    collection = json.loads((only_dir(workdir / "runs" / "adhoc") / "trajectory_collection.json").read_text())
    [root] = collection["trajectories"].values()
    assert root["reward"] == 0.0 and root["misc"]["reward_processor"] == "rollout_rewards_scoring:bonus"


def test_the_tree_shows_the_processed_reward(workdir, processor, capsys):
    with serve_policy(wrong):
        assert main(["rollout", str(TRAIN), "--task", "train:0", processor]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert "reward 0.25  outcome scored [reward=0]" in header


def test_a_processor_that_raises_is_one_line_and_exit_1_after_the_files_are_written(
    workdir, processor, capsys
):
    with serve_policy(wrong):
        status = main(["rollout", str(TRAIN), "--task", "train:0", processor.replace(":bonus", ":strict")])
    err = capsys.readouterr().err
    assert status == 1
    assert (
        "platoon: reward processor 'rollout_rewards_scoring:strict' raised KeyError: 'score'"
        in err.splitlines()
    )
    assert "Traceback" not in err
    assert (only_dir(workdir / "runs" / "adhoc") / "trajectory_collection.json").is_file()


def test_eval_scores_with_the_entrys_processor(workdir, processor, capsys):
    argv = [
        "eval",
        str(EVAL),
        processor,
        "inference.workflow.num_rollouts_per_task=2",
        "environments.0.eval_dataset_kwargs={split_name: val, limit: 1}",
    ]
    with serve_policy(wrong):
        status = main(argv)
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["total_rollouts"] == 2 and summary["reward_mean"] == 0.25


@pytest.mark.slow
def test_training_uses_the_same_processed_reward(workdir, processor, capsys, monkeypatch, tmp_path):
    # The local server keeps its checkpoints under the site cache: a profile points it into the test's directory.
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    argv = [
        "train",
        str(TRAIN),
        processor,
        f"log_path={tmp_path / 'logs'}",
        "train.batch_size=1",
        "train.workflow_config.group_size=2",
        "train.max_training_steps=1",
    ]
    with serve_policy(
        wrong
    ):  # training rollouts in process sample the served policy; training runs on the server
        status = main(argv)
    assert status == 0, capsys.readouterr().err
    [row] = [json.loads(line) for line in (tmp_path / "logs" / "bandit" / "run" / "metrics.jsonl").open()]
    assert row["train/batch/task_reward/avg"] == 0.25 and row["train/batch/task_reward/count"] == 2
