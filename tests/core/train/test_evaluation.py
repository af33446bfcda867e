"""Evaluation during training: due steps, `evaluations.jsonl`, the eval split's tasks, and one
evaluation of a scripted sampler over the bandit's val split — metrics, the row and the written trajectories.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from platoon.config import load_config
from platoon.errors import ConfigError
from platoon.testing import Completion, ScriptedPolicy, toy_renderer
from platoon.train.tinker.evaluation import (
    EVALUATIONS_FILE,
    eval_due,
    evaluate,
    evaluated_steps,
    list_eval_tasks,
    record_evaluation,
)

# -- when ------------------------------------------------------------------------------------------------------


def due(steps: range, **kwargs: Any) -> list[int]:
    return [s for s in steps if eval_due(s, **kwargs)]


def test_every_counts_training_steps_and_step_0_needs_at_start():
    assert due(range(11), every=3, at_start=False, done=set()) == [3, 6, 9]
    assert due(range(11), every=3, at_start=True, done=set()) == [0, 3, 6, 9]
    assert due(range(4), every=1, at_start=False, done=set()) == [1, 2, 3]


def test_every_0_never_evaluates_even_with_at_start():
    # No eval section means every 0: nothing is evaluated, at_start included.
    assert due(range(10), every=0, at_start=True, done=set()) == []


def test_a_resume_never_evaluates_a_step_twice():
    assert due(range(7), every=2, at_start=True, done={0, 2}) == [4, 6]
    # A resume at step 4 whose evaluation a crash cut short still evaluates it; one that completed does not.
    assert eval_due(4, every=2, at_start=False, done={0, 2})
    assert not eval_due(4, every=2, at_start=False, done={0, 2, 4})


def test_evaluated_steps_reads_the_rows_and_skips_a_cut_off_last_line(tmp_path):
    assert evaluated_steps(tmp_path) == set()
    record_evaluation(tmp_path, step=0, logged_at=0, tasks=4, seconds=1.234)
    record_evaluation(tmp_path, step=5, logged_at=6, tasks=4, seconds=2.0)
    path = tmp_path / EVALUATIONS_FILE
    with path.open("a") as handle:
        handle.write('{"step": 10, "logged_at": 1')  # a crash mid-write
    assert evaluated_steps(tmp_path) == {0, 5}
    record_evaluation(tmp_path, step=10, logged_at=10, tasks=4, seconds=0.04)
    assert evaluated_steps(tmp_path) == {0, 5, 10}
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"step", "logged_at", "tasks", "seconds", "time"}
    assert first["seconds"] == 1.2 and first["time"].endswith("+00:00")


# -- what: the eval split --------------------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A task table with train and eval rows, and a config writer, in a temporary working directory."""
    monkeypatch.chdir(tmp_path)
    rows = [{"id": f"t{i}", "goal": "solve"} for i in range(3)] + [
        {"id": f"e{i}", "goal": "check", "split": "eval"} for i in range(4)
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def write(text: str) -> Any:
        (tmp_path / "c.yaml").write_text(text)
        return load_config("c.yaml", [], kind="train").config

    return write


TABLE_HEAD = textwrap.dedent(
    """
    log_path: runs
    train: {model_name: platoon/toy, renderer_name: qwen3_instruct, batch_size: 2, max_training_steps: 1}
    eval: {every: 1}
    """
)


def test_a_service_without_a_named_split_is_evaluated_on_its_eval_split(project):
    config = project(TABLE_HEAD + "environments: [{service: table, service_kwargs: {path: tasks.jsonl}}]\n")
    tasks = asyncio.run(list_eval_tasks(config, base_dir=Path.cwd()))
    assert [(label, task.id) for label, task in tasks] == [("default", f"e{i}") for i in range(4)]


def test_eval_dataset_kwargs_select_the_split_and_exclusions_and_limit_apply(project):
    config = project(
        TABLE_HEAD
        + textwrap.dedent(
            """
            environments:
              - name: a
                service: table
                service_kwargs: {path: tasks.jsonl}
                eval_dataset_kwargs: {split_name: eval, limit: 2}
                exclude_tasks: [e0]
              - name: b
                service: table
                service_kwargs: {path: tasks.jsonl}
                eval_dataset_kwargs: {split_name: [train]}
            """
        )
    )
    tasks = asyncio.run(list_eval_tasks(config, base_dir=Path.cwd()))
    assert [(label, task.id) for label, task in tasks] == [
        ("a", "e1"),
        ("a", "e2"),
        ("b", "t0"),
        ("b", "t1"),
        ("b", "t2"),
    ]


def test_a_split_the_service_does_not_have_is_a_config_error(project):
    config = project(
        TABLE_HEAD
        + "environments: [{service: table, service_kwargs: {path: tasks.jsonl}, "
        + "eval_dataset_kwargs: {split_name: nope}}]\n"
    )
    match = r"^environments\.0\.eval_dataset_kwargs\.split_name: no split 'nope'; known splits: train, eval$"
    with pytest.raises(ConfigError, match=match):
        asyncio.run(list_eval_tasks(config, base_dir=Path.cwd()))


# -- one evaluation over the bandit's val split ----------------------------------------------------------------

BANDIT = """
    log_path: runs
    train:
      model_name: platoon/toy
      renderer_name: qwen3_instruct
      batch_size: 4
      max_training_steps: 2
      sample_timeout_seconds: 2  # generous: only the one-minute answer outlives it, even on a busy machine
      workflow_config:
        group_size: 8
        rollout_config: {verbose: false}
    eval:
      every: 1
      max_concurrent_rollouts: 3
      workflow_config: {group_size: 2}
    environments:
      - env: platoon-bandit
        harness_options: {max_tokens: 1}
        eval_overrides: {harness_options: {max_tokens: 3}}
"""


class CountingPolicy(ScriptedPolicy):
    """A scripted sampler that records the most calls it served at once."""

    def __init__(self, script: Any) -> None:
        super().__init__(script)
        self.running = 0
        self.most = 0

    async def sample_async(self, *args: Any, **kwargs: Any) -> Any:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.01)  # let other rollouts reach the sampler meanwhile
            return await super().sample_async(*args, **kwargs)
        finally:
            self.running -= 1


def answer(prompt: str) -> str | Completion:
    """C (reward 1) for the first val task, B (reward 0) for two others; the second one would take a minute, far
    past the sample timeout, so its rollouts are untrainable and never averaged in as 0."""
    if "A, B, D or C." in prompt:
        return Completion("C", delay=60.0)
    return "C" if "A, B, C or D." in prompt else "B"


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    """One evaluation at step 4 of the bandit's four val tasks, two rollouts each: (config, metrics, run dir,
    policy)."""
    root = tmp_path_factory.mktemp("bandit")
    (root / "c.yaml").write_text(textwrap.dedent(BANDIT))
    config = load_config(str(root / "c.yaml"), [], kind="train").config
    run_dir = root / "run"
    policy = CountingPolicy(answer)

    async def go() -> dict[str, float]:
        tasks = await list_eval_tasks(config, base_dir=root)
        return await evaluate(
            config, step=4, sampler=policy, renderer=toy_renderer(), run_dir=run_dir, tasks=tasks
        )

    return config, asyncio.run(go()), run_dir, policy


def test_the_metrics_average_scored_rollouts_only(evaluation):
    _, metrics, _, _ = evaluation
    # Val tasks 0, 2, 3 are scored twice each (1, 0, 0); task 1's two rollouts timed out: counted, not 0.
    assert metrics["eval/reward/avg"] == pytest.approx(1 / 3)
    assert metrics["eval/reward/count"] == 6
    assert metrics["eval/reward/min"] == 0.0 and metrics["eval/reward/max"] == 1.0
    assert metrics["eval/success_rate"] == pytest.approx(1 / 3)
    assert metrics["eval/untrainable"] == 2 and metrics["eval/rollouts"] == 8
    assert metrics["eval/outcome/scored"] == 6
    assert (
        sum(metrics[f"eval/outcome/{s}"] for s in ("failed", "error", "timeout", "cancelled", "interrupted"))
        == 2
    )
    assert metrics["eval/default/reward/avg"] == pytest.approx(1 / 3)
    assert metrics["eval/default/untrainable"] == 2
    assert metrics["eval/rollout_completion/task_reward/avg"] == pytest.approx(1 / 3)
    assert metrics["eval/environment/default/task_reward/count"] == 6
    assert metrics["eval/num_tasks"] == 4 and metrics["eval/tasks"] == 4 and metrics["eval/step"] == 4
    assert metrics["eval/time"] > 0


def test_the_evaluation_is_recorded_once_in_evaluations_jsonl(evaluation):
    _, metrics, run_dir, _ = evaluation
    rows = [json.loads(line) for line in (run_dir / EVALUATIONS_FILE).read_text().splitlines()]
    assert len(rows) == 1
    assert rows[0]["step"] == 4 and rows[0]["logged_at"] == 4 and rows[0]["tasks"] == 4
    assert rows[0]["seconds"] == pytest.approx(metrics["eval/time"], abs=0.06)
    assert evaluated_steps(run_dir) == {4}
    assert not eval_due(4, every=1, at_start=False, done=evaluated_steps(run_dir))


def test_each_rollout_writes_its_trajectories_under_rollouts_eval_step(evaluation):
    _, _, run_dir, _ = evaluation
    step_dir = run_dir / "rollouts" / "eval" / "step_4"
    written = sorted(p.relative_to(step_dir).as_posix() for p in step_dir.rglob("trajectory_collection.json"))
    assert len(written) == 8
    assert all(
        p.endswith(("rollout_0/trajectory_collection.json", "rollout_1/trajectory_collection.json"))
        for p in written
    )
    rewards: dict[str, list[float | None]] = {}
    for meta_path in step_dir.rglob("metadata.json"):
        meta = json.loads(meta_path.read_text())
        assert meta["step"] == 4 and meta["label"] == "default" and meta["status"] == "completed"
        collection = json.loads((meta_path.parent / "trajectory_collection.json").read_text())
        assert collection  # the full collection, as the rollout built it
        rewards.setdefault(meta["task_id"], []).append(meta["reward"])
    assert len(rewards) == 4
    assert sorted(rewards.values(), key=str) == sorted(
        [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [None, None]], key=str
    )


def test_rollouts_use_the_eval_route_and_the_concurrency_limit(evaluation):
    _, _, _, policy = evaluation
    assert len(policy.calls) == 8
    # eval_overrides.harness_options (max_tokens 3) is laid over the entry's harness_options (1).
    assert {call.sampling_params.max_tokens for call in policy.calls} == {3}
    assert 1 < policy.most <= 3  # eval.max_concurrent_rollouts
