"""The per-live-env admission gate: turn-taking for every agent acting on one live environment.

Operations come in three classes: `serial` (one at a time), `concurrent` (declared safe; run beside others) and
`exclusive` (waits for everything that arrived earlier, runs alone, holds back everything that arrived later).
Each caller has at most one waiter in the shared queue; its next operation joins the back when the previous one is
granted, so calls are FIFO per caller and round-robin across callers. A waiter not admitted within
`queue_timeout_s` gets `EnvBusy` and never runs; an admitted operation runs shielded to completion even if its
caller gives up. asyncio only; one gate belongs to one event loop.

`SharedLease` (a live backend with its gate, shared by the views forked from it, closed by the last) and
`SessionView` (what a harness holds) are what every session backend builds on: ORS's in process and remote, Harbor's
sandbox sessions.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    import logging

    from platoon.task import Task

__all__ = [
    "DEFAULT_QUEUE_TIMEOUT_S",
    "OP_CLASSES",
    "EnvBusy",
    "Gate",
    "GateClosed",
    "OpClass",
    "SessionView",
    "SharedLease",
]

T = TypeVar("T")

OpClass = Literal["serial", "concurrent", "exclusive"]

#: The operation classes, in the order of how much they hold back.
OP_CLASSES: tuple[str, ...] = ("concurrent", "serial", "exclusive")

#: How long a waiter may queue before it is refused unrun.
DEFAULT_QUEUE_TIMEOUT_S = 240.0

# The gates whose grant the running code holds: an acquire from inside one would wait for itself.
_HELD: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "platoon_gate_held", default=frozenset()
)


class EnvBusy(Exception):
    """An operation waited longer than the queue deadline and was not run."""

    def __init__(self, message: str, *, waited_s: float, limit_s: float) -> None:
        super().__init__(message)
        self.waited_s = waited_s
        self.limit_s = limit_s


class GateClosed(Exception):
    """The gate was closed (its environment is going away) before the operation was admitted."""


@dataclass(eq=False)
class _Waiter:
    seq: int
    op_class: str
    caller: Hashable
    what: str
    future: asyncio.Future[None]
    queued_at: float
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False)
class _Caller:
    pending: deque[_Waiter] = field(default_factory=deque)


class Gate:
    """Admission control for one live environment shared by several agents.

    `await gate.run(fn, "serial", caller=agent_id)` waits for a turn, then runs `fn()` (a coroutine function)
    shielded: cancelling the caller after admission does not stop the operation, and the grant is released only
    when it ends. `caller` is the fairness key (an agent id, or the session view); None makes the call its own
    caller. `what` names the operation in `EnvBusy` messages.
    """

    def __init__(self, *, queue_timeout_s: float | None = DEFAULT_QUEUE_TIMEOUT_S, name: str = "env") -> None:
        if queue_timeout_s is not None and (
            isinstance(queue_timeout_s, bool)
            or not isinstance(queue_timeout_s, (int, float))
            or not math.isfinite(queue_timeout_s)
            or queue_timeout_s <= 0
        ):
            raise ValueError(
                f"queue_timeout_s must be a positive number of seconds or None; got {queue_timeout_s!r}"
            )
        self.queue_timeout_s = None if queue_timeout_s is None else float(queue_timeout_s)
        self.name = name
        self._seq = itertools.count()
        self._callers: dict[Hashable, _Caller] = {}
        # Heads of the callers' private queues, in the order they joined the shared queue.
        self._queue: list[_Waiter] = []
        self._running: dict[str, int] = {"serial": 0, "concurrent": 0, "exclusive": 0}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    # -- state -------------------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        """Admitted operations that have not ended."""
        return sum(self._running.values())

    @property
    def waiting(self) -> int:
        """Operations waiting for a turn."""
        return sum(len(c.pending) for c in self._callers.values())

    def holds(self) -> bool:
        """Whether the running code is inside an operation admitted by this gate."""
        return id(self) in _HELD.get()

    # -- the public operations ---------------------------------------------------------------------------------

    async def run(
        self,
        fn: Callable[[], Awaitable[T]],
        op_class: OpClass | str = "serial",
        *,
        caller: Hashable | None = None,
        what: str = "",
    ) -> T:
        """Wait for a turn of `op_class`, then run `fn()` to completion under the grant and return its result.

        Raises `EnvBusy` when not admitted within `queue_timeout_s` (the operation never ran), `GateClosed` when
        the gate closes first, and `RuntimeError` when called from inside an operation this gate admitted.
        """
        granted = await self._admit(op_class, caller, what)
        # Started eagerly: an operation that ends without waiting (most in-process tool calls) is done here, with
        # no hand-off through the event loop; one that waits runs on as its own task.
        task = asyncio.Task(self._granted(fn, granted), loop=asyncio.get_running_loop(), eager_start=True)
        if task.done():
            return task.result()
        self._tasks.add(task)
        task.add_done_callback(self._op_done)
        # The shield keeps an admitted operation running when the caller is cancelled; its grant is released
        # when the operation itself ends (`_granted`'s finally), never before.
        return await asyncio.shield(task)

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until no admitted operation is in flight (at most `timeout_s`); True when none is."""
        if not self.in_flight:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return not self.in_flight
        return True

    def cancel_in_flight(self) -> int:
        """Cancel the tasks of admitted operations still running (for a bounded teardown); returns how many."""
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        return len(tasks)

    def close(self) -> None:
        """Refuse every waiter and every later operation with `GateClosed`; idempotent.

        Admitted operations keep running; `drain` waits for them.
        """
        if self._closed:
            return
        self._closed = True
        waiters = [w for c in self._callers.values() for w in c.pending]
        self._callers.clear()
        self._queue.clear()
        for waiter in waiters:
            if waiter.timer is not None:
                waiter.timer.cancel()
            if not waiter.future.done():
                waiter.future.set_exception(GateClosed(f"{self.name} is closed: the operation was not run"))
                # Retrieved here so an abandoned waiter's failure is never reported as unretrieved.
                waiter.future.exception()

    # -- admission ---------------------------------------------------------------------------------------------

    async def _admit(self, op_class: str, caller: Hashable | None, what: str) -> str:
        """Wait for a turn of `op_class`; returns the class granted (what `_release` gives back)."""
        if op_class not in OP_CLASSES:
            raise ValueError(f"operation class must be one of {', '.join(OP_CLASSES)}; got {op_class!r}")
        if self.holds():
            raise RuntimeError(
                f"re-entrant acquire of {self.name}'s gate from inside an operation it admitted "
                "(the inner call would wait for the outer one forever)"
            )
        if self._closed:
            raise GateClosed(f"{self.name} is closed: the operation was not run")
        if not self._queue and self._may_start(op_class):
            # Nobody waits and nothing running holds this class back: `_schedule` would grant it at once, so
            # grant it without a queue entry, a future or a timer (the common case: one agent per environment).
            next(self._seq)
            self._running[op_class] += 1
            self._idle.clear()
            return op_class
        loop = asyncio.get_running_loop()
        key: Hashable = object() if caller is None else caller
        waiter = _Waiter(next(self._seq), op_class, key, what, loop.create_future(), time.monotonic())
        entry = self._callers.setdefault(key, _Caller())
        entry.pending.append(waiter)
        if len(entry.pending) == 1:
            self._queue.append(waiter)
        if self.queue_timeout_s is not None:
            waiter.timer = loop.call_later(self.queue_timeout_s, self._expire, waiter)
        self._schedule()
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                # Granted in the same instant the caller gave up: the operation will not run, so give the turn back.
                self._release(waiter.op_class)
            else:
                self._withdraw(waiter)
            raise
        return waiter.op_class

    def _may_start(self, op_class: str) -> bool:
        """Whether an operation of `op_class` may start beside what runs now (with nobody waiting before it)."""
        running = self._running
        if op_class == "exclusive":
            return not self.in_flight
        if running["exclusive"]:
            return False
        return op_class == "concurrent" or not running["serial"]

    def _expire(self, waiter: _Waiter) -> None:
        if waiter.future.done():
            return
        waited = time.monotonic() - waiter.queued_at
        limit = self.queue_timeout_s or 0.0
        ahead = self.in_flight
        doing = f"{waiter.what} " if waiter.what else ""
        self._withdraw(waiter)
        waiter.future.set_exception(
            EnvBusy(
                f"{doing}not run: env busy (waited {waited:.1f} s behind {ahead} operation(s) in flight on "
                f"{self.name}; the limit is {limit:g} s)",
                waited_s=waited,
                limit_s=limit,
            )
        )

    def _withdraw(self, waiter: _Waiter) -> None:
        """Take a waiter that was never granted out of the queues; its caller's next call takes its place."""
        if waiter.timer is not None:
            waiter.timer.cancel()
        entry = self._callers.get(waiter.caller)
        if entry is None or waiter not in entry.pending:
            return
        was_head = entry.pending[0] is waiter
        entry.pending.remove(waiter)
        if was_head:
            position = self._queue.index(waiter)
            if entry.pending:
                # The caller keeps its place in the round: it did not get a turn.
                self._queue[position] = entry.pending[0]
            else:
                del self._queue[position]
        if not entry.pending:
            self._callers.pop(waiter.caller, None)
        self._schedule()

    def _schedule(self) -> None:
        """Grant every waiter that may start now, in shared-queue order."""
        if not self._queue:
            return  # nobody waits (every waiting caller's first call is in the shared queue)
        progress = True
        while progress and not self._closed:
            progress = False
            if self._running["exclusive"]:
                return
            # The earliest-arrived waiting exclusive operation is a barrier: nothing that arrived after it starts
            # before it has ended, and it starts once everything that arrived before it has ended.
            barrier = min(
                (w.seq for c in self._callers.values() for w in c.pending if w.op_class == "exclusive"),
                default=None,
            )
            for waiter in list(self._queue):
                if barrier is not None and waiter.seq > barrier:
                    continue
                if waiter.op_class == "exclusive":
                    earlier_waiting = any(
                        w.seq < waiter.seq for c in self._callers.values() for w in c.pending
                    )
                    if self.in_flight or earlier_waiting:
                        continue
                elif waiter.op_class == "serial" and self._running["serial"]:
                    # A concurrent waiter further back may still pass this one: it waits only for the slot.
                    continue
                self._grant(waiter)
                progress = True
                break

    def _grant(self, waiter: _Waiter) -> None:
        if waiter.timer is not None:
            waiter.timer.cancel()
        entry = self._callers[waiter.caller]
        entry.pending.popleft()
        self._queue.remove(waiter)
        if entry.pending:
            # The caller's next call joins the back once this one has its turn: round-robin across callers.
            self._queue.append(entry.pending[0])
        else:
            del self._callers[waiter.caller]
        self._running[waiter.op_class] += 1
        self._idle.clear()
        waiter.future.set_result(None)

    def _release(self, op_class: str) -> None:
        self._running[op_class] -= 1
        if not self.in_flight:
            self._idle.set()
        self._schedule()

    async def _granted(self, fn: Callable[[], Awaitable[T]], op_class: str) -> T:
        _HELD.set(_HELD.get() | {id(self)})
        try:
            return await fn()
        finally:
            self._release(op_class)

    def _op_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        # A caller that gave up never reads the result; read it here so the loop does not report it unretrieved.
        if not task.cancelled():
            task.exception()


# -- the lease a gate guards, and the views that hold it: what every session backend (ORS, Harbor) shares -----------------------------------------------------------------------------


class SharedLease:
    """A live backend (an environment session, a sandbox) with its gate, shared by every view forked `shared`.

    The last view to release it starts `_close` in a task, shielded: cancelling the caller must not cut the drain
    and the teardown short.
    """

    def __init__(self, gate: Gate, label: str) -> None:
        self.gate = gate
        self.label = label
        self.refs = 1
        self.closed = False
        self._closing: asyncio.Task[None] | None = None

    async def release(self) -> None:
        self.refs -= 1
        if self.refs > 0:
            return
        if self._closing is None:
            self.closed = True
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        raise NotImplementedError

    async def _drain_gate(
        self, timeout_s: float, logger: logging.Logger, *, then: str, close_gate: bool = True
    ) -> None:
        """Let the calls in flight land (at most `timeout_s`); with `close_gate`, close the gate and cancel what is
        still running, saying so (`then`) on the backend's own logger."""
        drained = await self.gate.drain(timeout_s)
        if close_gate:
            self.gate.close()
            if not drained:
                logger.warning("%s: calls still running after %g s; %s", self.label, timeout_s, then)
                self.gate.cancel_in_flight()


class SessionView:
    """A session as a harness holds it: a view of a `SharedLease`, closed once; the last view closes the lease."""

    #: calls go through this session's own gate; the runtime need not serialise them
    manages_concurrency = True

    def __init__(self, lease: Any, task: Task) -> None:
        self._lease = lease
        self._task = task
        self._closed = False

    @property
    def task(self) -> Task:
        return self._task

    async def close(self) -> None:
        """Release this view; the last one closes what it holds."""
        if self._closed:
            return
        self._closed = True
        await self._lease.release()
