"""Ending a launch's processes: TERM, a grace period, KILL; by process group and environment marker on the host,
by marker inside a sandbox. Killing the launcher (or the `docker exec` client) is not enough: what it started
keeps running, so processes are found by what they carry.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable
from typing import Any

from platoon_harnesses.spec_runner.launch import MARKER_VAR

#: Runs inside a sandbox with cwd `/` (argv: marker, grace in tenths of a second). It does not carry the marker
#: itself. `grep -z` reads the NUL-separated environ files in one process; a shell loop is the fallback for greps
#: without -z. Zombies have an empty environ and are skipped. KILL is repeated for up to 10 s: a process in an
#: uninterruptible wait (disk I/O on a loaded machine) dies only when the wait ends.
SANDBOX_KILL_SCRIPT = r"""
m="PLATOON_HARNESS_AGENT=$1"; g="$2"
pids() {
  if grep -lzxF "$m" /proc/self/environ >/dev/null 2>&1 || [ $? -eq 1 ]; then
    grep -lzxF "$m" /proc/[0-9]*/environ 2>/dev/null | sed -e 's#^/proc/##' -e 's#/environ$##' | grep -vx "$$"
  else
    for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = "$$" ] && continue
      tr '\0' '\n' < "$d/environ" 2>/dev/null | grep -qxF "$m" && echo "$p"; done
  fi
}
l=$(pids); [ -z "$l" ] && exit 0
kill -TERM $l 2>/dev/null
i=0
while [ "$i" -lt "$g" ]; do sleep 0.1; l=$(pids); [ -z "$l" ] && exit 0; i=$((i+1)); done
n=0
while [ "$n" -lt 100 ]; do l=$(pids); [ -z "$l" ] && exit 0; kill -KILL $l 2>/dev/null; sleep 0.1; n=$((n+1)); done
echo "processes survived SIGKILL: $(pids | tr '\n' ' ')" >&2
exit 1
"""


async def uncancellable[T](work: Awaitable[T]) -> T:
    """Await `work` to its end even if the caller is cancelled (again and again); the cancellation is re-raised
    once it is done, so cleanup is never cut short."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


def marker_pids(marker: str) -> list[int]:
    """Host processes (of this user: others' environ is unreadable) carrying `PLATOON_HARNESS_AGENT=<marker>`."""
    needle = f"\0{MARKER_VAR}={marker}\0".encode()
    found = []
    me = os.getpid()
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        if needle in b"\0" + data + (b"" if data.endswith(b"\0") else b"\0"):
            found.append(int(name))
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_all(pgid: int, pids: list[int], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


async def end_local(process: Any, marker: str, grace_s: float) -> None:
    """TERM the launch's process group and every host process carrying its marker, wait up to `grace_s` for them
    to go, KILL what is left, and reap the leader."""
    pgid = process.pid
    pids = await asyncio.to_thread(marker_pids, marker)
    if _group_alive(pgid) or pids:
        _signal_all(pgid, pids, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            pids = await asyncio.to_thread(marker_pids, marker)
            if not _group_alive(pgid) and not pids:
                break
        for _ in range(50):
            pids = await asyncio.to_thread(marker_pids, marker)
            if not _group_alive(pgid) and not pids:
                break
            _signal_all(pgid, pids, signal.SIGKILL)
            await asyncio.sleep(0.02)
    if process.returncode is None:
        await process.wait()
