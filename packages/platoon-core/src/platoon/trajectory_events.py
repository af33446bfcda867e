"""Trajectory event files: a finished rollout's collection as the JSONL event stream the trajectory
viewer tails and replays — per trajectory, root first: `trajectory_created`, `trajectory_task_set`, one
`trajectory_step_added` per step, `trajectory_finished`.

Written atomically (a hidden `.<name>.<pid>.tmp`, then a rename), so a viewer following a directory never reads
half a file. Training writes under `<run>/rollouts/<scope>/<policy version>/events/`, `platoon eval` next to each
rollout's `trajectory_collection.json`, `platoon rollout` under its run dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from platoon.trajectory import TrajectoryCollection

__all__ = ["EVENTS_DIR", "event_file_name", "events_of", "write_events"]

EVENTS_DIR = "events"
#: misc keys a `trajectory_created` record keeps: what the viewer needs to place a verifier under what it verifies
VERIFIER_PLACEMENT_KEYS = ("agent", "verifier_of", "verifies", "verifier_role", "role")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_TASK_PART_LIMIT = 120


def event_file_name(task_id: str | None, collection_id: str) -> str:
    """`events_<task id>_<collection id>.jsonl`, unsafe characters as `_`, the task part cut to 120 characters."""
    task_part = _UNSAFE.sub("_", str(task_id if task_id is not None else "task"))[:_TASK_PART_LIMIT]
    return f"events_{task_part}_{_UNSAFE.sub('_', collection_id)}.jsonl"


def events_of(collection: TrajectoryCollection, *, ts: float | None = None) -> Iterator[dict[str, Any]]:
    """The event records of `collection`, root first, `ts` one microsecond apart from `ts` (default: now)."""
    start = time.time() if ts is None else ts
    pid = os.getpid()
    count = 0

    def record(kind: str, trajectory_id: str, **fields: Any) -> dict[str, Any]:
        nonlocal count
        stamp = start + count * 1e-6
        count += 1
        return {
            "type": kind,
            "collection_id": collection.id,
            "trajectory_id": trajectory_id,
            "process_id": pid,
            "ts": stamp,
            **fields,
        }

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
    text = "".join(json.dumps(event, default=str) + "\n" for event in events_of(collection))
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()  # a full disk leaves no half-written file behind
        raise
    return path
