"""`platoon train` on number search end to end: the quickstart example on the local Tinker-compatible server, with
rollouts sampled in process from a scripted policy (`platoon.testing.serve_policy`) that, on a rollout's first turn,
either gives up at once (an answer with no guess: reward 0) or starts a binary search, which always finds the number
within the 11 turns allowed (reward 1). Each rollout picks at random, so a group of 8 has both rewards (and its step
trains) unless all 8 pick alike, which happens to both groups of a step with odds of 1 in 16,384.

The run takes steps, writes a checkpoint each step, evaluates at the configured steps, is killed with SIGKILL in
the middle of a step, and resumes without losing a checkpoint or evaluating a step twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "examples" / "quickstart" / "train.yaml"

#: A script that serves the scripted searcher and runs `platoon train` with its arguments, in its own process.
DRIVER = textwrap.dedent(
    '''
    import random
    import sys

    from platoon.cli import main
    from platoon.testing.number_search import open_range, react_guesses
    from platoon.testing import serve_policy, tool_call

    rng = random.Random(int(sys.argv[1]))


    def searcher(prompt: str) -> str:
        """On a first turn, give up half the time; otherwise the binary-search guess (replaying the feedback)."""
        guesses = react_guesses(prompt)
        if not guesses and rng.random() < 0.5:
            return "\\nI give up."
        low, high = open_range(prompt, guesses)
        return "\\n" + tool_call("guess", {"number": (low + high) // 2})


    with serve_policy(searcher):
        sys.exit(main(sys.argv[2:]))
    '''
)


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _argv(log_path: Path, steps: int) -> list[str]:
    return [
        "train",
        str(QUICKSTART),
        f"log_path={log_path}",
        "train.batch_size=2",
        "train.workflow_config.group_size=8",
        f"train.max_training_steps={steps}",
        "train.workflow_config.rollout_config.max_steps=11",  # 0..1024 in 11 halvings
        "checkpoint.every=1",
        "eval.every=2",
        "eval.workflow_config.group_size=1",
        "environments.0.eval_dataset_kwargs={split_name: val, limit: 2}",
    ]


@pytest.fixture
def driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    script = tmp_path / "drive_scripted.py"
    script.write_text(DRIVER)
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")  # the local server's checkpoints outlive a start
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    return [sys.executable, str(script)]


@pytest.mark.slow
def test_number_search_trains_evaluates_and_resumes_after_sigkill(tmp_path: Path, driver: list[str]) -> None:
    logs = tmp_path / "logs"
    run = logs / "quickstart" / "run"
    argv = _argv(logs, steps=6)
    child = subprocess.Popen(
        [*driver, "1", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    try:
        deadline = time.monotonic() + 300
        # two steps checkpointed, then SIGKILL while the third one runs
        while time.monotonic() < deadline and child.poll() is None:
            if any(
                row.get("batch", 0) >= 2 and row.get("kind") == "permanent"
                for row in _rows(run / "checkpoints.jsonl")
            ):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the run never checkpointed step 2: {child.communicate()[1][-3000:]}")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    killed = _rows(run / "checkpoints.jsonl")
    assert [row["name"] for row in killed][:3] == ["recovery-000000", "000001", "000002"]

    resumed = subprocess.run([*driver, "2", *argv], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step" in resumed.stderr

    rows = _rows(run / "checkpoints.jsonl")
    assert rows[: len(killed)] == killed  # no checkpoint of the killed start was lost or rewritten
    assert rows[-1]["name"] == "final" and rows[-1]["batch"] == 6
    permanent = [row["batch"] for row in rows if row["kind"] == "permanent"]
    assert set(range(1, 7)) <= set(permanent) | {6}  # a checkpoint for every step (the last is `final` too)

    steps = [row for row in _rows(run / "metrics.jsonl") if "train/step" in row]
    assert sorted({row["step"] for row in steps}) == [1, 2, 3, 4, 5, 6]
    # every step trained: the searchers that gave up and those that searched differ in reward
    assert all(row["train/batch/optimizer_updates"] == 1.0 for row in steps)
    assert any(0.0 < row["train/batch/task_reward/avg"] < 1.0 for row in steps)
    for row in steps:  # per group: the best of its 8 rollouts, their mean, the worst
        best, mean, worst = (row[f"train/batch/task_reward_at_k_{k}/avg"] for k in ("max", "mean", "min"))
        assert worst <= mean <= best and row["train/batch/task_reward_at_k_max/count"] == 2.0
    assert all(
        row["train/datums/tokens_after_merge"] < row["train/datums/tokens_before_merge"] for row in steps
    )

    evaluated = [row["step"] for row in _rows(run / "evaluations.jsonl")]
    assert sorted(evaluated) == [2, 4, 6] and len(evaluated) == len(set(evaluated))
    assert all(row["tasks"] == 2 for row in _rows(run / "evaluations.jsonl"))
    for step in (2, 4, 6):
        assert (
            len(
                list(
                    (run / "rollouts" / "eval" / f"step_{step}").glob(
                        "*/rollout_0/trajectory_collection.json"
                    )
                )
            )
            == 2
        )

    # training rollouts leave the viewer's events: one file per policy version they sampled, holding every
    # rollout of it whole (split by collection id)
    from platoon.trajectory_events import by_collection, read_events

    versions = sorted((run / "rollouts" / "train").iterdir())
    events = sorted((run / "rollouts" / "train").glob("*/events/*"))
    assert [f.name for f in events] == [f"events_train_{v.name}.jsonl" for v in versions]
    rollouts = by_collection(read_events(events))
    whole = [
        records
        for records in rollouts.values()
        if records[0]["type"] == "trajectory_created" and records[-1]["type"] == "trajectory_finished"
    ]
    assert len(whole) >= 6 * 2 * 8  # (the SIGKILL may have cut the killed start's last rollout short)
    # each record says where its rollout belongs, by which the viewer groups them: its training step and the policy
    # version it sampled (the version its file is named after); an evaluation's, the step it evaluated
    for records in whole:
        assert {r["scope"] for r in records} == {"train"}
        assert len({(r["training_step"], r["policy_version"]) for r in records}) == 1
        step, version = records[0]["training_step"], records[0]["policy_version"]
        assert 1 <= step <= 6 and 0 <= version <= step - 1
    evaluated = read_events(sorted((run / "rollouts" / "eval").glob("step_*/events/*.jsonl")))
    assert evaluated and {(r["scope"], r["training_step"]) for r in evaluated} <= {
        ("eval", 2),
        ("eval", 4),
        ("eval", 6),
    }
    assert not (run / "process.json").exists()
