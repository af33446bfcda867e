"""The cyclic garbage collector in a process the `platoon` command owns.

A full collection walks every object the process tracks. Once a run's stack is loaded (the SDKs, the tokenizer,
the renderer, the environment classes) that is half a million objects or more, and a full collection stops the
event loop for 0.4-0.5 s on a 2-core machine: every rollout in flight, and the gateway serving them, waits. The
run commands therefore move what their start allocated into the collector's permanent generation (`gc.freeze`)
once the stack is ready; later collections walk only what the run made since. Reference counting still frees
frozen objects; only a cycle among them is never collected, which is why this is done once, on what a start
loads to keep.

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

__all__ = ["FREEZE_SWITCH", "freeze_after_first_episode", "freeze_loaded_heap", "owned_by_the_command"]

log = logging.getLogger(__name__)

_owned = False
_episode_froze = False

#: `0` keeps `run_episode` from freezing the caller's heap
FREEZE_SWITCH = "PLATOON_FREEZE_HEAP"


@contextlib.contextmanager
def owned_by_the_command() -> Iterator[None]:
    """While the `platoon` console script runs its command: the process and its heap are the command's."""
    global _owned
    _owned = True
    try:
        yield
    finally:
        _owned = False


_episode_froze = False

#: `0` keeps `run_episode` from freezing the caller's heap
FREEZE_SWITCH = "PLATOON_FREEZE_HEAP"


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
