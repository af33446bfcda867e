"""The cyclic garbage collector in a process the `platoon` command owns.

A full collection walks every object the process tracks. Once a run's stack is loaded (the SDKs, the tokenizer,
the renderer, the environment classes) that is half a million objects or more, and a full collection stops the
event loop for 0.4-0.5 s on a 2-core machine: every rollout in flight, and the gateway serving them, waits. The
run commands therefore move what their start allocated into the collector's permanent generation (`gc.freeze`)
once the stack is ready; later collections walk only what the run made since. Reference counting still frees
frozen objects; only a cycle among them is never collected, which is why this is done once, on what a start
loads to keep.

Then the rollouts in flight are the heap: with a thousand of them, a quarter of a megabyte each, the default
thresholds (700, 10, 10) promote their live state into the old generation within a few calls, and a full
collection, walking all of it, comes every time that generation grew by a quarter: a quarter of the CPU of
`benchmarks/scale.py`'s 1,024 number-search rollouts went to it. So training also sets `RUN_THRESHOLDS`
(`use_training_thresholds`): a young collection every 50,000 allocations, by when most of a model call's objects
are gone, and full collections far rarer; and it collects fully at each step's end (`collect_at_step_end`), so the
cycles a step's rollouts leave (a few hundred objects an episode) are freed within a step. Evaluations and
`run_episode` loops have no step to collect at, and keep CPython's thresholds.

A run under the console script freezes (`owned_by_the_command`); a run started by calling platoon in process (a
test, a notebook) leaves the caller's collector as it is, unless the caller asks (`freeze_loaded_heap(force=True)`).
The one exception is `platoon.testing.run_episode`, which users call in loops of thousands (0.2.0's way to roll out
without a run): once per process, after its first episode has loaded the stack, it freezes what is alive
(`freeze_after_first_episode`), which makes such a loop about a quarter faster (docs/performance.md). Setting
`PLATOON_FREEZE_HEAP=0` leaves the collector alone there too.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Iterator

__all__ = [
    "FREEZE_SWITCH",
    "RUN_THRESHOLDS",
    "collect_at_step_end",
    "freeze_after_first_episode",
    "freeze_loaded_heap",
    "owned_by_the_command",
    "use_training_thresholds",
]

log = logging.getLogger(__name__)

_owned = False
_episode_froze = False
#: the thresholds `use_training_thresholds` replaced, restored when the command ends; None while CPython's stand
_replaced_thresholds: tuple[int, int, int] | None = None

#: the collector's thresholds while a training run's rollouts are the heap (CPython's defaults: 700, 10, 10)
RUN_THRESHOLDS = (50_000, 20, 100)

#: `0` keeps `run_episode` from freezing the caller's heap
FREEZE_SWITCH = "PLATOON_FREEZE_HEAP"


@contextlib.contextmanager
def owned_by_the_command() -> Iterator[None]:
    """While the `platoon` console script runs its command: the process and its heap are the command's. When it
    ends, the collector's thresholds are what they were (a command run in process leaves the caller's as it found
    them)."""
    global _owned, _replaced_thresholds
    _owned = True
    try:
        yield
    finally:
        _owned = False
        if _replaced_thresholds is not None:
            gc.set_threshold(*_replaced_thresholds)
            _replaced_thresholds = None


def freeze_loaded_heap(what: str, *, force: bool = False) -> int:
    """Collect, then freeze what is alive now; returns how many objects were frozen (0 when not done).

    Done while the console script runs its command (`owned_by_the_command`), or anywhere with `force`. `what`
    names the moment, for the debug log.
    """
    if not (_owned or force):
        return 0
    started = time.perf_counter()
    gc.collect()
    before = gc.get_freeze_count()
    gc.freeze()
    frozen = gc.get_freeze_count() - before
    log.debug("%s: froze %d objects in %.3f s", what, frozen, time.perf_counter() - started)
    return frozen


def freeze_after_first_episode() -> int:
    """`run_episode`'s freeze: the first call in a process freezes (see the module docstring), later ones do not.
    Returns how many objects were frozen (0 when not done)."""
    global _episode_froze
    if _episode_froze or os.environ.get(FREEZE_SWITCH, "1").strip() == "0":
        return 0
    _episode_froze = True
    return freeze_loaded_heap("the first episode of run_episode", force=True)


def use_training_thresholds(*, force: bool = False) -> bool:
    """Set `RUN_THRESHOLDS` for a training run under the console script, until the command ends (or anywhere with
    `force`, where the caller restores them); True when set. The trainer then calls `collect_at_step_end` at each
    step's end."""
    global _replaced_thresholds
    if not (_owned or force):
        return False
    if _replaced_thresholds is None:
        _replaced_thresholds = gc.get_threshold()
    gc.set_threshold(*RUN_THRESHOLDS)
    return True


def collect_at_step_end() -> float:
    """A full collection at a training step's end, where the thresholds were raised (`RUN_THRESHOLDS`): cycles
    the step's rollouts left are freed within a step however rare the automatic full collections are. Returns its
    seconds (0.0 when the thresholds are CPython's own)."""
    if _replaced_thresholds is None:
        return 0.0
    started = time.perf_counter()
    gc.collect()
    return time.perf_counter() - started
