"""`platoon train` with a command-line agent: two steps of number search with `platoon-bash@1` (a TOML spec: a
separate process that reaches the policy over HTTP and the environment's tools over MCP) on the embedded local
Tinker-compatible server, the policy scripted in process (`platoon.testing.serve_policy`). Every step trains on
datums built from the tokens the gateway recorded for the agent's calls."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from platoon.cli import main
from platoon.testing import serve_policy, tool_call
from platoon.testing.number_search import open_range, react_guesses

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "examples" / "quickstart" / "train.yaml"


def searcher(seed: int):
    rng = random.Random(seed)

    def next_guess(prompt: str) -> str:
        """On a rollout's first turn, give up half the time (an answer with no guess: reward 0); otherwise the
        binary-search guess from the feedback the prompt shows, which finds the number within the 11 turns allowed
        (reward 1). A group of 8 then has both rewards, and its step trains, unless all 8 pick alike: both groups of a
        step do so with odds of 1 in 16,384."""
        guesses = react_guesses(prompt)
        if not guesses and rng.random() < 0.5:
            return "\nI give up."
        low, high = open_range(prompt, guesses)
        return "\n" + tool_call("guess", {"number": (low + high) // 2})

    return next_guess


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_two_training_steps_of_number_search_with_platoon_bash(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    for variable in ("TINKER_API_KEY", "TINKER_BASE_URL", "WANDB_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    logs = tmp_path / "logs"
    argv = [
        "train",
        str(QUICKSTART),
        f"log_path={logs}",
        "train.batch_size=2",
        "train.workflow_config.group_size=8",
        "train.max_training_steps=2",
        "train.workflow_config.rollout_config.max_steps=11",  # 0..1024 in 11 halvings
        "environments.0.harness=platoon-bash",
    ]
    with serve_policy(searcher(7)):
        status = main(argv)
    err = capsys.readouterr().err
    assert status == 0, err[-3000:]

    run = logs / "quickstart" / "run"
    steps = [row for row in rows(run / "metrics.jsonl") if "train/step" in row]
    assert [row["step"] for row in steps] == [1, 2]
    assert all(row["train/batch/optimizer_updates"] == 1.0 for row in steps)
    assert all(row["train/datums/tokens_after_merge"] > 0 for row in steps)

    # training rollouts are kept as the viewer's events: each finished trajectory carries its misc
    from platoon.trajectory_events import read_events

    finished = [
        record
        for record in read_events(sorted((run / "rollouts" / "train").glob("*/events/*.jsonl")))
        if record["type"] == "trajectory_finished"
    ]
    assert len(finished) == 2 * 2 * 8  # two steps of two groups of eight, one agent each
    for record in finished:
        harness = record["misc"]["harness"]
        assert harness["spec"] == "platoon-bash@1" and harness["placement"] == "local"
        log = Path(harness["logs_path"])
        assert log.is_file() and log.is_relative_to(run / "rollouts" / "train" / "harness")
