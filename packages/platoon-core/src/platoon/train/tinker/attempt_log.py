"""The attempt log, `attempts.jsonl` in the run directory: one durable row per change of a group attempt's state, so
that across a SIGKILL, a resume or a watchdog restart no group trains twice into the weights and none is lost.

A group is identified by its batch and its slot in that batch (`order.batch(batch)[slot]`). Each time the feeder
hands it to the pipeline it gets a `started` row with the next attempt number; the step that consumes it writes
`trained` (datums were sent) or `dropped` (stale, failed, rejected, or nothing left to send), before that step's
checkpoint row. A start that resumes at step S keeps the attempts its weights contain (consumed at step <= S) and
appends `superseded` for every other attempt (consumed later, or still in flight when the last start ended); it then
feeds again the groups of earlier batches that no kept attempt finished, and skips the groups of later batches that
one already finished (a group that ran ahead under `train.max_staleness`). Rows are appended whole and fsynced.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.rollouts.records import append_jsonl_rows, read_jsonl, repair_jsonl

if TYPE_CHECKING:
    import tinker

    from platoon.train.tinker.admission import Row

__all__ = ["ATTEMPTS_FILE", "AttemptLog", "GroupKey", "ResumePlan", "datum_digest"]

ATTEMPTS_FILE = "attempts.jsonl"
#: states an attempt ends in when a step consumed it (`superseded` ends it when no kept weights contain it)
CONSUMED = ("trained", "dropped")

#: (batch, slot): one group of the task order
GroupKey = tuple[int, int]


def datum_digest(datum: tinker.Datum) -> str:
    """A short fingerprint of a datum's tokens (its input and its targets): what the attempt log records of each
    datum a group sent, so that a datum the service received can be traced to the attempt that sent it."""
    # The tokens packed as 64-bit integers: it runs on the trainer's event loop for every datum of every step, and
    # joining decimal strings cost 18 ms for a 32k-token datum where this costs 2.
    digest = hashlib.sha256(array("q", datum.model_input.to_ints()).tobytes())
    targets = datum.loss_fn_inputs.get("target_tokens")
    if targets is not None:
        digest.update(b"|")
        digest.update(array("q", map(int, targets.data)).tobytes())
    return digest.hexdigest()[:16]


@dataclass
class ResumePlan:
    """What a start feeds besides the batches from its start step: `carried` groups of earlier batches that no kept
    attempt finished (fed first, in order), and `finished` groups of later batches that a kept attempt finished."""

    carried: list[GroupKey] = field(default_factory=list)
    finished: set[GroupKey] = field(default_factory=set)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


def _key(row: dict[str, Any]) -> GroupKey | None:
    batch, slot = row.get("batch"), row.get("slot")
    if isinstance(batch, int) and isinstance(slot, int):
        return batch, slot
    return None


class AttemptLog:
    """The run's `attempts.jsonl`, read and settled once for a start at `start_step` (see the module docstring)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, start_step: int) -> None:
        self.path = Path(run_dir) / ATTEMPTS_FILE
        self.start_step = start_step
        repair_jsonl(self.path)  # a row a killed writer left half-written is cut off (kept in .torn)
        rows = read_jsonl(self.path)
        #: (batch, slot) -> the last attempt number started
        self._attempts: dict[GroupKey, int] = {}
        #: (batch, slot, attempt) -> that attempt's last row
        last: dict[tuple[int, int, int], dict[str, Any]] = {}
        for row in rows:
            key, attempt = _key(row), row.get("attempt")
            if key is None or not isinstance(attempt, int):
                continue
            self._attempts[key] = max(self._attempts.get(key, 0), attempt)
            last[(*key, attempt)] = row
        kept: set[GroupKey] = set()
        superseded: list[dict[str, Any]] = []
        for (batch, slot, attempt), row in last.items():
            state, step = row.get("state"), row.get("step")
            if state in CONSUMED and isinstance(step, int) and step <= start_step:
                kept.add((batch, slot))
            elif state != "superseded":
                superseded.append(
                    {
                        "batch": batch,
                        "slot": slot,
                        "task_id": row.get("task_id"),
                        "attempt": attempt,
                        "state": "superseded",
                        "was": state,
                        "superseded_by_start_at_step": start_step,
                        "time": _now(),
                    }
                )
        if superseded:
            append_jsonl_rows(self.path, superseded)
            print(
                f"platoon: {self.path.name}: this start resumes at step {start_step}, so {len(superseded)} group "
                "attempt(s) of an earlier start that its weights do not contain are superseded and run again",
                file=sys.stderr,
                flush=True,
            )
        self._kept = kept
        #: batches with a group that no kept attempt finished, below the start step (fed again first)
        self._unfinished_batches = sorted(
            {batch for (batch, _slot) in self._attempts if batch < start_step and (batch, _slot) not in kept}
        )

    def resume_plan(self, batch_sizes: Iterable[tuple[int, int]]) -> ResumePlan:
        """The plan for this start, given `(batch, groups in it)` for every batch below the start step that may hold
        an unfinished group (`unfinished_batches`)."""
        plan = ResumePlan(finished={key for key in self._kept if key[0] >= self.start_step})
        for batch, size in batch_sizes:
            plan.carried += [(batch, slot) for slot in range(size) if (batch, slot) not in self._kept]
        return plan

    @property
    def unfinished_batches(self) -> list[int]:
        """Batches below the start step that an earlier start began and some group of which no kept attempt
        finished."""
        return list(self._unfinished_batches)

    def started(self, rows: Sequence[Row]) -> None:
        """The feeder hands `rows` to the pipeline: one `started` row each, in one append."""
        records = []
        when = _now()
        for row in rows:
            key = (row.batch, row.slot)
            attempt = self._attempts.get(key, 0) + 1
            self._attempts[key] = attempt
            records.append(
                {
                    "batch": row.batch,
                    "slot": row.slot,
                    "task_id": row.task_id,
                    "attempt": attempt,
                    "state": "started",
                    "time": when,
                }
            )
        if records:
            append_jsonl_rows(self.path, records)

    def consumed(self, step: int, outcomes: Sequence[dict[str, Any]]) -> None:
        """Step `step` consumed these groups: each outcome has `row` (the admission row), `state` (`trained` or
        `dropped`), and optionally `reason`, `datums` (digests of the datums sent) and `rollouts` (root ids).
        Written before the step's checkpoint row, so a checkpoint never stands without them."""
        when = _now()
        records = []
        for outcome in outcomes:
            row: Row = outcome["row"]
            record: dict[str, Any] = {
                "batch": row.batch,
                "slot": row.slot,
                "task_id": row.task_id,
                "attempt": self._attempts.get((row.batch, row.slot), 1),
                "state": outcome["state"],
                "step": step,
                "time": when,
            }
            for name in ("reason", "datums", "rollouts"):
                if outcome.get(name) is not None:
                    record[name] = outcome[name]
            records.append(record)
        if records:
            append_jsonl_rows(self.path, records)
