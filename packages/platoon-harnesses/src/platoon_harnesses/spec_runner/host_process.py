"""Host processes started off the event loop and awaited on it.

`subprocess.Popen` returns only once the child has exec'ed (it reads the child's error pipe to report a failed
exec), and on a loaded machine the child waits for a CPU before it gets there: tens of milliseconds per start with
hundreds of agents running, during which `asyncio.create_subprocess_exec` holds the event loop. Here the start runs
on a thread of a small pool of its own (CPython releases the GIL while it waits for the child), and the exit is
awaited through a pidfd on the loop, as asyncio's own child watcher does, or by a thread where pidfds are missing.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from platoon_harnesses.spec_runner.kill import uncancellable

#: a start blocks its thread only while the child reaches exec; a few at once keep a burst of rollouts moving
#: without pulling CPU from the agents already running
STARTER_THREADS = 8

_starter: ThreadPoolExecutor | None = None
_starter_lock = threading.Lock()


def _starter_pool() -> ThreadPoolExecutor:
    global _starter
    with _starter_lock:
        if _starter is None:
            _starter = ThreadPoolExecutor(max_workers=STARTER_THREADS, thread_name_prefix="platoon-start")
        return _starter


class HostProcess:
    """A started child: `pid`, `returncode` (None while it runs) and `await wait()`, as asyncio's `Process`."""

    def __init__(self, popen: subprocess.Popen[Any]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self._exited: asyncio.Future[None] | None = None

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    async def wait(self) -> int:
        """The exit code (-N when a signal N ended it). A cancelled wait leaves the watch on for the next."""
        if self.popen.returncode is None:
            if self._exited is None:
                self._exited = self._watch_exit()
            await asyncio.shield(self._exited)
        code = self.popen.returncode
        assert code is not None
        return code

    def _watch_exit(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfd (not Linux 5.3+, or a seccomp policy): a thread waits
            threading.Thread(target=self._wait_in_thread, args=(loop, exited), daemon=True).start()
            return exited

        def on_exit() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self.popen.wait()  # it has exited: this reaps it at once
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, on_exit)
        return exited

    def _wait_in_thread(self, loop: asyncio.AbstractEventLoop, exited: asyncio.Future[None]) -> None:
        self.popen.wait()
        if not loop.is_closed():
            loop.call_soon_threadsafe(_resolve, exited)


def _resolve(exited: asyncio.Future[None]) -> None:
    if not exited.done():
        exited.set_result(None)


async def start(
    argv: list[str], *, on_cancel: Callable[[HostProcess], Awaitable[None]], **popen_options: Any
) -> HostProcess:
    """`subprocess.Popen(argv, **popen_options)` on a starter thread; OSError as Popen raises it.

    A caller cancelled while the child starts does not leave it behind: the start is awaited, then
    `await on_cancel(process)` ends it, then the cancellation goes on.
    """
    loop = asyncio.get_running_loop()
    starting = loop.run_in_executor(
        _starter_pool(), functools.partial(subprocess.Popen, argv, **popen_options)
    )
    try:
        popen = await asyncio.shield(starting)
    except asyncio.CancelledError:
        await uncancellable(_end_if_started(starting, on_cancel))
        raise
    return HostProcess(popen)


async def _end_if_started(
    starting: asyncio.Future[Any], on_cancel: Callable[[HostProcess], Awaitable[None]]
) -> None:
    try:
        popen = await starting
    except OSError:
        return
    await on_cancel(HostProcess(popen))
