"""Rollout progress in this process: a count that goes up whenever a rollout moves — its environment session opened,
a model call answered, a tool call returned, the rollout finished; for a rollout worker, the worker got ready and
each rise of the count its diag reports. The training watchdog's keep-alive beats only while it moves, so rollouts
that all hang stop the beats.
"""

from __future__ import annotations

import itertools

__all__ = ["count", "note"]

_steps = itertools.count(1)
_latest = 0


def note() -> None:
    """A rollout made progress (safe from any thread)."""
    global _latest
    _latest = next(_steps)  # next() on itertools.count is atomic under the GIL


def count() -> int:
    """How often rollouts of this process made progress so far."""
    return _latest
