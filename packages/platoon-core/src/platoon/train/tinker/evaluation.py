"""Evaluation during training: which steps are due, the eval split's tasks, and one evaluation of a
sampler's policy — rollouts of every eval task through the entry's eval route, trajectories under
`rollouts/eval/step_<n>/`, a row in `evaluations.jsonl` and the `eval/...` metrics.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import random
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.envs.resolve import entry_service_kwargs, resolve_service
from platoon.envs.service import task_check_refusals, unknown_split
from platoon.episode.rollout import process_rewards
from platoon.errors import ConfigError
from platoon.gateway.core import ModelGateway
from platoon.rollouts.one_rollout import MemberRequest, run_member
from platoon.rollouts.records import append_jsonl, read_jsonl
from platoon.train.tinker.advantages import is_interrupted
from platoon.train.tinker.task_order import DEFAULT_LABEL
from platoon.trajectory_events import append_events, scope_event_file

if TYPE_CHECKING:
    from platoon.config.environments import EnvironmentConfig
    from platoon.task import Task
    from platoon.trajectory import TrajectoryCollection

__all__ = [
    "EVALUATIONS_FILE",
    "eval_due",
    "evaluate",
    "evaluated_steps",
    "final_evaluation_due",
    "list_eval_tasks",
    "record_evaluation",
]

log = logging.getLogger("platoon.train.eval")

EVALUATIONS_FILE = "evaluations.jsonl"
#: the outcome statuses always counted (zeros included) under eval/outcome/
STATUSES = ("scored", "failed", "error", "interrupted", "timeout", "cancelled")
#: a rollout whose task reward reaches this counts as a success (the evaluation config's default threshold)
SUCCESS_THRESHOLD = 1.0
#: split names taken as a service's eval split, in order of preference, when an entry names none
EVAL_SPLIT_NAMES = ("eval", "val", "validation", "test")
_TASK_LOOKUPS = 32
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


# ---------------------------------------------------------------------------------------------------------------
# When


def eval_due(step: int, *, every: int, at_start: bool, done: set[int] | frozenset[int]) -> bool:
    """Whether training step `step` (0 = the starting policy) is evaluated: `every >= 1`, not already in `done`
    (a resume never evaluates a step twice), and step 0 only with `at_start`, any other step when `every` divides it.
    """
    if every < 1 or step < 0 or step in done:
        return False
    if step == 0:
        return at_start
    return step % every == 0


def final_evaluation_due(
    config: Any, run_dir: str | os.PathLike[str], end_step: int, *, has_tasks: bool
) -> bool:
    """Whether a run that reached its last step still owes that step's evaluation: the start that trained it was
    stopped (killed, or the machine lost) after the final checkpoint and before the evaluation's row."""
    return has_tasks and eval_due(
        end_step, every=config.eval.every or 0, at_start=config.eval.at_start, done=evaluated_steps(run_dir)
    )


def evaluated_steps(run_dir: str | os.PathLike[str]) -> set[int]:
    """The steps `evaluations.jsonl` lists as evaluated; unparsable lines (a cut-off last line) are ignored."""
    steps: set[int] = set()
    for row in read_jsonl(Path(run_dir) / EVALUATIONS_FILE):
        step = row.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            steps.add(step)
    return steps


def record_evaluation(
    run_dir: str | os.PathLike[str], *, step: int, logged_at: int, tasks: int, seconds: float
) -> dict[str, Any]:
    """Append one completed evaluation to `evaluations.jsonl` (`{step, logged_at, tasks, seconds, time}`)."""
    row = {
        "step": step,
        "logged_at": logged_at,
        "tasks": tasks,
        "seconds": round(seconds, 1),
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    append_jsonl(Path(run_dir) / EVALUATIONS_FILE, row)
    return row


# ---------------------------------------------------------------------------------------------------------------
# What: the eval split of each entry


def _entries(config: Any) -> dict[str, tuple[int, EnvironmentConfig]]:
    """label -> (index, entry): a mixture labels by entry name, a single entry is `default` (as training does)."""
    entries = list(config.environments or [])
    if len(entries) == 1:
        return {DEFAULT_LABEL: (0, entries[0])}
    return {str(entry.name): (index, entry) for index, entry in enumerate(entries)}


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _eval_splits(entry: EnvironmentConfig, service: Any, where: str) -> list[str]:
    """The entry's `eval_dataset_kwargs.split_name`, else the service's eval split (the first of
    EVAL_SPLIT_NAMES it lists, else its only non-train split); [] when it has none."""
    value = entry.eval_dataset_kwargs.get("split_name")
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return list(dict.fromkeys(value))
    if value is not None:
        raise ConfigError([f"{where}.eval_dataset_kwargs.split_name: a split name or a list of split names"])
    ask = getattr(service, "list_splits", None)
    splits = [str(s) for s in await _maybe_await(ask())] if ask is not None else []
    for name in EVAL_SPLIT_NAMES:
        if name in splits:
            return [name]
    others = [s for s in splits if s != "train"]
    # Several candidates and none named like an eval split: guessing would evaluate on the wrong tasks.
    return others if len(others) == 1 else []


async def _list_entry(
    label: str, index: int, entry: EnvironmentConfig, service: Any
) -> list[tuple[str, Task]]:
    where = f"environments.{index}"
    splits = await _eval_splits(entry, service, where)
    if not splits:
        log.info("environments[%s]: no eval split (set eval_dataset_kwargs.split_name): not evaluated", label)
        return []
    listing = entry.eval_dataset_kwargs
    ids: list[str] = []
    names: dict[str, str] = {}
    split_of: dict[str, str] = {}  # a task listed by several splits is checked with the first
    for split in splits:
        if (problem := await unknown_split(service, split)) is not None:
            raise ConfigError([f"{where}.eval_dataset_kwargs.split_name: {problem}"])
        listed = [str(t) for t in await service.list_tasks(split)]
        ids += listed
        for task_id in listed:
            split_of.setdefault(task_id, split)
        ask = getattr(service, "list_task_names", None)
        if ask is not None:
            names.update({str(k): str(v) for k, v in dict(await _maybe_await(ask(split)) or {}).items()})
    ids = list(dict.fromkeys(ids))  # each task once, in listing order
    seed = listing.get("shuffle_seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        random.Random(seed).shuffle(ids)
    # exclude_tasks takes ids or names; training's listing already refused items that name nothing.
    excluded = set(entry.exclude_tasks)
    ids = [t for t in ids if t not in excluded and names.get(t) not in excluded]
    limit = listing.get("limit")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
        ids = ids[:limit]
    refusals = await task_check_refusals(service, [(split_of[t], t) for t in ids])
    if refusals:
        raise ConfigError([f"{where}: {refusal}" for refusal in refusals])
    gate = asyncio.Semaphore(_TASK_LOOKUPS)  # remote services: a bounded number of lookups at once

    async def fetch(task_id: str) -> Task:
        async with gate:
            task: Task = await service.get_task(task_id)
            return task

    tasks = await asyncio.gather(*(fetch(t) for t in ids))
    return [(label, task) for task in tasks]


def _resolve(entry: EnvironmentConfig, base_dir: Path | None) -> Any:
    import importlib

    if entry.package:
        importlib.import_module(entry.package)
    kwargs = entry_service_kwargs(entry, base_dir) if base_dir is not None else dict(entry.service_kwargs)
    return resolve_service(entry.service, kwargs)


async def list_eval_tasks(
    config: Any,
    *,
    base_dir: str | os.PathLike[str],
    services: Mapping[str, Any] | None = None,
) -> list[tuple[str, Task]]:
    """The eval split's tasks as `(label, task)`, every selected task once, entries in config order.

    Each entry lists `eval_dataset_kwargs.split_name` (else the service's eval split, see `_eval_splits`), with
    its `shuffle_seed`, `exclude_tasks` and `limit`. `services` (label -> service, e.g. the trainer's) are reused;
    other entries' services are built from the config, relative paths against `base_dir`. Raises `ConfigError`
    with every entry's problem.
    """
    problems: list[str] = []
    found: list[tuple[str, Task]] = []
    for label, (index, entry) in _entries(config).items():
        if entry.service is None:
            problems.append(f"environments.{index}: no service to list eval tasks from: set service")
            continue
        try:
            service = (services or {}).get(label) or _resolve(entry, Path(base_dir))
            found += await _list_entry(label, index, entry, service)
        except ConfigError as exc:
            problems += exc.problems
        except Exception as exc:  # the user's service: any failure to list is one problem line
            problems.append(
                f"environments.{index}: listing the eval split failed: {type(exc).__name__}: {exc}"
            )
    if problems:
        raise ConfigError(problems)
    return found


# ---------------------------------------------------------------------------------------------------------------
# One evaluation


@dataclass
class _Result:
    """One eval rollout: its task (index into the task list), label, outcome status, task reward (None when
    untrainable or failed) and the exception text of a rollout that raised."""

    task: int
    label: str
    status: str
    reward: float | None
    seconds: float
    error: str | None = None


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text)


def _label_key(label: str) -> str:
    # Labels become one metric-path segment each.
    return label.replace("/", "--")


def _score(collection: TrajectoryCollection, reward_processor: str | None) -> tuple[str, float | None]:
    """(outcome status, task reward or None): an untrainable outcome's 0 is no score, so it is None."""
    root = collection.root
    if root is None:
        return "error", None
    outcome = root.misc.get("outcome")
    status = str(outcome.get("status", "error")) if isinstance(outcome, Mapping) else "scored"
    if status != "scored" or is_interrupted(root):
        return status, None
    ref = reward_processor or root.misc.get("reward_processor")
    if ref:
        scored = process_rewards(str(ref), collection).get(root.id)
        if scored is not None:
            return status, scored[0]
    return status, float(root.reward)


def _write(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def _append_events(
    collection: TrajectoryCollection, path: Path, task_id: str, context: Mapping[str, Any]
) -> None:
    """The viewer's copy of one rollout, appended to its evaluation's event file: a failure only warns."""
    try:
        append_events(collection, path, context=context)
    except OSError as exc:
        log.warning("writing the events of %s failed: %s", task_id, exc)


def _family(metrics: dict[str, float], prefix: str, values: Sequence[float]) -> None:
    metrics[f"{prefix}/count"] = float(len(values))
    if values:  # no scored rollout: no average, never a 0 standing in for failures
        metrics[f"{prefix}/avg"] = statistics.fmean(values)
        metrics[f"{prefix}/min"] = min(values)
        metrics[f"{prefix}/max"] = max(values)


def _summary(results: Sequence[_Result], prefix: str) -> dict[str, float]:
    rewards = [r.reward for r in results if r.reward is not None]
    metrics: dict[str, float] = {}
    _family(metrics, f"{prefix}/reward", rewards)
    if rewards:
        metrics[f"{prefix}/success_rate"] = sum(1 for r in rewards if r >= SUCCESS_THRESHOLD) / len(rewards)
    metrics[f"{prefix}/tasks"] = float(len({r.task for r in results}))
    metrics[f"{prefix}/rollouts"] = float(len(results))
    metrics[f"{prefix}/untrainable"] = float(len(results) - len(rewards))
    return metrics


def eval_metrics(
    results: Sequence[_Result], *, step: int, tasks: int, seconds: float, labels: Sequence[str]
) -> dict[str, float]:
    """The `eval/...` metrics of one evaluation (the names are listed in `evaluate`)."""
    metrics = _summary(results, "eval")
    statuses = [r.status for r in results]
    for status in STATUSES:
        metrics[f"eval/outcome/{status}"] = float(statuses.count(status))
    metrics["eval/rollout_errors"] = float(sum(1 for r in results if r.error is not None))
    _family(
        metrics, "eval/rollout_completion/task_reward", [r.reward for r in results if r.reward is not None]
    )
    for label in labels:
        mine = [r for r in results if r.label == label]
        key = _label_key(label)
        metrics.update(_summary(mine, f"eval/{key}"))
        # The per-label family, named like training's `train/batch/environment/<label>/...`.
        _family(
            metrics, f"eval/environment/{key}/task_reward", [r.reward for r in mine if r.reward is not None]
        )
    metrics["eval/time"] = seconds
    metrics["eval/num_tasks"] = float(tasks)
    metrics["eval/step"] = float(step)
    return metrics


async def evaluate(
    config: Any,
    *,
    step: int,
    sampler: Any,
    renderer: Any,
    run_dir: str | os.PathLike[str],
    tasks: Sequence[tuple[str, Task]],
    services: Mapping[str, Any] | None = None,
    logged_at: int | None = None,
    gateway: Any = None,
    workers: Any = None,
    service_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, float]:
    """Evaluate `sampler`'s policy (the policy of training step `step`) on `tasks` (from `list_eval_tasks`).

    Each task rolls out `eval.workflow_config.group_size` times through the trainer's member body with its entry's
    eval route (`eval_overrides.harness_options` over `harness_options`) and eval rollout config, at most
    `eval.max_concurrent_rollouts` at once, on a `ModelGateway` of its own over `sampler`. Each rollout's
    `trajectory_collection.json` and `metadata.json` go to `<run_dir>/rollouts/eval/step_<n>/<safe task
    id>/rollout_<i>/`; the `evaluations.jsonl` row is appended once all are done (`logged_at` defaults to `step`).
    `services` (label -> service, e.g. the trainer's) are reused, others built from the config. `gateway` (e.g. a
    served scripted policy's) replaces the one built over `sampler`. `workers` (the trainer's `RolloutWorkers` in
    process isolation, with the `service_kwargs` its entries were built with) runs each rollout in a worker.

    Returns, over scored rollouts only (untrainable outcomes and raised rollouts are counted, never scored 0):
    `eval/reward/{avg,min,max,count}`, `eval/success_rate` (reward >= 1), `eval/tasks`, `eval/rollouts`,
    `eval/untrainable`, `eval/outcome/<status>` (all six), `eval/rollout_errors`, per label the same under
    `eval/<label>/...` and `eval/environment/<label>/task_reward/...`, and
    `eval/rollout_completion/task_reward/...`, `eval/time`, `eval/num_tasks`, `eval/step`.
    """
    started = time.monotonic()
    entries = _entries(config)
    unknown = sorted({label for label, _ in tasks if label not in entries})
    if unknown:
        raise ValueError(f"eval tasks of labels the config has no entry for: {', '.join(unknown)}")
    built: dict[str, Any] = dict(services or {})
    for label in dict.fromkeys(label for label, _ in tasks):
        if label not in built:
            built[label] = _resolve(entries[label][1], None)
    workflow = config.eval.workflow_config
    group_size = int(workflow.group_size)
    rollout_config = workflow.rollout_config.model_copy(
        update={"model_name": config.train.model_name, "return_dict": True, "train": False}
    )
    if gateway is None:
        gateway = ModelGateway(
            sampler,
            renderer,
            model_name=config.train.model_name,
            context_window_length=config.train.context_window_length,
            sample_timeout_seconds=config.train.sample_timeout_seconds,
        )
    gate = asyncio.Semaphore(int(config.eval.max_concurrent_rollouts or 1))
    mixture = len(entries) > 1
    out = Path(run_dir) / "rollouts" / "eval" / f"step_{step}"
    events = scope_event_file(out, "eval", step)  # every rollout of this evaluation, one file

    async def one(index: int, label: str, task: Task, member: int) -> _Result:
        entry = entries[label][1]
        task_id = f"{label}::{task.id}" if mixture else str(task.id)
        where = out / _safe(task_id) / f"rollout_{member}"
        request = MemberRequest(
            task=task,
            task_id=task_id,
            label=label,
            entry=entry,
            split="eval",
            rollout_number=member,
            rollout_config=rollout_config,
            service_kwargs=dict((service_kwargs or {}).get(label, {})),
            output_dir=None,  # this evaluation writes the trajectory, its metadata and the step's event file
        )
        async with gate:
            if workers is not None:
                outcome = await workers.run(request, scope="eval")
            else:
                outcome = await run_member(
                    request, service=built[label], gateway=gateway, version=lambda: step
                )
        collection = outcome.collection if outcome.observed else None
        error = None if outcome.observed else (outcome.error or outcome.disposition)
        status, reward = (
            _score(collection, entry.reward_processor) if collection is not None else ("error", None)
        )
        seconds = outcome.seconds
        if outcome.collection is not None:
            context = {"scope": "eval", "training_step": step, "label": label if mixture else None}
            await asyncio.to_thread(_append_events, outcome.collection, events, task_id, context)
        if collection is not None:
            await asyncio.to_thread(_write, where / "trajectory_collection.json", collection.to_dict())
        metadata = {
            "task_id": task_id,
            "label": label,
            "rollout_index": member,
            "step": step,
            "wall_time_seconds": round(seconds, 3),
            "outcome_status": status,
            "reward": reward,
            "error": error,
            "status": "errored" if error is not None else "completed",
        }
        await asyncio.to_thread(_write, where / "metadata.json", metadata)
        return _Result(index, label, status, reward, seconds, error)

    results = list(
        await asyncio.gather(
            *(
                one(index, label, task, member)
                for index, (label, task) in enumerate(tasks)
                for member in range(group_size)
            )
        )
    )
    seconds = time.monotonic() - started
    record_evaluation(
        run_dir,
        step=step,
        logged_at=step if logged_at is None else logged_at,
        tasks=len(tasks),
        seconds=seconds,
    )
    labels = list(dict.fromkeys(label for label, _ in tasks))
    metrics = eval_metrics(results, step=step, tasks=len(tasks), seconds=seconds, labels=labels)
    average = metrics.get("eval/reward/avg")
    log.info(
        "eval at step %d: %s over %d scored of %d rollouts (%d tasks) in %.1f s",
        step,
        "no scored rollout" if average is None else f"reward {average:.3f}",
        int(metrics["eval/reward/count"]),
        len(results),
        len(tasks),
        seconds,
    )
    return metrics
