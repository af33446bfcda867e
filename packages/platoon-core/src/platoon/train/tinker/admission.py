"""Admission of training tasks to group workers: the feeder puts rows on a bounded queue (capacity
`batch_size`) and each group worker takes one row and runs its whole group.

Without `train.rollout_group_limits` the queue is FIFO. With limits it is label-aware: a worker takes the first
pending row whose label is under its cap, holds the label's slot for the whole group (environment teardown
included) and releases it afterwards, so rows of a blocked label never block other labels.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["AdmissionQueue", "Row"]


@dataclass(frozen=True)
class Row:
    """One task of one batch: `pool` is the environment entry it comes from, `label` its `train.label_by` label,
    `slot` its place in the batch (a batch may hold one task twice: the batch and the slot name the group)."""

    batch: int
    task_id: str
    pool: str
    label: str | None
    slot: int = 0


class AdmissionQueue:
    """Rows waiting for a group worker; `close()` lets workers drain the rest and then get None."""

    def __init__(self, capacity: int, limits: Mapping[str, int] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"the queue holds at least one row; got capacity {capacity}")
        self.capacity = capacity
        self.limits = dict(limits or {})
        self._rows: deque[Row] = deque()
        self._in_flight: Counter[str] = Counter()
        self._changed = asyncio.Condition()
        self._closed = False

    def __len__(self) -> int:
        return len(self._rows)

    def in_flight(self, label: str) -> int:
        """Groups of `label` taken and not yet released."""
        return self._in_flight[label]

    def _admissible(self) -> Row | None:
        for row in self._rows:
            cap = self.limits.get(row.label) if row.label is not None else None
            if cap is None or self._in_flight[str(row.label)] < cap:
                return row
        return None

    async def put(self, row: Row) -> None:
        """Wait for room, then append `row`."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._rows) < self.capacity)
            self._rows.append(row)
            self._changed.notify_all()

    async def take(self) -> Row | None:
        """The first admissible row (FIFO among those), holding its label's slot; None once closed and drained."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._admissible() is not None or (self._closed and not self._rows)
            )
            row = self._admissible()
            if row is None:
                return None
            self._rows.remove(row)
            if row.label is not None:
                self._in_flight[row.label] += 1
            self._changed.notify_all()
            return row

    async def release(self, row: Row) -> None:
        """The group of `row` finished (teardown included): free its label's slot."""
        async with self._changed:
            if row.label is not None and self._in_flight[row.label] > 0:
                self._in_flight[row.label] -= 1
            self._changed.notify_all()

    async def close(self) -> None:
        """No more rows will come."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()
