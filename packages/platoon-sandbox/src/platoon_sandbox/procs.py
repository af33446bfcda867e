"""Finding and killing host processes through /proc: start times (a pid-reuse guard), process groups and
environment markers (cleanup is by marker, because a process can leave its group)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

__all__ = ["alive", "kill_group", "pids_with_marker", "running", "start_time", "wait_gone"]


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])


def alive(pid: int, started: int | None) -> bool:
    """Whether `pid` is still the process that started at `started` (not a reuse of its number)."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def kill_group(pgid: int, started: int | None = None) -> None:
    """SIGKILL a process group. With `started`, only while its leader is that same process or gone: a leader
    alive under another start time means the number was reused by a group that is not ours."""
    if started is not None:
        now = start_time(pgid)
        if now is not None and now != started:
            return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def pids_with_marker(markers: Iterable[bytes], *, spare: bytes | None = None) -> list[int]:
    """Our uid's processes whose environment holds one of `markers` (each `NAME=value`), except those whose
    environment also holds `spare` (the route forwarder)."""
    wanted = [b"\0" + m + b"\0" for m in markers]
    me = os.getpid()
    uid = os.getuid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue  # another user's environ is unreadable anyway: skip the open
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                environ = b"\0" + handle.read() + b"\0"
        except OSError:
            continue
        if any(m in environ for m in wanted) and not (spare and b"\0" + spare + b"\0" in environ):
            found.append(int(entry.name))
    return found


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pids: Iterable[int], timeout_s: float) -> list[int]:
    """Wait until each of `pids` (killed already) is gone or a zombie, up to `timeout_s`; returns those still there."""
    left = list(pids)
    deadline = time.monotonic() + timeout_s
    while True:
        left = [pid for pid in left if running(pid)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.005)


def running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z"
