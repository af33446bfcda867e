"""The tasks an evaluation rolls out: each entry's listing of the chosen split, with the
listing keys of that phase (`dataset_kwargs` for `train`, `eval_dataset_kwargs` for any other split), its
`exclude_tasks` recorded for `lock.json`, and the services that listed them (the rollouts reuse them).

Split names: `train` lists the service's `train` split (or `dataset_kwargs.split_name`); `eval` lists
`eval_dataset_kwargs.split_name`, else the service's eval split (the first of eval/val/validation/test it has,
else its only split other than train); any other name lists that split of the service.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.envs.resolve import entry_service_kwargs, resolve_service
from platoon.envs.service import task_check_refusals, unknown_split
from platoon.errors import ConfigError

if TYPE_CHECKING:
    from platoon.config.environments import EnvironmentConfig
    from platoon.task import Task

__all__ = ["DEFAULT_LABEL", "EvalTask", "Listing", "entries_by_label", "list_tasks", "resolve_task"]

DEFAULT_LABEL = "default"
ID_SEPARATOR = "::"
EVAL_SPLIT_NAMES = ("eval", "val", "validation", "test")
#: task lookups in flight at once (remote services)
_LOOKUPS = 32


@dataclass(frozen=True)
class EvalTask:
    """One task to roll out: its entry label, the run's id (`<name>::<id>` in a mixture) and the task."""

    label: str
    task_id: str
    task: Task


@dataclass
class Listing:
    """What listing found: the tasks in order, `excluded_tasks` for the lock, the services by label."""

    tasks: list[EvalTask] = field(default_factory=list)
    excluded: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    services: dict[str, Any] = field(default_factory=dict)


def entries_by_label(config: Any) -> dict[str, tuple[int, EnvironmentConfig]]:
    """label -> (index, entry): a single entry is `default`, a mixture's entries go by their names."""
    entries = list(config.environments or [])
    if len(entries) == 1:
        return {DEFAULT_LABEL: (0, entries[0])}
    return {str(entry.name): (index, entry) for index, entry in enumerate(entries)}


def service_kwargs(entry: EnvironmentConfig, base_dir: Path) -> dict[str, Any]:
    """The entry's service kwargs, relative input paths against `base_dir` (the loader made a file's absolute)."""
    return entry_service_kwargs(entry, base_dir)


def build_service(entry: EnvironmentConfig, base_dir: Path) -> Any:
    if entry.package:
        importlib.import_module(entry.package)
    return resolve_service(entry.service, service_kwargs(entry, base_dir))


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _listing_keys(entry: EnvironmentConfig, split: str) -> tuple[str, Mapping[str, Any]]:
    if split == "train":
        return "dataset_kwargs", entry.dataset_kwargs
    return "eval_dataset_kwargs", entry.eval_dataset_kwargs


async def _split_names(entry: EnvironmentConfig, split: str, service: Any, where: str) -> list[str]:
    key, listing = _listing_keys(entry, split)
    value = listing.get("split_name")
    if split not in ("train", "eval"):
        return [split]  # a named split is listed as named
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return list(dict.fromkeys(value))
    if value is not None:
        raise ConfigError(f"{where}.{key}.split_name: a split name or a list of split names")
    if split == "train":
        return ["train"]
    ask = getattr(service, "list_splits", None)
    splits = [str(s) for s in await _maybe_await(ask())] if ask is not None else []
    for name in EVAL_SPLIT_NAMES:
        if name in splits:
            return [name]
    others = [s for s in splits if s != "train"]
    if len(others) == 1:
        return others
    raise ConfigError(
        f"{where}: the service names no eval split (splits: {', '.join(splits) or 'none'}): set "
        "eval_dataset_kwargs.split_name, or name the split with split=..."
    )


async def _list_entry(
    label: str,
    index: int,
    entry: EnvironmentConfig,
    service: Any,
    split: str,
    mixture: bool,
    listing: Listing,
) -> None:
    where = f"environments.{index}"
    key, keys = _listing_keys(entry, split)
    seed, limit = keys.get("shuffle_seed"), keys.get("limit")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"{where}.{key}.shuffle_seed: {seed!r} is not an int")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigError(f"{where}.{key}.limit: {limit!r} is not a non-negative int")
    splits = await _split_names(entry, split, service, where)
    listed: list[tuple[str, str]] = []
    names: dict[str, str] = {}
    seen: set[str] = set()
    for name in splits:
        if (problem := await unknown_split(service, name)) is not None:
            raise ConfigError(
                f"{where}.{key}.split_name: {problem}" if name != split else f"{where}: {problem}"
            )
        ids = [str(t) for t in await service.list_tasks(name)]
        ask = getattr(service, "list_task_names", None)
        if ask is not None:
            names.update({str(k): str(v) for k, v in dict(await _maybe_await(ask(name)) or {}).items()})
        for task_id in ids:
            if task_id not in seen:
                seen.add(task_id)
                listed.append((name, task_id))
    if seed is not None:
        random.Random(seed).shuffle(listed)
    excluded_items = set(entry.exclude_tasks)
    excluded = {t for _, t in listed if t in excluded_items or names.get(t) in excluded_items}
    listing.excluded[label] = {
        name: {
            "listed": sum(1 for s, _ in listed if s == name),
            "excluded": [t for s, t in listed if s == name and t in excluded],
        }
        for name in splits
    }
    selected = [(name, t) for name, t in listed if t not in excluded]
    if limit is not None:
        selected = selected[:limit]
    refusals = await task_check_refusals(service, selected)
    if refusals:
        raise ConfigError([f"{where}: {refusal}" for refusal in refusals])
    kept = [t for _, t in selected]
    gate = asyncio.Semaphore(_LOOKUPS)

    async def fetch(raw: str) -> EvalTask:
        async with gate:
            task: Task = await service.get_task(raw)
        return EvalTask(label, f"{entry.name}{ID_SEPARATOR}{raw}" if mixture else raw, task)

    listing.tasks += await asyncio.gather(*(fetch(raw) for raw in kept))


async def list_tasks(config: Any, *, split: str, base_dir: str | Path) -> Listing:
    """Every selected task of `split`, entries in config order; ConfigError with each entry's problem."""
    entries = entries_by_label(config)
    if not entries:
        raise ConfigError("environments: Config must define at least one environment in `environments`")
    listing = Listing()
    problems: list[str] = []
    for label, (index, entry) in entries.items():
        if entry.service is None:
            problems.append(f"environments.{index}: no service to list tasks from: set service")
            continue
        try:
            service = build_service(entry, Path(base_dir))
            listing.services[label] = service
            await _list_entry(label, index, entry, service, split, len(entries) > 1, listing)
        except ConfigError as exc:
            problems += exc.problems
        except Exception as exc:  # the user's service: a failure to list it is one problem line
            problems.append(
                f"environments.{index}: listing split {split!r} failed: {type(exc).__name__}: {exc}"
            )
    if problems:
        raise ConfigError(problems)
    return listing


async def resolve_task(
    config: Any, task_id: str, *, base_dir: str | Path, split: str = "train"
) -> tuple[EvalTask, Any]:
    """The task `platoon rollout --task` names (`ENVIRONMENT::TASK_ID` in a mixture, of `split`) and its entry's
    service, once the service's run-start checks accept it."""
    entries = entries_by_label(config)
    if not entries:
        raise ConfigError("environments: Config must define at least one environment in `environments`")
    if len(entries) > 1:
        name, sep, raw = task_id.partition(ID_SEPARATOR)
        if not sep or name not in entries:
            raise ConfigError(
                f"--task {task_id!r}: a mixture's tasks are ENVIRONMENT::TASK_ID, with ENVIRONMENT one of "
                + ", ".join(sorted(entries))
            )
        label = name
    else:
        label, raw = DEFAULT_LABEL, task_id
    index, entry = entries[label]
    if entry.service is None:
        raise ConfigError(f"environments.{index}: no service to find task {raw!r} in: set service")
    try:
        service = build_service(entry, Path(base_dir))
    except Exception as exc:  # the user's service: one line
        raise ConfigError(f"environments.{index}.service: {type(exc).__name__}: {exc}") from None
    try:
        task = await service.get_task(raw)
    except Exception as exc:  # an unknown id, as the service words it
        raise ConfigError(
            f"--task {task_id!r}: environments[{label}] has no such task ({type(exc).__name__}: {exc})"
        ) from None
    refusals = await task_check_refusals(service, [(split, raw)])
    if refusals:
        raise ConfigError(f"--task {task_id!r}: environments[{label}] refuses it: {refusals[0]}")
    return EvalTask(label, task_id, task), service
