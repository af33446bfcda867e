"""Rollout progress in this process: a count that goes up whenever a rollout moves — its environment session opened,
a model call answered, a tool call returned, the rollout finished; for a rollout worker, the worker got ready and
each rise of the count its diag reports. The training watchdog's keep-alive beats only while it moves, so rollouts
that all hang stop the beats.

A rollout waiting on a call that has a deadline of its own (an environment call under the step deadline, a sample
under the sample timeout) is not hung: that deadline ends the wait. While such a wait is within its deadline, each
look at the count finds it risen, so a long tool call or a slow sample never sets the watchdog off; a wait with no
deadline (`step_timeout: null`) counts for nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator

__all__ = ["bounded_wait", "count", "note"]

_steps = itertools.count(1)
_latest = 0
_wait_tokens = itertools.count(1)
#: the open bounded waits: token -> the monotonic time their deadline ends them
_bounded: dict[int, float] = {}


def note() -> None:
    """A rollout made progress (safe from any thread)."""
    global _latest
    _latest = next(_steps)  # next() on itertools.count is atomic under the GIL


@contextlib.contextmanager
def bounded_wait(seconds: float) -> Iterator[None]:
    """A wait that a deadline `seconds` from now ends: progress while it lasts (and within that deadline)."""
    token = next(_wait_tokens)
    _bounded[token] = time.monotonic() + seconds
    try:
        yield
    finally:
        _bounded.pop(token, None)


def count() -> int:
    """How often rollouts of this process made progress so far (a bounded wait within its deadline is one more)."""
    now = time.monotonic()
    if any(deadline > now for deadline in list(_bounded.values())):
        note()
    return _latest
