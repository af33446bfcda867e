"""Supervised training: `platoon train` with `watchdog.max_restarts > 0` runs child
starts (the command it is given: `platoon.startup.supervised_start`'s) and starts again from the newest checkpoint
after a failed start.
Also holds the stop-at-boundary event the child's signal handlers set and the trainer polls (`stop_requested`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from platoon.console import err
from platoon.rollouts.records import (
    ProcessRecord,
    process_start_time,
    read_process,
    update_process,
)
from platoon.sandbox_runs import reap_run
from platoon.train.tinker.checkpoints import CheckpointLog

__all__ = [
    "MAX_STALLED_STARTS",
    "NO_RESTART_CODES",
    "clear_stop",
    "hold_for_trainer",
    "progress_mark",
    "request_stop",
    "stop_requested",
    "supervise",
]

#: exits after which a start is final: done, a user error (78), interrupted (SIGINT 130, SIGTERM 143)
NO_RESTART_CODES = frozenset({0, 78, 130, 143})
#: consecutive starts that saved no new checkpoint before the supervisor gives up
MAX_STALLED_STARTS = 3

# Set by the supervised child's first SIGINT/SIGTERM or any SIGUSR2; the trainer polls it at step boundaries.
_stop = threading.Event()


def stop_requested() -> bool:
    """Whether this process was asked to stop at the next step boundary."""
    return _stop.is_set()


def request_stop() -> None:
    """Ask the trainer in this process to stop at the next step boundary."""
    _stop.set()


def clear_stop() -> None:
    """Forget a stop request (a new start in the same process begins without one)."""
    _stop.clear()


def progress_mark(run_dir: Path) -> int | None:
    """The batch of the newest resumable checkpoint, not counting the launch recovery save (None: none yet).

    A launch save re-saves the point a start resumed from, so it is no progress of that start.
    """
    rows = [row for row in CheckpointLog(run_dir).rows() if row.state_path and row.kind != "launch"]
    return rows[-1].batch if rows else None


def hold_for_trainer(run_dir: Path) -> bool:
    """In a supervised start: record this process as the run's trainer under the supervisor and return True.

    False when `process.json` does not name this process's parent (not supervised): the trainer then holds the
    run dir itself (`records.hold_run_dir`) and removes `process.json` when it ends; a supervised start leaves
    both to its supervisor, so the record keeps naming the supervisor between starts.
    """
    record = read_process(run_dir)
    parent = os.getppid()
    if record is None or record.pid != parent or record.host != ProcessRecord.current().host:
        return False
    pid = os.getpid()
    update_process(run_dir, trainer_pid=pid, trainer_start_time=process_start_time(pid))
    return True


def _exit_code(returncode: int) -> int:
    # Popen reports death by signal N as -N; a shell reports 128+N, which is what the user expects to see.
    return 128 - returncode if returncode < 0 else returncode


def _say(text: str) -> None:
    err(text)


class _Forwarder:
    """The supervisor's SIGINT/SIGTERM handler: the first is forwarded to the child as SIGUSR2 (stop at the next
    step boundary), later ones as SIGUSR1 (stop now); any of them ends supervision after the current start."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.received = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _Forwarder:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        forward = signal.SIGUSR2 if self.received == 1 else signal.SIGUSR1
        child = self.child
        if child is not None and child.poll() is None:
            try:
                child.send_signal(forward)
            except ProcessLookupError:
                pass  # it exited between the poll and the send


def _record_trainer(run_dir: Path, child: subprocess.Popen[bytes]) -> None:
    # The child's trainer may have replaced process.json with its own record (or removed it on exit): the record
    # names this supervisor as the holder and the current start as the trainer.
    me = ProcessRecord.current().to_json()
    me.update(trainer_pid=child.pid, trainer_start_time=process_start_time(child.pid))
    update_process(run_dir, **me)


def supervise(
    run_dir: Path,
    *,
    max_restarts: int,
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
) -> int:
    """Run child starts of `command` until one is final; returns the last start's exit code.

    Restarts after any exit but 0, 78, 130, 143 or death by SIGINT/SIGTERM, never after this process was signalled,
    at most `max_restarts` times, and not after `MAX_STALLED_STARTS` consecutive starts that saved no new checkpoint.
    Reaps the run's sandboxes before each restart and at exit.
    """
    run_dir = Path(run_dir)
    argv = list(command)
    child_env = dict(os.environ if env is None else env)
    try:
        return _supervise(run_dir, argv, child_env, max_restarts)
    finally:
        _reap_sandboxes(run_dir)  # at exit: what a last start that was killed left


def _supervise(run_dir: Path, argv: list[str], child_env: dict[str, str], max_restarts: int) -> int:
    restarts = stalled = 0
    code = 0
    with _Forwarder() as forwarder:
        while True:
            if forwarder.received:
                return code  # signalled between two starts: the one that ended was the last
            before = progress_mark(run_dir)
            child = subprocess.Popen(argv, env=child_env)
            forwarder.child = child
            try:
                _record_trainer(run_dir, child)
                returncode = child.wait()
            finally:
                if child.poll() is None:
                    # Only an exception here (not a signal: the handler forwards those) leaves it running.
                    child.kill()
                    child.wait()
                forwarder.child = None
            code = _exit_code(returncode)
            if forwarder.received:
                return code
            if code in NO_RESTART_CODES or returncode in (-signal.SIGINT, -signal.SIGTERM):
                return code
            after = progress_mark(run_dir)
            advanced = after is not None and (before is None or after > before)
            stalled = 0 if advanced else stalled + 1
            if restarts >= max_restarts:
                _say(
                    f"training exited with {code}; not starting again: watchdog.max_restarts ({max_restarts}) used"
                )
                return code
            if stalled >= MAX_STALLED_STARTS:
                _say(
                    f"training exited with {code}; not starting again: {stalled} starts in a row saved no new "
                    f"checkpoint in {run_dir}"
                )
                return code
            restarts += 1
            where = f"from step {after}" if after is not None else "from the beginning (no checkpoint yet)"
            _say(
                f"training exited with {code}; starting again {where} (restart {restarts} of {max_restarts})"
            )
            _reap_sandboxes(
                run_dir
            )  # what the dead start's rollouts left, before the next start adds its own


def _reap_sandboxes(run_dir: Path) -> None:
    reaped = reap_run(run_dir)
    if reaped:
        _say(f"reaped {reaped} sandbox(es) of {run_dir}")
