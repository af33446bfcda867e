"""The reward-processor contract as docs/extending.md states it, on the bandit with the embedded local server: the
score replaces the task reward of a step, and each component `<name>` is the family `train/batch/reward/<name>/...`
(and `train/batch/root_<name>/...` for roots)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from platoon.cli import main

BANDIT = Path(__file__).resolve().parents[3] / "examples" / "bandit" / "train.yaml"


@pytest.mark.slow
def test_the_score_replaces_the_task_reward_and_components_are_named_metrics(tmp_path, monkeypatch, capsys):
    (tmp_path / "contract_scoring.py").write_text(
        textwrap.dedent(
            """
            def bonus(trajectory):
                assert trajectory["misc"]["outcome"]["status"] == "scored"  # only scored rollouts arrive
                return float(trajectory["reward"]) + 0.25, {"reward/bonus": 0.25, "closeness": 0.5}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    argv = [
        "train",
        str(BANDIT),
        f"log_path={tmp_path / 'runs'}",
        "train.batch_size=2",
        "train.workflow_config.group_size=4",
        "train.max_training_steps=1",
        "environments.0.reward_processor=contract_scoring:bonus",
    ]
    assert main(argv) == 0
    capsys.readouterr()
    row = json.loads((tmp_path / "runs" / "bandit" / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    # every rollout's environment reward is 0 or 1; the processor's 0.25 is in every task reward
    assert row["train/batch/task_reward/min"] >= 0.25
    for family in ("reward/reward/bonus", "reward/closeness", "root_reward/bonus", "root_closeness"):
        assert row[f"train/batch/{family}/count"] == 8.0, family
    assert row["train/batch/reward/reward/bonus/avg"] == 0.25
    assert row["train/batch/root_closeness/avg"] == 0.5
