"""The watchdog's keep-alive over in-flight rollouts: a rollout waiting on a call that has a deadline of its own (a
tool call under the step deadline, a sample under its timeout) is not hung, so it counts as progress while the wait
is within that deadline; a wait with no deadline, or one past it, is no progress (then the watchdog fires:
test_hanging_graders.py)."""

from __future__ import annotations

import asyncio
import time

from platoon import rollout_progress as progress
from platoon.train.tinker.watchdog import Watchdog

#: a hang guard, not a margin
HANG_GUARD = 60.0


def test_a_wait_within_its_deadline_is_progress_each_time_it_is_looked_at():
    before = progress.count()
    assert progress.count() == before  # nothing moves
    with progress.bounded_wait(3600):
        first = progress.count()
        assert first > before
        assert progress.count() > first
    settled = progress.count()
    assert progress.count() == settled


def test_a_wait_past_its_deadline_is_no_progress():
    with progress.bounded_wait(0):
        before = progress.count()
        assert progress.count() == before


def test_the_keep_alive_beats_while_a_rollout_waits_within_its_deadline():
    async def watch() -> None:
        watchdog = Watchdog(
            timeout_seconds=0.4, exit_code=2
        )  # keep-alive every 0.1 s; never armed, never fires
        async with watchdog.keep_alive(progress=progress.count):
            with progress.bounded_wait(3600):
                start = watchdog._last
                give_up = time.monotonic() + HANG_GUARD
                while watchdog._last == start:
                    assert time.monotonic() < give_up, "no beat while a bounded wait was open"
                    await asyncio.sleep(0.05)

    asyncio.run(watch())
