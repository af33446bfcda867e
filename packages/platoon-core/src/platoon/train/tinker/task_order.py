"""The training task order: which task fills each slot of each batch, epoch after epoch.

Every training task trains: the order is one endless stream of seeded shuffled passes; epoch `k` is items
`[k*E, (k+1)*E)` of it and batch `b` is items `[b*S, (b+1)*S)`, so a batch depends only on its number.

`auto` (a single entry, `train.task_order: auto`): pass `p` is NumPy `default_rng(seed + p*101).permutation(n)` of
the listing (what Hugging Face `Dataset.shuffle(seed=42 + p*101)` draws; the trainer's seed is 42); the epoch is
`floor(n / S) * S` tasks, and a batch larger than the tasks is refused.

`weighted` (a mixture, or `task_order: weighted`), the fair interleave: the non-empty pools are groups
`0..G-1` with shares `weight / sum(weights)` (`weight: tasks` = the pool's task count). For every slot of the
stream, each group's credit grows by its share; the group with the largest credit wins the slot, ties (within
1e-12 absolute of the largest) going to the first group met scanning from the group after the last winner (from
group 0 at the start); the winner's credit drops by 1. Credits carry over from epoch to epoch. The winner gives
its next task: group `i` draws passes over its listing, pass `p` shuffled by `random.Random(pool.seed + i*10007 +
p*101).shuffle`, so each of its tasks once per pass, and a pass left unfinished at an epoch's end goes on in the
next. The epoch is the task count rounded up to whole batches.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import inspect
import json
import logging
import math
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from platoon.envs import listing_cache
from platoon.envs.resolve import entry_service_kwargs, resolve_service
from platoon.envs.service import task_check_refusals, unknown_split
from platoon.errors import ConfigError

__all__ = [
    "AUTO_SEED",
    "DEFAULT_LABEL",
    "ORDER_STATE_KEY",
    "Pool",
    "TaskOrder",
    "draw_harness",
    "epoch_size",
    "label_text",
    "list_training_tasks",
    "plan_lines",
    "planned_steps",
    "split_task_id",
    "stale_listing",
    "training_problems_after_listing",
]

log = logging.getLogger(__name__)

#: the row field of `checkpoints.jsonl` holding the task order's position (`TaskOrder.state`)
ORDER_STATE_KEY = "task_order"

#: The label of a single entry's tasks (a mixture labels them with the entry names).
DEFAULT_LABEL = "default"
#: The seed of a single entry's `auto` order (Hugging Face `Dataset.shuffle(seed=42 + p*101)`).
AUTO_SEED = 42
PASS_SEED_STEP = 101
GROUP_SEED_STEP = 10007
TIE_TOLERANCE = 1e-12
#: A mixture entry whose per-task draw rate differs from another's by more than this gets a warning.
RATE_WARNING_RATIO = 4.0
#: The column a mixture row carries its entry name in, and the default label column.
ENVIRONMENT_COLUMN = "_platoon_environment"
ID_SEPARATOR = "::"
STATE_VERSION = 1

Mode = Literal["auto", "weighted"]
Weight = float | Literal["tasks"]


@dataclass(frozen=True)
class Pool:
    """The training tasks of one `environments` entry, as the order draws them.

    `label`: the entry name in a mixture, `default` for a single entry. `task_ids`: the run's ids (`<name>::<raw
    id>` in a mixture), in listing order. `seed`: the entry's `seed`. `labels`: each task's label when
    `train.label_by` names another column than the entry (None = the pool's label for all). `columns`: the columns
    the tasks have (for the `label_by` check). `excluded`: what `lock.json` records as `excluded_tasks` of this
    entry, `{split: {listed: N, excluded: [ids]}}`.
    """

    label: str
    weight: Weight
    task_ids: Sequence[str]
    seed: int = 0
    entry: int = 0
    labels: Mapping[str, str | None] | None = None
    columns: frozenset[str] = frozenset()
    excluded: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: the task listing cache's key when the listing came from the cache (`listing_cache`), else None
    cached: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # A tuple, so a pool cannot change under an order that already drew from it.
        object.__setattr__(self, "task_ids", tuple(self.task_ids))
        if self.weight != "tasks" and (
            isinstance(self.weight, bool)
            or not isinstance(self.weight, int | float)
            or not math.isfinite(self.weight)
            or self.weight <= 0
        ):
            raise ValueError(
                f"pool {self.label!r}: weight {self.weight!r} is not a positive finite number or 'tasks'"
            )

    @property
    def size(self) -> int:
        return len(self.task_ids)

    @property
    def weight_value(self) -> float:
        """The weight as a number: `tasks` is the task count."""
        return float(self.size) if self.weight == "tasks" else float(self.weight)

    def label_of(self, task_id: str) -> str | None:
        """The label a task carries: its `label_by` value, else the pool's label."""
        return self.labels.get(task_id) if self.labels is not None else self.label


def split_task_id(task_id: str) -> tuple[str | None, str]:
    """(entry name, raw id) of a run's task id: `name::raw` in a mixture, (None, id) for a single entry."""
    name, sep, raw = task_id.partition(ID_SEPARATOR)
    return (name, raw) if sep else (None, task_id)


def label_text(value: Any) -> str | None:
    """A column value as a label: strings as-is (empty = none), booleans `true`/`false`, numbers as
    Python prints them, anything else none."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value or None
    if isinstance(value, int | float):
        return str(value)
    return None


def draw_harness(harness: Mapping[str, float], *, seed: int, task_id: str) -> str:
    """The harness of a harness mixture that `task_id` (the raw id) rolls out with, the same every epoch.

    sha256 of `"<seed>:<task id>"`, its first 8 bytes big-endian over 2^64 times the total weight, walked down the
    alphabetically sorted names; the first that takes it below zero wins.
    """
    if not harness:
        raise ValueError("a harness mixture names at least one harness")
    digest = hashlib.sha256(f"{seed}:{task_id}".encode()).digest()
    point = int.from_bytes(digest[:8], "big") / 2**64 * sum(harness.values())
    names = sorted(harness)
    for name in names:
        point -= harness[name]
        if point < 0:
            return name
    return names[-1]  # float rounding can leave a sliver at the top end: it belongs to the last name


def epoch_size(total: int, batch_size: int, mode: Mode) -> int:
    """Tasks per epoch: `auto` keeps whole batches only (0 when the batch is larger); `weighted` rounds up."""
    if mode == "auto":
        return total // batch_size * batch_size
    return -(-total // batch_size) * batch_size


def _effective_mode(pools: Sequence[Pool], mode: str) -> Mode:
    if mode not in ("auto", "weighted"):
        raise ValueError(f"task order mode {mode!r} is not one of 'auto', 'weighted'")
    # Several entries always interleave by weight: `auto` only means the single entry's dataloader shuffle.
    return "weighted" if mode == "weighted" or len(pools) > 1 else "auto"


def _shares(groups: Sequence[Pool]) -> list[float]:
    kinds = {pool.weight == "tasks" for pool in groups}
    if len(kinds) > 1:
        raise ValueError("pool weights are all numbers or all 'tasks', not both")
    weights = [pool.weight_value for pool in groups]
    total = sum(weights)
    return [w / total for w in weights]


class TaskOrder:
    """The endless order of training tasks; `next_batch()` gives the next step's `(label, task_id)` pairs.

    `seed` seeds the `auto` order (pass `p` uses `seed + p*101`; the trainer passes 42); a weighted order seeds
    each group from its pool's `seed`. The rule is in the module docstring. `state()` and `restore()` carry the
    position across a restart; the order itself is a pure function of the pools, seeds, mode and batch size.
    """

    def __init__(
        self, pools: Sequence[Pool], *, seed: int = AUTO_SEED, batch_size: int, mode: Mode | str = "auto"
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
        self.pools: list[Pool] = list(pools)
        self.seed = seed
        self.batch_size = batch_size
        self.mode: Mode = _effective_mode(self.pools, mode)
        self.requested_mode = mode
        self._groups = [pool for pool in self.pools if pool.size]
        if not self._groups:
            raise ValueError("there are no training tasks to order")
        self.shares: list[float] = _shares(self._groups)
        self.total_tasks = sum(pool.size for pool in self._groups)
        self.epoch_size = epoch_size(self.total_tasks, batch_size, self.mode)
        if self.epoch_size == 0:
            raise ValueError(
                f"batch_size {batch_size} is larger than the {self.total_tasks} training tasks: an epoch holds "
                "only whole batches"
            )
        self._next_batch = 0
        # The stream is regenerated from its start only when an earlier item than the last one read is asked for.
        self._stream: Iterator[tuple[int, str]] | None = None
        self._stream_position = 0

    # -- position ---------------------------------------------------------------------------------------------

    @property
    def steps_per_epoch(self) -> int:
        """Batches (training steps) per epoch."""
        return self.epoch_size // self.batch_size

    @property
    def batches_drawn(self) -> int:
        """How many batches `next_batch()` has given: the number of the next batch."""
        return self._next_batch

    @property
    def epoch(self) -> int:
        """The epoch (from 0) the next batch belongs to."""
        return self._next_batch // self.steps_per_epoch

    def seek(self, batch: int) -> None:
        """Make `batch` the next batch `next_batch()` gives (a resume at `start_batch`)."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            raise ValueError(f"a batch number is a non-negative int; got {batch!r}")
        self._next_batch = batch

    def share_of(self) -> dict[str, float]:
        """Each non-empty pool's share of the slots, by label."""
        return {pool.label: share for pool, share in zip(self._groups, self.shares, strict=True)}

    # -- drawing ----------------------------------------------------------------------------------------------

    def next_batch(self) -> list[tuple[str | None, str]]:
        """The next step's tasks as `(label, task_id)`; batches go on forever, epoch after epoch."""
        items = self.batch(self._next_batch)
        self._next_batch += 1
        return items

    def batch(self, number: int) -> list[tuple[str | None, str]]:
        """Batch `number` (from 0): items `[number*S, (number+1)*S)` of the stream."""
        start = number * self.batch_size
        return self._labelled(self._items(start, start + self.batch_size))

    def epoch_items(self, epoch: int) -> list[tuple[str | None, str]]:
        """Epoch `epoch` (from 0), all its batches in order."""
        start = epoch * self.epoch_size
        return self._labelled(self._items(start, start + self.epoch_size))

    def _labelled(self, items: list[tuple[int, str]]) -> list[tuple[str | None, str]]:
        return [(self._groups[group].label_of(task_id), task_id) for group, task_id in items]

    def _items(self, start: int, stop: int) -> list[tuple[int, str]]:
        if start < 0 or stop < start:
            raise ValueError(f"no items [{start}, {stop}) in the task order")
        if self._stream is None or start < self._stream_position:
            self._stream = self._generate()
            self._stream_position = 0
        stream = self._stream
        for _ in range(start - self._stream_position):
            next(stream)
        items = [next(stream) for _ in range(stop - start)]
        self._stream_position = stop
        return items

    def _generate(self) -> Iterator[tuple[int, str]]:
        return self._auto() if self.mode == "auto" else self._weighted()

    def _auto(self) -> Iterator[tuple[int, str]]:
        import numpy as np

        tasks = self._groups[0].task_ids
        for p in range(1 << 62):
            # Hugging Face's Dataset.shuffle(seed) is exactly this permutation of the row indices.
            for index in np.random.default_rng(self.seed + p * PASS_SEED_STEP).permutation(len(tasks)):
                yield 0, tasks[int(index)]
        raise AssertionError("unreachable")  # pragma: no cover

    def _weighted(self) -> Iterator[tuple[int, str]]:
        count = len(self._groups)
        passes = [_Passes(pool, pool.seed + i * GROUP_SEED_STEP) for i, pool in enumerate(self._groups)]
        credits = [0.0] * count
        last = -1
        while True:
            for i in range(count):
                credits[i] += self.shares[i]
            best = max(credits)
            winner = next(
                g
                for g in ((last + 1 + k) % count for k in range(count))
                if credits[g] >= best - TIE_TOLERANCE
            )
            credits[winner] -= 1.0
            last = winner
            yield winner, passes[winner].next()

    # -- resume -----------------------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """A digest of what the order depends on, so a resume can tell when the tasks changed under it."""
        what = {
            "mode": self.mode,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "pools": [[p.label, p.weight, p.seed, list(p.task_ids)] for p in self._groups],
        }
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]

    def state(self, next_batch: int | None = None) -> dict[str, Any]:
        """What `restore()` needs to go on with batch `next_batch` (default: the next one `next_batch()` gives);
        JSON-serializable. A trainer that draws ahead of training saves the batch its resume starts at."""
        position = self._next_batch if next_batch is None else next_batch
        return {
            "version": STATE_VERSION,
            "mode": self.mode,
            "batch_size": self.batch_size,
            "next_batch": position,
            "epoch": position // self.steps_per_epoch,
            "fingerprint": self.fingerprint(),
        }

    @classmethod
    def restore(
        cls,
        pools: Sequence[Pool],
        state: Mapping[str, Any],
        *,
        seed: int = AUTO_SEED,
        batch_size: int,
        mode: Mode | str = "auto",
    ) -> TaskOrder:
        """The order positioned where `state()` was taken: it gives the batches the uninterrupted run would.

        Tasks that changed since (a different fingerprint) are logged: the order then goes on as the current
        pools draw it, from the same batch number.
        """
        if state.get("version") != STATE_VERSION or not isinstance(state.get("next_batch"), int):
            raise ValueError(f"not a task order state (version {STATE_VERSION}): {dict(state)!r}")
        order = cls(pools, seed=seed, batch_size=batch_size, mode=mode)
        if state.get("fingerprint") != order.fingerprint():
            log.warning(
                "the training tasks, weights, seeds or batch size changed since the task order was saved: "
                "batches from %d follow the current tasks",
                state["next_batch"],
            )
        order.seek(state["next_batch"])
        return order


class _Passes:
    """One group's seeded shuffled passes: pass `p` is `random.Random(base + p*101).shuffle` of the listing."""

    def __init__(self, pool: Pool, base_seed: int) -> None:
        self._tasks = list(pool.task_ids)
        self._base = base_seed
        self._pass = -1
        self._order: list[str] = []
        self._position = 0

    def next(self) -> str:
        if self._position >= len(self._order):
            self._pass += 1
            self._order = list(self._tasks)
            random.Random(self._base + self._pass * PASS_SEED_STEP).shuffle(self._order)
            self._position = 0
        task = self._order[self._position]
        self._position += 1
        return task


# ---------------------------------------------------------------------------------------------------------------
# Listing the training tasks of a config (`exclude_tasks`, labels).


def _split_names(value: Any) -> list[str] | None:
    if value is None:
        return ["train"]
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return list(dict.fromkeys(value))
    return None


def _failure(exc: BaseException) -> str:
    # A user's mistake (ConfigError, ValueError) says itself; anything else also says what kind of failure it was.
    if isinstance(exc, ValueError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _names(service: Any, split: str) -> dict[str, str]:
    ask = getattr(service, "list_task_names", None)
    if ask is None:
        return {}
    names = await _maybe_await(ask(split))
    return {str(k): str(v) for k, v in dict(names or {}).items()}


async def _known_elsewhere(service: Any, listed_splits: Sequence[str], items: Sequence[str]) -> set[str]:
    """The items that name a task (by id or name) of a split training does not list."""
    ask = getattr(service, "list_splits", None)
    if ask is None or not items:
        return set()
    try:
        splits = [s for s in await _maybe_await(ask()) if s not in listed_splits]
    except Exception:  # the cross-split lookup only refines a refusal: a service failing it keeps the refusal
        return set()
    found: set[str] = set()
    for split in splits:
        try:
            ids = await service.list_tasks(split)
            names = await _names(service, split)
        except Exception:  # likewise: a split that cannot be listed names nothing
            continue
        known = set(map(str, ids)) | set(names.values())
        found |= {item for item in items if item in known}
    return found


async def _columns(service: Any, raw_ids: Sequence[str]) -> dict[str, Mapping[str, Any]]:
    """Each task's dataset columns: the service's `task_columns(ids)`, else its tasks' `misc`."""
    ask = getattr(service, "task_columns", None)
    if ask is not None:
        found = await _maybe_await(ask(list(raw_ids)))
        return {str(k): dict(v or {}) for k, v in dict(found or {}).items()}
    limit = asyncio.Semaphore(32)  # remote services: a bounded number of lookups at once

    async def misc(task_id: str) -> Mapping[str, Any]:
        async with limit:
            task = await service.get_task(task_id)
        return dict(getattr(task, "misc", None) or {})

    values = await asyncio.gather(*(misc(t) for t in raw_ids))
    return dict(zip(raw_ids, values, strict=True))


async def _list_entry(
    config: Any, index: int, entry: Any, *, mixture: bool, base_dir: Path, problems: list[str]
) -> Pool | None:
    import importlib

    where = f"environments.{index}"
    label = entry.name if mixture else DEFAULT_LABEL
    if entry.service is None:
        problems.append(
            f"{where}: no service to list training tasks from: set service "
            "(table, python://... or module:Class)"
        )
        return None
    listing = entry.dataset_kwargs
    splits = _split_names(listing.get("split_name"))
    shuffle_seed = listing.get("shuffle_seed")
    limit = listing.get("limit")
    bad = len(problems)
    if splits is None:
        problems.append(f"{where}.dataset_kwargs.split_name: a split name or a list of split names")
    if shuffle_seed is not None and (isinstance(shuffle_seed, bool) or not isinstance(shuffle_seed, int)):
        problems.append(f"{where}.dataset_kwargs.shuffle_seed: {shuffle_seed!r} is not an int")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        problems.append(f"{where}.dataset_kwargs.limit: {limit!r} is not a non-negative int")
    if len(problems) > bad or splits is None:
        return None
    cache_key: str | None = None
    try:
        service_kwargs = entry_service_kwargs(entry, base_dir)
        settings = {
            "entry": index,
            "label": label,
            "mixture": mixture,
            "name": entry.name,
            "package": entry.package,
            "splits": splits,
            "shuffle_seed": shuffle_seed,
            "limit": limit,
            "exclude_tasks": list(entry.exclude_tasks),
            "label_column": config.train.label_column,
        }
        cache_key = listing_cache.listing_key(entry.service, service_kwargs, settings)
        cached = listing_cache.load(cache_key) if cache_key is not None else None
        if cached is not None and (pool := _pool_of_listing(cached, label, entry, index)) is not None:
            # the same environment listed the same way before: no service is built (`stale_listing` checks it
            # once a start builds the service anyway)
            return replace(pool, cached=cache_key)
        if entry.package:
            importlib.import_module(entry.package)
        service = resolve_service(entry.service, service_kwargs)
    except Exception as exc:  # the user's service: any failure to build it is one problem line
        problems.append(f"{where}.service: {_failure(exc)}")
        return None

    listed: list[tuple[str, str]] = []  # (split, raw id), in listing order, each id once
    names: dict[str, str] = {}
    seen: set[str] = set()
    for split in splits:
        if (problem := await unknown_split(service, split)) is not None:
            problems.append(f"{where}.dataset_kwargs.split_name: {problem}")
            return None
        try:
            ids = [str(t) for t in await service.list_tasks(split)]
            names.update(await _names(service, split))
        except Exception as exc:  # listing runs the user's service (maybe a server): report, do not raise
            problems.append(f"{where}: listing split {split!r} failed: {_failure(exc)}")
            return None
        for task_id in ids:
            if task_id not in seen:
                seen.add(task_id)
                listed.append((split, task_id))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(listed)

    excluded: set[str] = set()
    unmatched: list[str] = []
    for item in entry.exclude_tasks:
        hits = {t for _, t in listed if t == item or names.get(t) == item}
        excluded |= hits
        if not hits:
            unmatched.append(item)
    elsewhere = await _known_elsewhere(service, splits, unmatched)
    for item in unmatched:
        if item in elsewhere:
            continue  # a task of another split: nothing to leave out of training
        service_name = getattr(service, "name", entry.service)
        message = f"{where}.exclude_tasks: {item!r} names no task (by id or name) in any split of the {service_name!r} service"
        prefix, sep, raw = item.partition(ID_SEPARATOR)
        if sep:
            message += (
                f"; exclude_tasks takes the entry's own task ids, without the `{prefix}::` prefix of mixture ids"
                + (f": write {raw!r}" if raw in seen or raw in names.values() else "")
            )
        problems.append(message)
    if listed and excluded and len(excluded) == len(listed):
        problems.append(
            f"{where}.exclude_tasks: excludes all {len(listed)} training tasks of environments[{label}]; "
            "leave at least one"
        )
    kept = [(s, t) for s, t in listed if t not in excluded]
    if limit is not None:
        kept = kept[:limit]
    # the service's own run-start checks, on the tasks the run would train on
    problems += [f"{where}: {refusal}" for refusal in await task_check_refusals(service, kept)]
    record = {
        split: {
            "listed": sum(1 for s, _ in listed if s == split),
            "excluded": [t for s, t in listed if s == split and t in excluded],
        }
        for split in splits
    }

    def run_id(raw: str) -> str:
        return f"{entry.name}{ID_SEPARATOR}{raw}" if mixture else raw

    task_ids = [run_id(t) for _, t in kept]
    column = config.train.label_column
    labels: dict[str, str | None] | None = None
    columns: set[str] = {ENVIRONMENT_COLUMN} if mixture else set()
    if column != ENVIRONMENT_COLUMN and kept:
        raw_ids = [t for _, t in kept]
        try:
            rows = await _columns(service, raw_ids)
        except Exception as exc:  # the user's service again
            problems.append(f"{where}: reading the tasks' columns for train.label_by failed: {_failure(exc)}")
            return None
        labels = {}
        for raw in raw_ids:
            row = rows.get(raw, {})
            columns |= set(row)
            labels[run_id(raw)] = label_text(row.get(column))
    listing = {"task_ids": task_ids, "labels": labels, "columns": sorted(columns), "excluded": record}
    if cache_key is not None and len(problems) == bad:  # only a listing the run accepts is kept
        listing_cache.store(cache_key, listing)
    return _pool(listing, label, entry, index)


async def stale_listing(pool: Pool, service: Any) -> str | None:
    """Why a pool listed from the cache no longer matches what its service lists (None when it still does): a
    task the service no longer has, or another number of tasks in one of its splits. The cache key cannot see
    everything an environment depends on (code outside its directory, environment variables); this check costs
    one listing, made once the start has built the service."""
    fresh: set[str] = set()
    cached = 0
    for split, record in pool.excluded.items():
        try:
            fresh.update(str(t) for t in await service.list_tasks(split))
        except Exception as exc:  # the user's service: listing it afresh reports the failure properly
            return f"listing split {split!r} again failed: {_failure(exc)}"
        listed = record.get("listed") if isinstance(record, Mapping) else None
        cached += listed if isinstance(listed, int) else 0
    if len(fresh) != cached:  # each id once over the splits, as the listing counted them
        return f"the service now lists {len(fresh)} tasks, the cached listing {cached}"
    prefix = f"{pool.label}{ID_SEPARATOR}"
    gone = [t for t in pool.task_ids if t.removeprefix(prefix) not in fresh]
    if gone:
        more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
        return f"the service no longer lists {gone[0]!r}{more}"
    return None


def _pool_of_listing(listing: Mapping[str, Any], label: str, entry: Any, index: int) -> Pool | None:
    """The pool a cached listing gives, or None when the cache file holds something else than a listing."""
    task_ids, labels = listing.get("task_ids"), listing.get("labels")
    columns, excluded = listing.get("columns"), listing.get("excluded")
    if not (
        isinstance(task_ids, list)
        and all(isinstance(t, str) for t in task_ids)
        and (
            labels is None
            or (
                isinstance(labels, dict)
                and all(isinstance(v, str | None) for v in labels.values())
                and set(labels) == set(task_ids)
            )
        )
        and isinstance(columns, list)
        and all(isinstance(c, str) for c in columns)
        and isinstance(excluded, dict)
    ):
        return None
    return _pool(listing, label, entry, index)


def _pool(listing: Mapping[str, Any], label: str, entry: Any, index: int) -> Pool:
    """The pool of an entry from its listing (fresh or cached: the same fields either way)."""
    return Pool(
        label=label,
        weight=entry.weight,
        task_ids=listing["task_ids"],
        seed=entry.seed,
        entry=index,
        labels=listing["labels"],
        columns=frozenset(listing["columns"]),
        excluded=listing["excluded"],
    )


async def list_training_tasks(config: Any, *, base_dir: str | os.PathLike[str]) -> list[Pool]:
    """List each entry's training tasks through its service, as `platoon train` does; one `Pool` per entry.

    Applies `dataset_kwargs` (`split_name`, `shuffle_seed`, `limit`), `exclude_tasks` and `train.label_by`.
    Raises `ConfigError` with every problem (unknown `exclude_tasks` items, services that fail to list).
    Relative service paths left in the config resolve against `base_dir`.
    """
    entries = list(config.environments or [])
    if not entries:
        raise ConfigError(["environments: Config must define at least one environment in `environments`"])
    mixture = len(entries) > 1
    problems: list[str] = []
    pools: list[Pool] = []
    for index, entry in enumerate(entries):
        pool = await _list_entry(
            config, index, entry, mixture=mixture, base_dir=Path(base_dir), problems=problems
        )
        if pool is not None:
            pools.append(pool)
    if problems:
        raise ConfigError(problems)
    return pools


# ---------------------------------------------------------------------------------------------------------------
# What the listing lets a run check, and the sampling plan.

RESERVED_COLUMN = "task_id"


def _mode(config: Any, pools: Sequence[Pool]) -> Mode:
    return _effective_mode(pools, config.train.task_order)


def planned_steps(config: Any, steps_per_epoch: int) -> int | None:
    """`min(num_epochs * batches_per_epoch, max_training_steps)` of those set; None when neither is."""
    train = config.train
    candidates = []
    if train.num_epochs is not None:
        candidates.append(train.num_epochs * steps_per_epoch)
    if train.max_training_steps is not None:
        candidates.append(train.max_training_steps)
    return min(candidates) if candidates else None


def training_problems_after_listing(config: Any, pools: Sequence[Pool]) -> list[str]:
    """What a run refuses (exit 78) once the tasks are listed: no tasks, a batch larger than the tasks of a single
    entry under `task_order: auto`, and a `train.label_by` column no training task has a value in."""
    problems: list[str] = []
    batch_size = config.train.batch_size
    total = sum(pool.size for pool in pools)
    if total == 0:
        problems.append(
            "environments: no training tasks were listed: check each entry's split_name and exclude_tasks"
        )
        return problems
    if _mode(config, pools) == "auto" and total < batch_size:
        problems.append(
            f"train.batch_size: {batch_size} is larger than the {total} training tasks: an epoch holds only whole "
            "batches; lower batch_size or list more tasks"
        )
    column = config.train.label_column
    if column != ENVIRONMENT_COLUMN:
        if column == RESERVED_COLUMN or column.startswith("_platoon"):
            problems.append(
                f"train.label_by: {column!r} is reserved (task_id and _platoon* columns): name a dataset column"
            )
        elif not any(label is not None for pool in pools for label in (pool.labels or {}).values()):
            known = sorted(set().union(*(pool.columns for pool in pools)))
            close = difflib.get_close_matches(column, known, n=1, cutoff=0.6)
            hint = (
                f"; did you mean {close[0]}?"
                if close
                else (f" (columns: {', '.join(known)})" if known else "")
            )
            problems.append(f"train.label_by: no training task has a value in column {column!r}{hint}")
    return problems


def _tasks(count: int) -> str:
    return f"{count} task" if count == 1 else f"{count} tasks"


def _times(value: float) -> str:
    if value >= 10:
        return f"{value:.0f}"
    return f"{value:.1f}".removesuffix(".0")


def plan_lines(config: Any, pools: Sequence[Pool]) -> list[str]:
    """The sampling plan `platoon train` logs and `config validate --tasks` prints, then its `warning: ` lines."""
    batch_size = config.train.batch_size
    mode = _mode(config, pools)
    groups = [pool for pool in pools if pool.size]
    total = sum(pool.size for pool in groups)
    size = epoch_size(total, batch_size, mode)
    per_epoch = size // batch_size
    steps = planned_steps(config, per_epoch)
    shown_steps = "no" if steps is None else str(steps)
    if size == 0:
        return [f"training tasks: {total}, fewer than one batch of {batch_size}: nothing to draw"]
    lines = [
        f"training tasks: {total}, drawn in epochs of {size} ({per_epoch} batches of {batch_size}), "
        f"{shown_steps} steps planned"
    ]
    if not groups:
        return lines
    shares = {id(pool): share for pool, share in zip(groups, _shares(groups), strict=True)}
    slots = (steps or 0) * batch_size
    rates: dict[str, float] = {}
    warnings: list[str] = []
    for pool in pools:
        if not pool.size:
            lines.append(f"environments[{pool.label}]: no training tasks, never drawn")
            continue
        share = shares[id(pool)]
        draws = slots * share / pool.size
        rates[pool.label] = share / pool.size
        weight = "tasks" if pool.weight == "tasks" else _times(float(pool.weight))
        lines.append(
            f"environments[{pool.label}]: share {share * 100:.1f}% (weight {weight}, {_tasks(pool.size)}), each task "
            f"drawn about {_times(draws)} times over the run's {steps or 0} steps"
        )
        # Only a run long enough to draw every task once under `weight: tasks` can promise each task a draw.
        if steps is not None and slots >= total and slots * share < pool.size:
            warnings.append(
                f"warning: environments[{pool.label}]: about {slots * share:.0f} draws over the run for its "
                f"{_tasks(pool.size)}, so some never train; raise its weight or the run's steps"
            )
    if len(rates) > 1:
        high = max(rates, key=lambda label: rates[label])
        low = min(rates, key=lambda label: rates[label])
        if rates[high] > RATE_WARNING_RATIO * rates[low]:
            warnings.append(
                f"warning: environments[{high}] draws each of its tasks {rates[high] / rates[low]:.1f}x as often as "
                f"environments[{low}] does (more than {RATE_WARNING_RATIO:.0f}x); weight: tasks draws every task "
                "equally often"
            )
    labels = {pool.label_of(t) for pool in groups for t in pool.task_ids}
    for limited in config.train.rollout_group_limits:
        if limited not in labels:
            warnings.append(
                f"warning: train.rollout_group_limits.{limited}: no training task has this label, so it limits "
                "nothing"
            )
    return lines + warnings
