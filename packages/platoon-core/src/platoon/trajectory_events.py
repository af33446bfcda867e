"""Trajectory event files: a finished rollout's collection as the JSONL event stream the trajectory
viewer tails and replays — per trajectory, root first: `trajectory_created`, `trajectory_task_set`, one
`trajectory_step_added` per step, `trajectory_finished`. Every record carries its `collection_id` (one rollout) and
`trajectory_id`, so a file holding many rollouts splits back into them (`by_collection`).

Two layouts. Training writes one file per scope and step: every rollout of `<run>/rollouts/train/<policy
version>/` is appended to `events/events_train_<version>.jsonl`, and every rollout of an evaluation during training
to `rollouts/eval/step_<n>/events/events_eval_<n>.jsonl` (`append_events`: whole lines, one rollout at a time, so a
viewer tailing the file never reads half a rollout's line). `platoon eval` and `platoon rollout`, whose rollouts
each have a record directory of their own, write one file per rollout beside it (`write_events`: atomically, a
hidden `.<name>.<pid>.tmp` then a rename). Training's records also say where the rollout belongs (`scope`,
`training_step`, `policy_version`, and `label` when the run has labels): the viewer groups and filters by them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from platoon.trajectory import TrajectoryCollection

__all__ = [
    "EVENTS_DIR",
    "append_events",
    "by_collection",
    "event_file_name",
    "events_of",
    "read_events",
    "scope_event_file",
    "write_events",
]

EVENTS_DIR = "events"
#: misc keys a `trajectory_created` record keeps: what the viewer needs to place a verifier under what it verifies
VERIFIER_PLACEMENT_KEYS = ("agent", "verifier_of", "verifies", "verifier_role", "role")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_TASK_PART_LIMIT = 120


def event_file_name(task_id: str | None, collection_id: str) -> str:
    """`events_<task id>_<collection id>.jsonl`, unsafe characters as `_`, the task part cut to 120 characters."""
    task_part = _UNSAFE.sub("_", str(task_id if task_id is not None else "task"))[:_TASK_PART_LIMIT]
    return f"events_{task_part}_{_UNSAFE.sub('_', collection_id)}.jsonl"


def events_of(
    collection: TrajectoryCollection, *, ts: float | None = None, context: Mapping[str, Any] | None = None
) -> Iterator[dict[str, Any]]:
    """The event records of `collection`, root first, `ts` one microsecond apart from `ts` (default: now). Every
    record also carries `context`: where the rollout belongs (training writes its `scope`, `training_step`,
    `policy_version` and `label`, by which the viewer groups and filters); a record's own fields win over it."""
    where = {key: value for key, value in (context or {}).items() if value is not None}
    start = time.time() if ts is None else ts
    pid = os.getpid()
    count = 0

    def record(kind: str, trajectory_id: str, **fields: Any) -> dict[str, Any]:
        nonlocal count
        stamp = start + count * 1e-6
        count += 1
        event = {
            "type": kind,
            "collection_id": collection.id,
            "trajectory_id": trajectory_id,
            "process_id": pid,
            "ts": stamp,
            **fields,
        }
        for key, value in where.items():
            event.setdefault(key, value)
        return event

    for trajectory in collection.trajectories.values():
        data = trajectory.to_dict()
        misc = data.get("misc") or {}
        created = {key: value for key, value in data.items() if key not in ("steps", "task", "misc")}
        created["misc"] = {key: misc[key] for key in VERIFIER_PLACEMENT_KEYS if key in misc}
        yield record("trajectory_created", trajectory.id, trajectory=created)
        yield record("trajectory_task_set", trajectory.id, task=data.get("task"))
        for index, step in enumerate(data.get("steps") or ()):
            yield record(
                "trajectory_step_added",
                trajectory.id,
                step_index=index,
                step=step,
                reward=data.get("reward"),
                finish_message=data.get("finish_message"),
                error_message=data.get("error_message"),
            )
        yield record(
            "trajectory_finished",
            trajectory.id,
            reward=data.get("reward"),
            finish_message=data.get("finish_message"),
            error_message=data.get("error_message"),
            misc=misc,
        )


def write_events(
    collection: TrajectoryCollection | Mapping[str, Any],
    output_dir: str | os.PathLike[str],
    *,
    task_id: str | None,
) -> Path:
    """Write `collection`'s event file into `<output_dir>/events/` atomically; returns its path."""
    if not isinstance(collection, TrajectoryCollection):
        collection = TrajectoryCollection.from_dict(collection)
    directory = Path(output_dir) / EVENTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / event_file_name(task_id, collection.id)
    temporary = directory / f".{path.name}.{os.getpid()}.tmp"
    text = events_text(collection)
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()  # a full disk leaves no half-written file behind
        raise
    return path


#: `json.dumps(record, default=str)`, without building an encoder per record (it keeps no state between calls)
_ENCODE = json.JSONEncoder(default=str).encode


def events_text(collection: TrajectoryCollection, context: Mapping[str, Any] | None = None) -> str:
    """`collection`'s event records as JSONL text, one record a line."""
    return "".join(_ENCODE(event) + "\n" for event in events_of(collection, context=context))


def scope_event_file(output_dir: str | os.PathLike[str], scope: str, key: str | int) -> Path:
    """`<output_dir>/events/events_<scope>_<key>.jsonl`: the one event file of a scope's step (training: `train`
    and the policy version; evaluation during training: `eval` and the step)."""
    name = f"events_{_UNSAFE.sub('_', scope)}_{_UNSAFE.sub('_', str(key))}.jsonl"
    return Path(output_dir) / EVENTS_DIR / name


#: one append at a time in this process: rollouts of one step finish concurrently and share the step's file
_APPEND_LOCK = threading.Lock()
#: files this process appended to (a file it finds ending mid-line is one a killed writer left)
_APPENDED: set[Path] = set()


def append_events(
    collection: TrajectoryCollection | Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    context: Mapping[str, Any] | None = None,
) -> None:
    """Append `collection`'s event records (each carrying `context`, as `events_of`) to `path` as whole lines.

    A write that fails part-way (a full disk) is cut back to where it began, so the file never holds half a
    record; a tail a killed process left without its newline is closed first, so the next rollout starts on a
    line of its own (a reader skips the torn line).
    """
    if not isinstance(collection, TrajectoryCollection):
        collection = TrajectoryCollection.from_dict(collection)
    data = events_text(collection, context).encode("utf-8")
    target = Path(path)
    with _APPEND_LOCK:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Read-write: the last byte of a file another process left is read to see whether it ended mid-line.
        fd = os.open(target, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if target not in _APPENDED and size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            _APPENDED.add(target)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)  # no half record left behind
                raise
        finally:
            os.close(fd)


def read_events(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """The records of event files (a file, a directory's `*.jsonl`, or several), merged by `ts` as the viewer
    replays them; a line that does not parse (a torn tail) is skipped."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    files: list[Path] = []
    for given in paths:
        where = Path(given)
        files += sorted(where.glob("*.jsonl")) if where.is_dir() else [where]
    records: list[dict[str, Any]] = []
    for file in files:
        for line in file.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    records.sort(key=lambda record: float(record.get("ts") or 0.0))
    return records


def by_collection(records: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Records grouped by `collection_id` (one rollout each), each group in the order given."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(str(record.get("collection_id")), []).append(dict(record))
    return groups
