"""The training pipeline's behaviour through `platoon train` on the local Tinker-compatible server: straggler
cutoffs, group limits by label, the watchdog, a supervised restart after a crash, W&B logging, hold-out identity.

Harnesses that run in a child process live in a module the test writes (the child imports it by name); the others
are registered here and run in process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.harness.agent import AgentResult
from platoon.harness.function import harness
from platoon.trajectory_events import by_collection, read_events

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _steps(run: Path) -> list[dict[str, Any]]:
    return [row for row in _rows(run / "metrics.jsonl") if "train/step" in row]


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site profile whose cache (the local server's checkpoints) lives in the test's directory; returns log_path."""
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    return tmp_path / "logs"


def _bandit(log_path: Path, *overrides: str) -> list[str]:
    return [
        "train",
        str(BANDIT),
        f"log_path={log_path}",
        "train.batch_size=2",
        "train.workflow_config.group_size=4",
        *overrides,
    ]


def _answer(ctx: Any) -> Any:
    return ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=1)


# ---------------------------------------------------------------------------------------------------------------
# Stragglers and group limits (in process)

SLOW_LAST = "test-pipeline-slow-last"
_started_by_task: dict[str, int] = {}
_stragglers: dict[str, list[str]] = {"cancelled": [], "finished": []}


@harness(SLOW_LAST)
async def _slow_last(ctx: Any) -> AgentResult:
    """The bandit's answer; the last member of each group to start (a group is one task) is a straggler that
    would take a minute, and records whether it was cancelled or finished."""
    task_id = str(ctx.task.id)
    _started_by_task[task_id] = _started_by_task.get(task_id, 0) + 1
    if _started_by_task[task_id] == 4:
        try:
            await asyncio.sleep(60)  # the hang guard: only the cutoff ends it sooner
        except asyncio.CancelledError:
            _stragglers["cancelled"].append(task_id)
            raise
        _stragglers["finished"].append(task_id)
    reply = await _answer(ctx)
    await ctx.call_tool("answer", {"letter": reply.text or ""})
    return AgentResult(final_message=reply.text)


@pytest.mark.slow
def test_a_straggler_cutoff_cancels_the_slow_members_and_the_step_goes_on(site: Path, capsys: Any) -> None:
    harness(SLOW_LAST)(_slow_last)
    _started_by_task.clear()
    _stragglers["cancelled"].clear()
    _stragglers["finished"].clear()
    argv = _bandit(
        site,
        "train.max_training_steps=2",
        "train.max_staleness=0",  # no prefetch: each step's groups start together, one straggler in each
        "train.workflow_config.straggler_timeout_seconds=1",
        f"environments=[{{env: platoon-bandit, harness: {SLOW_LAST}}}]",
    )
    assert main(argv) == 0, capsys.readouterr().err
    # every group (four distinct tasks) had its straggler cancelled by the cutoff; none slept its minute out
    assert len(set(_stragglers["cancelled"])) == 4 and _stragglers["finished"] == []
    steps = _steps(site / "bandit" / "run")
    assert [row["step"] for row in steps] == [1, 2]
    for row in steps:
        assert row["train/straggler_cancelled"] == 2.0  # one per group, two groups a step
        assert row["train/batch/outcome/none"] == 2.0  # a cancelled member is a missing one, never a 0
        assert row["train/batch/outcome/scored"] == 6.0


LABELLED = "test-pipeline-labelled"
_in_flight: dict[str, int] = {}
_most: dict[str, int] = {}


@harness(LABELLED)
async def _labelled(ctx: Any) -> AgentResult:
    """The bandit's answer, counting how many rollouts of its entry (option `label`) run at once."""
    label = str(ctx.options["label"])
    _in_flight[label] = _in_flight.get(label, 0) + 1
    _most[label] = max(_most.get(label, 0), _in_flight[label])
    try:
        await asyncio.sleep(0.3)
        reply = await _answer(ctx)
        await ctx.call_tool("answer", {"letter": reply.text or ""})
        return AgentResult(final_message=reply.text)
    finally:
        _in_flight[label] -= 1


@pytest.mark.slow
def test_rollout_group_limits_cap_the_groups_of_a_label_in_flight(site: Path, capsys: Any) -> None:
    harness(LABELLED)(_labelled)
    _in_flight.clear()
    _most.clear()
    entries = (
        f"[{{name: capped, env: platoon-bandit, harness: {LABELLED}, harness_options: {{label: capped}}}}, "
        f"{{name: free, env: platoon-bandit, harness: {LABELLED}, harness_options: {{label: free}}}}]"
    )
    argv = _bandit(
        site,
        "train.batch_size=4",
        "train.max_training_steps=2",
        f"environments={entries}",
        "train.rollout_group_limits={capped: 1}",
    )
    assert main(argv) == 0, capsys.readouterr().err
    group = 4
    assert _most["capped"] <= group  # one group of `capped` at a time
    assert _most["free"] > group  # the other label was never held back behind it
    # steps consume groups as they finish (the capped label's come later), but the run trains every one of them
    steps = _steps(site / "bandit" / "run")
    assert sum(row.get("train/batch/environment/capped/groups", 0.0) for row in steps) == 4.0
    assert sum(row.get("train/batch/environment/free/groups", 0.0) for row in steps) == 4.0


# ---------------------------------------------------------------------------------------------------------------
# The watchdog and supervised restarts (child processes)

CHILD_HARNESSES = textwrap.dedent(
    '''
    """Harnesses the child starts of these tests import by name."""
    import os
    import time
    from pathlib import Path

    from platoon.harness.agent import AgentResult
    from platoon.harness.function import harness


    @harness("test-blocks-the-loop")
    async def blocks_the_loop(ctx):
        Path(os.environ["BLOCKED_MARKER"]).write_text("blocked")
        time.sleep(3600)  # a synchronous call that never returns: no heartbeat can run
        return AgentResult(final_message="")


    @harness("test-crashes-once")
    async def crashes_once(ctx):
        marker = Path(os.environ["CRASH_MARKER"])
        if not marker.exists():
            marker.write_text("crashed")
            os._exit(3)  # the trainer process dies in the middle of a step
        reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=1)
        await ctx.call_tool("answer", {"letter": reply.text or ""})
        return AgentResult(final_message=reply.text)
    '''
)


@pytest.fixture
def child_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "child_harnesses.py").write_text(CHILD_HARNESSES)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    env["CRASH_MARKER"] = str(tmp_path / "crashed")
    env["BLOCKED_MARKER"] = str(tmp_path / "blocked")
    return env


@pytest.mark.slow
def test_the_watchdog_ends_a_run_whose_event_loop_is_stuck(
    site: Path, tmp_path: Path, child_env: dict[str, str]
) -> None:
    argv = _bandit(
        site,
        "train.max_training_steps=2",
        "watchdog.timeout_seconds=10",
        "watchdog.exit_code=5",
        "environments=[{env: platoon-bandit, harness: 'child_harnesses:blocks_the_loop'}]",
    )
    # the harness blocks for an hour: only the watchdog can end the run (the timeout is a hang guard)
    done = subprocess.run(
        [sys.executable, "-m", "platoon", *argv], env=child_env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 5, done.stderr[-2000:]
    assert (tmp_path / "blocked").exists()  # the run was inside the blocking call when the watchdog ended it
    assert "watchdog: no progress for" in done.stderr


@pytest.mark.slow
def test_a_supervised_run_that_crashes_once_restarts_from_its_checkpoint_and_finishes(
    site: Path, child_env: dict[str, str]
) -> None:
    argv = _bandit(
        site,
        "train.max_training_steps=2",
        "watchdog.max_restarts=1",
        "environments=[{env: platoon-bandit, harness: 'child_harnesses:crashes_once'}]",
    )
    done = subprocess.run(
        [sys.executable, "-m", "platoon", *argv], env=child_env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "training exited with 3; starting again" in done.stderr
    run = site / "bandit" / "run"
    launches = [row for row in _rows(run / "checkpoints.jsonl") if row["kind"] == "launch"]
    assert len(launches) == 2  # the crashed start and the one that finished
    assert [row["step"] for row in _steps(run)] == [1, 2]
    assert _rows(run / "checkpoints.jsonl")[-1]["name"] == "final"
    assert not (run / "process.json").exists()


# ---------------------------------------------------------------------------------------------------------------
# W&B


@pytest.mark.slow
def test_wandb_offline_logs_every_step_and_a_resume_continues_the_same_run(site: Path, capsys: Any) -> None:
    argv = _bandit(site, "train.max_training_steps=2", "stats.wandb.mode=offline")
    assert main(argv) == 0, capsys.readouterr().err
    run = site / "bandit" / "run"
    offline = sorted((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    ids = {row["wandb_run_id"] for row in _rows(run / "checkpoints.jsonl")}
    assert len(ids) == 1 and offline[0].name.endswith(next(iter(ids)))
    assert main(_bandit(site, "train.max_training_steps=3", "stats.wandb.mode=offline")) == 0
    resumed = {row["wandb_run_id"] for row in _rows(run / "checkpoints.jsonl")}
    assert resumed == ids  # the resumed start logged into the run its checkpoints name


def test_wandb_online_without_a_key_is_one_line_and_78_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc of the developer's
    assert main(["train", str(BANDIT), f"log_path={tmp_path / 'logs'}", "stats.wandb.mode=online"]) == 78
    lines = [line for line in capsys.readouterr().err.splitlines() if "site profile" not in line]
    assert lines == [
        "platoon: stats.wandb.mode is online but no W&B key is set: set WANDB_API_KEY (or stats.wandb.api_key, or "
        "run wandb login), or set stats.wandb.mode to offline or disabled"
    ]
    assert not (tmp_path / "logs").exists()


# ---------------------------------------------------------------------------------------------------------------
# Hold-out identity

HOLDOUT_SERVICE = textwrap.dedent(
    '''
    """A task table that holds tasks out of training (`holdout`: ids) and keeps a split record, as Harbor does."""
    from platoon.envs.service import Outcome
    from platoon.envs.table import TaskTableService
    from platoon.harness.agent import AgentResult
    from platoon.harness.function import harness


    @harness("test-holdout-answer")
    async def answer(ctx):
        reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=1)
        return AgentResult(final_message=reply.text)


    async def graded(ep):
        """The episode program: a table cannot grade, so the answer C scores 1 here (a run trains nothing, and
        fails, when no rollout is ever graded)."""
        result = await ep.run()
        return Outcome("scored", rewards={"reward": 1.0 if (result.final_message or "").strip() == "C" else 0.0})


    class HoldoutTable(TaskTableService):
        def __init__(self, rows, *, holdout=(), **kwargs):
            super().__init__(rows, **kwargs)
            self.holdout = [str(task_id) for task_id in holdout]

        async def list_splits(self):
            return ["train", "eval"]

        async def list_tasks(self, split):
            every = await super().list_tasks("train")
            held = [t for t in every if t in self.holdout]
            return held if split == "eval" else [t for t in every if t not in self.holdout]

        def split_record(self):
            return {"holdout_rule": "ids", "held_out": list(self.holdout), "eval": list(self.holdout)}
    '''
)


@pytest.mark.slow
def test_identity_records_the_hold_out_and_a_resume_that_changes_it_is_refused(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    (tmp_path / "holdout_table.py").write_text(HOLDOUT_SERVICE)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = "[{id: a, goal: 'Answer with the letter C'}, {id: b, goal: 'Answer with the letter C'}, {id: c, goal: 'Answer with the letter C'}]"

    def argv(holdout: str) -> list[str]:
        entry = (
            f"[{{service: 'holdout_table:HoldoutTable', service_kwargs: {{rows: {rows}, holdout: {holdout}}}, "
            "harness: 'holdout_table:answer', program: 'holdout_table:graded', exclude_tasks: [c]}]"
        )
        return _bandit(site, "train.batch_size=1", "train.max_training_steps=1", f"environments={entry}")

    assert main(argv("[a]")) == 0, capsys.readouterr().err
    run = site / "bandit" / "run"
    identity = json.loads((run / "identity.json").read_text())
    assert identity["environments"] == {"default": {"holdout_rule": "ids", "held_out": ["a"], "eval": ["a"]}}
    excluded = json.loads((run / "lock.json").read_text())["excluded_tasks"]
    assert excluded == {"default": {"train": {"listed": 2, "excluded": ["c"]}}}
    capsys.readouterr()
    # releasing `a` into training and holding `b` out instead: both refused, before any service
    assert main([*argv("[b]"), "train.max_training_steps=2"]) == 78
    err = capsys.readouterr().err
    assert "environments[default]: 1 task(s) the run held out would now train (a)" in err
    assert "environments[default]: 1 task(s) are newly held out (b)" in err
    assert json.loads((run / "lock.json").read_text())["resume_refused"]["problems"]


# ---------------------------------------------------------------------------------------------------------------
# Rollout workers


@pytest.mark.slow
def test_process_isolation_trains_from_rollouts_in_forked_workers(site: Path, capsys: Any) -> None:
    argv = _bandit(
        site,
        "train.max_training_steps=2",
        "train.workflow_config.rollout_isolation=process",
        "eval.every=1",
        "environments.0.eval_dataset_kwargs={limit: 1}",
    )
    assert main(argv) == 0, capsys.readouterr().err
    run = site / "bandit" / "run"
    steps = _steps(run)
    assert [row["step"] for row in steps] == [1, 2]
    for row in steps:
        assert row["train/batch/outcome/scored"] == 8.0  # every member came back from its worker, graded
        assert row["train/rollout_worker_crashed"] == 0.0 and row["train/rollout_worker_hard_timeout"] == 0.0
        assert row["train/rollout_worker_wall_seconds"] > 0.0  # measured (how long is the machine's business)
        assert row["train/datums/calls"] == 8.0  # the exact sampled tokens crossed the process boundary
    assert [row["step"] for row in _rows(run / "evaluations.jsonl")] == [1, 2]
    eval_logs = list((run / "rollouts" / "eval").glob("*/workers/*"))
    assert eval_logs, "evaluation rollouts run in workers too"
    logs = list((run / "rollouts" / "train").glob("*/workers/*"))
    assert logs, "each worker leaves its log under rollouts/train/<version>/workers"
    # The viewer's events: one file per policy version (written by the trainer from the workers' outcomes), every
    # rollout in it whole and splittable by its collection id; one file per evaluated step beside its rollouts.
    files = sorted((run / "rollouts" / "train").glob("*/events/*"))
    assert [f.name for f in files] == [f"events_train_{f.parent.parent.name}.jsonl" for f in files]
    rollouts = by_collection(read_events(files))
    assert len(rollouts) == 2 * 8  # two steps of 2 tasks x 4 members
    for records in rollouts.values():
        assert records[0]["type"] == "trajectory_created" and records[-1]["type"] == "trajectory_finished"
    for step in (1, 2):
        where = run / "rollouts" / "eval" / f"step_{step}"
        assert [f.name for f in (where / "events").iterdir()] == [f"events_eval_{step}.jsonl"]
        written = {
            json.loads(path.read_text())["id"]
            for path in where.glob("*/rollout_*/trajectory_collection.json")
        }
        assert set(by_collection(read_events(where / "events"))) == written and written


# ---------------------------------------------------------------------------------------------------------------
# Prefetch and max_staleness

COUNTING = "test-pipeline-counting"
PER_BATCH = 2 * 4  # rollouts a batch: batch_size groups of group_size
_started_at: list[int] = []
_task_ids: list[str] = []
_next_batch_started: list[asyncio.Event] = []


@harness(COUNTING)
async def _counting(ctx: Any) -> AgentResult:
    """The bandit's answer; records how many steps the run had logged when this rollout started.

    With the option `hold`, the first batch cannot finish before the next one starts: a first-batch rollout of
    any task but the first one seen waits until a rollout past the first batch has started (at most a minute, a
    hang guard). Only a feeder that runs ahead of training lets the group worker freed by the first task's group
    start the next batch meanwhile."""
    metrics = Path(str(ctx.options["metrics"]))
    _started_at.append(len(_steps(metrics.parent)) if metrics.exists() else 0)
    started = len(_started_at)
    task_id = str(ctx.task.id)
    _task_ids.append(task_id)
    if started > PER_BATCH:
        _next_batch_started[0].set()
    elif ctx.options.get("hold") and task_id != _task_ids[0]:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_next_batch_started[0].wait(), 60)
    reply = await _answer(ctx)
    await ctx.call_tool("answer", {"letter": reply.text or ""})
    return AgentResult(final_message=reply.text)


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [None, 0])
def test_the_feeder_runs_ahead_of_training_unless_max_staleness_brakes_it(
    site: Path, capsys: Any, staleness: int | None
) -> None:
    harness(COUNTING)(_counting)
    _started_at.clear()
    _task_ids.clear()
    _next_batch_started[:] = [asyncio.Event()]
    metrics = site / "bandit" / "run" / "metrics.jsonl"
    hold = "true" if staleness is None else "false"  # held, an on-policy run would wait out the hang guard
    options = f"{{metrics: '{metrics}', hold: {hold}}}"
    entry = f"[{{env: platoon-bandit, harness: {COUNTING}, harness_options: {options}}}]"
    extra = [] if staleness is None else [f"train.max_staleness={staleness}"]
    assert main(_bandit(site, "train.max_training_steps=3", f"environments={entry}", *extra)) == 0
    assert len(_started_at) >= 3 * PER_BATCH
    if staleness == 0:
        # batch i's rollouts start only once step i-1 is logged: strictly on-policy
        assert _started_at[: 3 * PER_BATCH] == [n // PER_BATCH for n in range(3 * PER_BATCH)]
    else:
        # the next batch's first rollout started while the first batch was still in flight, before step 1
        assert _started_at[PER_BATCH] == 0
    assert [row["step"] for row in _steps(site / "bandit" / "run")] == [1, 2, 3]


# ---------------------------------------------------------------------------------------------------------------
# Pieces


def test_the_admission_queue_is_fifo_and_caps_labels_without_blocking_others() -> None:
    from platoon.train.tinker.admission import AdmissionQueue, Row

    async def scenario() -> list[str]:
        queue = AdmissionQueue(4, {"a": 1})
        for task, label in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b")):
            await queue.put(Row(0, task, "pool", label))
        taken = [await queue.take(), await queue.take(), await queue.take()]
        # a2 waits behind its label's cap; b1 and b2 went past it
        assert [row.task_id for row in taken if row] == ["a1", "b1", "b2"]
        assert queue.in_flight("a") == 1
        waiting = asyncio.ensure_future(queue.take())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await queue.release(taken[0])  # a1's group finished: a2 may go
        second = await waiting
        await queue.close()
        assert await queue.take() is None  # closed and drained
        return [row.task_id for row in [*taken, second] if row]

    assert asyncio.run(scenario()) == ["a1", "b1", "b2", "a2"]


def test_straggler_cutoffs_come_from_the_label_else_the_globals() -> None:
    from platoon.config.training import WorkflowConfig
    from platoon.train.tinker.workflows import GroupRolloutWorkflow, StragglerCutoff

    workflow = GroupRolloutWorkflow(
        WorkflowConfig.model_validate(
            {
                "group_size": 8,
                "straggler_timeout_seconds": 30,
                "straggler_policies": {
                    "slow": {"timeout_seconds": 300, "quorum": 4},
                    "patient": {"timeout_seconds": None},
                },
            }
        )
    )
    assert workflow.straggler_cutoff("slow") == StragglerCutoff(300, 4)
    assert workflow.straggler_cutoff("patient") is None  # null: this label waits for every member
    assert workflow.straggler_cutoff("other") == StragglerCutoff(30, 7)  # quorum default group_size - 1
    assert workflow.straggler_cutoff(None) == StragglerCutoff(30, 7)
    assert GroupRolloutWorkflow(WorkflowConfig()).straggler_cutoff("any") is None


FIRST_GROUP_SLOW = "test-pipeline-first-group-slow"
_rollouts_started: list[int] = [0]


@harness(FIRST_GROUP_SLOW)
async def _first_group_slow(ctx: Any) -> AgentResult:
    """The bandit's answer; the first group's two rollouts take 5 s, every later one is immediate."""
    _rollouts_started[0] += 1
    if _rollouts_started[0] <= 2:
        await asyncio.sleep(5)
    reply = await _answer(ctx)
    await ctx.call_tool("answer", {"letter": reply.text or ""})
    return AgentResult(final_message=reply.text)


@pytest.mark.slow
def test_a_group_staler_than_max_staleness_is_dropped_whole(site: Path, capsys: Any) -> None:
    import itertools

    from platoon.testing import serve_policy

    harness(FIRST_GROUP_SLOW)(_first_group_slow)
    _rollouts_started[0] = 0
    answers = itertools.cycle(["C", "A"])
    argv = _bandit(
        site,
        "train.batch_size=1",
        "train.workflow_config.group_size=2",
        "train.max_concurrent_rollouts=4",  # two group workers: the others go past the slow first group
        "train.max_staleness=1",
        "train.max_training_steps=4",
        f"environments=[{{env: platoon-bandit, harness: {FIRST_GROUP_SLOW}}}]",
    )
    # a scripted policy answering C and A by turns: the two members of a group differ, so every step updates
    with serve_policy(lambda prompt: next(answers)):
        assert main(argv) == 0, capsys.readouterr().err
    steps = _steps(site / "bandit" / "run")
    assert [row["step"] for row in steps] == [1, 2, 3, 4]
    # the slow group sampled version 0 and arrived after three updates: dropped whole, its rollouts counted
    assert sum(row["train/batch/stale_groups"] for row in steps) == 1.0
    assert sum(row["train/stale_rollouts"] for row in steps) == 2.0
    assert sum(row["train/batch/groups_dequeued"] for row in steps) == 4.0


@pytest.mark.slow
def test_an_evaluation_of_tasks_training_draws_from_is_warned_about(site: Path, capsys: Any) -> None:
    argv = _bandit(
        site,
        "train.max_training_steps=1",
        "eval.every=1",
        "environments.0.eval_dataset_kwargs={split_name: train, limit: 1}",
    )
    assert main(argv) == 0
    assert "platoon: environments[default]: the evaluation lists 1 task(s) that training draws from" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_under_the_console_script_training_rolls_out_on_a_frozen_heap(
    site: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`platoon train` freezes what its start loaded (the SDK, the tokenizer, the renderer) before the first
    rollout (platoon.heap): full collections during training walk only what training makes."""
    import gc

    from platoon.testing import serve_policy

    frozen_while_sampling: list[int] = []

    def policy(prompt: str) -> str:
        frozen_while_sampling.append(gc.get_freeze_count())
        return "C"

    monkeypatch.setattr("sys.argv", ["platoon", *_bandit(site, "train.max_training_steps=1")])
    gc.unfreeze()
    try:
        with serve_policy(policy):
            assert main() == 0, capsys.readouterr().err
    finally:
        gc.unfreeze()
    # the loaded stack is hundreds of thousands of objects (a few hundred sit frozen without platoon's doing)
    assert len(frozen_while_sampling) == 8 and min(frozen_while_sampling) > 10_000
