"""A run's checkpoint records: `checkpoints.jsonl` (one row per full checkpoint, the
resume point is the newest row with a `state_path`) and `checkpoints_deleted.jsonl`, and which recovery
checkpoints `keep_recovery` pruning may delete (never a permanent one, the resume point, or one still sampled).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from platoon.rollouts.records import append_jsonl, read_jsonl

__all__ = [
    "CHECKPOINTS_FILE",
    "DELETED_FILE",
    "CheckpointLog",
    "CheckpointRow",
    "Deletion",
    "PrunePlan",
    "ResumePoint",
    "checkpoint_due",
    "checkpoint_name",
    "deletable_path",
]

CHECKPOINTS_FILE = "checkpoints.jsonl"
DELETED_FILE = "checkpoints_deleted.jsonl"
RECOVERY_PREFIX = "recovery-"
Kind = Literal["permanent", "recovery", "launch", "interrupted", "final"]
KINDS: tuple[str, ...] = ("permanent", "recovery", "launch", "interrupted", "final")
#: the only paths pruning deletes: a training state or sampler save of one Tinker training run
_DELETABLE = re.compile(r"^tinker://[^/\s]+/(?:weights|sampler_weights)/[^/\s]+$")


def checkpoint_name(kind: str, batch: int) -> str:
    """`NNNNNN` (permanent), `recovery-NNNNNN` (recovery and launch), `NNNNNN_interrupted`, `final`."""
    if kind in ("recovery", "launch"):
        return f"{RECOVERY_PREFIX}{batch:06d}"
    if kind == "interrupted":
        return f"{batch:06d}_interrupted"
    if kind == "final":
        return "final"
    if kind == "permanent":
        return f"{batch:06d}"
    raise ValueError(f"unknown checkpoint kind {kind!r}: expected one of {', '.join(KINDS)}")


def checkpoint_due(steps_completed: int, every: int, recovery_every: int | None) -> Kind | None:
    """Which full checkpoint a step that applied an update saves (permanent wins), or None (a sampler-only save).

    Both cadences count steps completed since this start's start_batch.
    """
    if every > 0 and steps_completed % every == 0:
        return "permanent"
    if recovery_every is not None and recovery_every > 0 and steps_completed % recovery_every == 0:
        return "recovery"
    return None


def deletable_path(path: str | None) -> bool:
    """Whether pruning may delete `path`: shaped `tinker://<run>/<weights|sampler_weights>/<name>`."""
    return isinstance(path, str) and _DELETABLE.match(path) is not None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class CheckpointRow:
    """One `checkpoints.jsonl` row; `index` is its position among the file's parsable rows (newest last)."""

    name: str
    batch: int
    state_path: str | None = None
    sampler_path: str | None = None
    policy_version: int | None = None
    optimizer_steps: int | None = None
    wandb_run_id: str | None = None
    kind: str = "permanent"
    index: int = -1
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def recovery(self) -> bool:
        """Prunable by name: recovery and launch saves (`recovery-...`); anything else is permanent."""
        return self.name.startswith(RECOVERY_PREFIX)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in (self.state_path, self.sampler_path) if p)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], index: int = -1) -> CheckpointRow | None:
        name = _str(data.get("name"))
        batch = _int(data.get("batch"))
        if batch is None:
            batch = _int(data.get("step"))  # rows written by early tools named it `step`
        if name is None or batch is None:
            return None
        kind = _str(data.get("kind"))
        if kind not in KINDS:
            if name.startswith(RECOVERY_PREFIX):
                kind = "recovery"
            elif name == "final":
                kind = "final"
            elif name.endswith("_interrupted"):
                kind = "interrupted"
            else:
                kind = "permanent"
        known = {"name", "batch", "step", "state_path", "sampler_path", "policy_version", "optimizer_steps"}
        known |= {"wandb_run_id", "kind"}
        return cls(
            name=name,
            batch=batch,
            state_path=_str(data.get("state_path")),
            sampler_path=_str(data.get("sampler_path")),
            policy_version=_int(data.get("policy_version")),
            optimizer_steps=_int(data.get("optimizer_steps")),
            wandb_run_id=_str(data.get("wandb_run_id")),
            kind=kind,
            index=index,
            extra={k: v for k, v in data.items() if k not in known},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "batch": self.batch,
            "wandb_run_id": self.wandb_run_id,
            "policy_version": self.policy_version,
            "optimizer_steps": self.optimizer_steps,
            "state_path": self.state_path,
            "sampler_path": self.sampler_path,
            **self.extra,
        }


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed start begins, with the row's defaults for older rows filled."""

    start_batch: int
    policy_version: int
    optimizer_steps: int
    wandb_run_id: str | None
    row: CheckpointRow


@dataclass(frozen=True)
class Deletion:
    """One recovery checkpoint to delete: its not-yet-deleted deletable paths (state and sampler)."""

    name: str
    policy_version: int | None
    paths: tuple[str, ...]
    row: CheckpointRow


@dataclass(frozen=True)
class PrunePlan:
    """What one pruning pass deletes, and how many live recovery checkpoints it keeps (the metric)."""

    delete: list[Deletion]
    recovery_kept: int


class CheckpointLog:
    """The checkpoint records of one run dir, and the names this process (this start) saved."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / CHECKPOINTS_FILE
        self.deleted_path = self.run_dir / DELETED_FILE
        #: indexes of the rows this start appended (staleness protects only those)
        self.saved_this_start: set[int] = set()

    # --------------------------------------------------------------------------------------------- reading

    def rows(self) -> list[CheckpointRow]:
        """Parsable rows in file order (readers skip cut-off and foreign lines)."""
        out: list[CheckpointRow] = []
        for data in read_jsonl(self.path):
            row = CheckpointRow.from_json(data, index=len(out))
            if row is not None:
                out.append(row)
        return out

    def latest_resumable(self) -> CheckpointRow | None:
        """The resume point: the newest row with a `state_path` (None = a fresh start)."""
        resumable = [row for row in self.rows() if row.state_path]
        return resumable[-1] if resumable else None

    def latest_sampler(self) -> CheckpointRow | None:
        """The newest row whose sampler weights were saved and not since deleted (what `platoon rollout` samples
        by default): None before the first checkpoint."""
        deleted = self.deleted_paths()
        sampled = [row for row in self.rows() if row.sampler_path and row.sampler_path not in deleted]
        return sampled[-1] if sampled else None

    def resume_point(self, num_minibatches: int = 1) -> ResumePoint | None:
        """The resume point with defaults (`policy_version` = batch, `optimizer_steps` = batch x minibatches)."""
        row = self.latest_resumable()
        if row is None:
            return None
        return ResumePoint(
            start_batch=row.batch,
            policy_version=row.policy_version if row.policy_version is not None else row.batch,
            optimizer_steps=(
                row.optimizer_steps if row.optimizer_steps is not None else row.batch * num_minibatches
            ),
            wandb_run_id=row.wandb_run_id,
            row=row,
        )

    def deleted_paths(self) -> set[str]:
        return {str(r["path"]) for r in read_jsonl(self.deleted_path) if isinstance(r.get("path"), str)}

    # --------------------------------------------------------------------------------------------- writing

    def record(
        self,
        name: str,
        *,
        kind: str,
        batch: int,
        state_path: str | None,
        sampler_path: str | None,
        policy_version: int | None = None,
        optimizer_steps: int | None = None,
        wandb_run_id: str | None = None,
        **extra: Any,
    ) -> CheckpointRow:
        """Append a full checkpoint's row (after both saves succeeded) and remember it as this start's."""
        if kind not in KINDS:
            raise ValueError(f"unknown checkpoint kind {kind!r}: expected one of {', '.join(KINDS)}")
        row = CheckpointRow(
            name=name,
            batch=batch,
            state_path=state_path,
            sampler_path=sampler_path,
            policy_version=policy_version,
            optimizer_steps=optimizer_steps,
            wandb_run_id=wandb_run_id,
            kind=kind,
            extra={"time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), **extra},
        )
        append_jsonl(self.path, row.to_json())
        # Its index is its position among parsable rows, which is how `rows()` will number it.
        index = len(self.rows()) - 1
        self.saved_this_start.add(index)
        return dataclasses.replace(row, index=index)

    def record_deleted(self, path: str, *, name: str, policy_version: int | None, result: str) -> None:
        """Append a deleted (or believed-absent) path to `checkpoints_deleted.jsonl`."""
        if result not in ("deleted", "absent"):
            raise ValueError(f"result {result!r}: expected deleted or absent")
        append_jsonl(
            self.deleted_path,
            {
                "path": path,
                "name": name,
                "policy_version": policy_version,
                "result": result,
                "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            },
        )

    # --------------------------------------------------------------------------------------------- pruning

    def plan(
        self,
        keep_recovery: int,
        *,
        resume_point: CheckpointRow | None = None,
        sampling_versions_in_use: Iterable[int | None] | None = None,
        current_version: int | None = None,
        max_staleness: int | None = None,
    ) -> PrunePlan:
        """Which recovery checkpoints one pruning pass deletes, oldest first.

        Never deleted: a permanent checkpoint (a name not starting `recovery-`) or any path a permanent row
        names; the resume point (the newest row with `state_path`; `resume_point` overrides it); the newest
        `keep_recovery` live recovery checkpoints; this start's recovery checkpoints that rollouts may still
        sample: a version in `sampling_versions_in_use`, within `max_staleness` of `current_version`, or unknown
        (with neither given, all of this start's); paths not shaped `tinker://<run>/<weights|sampler_weights>/..`.
        """
        if keep_recovery < 1:
            raise ValueError("keep_recovery must be at least 1")
        rows = self.rows()
        deleted = self.deleted_paths()
        resume = resume_point if resume_point is not None else _newest_resumable(rows)
        protected_paths: set[str] = set(resume.paths) if resume is not None else set()
        for row in rows:
            if not row.recovery:
                protected_paths.update(row.paths)
        versions = list(sampling_versions_in_use) if sampling_versions_in_use is not None else None
        in_use = {v for v in versions or () if v is not None}
        unknown_in_use = versions is not None and None in versions
        knows_staleness = versions is not None or (current_version is not None and max_staleness is not None)

        def still_sampled(row: CheckpointRow) -> bool:
            if row.policy_version is not None and row.policy_version in in_use:
                return True
            if row.index not in self.saved_this_start:
                return False
            if row.policy_version is None or unknown_in_use or not knows_staleness:
                return True
            if current_version is None or max_staleness is None:
                return False  # only the given in-use versions count, and this one is not among them
            return current_version - row.policy_version <= max_staleness

        # A recovery checkpoint saved twice under one path (a repeated row) is one checkpoint: the newest row.
        live: list[CheckpointRow] = []
        seen: set[tuple[str, ...]] = set()
        for row in reversed(rows):
            if not row.recovery or not row.paths or row.paths in seen:
                continue
            seen.add(row.paths)
            if all(path in deleted for path in row.paths):
                continue
            live.append(row)  # newest first
        kept = live[:keep_recovery]
        deletions: list[Deletion] = []
        for row in live[keep_recovery:]:
            if resume is not None and row.index == resume.index:
                kept.append(row)
                continue
            if still_sampled(row):
                kept.append(row)
                continue
            paths = tuple(
                p for p in row.paths if p not in protected_paths and p not in deleted and deletable_path(p)
            )
            if not paths:
                kept.append(row)
                continue
            deletions.append(Deletion(name=row.name, policy_version=row.policy_version, paths=paths, row=row))
        deletions.reverse()  # oldest first: a pass cut short leaves the newest ones
        return PrunePlan(delete=deletions, recovery_kept=len(kept))

    def prune(
        self,
        keep_recovery: int,
        *,
        resume_point: CheckpointRow | None = None,
        sampling_versions_in_use: Iterable[int | None] | None = None,
        current_version: int | None = None,
        max_staleness: int | None = None,
    ) -> list[Deletion]:
        """The deletions of `plan` (see there); the caller deletes each path and calls `record_deleted`."""
        return self.plan(
            keep_recovery,
            resume_point=resume_point,
            sampling_versions_in_use=sampling_versions_in_use,
            current_version=current_version,
            max_staleness=max_staleness,
        ).delete


def _newest_resumable(rows: list[CheckpointRow]) -> CheckpointRow | None:
    resumable = [row for row in rows if row.state_path]
    return resumable[-1] if resumable else None
