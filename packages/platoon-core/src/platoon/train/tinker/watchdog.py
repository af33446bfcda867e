"""The training watchdog and the trainer's hard exits (train.md 2.16).

The watchdog is a thread that expects heartbeats: after each rollout group and each step, and every so often while
the trainer awaits long service calls or in-flight groups (`keep_alive`). It warns at 75% of
`watchdog.timeout_seconds` and, when the time runs out — an event loop blocked by a synchronous call, a deadlock —
stops the run's rollout workers and exits the process with `watchdog.exit_code`, so a supervisor can start again
from the newest checkpoint.

`hard_exit` is the one way the trainer leaves without unwinding (the watchdog, a second interrupt, SIGUSR1): it runs
the registered last wishes (SIGTERM the workers, finish W&B) and calls `os._exit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable

__all__ = ["Watchdog", "at_hard_exit", "hard_exit"]

log = logging.getLogger("platoon.train")

_last_wishes: list[Callable[[], None]] = []
_last_wishes_lock = threading.Lock()


def at_hard_exit(wish: Callable[[], None]) -> Callable[[], None]:
    """Run `wish` before any hard exit of this process; returns a function that unregisters it."""
    with _last_wishes_lock:
        _last_wishes.append(wish)

    def forget() -> None:
        with _last_wishes_lock, contextlib.suppress(ValueError):
            _last_wishes.remove(wish)

    return forget


def hard_exit(code: int, message: str | None = None) -> None:
    """Print `message`, run the last wishes (each may fail on its own), and exit now with `code`."""
    if message:
        print(f"platoon: {message}", file=sys.stderr, flush=True)
    with _last_wishes_lock:
        wishes = list(reversed(_last_wishes))
    for wish in wishes:
        try:
            wish()
        except Exception as exc:  # a last wish failing must not keep the process alive
            print(f"platoon: while exiting: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    sys.stderr.flush()
    os._exit(code)


class Watchdog:
    """A heartbeat deadline on its own thread; `start()` arms it, `stop()` disarms it."""

    def __init__(self, *, timeout_seconds: float, exit_code: int, enabled: bool = True) -> None:
        self.timeout_seconds = float(timeout_seconds)
        self.exit_code = int(exit_code)
        self.enabled = enabled
        #: how often the thread looks: min(60, timeout / 10) seconds (train.md 2.16)
        self.check_seconds = min(60.0, self.timeout_seconds / 10.0)
        #: how often keep_alive beats while the trainer awaits something long
        self.keep_alive_seconds = min(60.0, self.timeout_seconds / 4.0)
        self._last = time.monotonic()
        self._warned = False
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Progress: the deadline starts over."""
        self._last = time.monotonic()
        self._warned = False

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self.beat()
        self._thread = threading.Thread(target=self._watch, name="platoon-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _watch(self) -> None:
        while not self._stopped.wait(self.check_seconds):
            quiet = time.monotonic() - self._last
            if quiet >= self.timeout_seconds:
                hard_exit(
                    self.exit_code,
                    f"watchdog: no progress for {quiet:.0f} s (watchdog.timeout_seconds {self.timeout_seconds:g}): "
                    f"stopping the rollout workers and exiting with {self.exit_code}",
                )
            if quiet >= 0.75 * self.timeout_seconds and not self._warned:
                self._warned = True
                log.warning(
                    "watchdog: no progress for %.0f s; the run exits at %.0f s (watchdog.timeout_seconds)",
                    quiet,
                    self.timeout_seconds,
                )

    @contextlib.asynccontextmanager
    async def keep_alive(self) -> AsyncIterator[None]:
        """Beat regularly while the block awaits a long service call or in-flight groups; a blocked event loop
        stops the beats, which is what the watchdog is for."""
        if not self.enabled:
            yield
            return

        async def beat_forever() -> None:
            while True:
                self.beat()
                await asyncio.sleep(self.keep_alive_seconds)

        beating = asyncio.ensure_future(beat_forever())
        try:
            yield
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
            self.beat()
