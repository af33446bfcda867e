"""The trainer's signal contract, installed by `platoon train` in process and by each supervised child start:
SIGUSR2 or the first SIGINT/SIGTERM asks for a stop at the next step boundary; SIGUSR1 or a second signal exits 1.
"""

from __future__ import annotations

import signal
from types import FrameType

from platoon.console import err
from platoon.train.tinker.supervisor import request_stop
from platoon.train.tinker.watchdog import hard_exit

__all__ = ["install_signal_contract", "restore_signals"]

_interrupts = 0


def _stop_at_boundary(signum: int, frame: FrameType | None) -> None:
    # SIGUSR2 is the supervisor's forwarded first signal: it does not count as a user's first interrupt.
    request_stop()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    global _interrupts
    _interrupts += 1
    if _interrupts == 1:
        # The request first: telling it may fail (a closed pipe), and the stop must happen anyway.
        request_stop()
        err(f"{signal.Signals(signum).name}: stopping at the next step boundary (again to stop now)")
        return
    _stop_now(signum, frame)


def _stop_now(signum: int, frame: FrameType | None) -> None:
    # A hard exit (after SIGTERM to the rollout workers and finishing W&B): the event loop may be blocked in a
    # service call, and a supervisor wants this start over.
    hard_exit(1, f"{signal.Signals(signum).name}: stopping now")


_CONTRACT = (signal.SIGUSR2, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def install_signal_contract() -> dict[int, object]:
    """SIGUSR2/first SIGINT/SIGTERM -> `supervisor.stop_requested()`; SIGUSR1/a second one -> exit 1 now.

    Returns the handlers it replaced (for `restore_signals`).
    """
    global _interrupts
    _interrupts = 0
    previous: dict[int, object] = {int(signum): signal.getsignal(signum) for signum in _CONTRACT}
    signal.signal(signal.SIGUSR2, _stop_at_boundary)
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGUSR1, _stop_now)
    return previous


def restore_signals(previous: dict[int, object]) -> None:
    """Put back the handlers `install_signal_contract` replaced."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)  # type: ignore[arg-type]
