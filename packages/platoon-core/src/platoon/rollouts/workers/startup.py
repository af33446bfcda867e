"""What a rollout worker process sets up before anything heavy: its environment, its startup alarm, its death signal;
and how a supervisor starts one of its children (a worker, the fork server, an eval slot) by exec.

Standard library only: the workers package imports this module at its own import, so an exec-started worker arms
its startup alarm before tinker or the environment packages load.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess

__all__ = [
    "DIAG_ENV",
    "STARTUP_BUDGET_ENV",
    "WORKER_MARKER_ENV",
    "ExecFailed",
    "arm_startup_alarm",
    "exec_child",
    "process_start_wall_time",
    "set_child_subreaper",
    "set_parent_death_signal",
    "worker_environment",
]

#: set in every rollout worker (and its fork server); descendants inherit it
WORKER_MARKER_ENV = "PLATOON_TINKER_ROLLOUT_WORKER"
#: seconds a worker may take from its process start to ready; consumed by the package init
STARTUP_BUDGET_ENV = "PLATOON_ROLLOUT_WORKER_STARTUP_BUDGET"
#: the worker's diagnostic marker file, written when an alarm fires
DIAG_ENV = "PLATOON_ROLLOUT_WORKER_DIAG"

#: a worker's environment: the trainer's, with these set (and REMOVED_VARIABLES removed)
WORKER_OVERRIDES: dict[str, str] = {
    "TINKER_TELEMETRY": "0",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "CUDA_VISIBLE_DEVICES": "",
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
    WORKER_MARKER_ENV: "1",
}
#: TINKER_API_KEY too: a worker samples through the pickled sampling client, which carries the key, and harness
#: code in the worker (and any process it starts) must not find the key in its environment
REMOVED_VARIABLES = ("TINKER_SUBPROCESS_SAMPLING", "TINKER_API_KEY")

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def worker_environment(
    base: Mapping[str, str], *, startup_budget: float | None = None, diag_path: str | None = None
) -> dict[str, str]:
    """The environment of a worker: `base` (the trainer's) with the worker overrides, the budget and diag path."""
    env = {
        k: v
        for k, v in base.items()
        if k not in REMOVED_VARIABLES and k not in (STARTUP_BUDGET_ENV, DIAG_ENV)
    }
    env.update(WORKER_OVERRIDES)
    if startup_budget is not None:
        env[STARTUP_BUDGET_ENV] = repr(float(startup_budget))
    if diag_path is not None:
        env[DIAG_ENV] = diag_path
    return env


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def set_parent_death_signal(sig: int, *, expected_parent: int | None = None) -> bool:
    """Ask the kernel for `sig` when the parent dies; False when the parent is already gone (the race re-check).

    Without an `expected_parent`, a parent that is init (pid 1) counts as gone: this process was reparented.
    """
    libc = _libc()
    if libc is not None:
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    parent = os.getppid()
    if expected_parent is not None:
        return parent == expected_parent
    return parent != 1


def set_child_subreaper() -> None:
    """Become the reaper of orphaned descendants, so every process a rollout starts stays findable below us."""
    libc = _libc()
    if libc is not None:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def process_age_seconds(pid: int | str = "self") -> float | None:
    """Seconds since the process started, from `/proc` (clock-tick resolution); None if unknown.

    Both the start time and `/proc/uptime` count from boot, so no wall clock enters the difference.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            fields = stat.read().rsplit(")", 1)[-1].split()
        ticks = int(fields[19])
        with open("/proc/uptime", encoding="ascii") as uptime:
            now = float(uptime.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return max(0.0, now - ticks / os.sysconf("SC_CLK_TCK"))


def process_start_wall_time(pid: int | str = "self") -> float | None:
    """When the process started, as a `time.time()` value; None if unknown."""
    age = process_age_seconds(pid)
    return None if age is None else time.time() - age


def _write_marker(path: str | None, text: str) -> None:
    if not path:
        return
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, text.encode("utf-8", "replace")[:4096])
        finally:
            os.close(fd)


def _die_by_startup_alarm(diag_path: str | None, budget: float) -> Callable[[int, object], None]:
    marker = f"phase=startup\tpid={os.getpid()}\tbudget={budget:g}\n"

    def handler(signum: int, frame: object) -> None:
        _write_marker(diag_path, marker)
        with contextlib.suppress(OSError):
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(88)

    return handler


def arm_startup_alarm(budget: float, *, diag_path: str | None) -> float | None:
    """Arm SIGALRM for what is left of `budget` since this process really started; returns the seconds armed.

    A budget of 0 arms nothing. The alarm writes `phase=startup` to the diag file and kills the process group.
    """
    if budget <= 0:
        return None
    started = process_start_wall_time()
    elapsed = 0.0 if started is None else max(0.0, time.time() - started)
    remaining = max(0.01, budget - elapsed)
    signal.signal(signal.SIGALRM, _die_by_startup_alarm(diag_path, budget))
    signal.setitimer(signal.ITIMER_REAL, remaining)
    return remaining


def arm_from_environment() -> None:
    """The package init's part: in a worker, arm the startup alarm from the environment and consume the variable."""
    if os.environ.get(WORKER_MARKER_ENV) != "1":
        return
    raw = os.environ.pop(
        STARTUP_BUDGET_ENV, None
    )  # consumed: descendants that import platoon must not re-arm it
    if raw is None:
        return
    try:
        budget = float(raw)
    except ValueError:
        return
    arm_startup_alarm(budget, diag_path=os.environ.get(DIAG_ENV))


class ExecFailed(Exception):
    """A child could not be started by exec; the message says why in one line."""


def exec_child(
    module: str,
    *arguments: str,
    log: str | os.PathLike[str],
    env: Mapping[str, str],
    cwd: str,
    what: str,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    """`python -m module arguments...` leading a session of its own, its stdout and stderr appended to `log`,
    `pass_fds` its only inherited descriptors. Raises ExecFailed."""
    import subprocess  # here, not at the top: workers import this module before anything else
    import sys

    try:
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ExecFailed(f"opening the {what} log failed: {exc.strerror}") from None
    try:
        return subprocess.Popen(
            [sys.executable, "-m", module, *arguments],
            pass_fds=pass_fds,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise ExecFailed(f"starting the {what} ({module}) failed: {exc}") from None
    finally:
        os.close(log_fd)
