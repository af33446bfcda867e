"""The lines a training start says on stderr while it prepares (`say`), and the heartbeat that speaks up when the
start has been quiet too long, naming what it waits for (`doing`), until the first step begins.
"""

from __future__ import annotations

import threading
import time

from platoon.console import write_stderr

__all__ = ["HEARTBEAT_SECONDS", "Heartbeat", "doing", "say", "start_heartbeat", "started_training"]

#: when `say` last printed (the heartbeat speaks only after this long a silence)
_last_said = 0.0
#: the longest a start stays silent: the heartbeat says what it waits for after this long
HEARTBEAT_SECONDS = 4.0


def say(message: str) -> None:
    """One progress line on stderr, prefixed like every diagnostic."""
    global _last_said
    write_stderr(f"platoon: {message}\n")  # one write: the heartbeat thread says lines too; never raises
    _last_said = time.monotonic()


class Heartbeat:
    """While a start prepares, a line whenever nothing was said for `HEARTBEAT_SECONDS`: what it is doing and for
    how long (`listing tasks (5 s)...`). A thread, not a task: imports and listings block the event loop."""

    def __init__(self) -> None:
        self._doing = "preparing the run"
        self._since = time.monotonic()
        self._started = self._since
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def doing(self, what: str) -> None:
        self._doing, self._since = what, time.monotonic()

    def start(self) -> None:
        self._done.clear()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="platoon-start-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def _run(self) -> None:
        while not self._done.wait(0.25):
            if time.monotonic() - max(_last_said, self._started) >= HEARTBEAT_SECONDS:
                say(f"{self._doing} ({time.monotonic() - self._since:.0f} s)...")


#: the one heartbeat of this process's start
_heartbeat = Heartbeat()


def start_heartbeat() -> None:
    """A start begins preparing: the heartbeat speaks from now on whenever the start is quiet."""
    _heartbeat.start()


def doing(what: str) -> None:
    """Name what the start does now, for the heartbeat's next line."""
    _heartbeat.doing(what)


def started_training() -> None:
    """The first step began, or the start ended: the heartbeat stops (steps say their own lines)."""
    _heartbeat.stop()
