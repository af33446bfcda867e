"""The training watchdog and the trainer's hard exits.

The watchdog is a thread that expects heartbeats: after each rollout group and each step, and every so often while
the trainer awaits long service calls or in-flight groups (`keep_alive`). It warns at 75% of
`watchdog.timeout_seconds` and, when the time runs out — an event loop blocked by a synchronous call, a deadlock —
stops the run's rollout workers and exits the process with `watchdog.exit_code`, so a supervisor can start again
from the newest checkpoint.

`hard_exit` is the one way the trainer leaves without unwinding (the watchdog, a second interrupt, SIGUSR1): it runs
the registered last wishes (SIGTERM the workers, finish W&B) and calls `os._exit`.

`ServiceMonitor` watches the training service itself: the local server's death is reported at once, a service that
has not answered its health route for `train.service_unreachable_seconds` is given up on, and while it does not
answer the keep-alive beats stop, so time spent waiting on a silent service counts against the watchdog too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from platoon.console import err

__all__ = ["ServiceMonitor", "Watchdog", "at_hard_exit", "hard_exit", "quiet_sdk_connection_noise"]

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
        err(message)  # never raises: a closed stderr must not skip the last wishes or the exit
    with _last_wishes_lock:
        wishes = list(reversed(_last_wishes))
    for wish in wishes:
        try:
            wish()
        except Exception as exc:  # a last wish failing must not keep the process alive
            err(f"while exiting: {type(exc).__name__}: {exc}")
    os._exit(code)


class Watchdog:
    """A heartbeat deadline on its own thread; `start()` arms it, `stop()` disarms it."""

    def __init__(
        self,
        *,
        timeout_seconds: float,
        exit_code: int,
        enabled: bool = True,
        answering: Callable[[], bool] | None = None,
    ) -> None:
        self.timeout_seconds = float(timeout_seconds)
        self.exit_code = int(exit_code)
        self.enabled = enabled
        #: whether the service the trainer waits on still answers (`ServiceMonitor.answering`); keep_alive beats
        #: only while it does
        self.answering = answering
        #: how often the thread looks: min(60, timeout / 10) seconds
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
    async def keep_alive(self, progress: Callable[[], int] | None = None) -> AsyncIterator[None]:
        """Beat regularly while the block awaits a long service call or in-flight groups; a blocked event loop
        stops the beats, which is what the watchdog is for, and so does a service that does not answer (waiting on
        it is no progress).

        With `progress` (a count that rises while the awaited work moves: `platoon.rollout_progress.count` for
        in-flight rollouts), a beat comes only when it rose since the last one: rollouts that all hang are no
        progress either, and the watchdog fires after `timeout_seconds` of them.
        """
        if not self.enabled:
            yield
            return

        async def beat_forever() -> None:
            seen = None if progress is None else progress()
            while True:
                moved = progress is None or progress() != seen
                if moved and (self.answering is None or self.answering()):
                    self.beat()
                    seen = None if progress is None else progress()
                await asyncio.sleep(self.keep_alive_seconds)

        beating = asyncio.ensure_future(beat_forever())
        try:
            yield
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
            self.beat()


#: seconds between two health probes of an answering service (the SDK heartbeats its session as often)
PROBE_SECONDS = 10.0
#: seconds one health probe may take
PROBE_TIMEOUT_SECONDS = 10.0


class ServiceMonitor:
    """Whether the Tinker service a run trains on still answers.

    Two ways to learn that it is gone: `lose(reason)`, which the local server's watcher calls (from its thread) the
    moment that child exits, and `run(probe)`, which awaits `probe()` (the service's health route) every
    `PROBE_SECONDS`, with backoff while it fails, and gives up once the service has not answered for
    `unreachable_seconds`. `run` returns why; the trainer then stops.
    """

    def __init__(
        self,
        name: str,
        *,
        unreachable_seconds: float,
        setting: str = "train.service_unreachable_seconds",
        probe_seconds: float = PROBE_SECONDS,
    ) -> None:
        self.name = name
        self.unreachable_seconds = float(unreachable_seconds)
        self.setting = setting
        self.probe_seconds = max(0.05, min(probe_seconds, self.unreachable_seconds / 4))
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._silent_since: float | None = None
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    @property
    def lost(self) -> str | None:
        """Why the service is gone; None while it is not known to be."""
        return self._reason

    def answering(self) -> bool:
        """False once a probe failed (until one succeeds again) or the service is lost."""
        return self._reason is None and self._silent_since is None

    def lose(self, reason: str) -> None:
        """The service is gone (thread-safe; the first reason is kept)."""
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason
            wake = self._wake
        if wake is not None:
            loop, event = wake
            with contextlib.suppress(RuntimeError):  # that loop has closed: nobody is waiting
                loop.call_soon_threadsafe(event.set)

    async def run(self, probe: Callable[[], Awaitable[object]]) -> str:
        """Probe the service until it is lost; returns why."""
        woken = asyncio.Event()
        with self._lock:
            self._wake = (asyncio.get_running_loop(), woken)
        last_answer = time.monotonic()
        failures = 0
        while self._reason is None:
            # Backoff while it fails (1, 2, 4 ... s), never longer than the period of an answering service.
            delay = self.probe_seconds if failures == 0 else min(2.0 ** (failures - 1), self.probe_seconds)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), delay)
            if self._reason is not None:
                break
            try:
                await asyncio.wait_for(probe(), PROBE_TIMEOUT_SECONDS)
            except Exception as exc:
                failures += 1
                silent = time.monotonic() - last_answer
                self._silent_since = last_answer
                why = _short_error(exc)
                if silent >= self.unreachable_seconds:
                    self.lose(
                        f"{self.name} has not answered for {silent:.0f} s ({self.setting} "
                        f"{self.unreachable_seconds:g}; last error: {why})"
                    )
                elif failures == 2:
                    err(
                        f"{self.name} is not answering ({why}); the run stops unless it answers within "
                        f"{self.unreachable_seconds:g} s ({self.setting})"
                    )
                continue
            if failures >= 2:
                err(f"{self.name} answers again")
            failures = 0
            last_answer = time.monotonic()
            self._silent_since = None
        assert self._reason is not None
        return self._reason


def _short_error(exc: BaseException) -> str:
    """`Type: message` of a failed probe; the SDK's connection error says only "Connection error.", its cause
    (httpx's) says what failed."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {PROBE_TIMEOUT_SECONDS:g} s"
    shown = exc.__cause__ if exc.__cause__ is not None and str(exc) in ("", "Connection error.") else exc
    return f"{type(shown).__name__}: {shown}" if str(shown) else type(shown).__name__


#: (SDK logger, message start) of the SDK's own reports of a service that does not answer
_SDK_CONNECTION_NOISE = (
    ("tinker.lib.internal_client_holder", "Session heartbeat failed"),
    ("tinker.lib.telemetry", "Failed to send telemetry batch"),  # 0.16
    ("tinker.lib.telemetry", "Dropping telemetry batch that failed to send"),  # 0.38
)
_quieted = False


class _DropMessages(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def quiet_sdk_connection_noise() -> None:
    """Drop the SDK's heartbeat warnings and telemetry tracebacks about a service that does not answer.

    platoon watches the service itself (`ServiceMonitor`) and says in one line when it stops answering; every
    10 s of the SDK's own warnings (with tracebacks) about the same outage would bury that line.
    """
    global _quieted
    if _quieted:
        return
    _quieted = True
    for name, prefix in _SDK_CONNECTION_NOISE:
        logging.getLogger(name).addFilter(_DropMessages(prefix))
