"""Trajectories: one per agent, gathered root first in a `TrajectoryCollection` per rollout.

`to_dict()` gives the JSON-safe form run records and reward processors read (docs/extending.md lists what a
reward processor finds in it).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from platoon.task import Task

__all__ = ["ParentInfo", "Trajectory", "TrajectoryCollection", "TrajectoryStep", "json_safe"]


@dataclass
class ParentInfo:
    """Where a child trajectory hangs: the parent trajectory's id and the parent step that spawned it."""

    id: str
    fork_step: int | None


@dataclass
class TrajectoryStep:
    """One recorded model call; `misc` holds `action_misc`, `message`, `reward_misc` and harness annotations."""

    misc: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """One agent's record: its task, where it hangs in the tree, its steps and its reward."""

    id: str
    task: Task | None = None
    parent_info: ParentInfo | None = None
    steps: list[TrajectoryStep] = field(default_factory=list)
    reward: float = 0.0
    finish_message: str | None = None
    error_message: str | None = None
    misc: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe dict form."""
        return json_safe(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trajectory:
        """Rebuild a trajectory from `to_dict()` output."""
        task = data.get("task")
        parent = data.get("parent_info")
        return cls(
            id=data["id"],
            task=Task.from_dict(task) if isinstance(task, Mapping) else task,
            parent_info=ParentInfo(parent["id"], parent.get("fork_step"))
            if isinstance(parent, Mapping)
            else parent,
            steps=[TrajectoryStep(misc=dict(step.get("misc") or {})) for step in data.get("steps") or ()],
            reward=float(data.get("reward", 0.0)),
            finish_message=data.get("finish_message"),
            error_message=data.get("error_message"),
            misc=dict(data.get("misc") or {}),
        )


@dataclass
class TrajectoryCollection:
    """Every trajectory of one rollout, keyed by trajectory id, the root first."""

    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    trajectories: dict[str, Trajectory] = field(default_factory=dict)

    @property
    def root(self) -> Trajectory | None:
        """The root trajectory (the first one), or None when the collection is empty."""
        return next(iter(self.trajectories.values()), None)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe dict form: `{"id": ..., "trajectories": {id: trajectory dict}}`."""
        return json_safe(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrajectoryCollection:
        """Rebuild a collection from `to_dict()` output, keeping the order (root first)."""
        trajectories = {
            str(tid): Trajectory.from_dict(t) for tid, t in (data.get("trajectories") or {}).items()
        }
        return cls(id=data["id"], trajectories=trajectories)


def _is_pydantic_model(value: Any) -> bool:
    # Detected by shape, not isinstance, so this module never imports pydantic.
    return (
        not isinstance(value, type)
        and callable(getattr(value, "model_dump", None))
        and hasattr(type(value), "model_fields")
    )


def json_safe(value: Any) -> Any:
    """`value` as plain JSON types: dataclasses walked field by field (no deep copy), pydantic models through
    `model_dump(mode="json")`, mappings and sequences recursively, anything else through `str`."""
    return _json_safe(value, set())


#: the exact types JSON holds as they are
_PLAIN = frozenset({bool, int, float, str, type(None)})


def _json_safe(value: Any, active: set[int]) -> Any:
    if type(value) in _PLAIN:
        return value
    # Subclasses (str enums, LaunchFailure, IntEnum, numpy-free bool/int subclasses) become their plain type.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if id(value) in active:  # a reference cycle: stop rather than recurse forever
        return str(value)
    active.add(id(value))
    try:
        # Plain dicts and lists first: they are nearly every node of a trajectory (messages, misc, token lists).
        if type(value) is dict:
            return {
                k if type(k) is str else _json_key(k): v if type(v) in _PLAIN else _json_safe(v, active)
                for k, v in value.items()
            }
        if type(value) is list:
            return [item if type(item) in _PLAIN else _json_safe(item, active) for item in value]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: _json_safe(getattr(value, f.name), active) for f in dataclasses.fields(value)}
        if _is_pydantic_model(value):
            return _json_safe(value.model_dump(mode="json"), active)
        if isinstance(value, Mapping):
            return {_json_key(k): _json_safe(v, active) for k, v in value.items()}
        if isinstance(value, (list, tuple, set, frozenset)):
            return [_json_safe(item, active) for item in value]
        return str(value)
    finally:
        active.discard(id(value))


def _json_key(key: Any) -> str:
    # JSON object keys are strings; str() of a str enum is its value.
    return str(key)
