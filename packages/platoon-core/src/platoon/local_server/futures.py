"""Futures of the local Tinker server: FIFO lanes, de-duplication of retried submissions, the 408 long-poll.

Every operation the SDK polls for runs on a lane (one worker thread per training model, one for
sampling), in the order it was submitted; its answer is a result body or `{"error", "category"}`, never an HTTP 500.
A cancellable operation (a sample) that `cancel` reaches is skipped while queued, or stopped where it next asks
`raise_if_cancelled`; the store keeps the ids it cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from platoon.local_server.inflight import SampleCancelled, cancellable

logger = logging.getLogger(__name__)

#: seconds a poll waits for a result before answering 408 (the SDK's own timeout per poll is 45 s)
LONG_POLL_SECONDS = 20.0
#: seconds a finished future stays retrievable (a client re-polls after a lost response)
KEEP_SECONDS = 1800.0


class UserError(Exception):
    """A request the client got wrong: answered with category `user` (the SDK raises `RequestFailedError`)."""


#: exceptions of an operation that are the request's fault rather than the server's
USER_ERRORS: tuple[type[Exception], ...] = (
    UserError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    FileNotFoundError,
    NotImplementedError,
)


def error_body(exc: BaseException) -> dict[str, Any]:
    """The `RequestFailedResponse` body for an exception raised by an operation."""
    category = "user" if isinstance(exc, USER_ERRORS) else "server"
    message = str(exc) or type(exc).__name__
    if category == "server":
        message = f"{type(exc).__name__}: {message}"
    return {"error": message, "category": category}


@dataclass
class FutureRecord:
    """One submitted operation; `future` resolves to the JSON body `retrieve_future` answers with."""

    request_id: str
    model_id: str | None
    future: concurrent.futures.Future[dict[str, Any]] = field(default_factory=concurrent.futures.Future)
    done_at: float | None = None
    keys: tuple[Hashable, ...] = ()
    #: more fields of the submission's answer (a sample's `sample_sequence_ids`), the same for a retried submission
    extra: dict[str, Any] = field(default_factory=dict)
    #: whether `FutureStore.cancel` may stop it (only samples: the SDK cancels nothing else)
    cancellable: bool = False
    #: queued, running, done or cancelled
    state: str = "queued"
    cancel_flag: threading.Event = field(default_factory=threading.Event)

    def body(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "model_id": self.model_id, **self.extra}


_STOP = object()

#: the answer of a cancelled request (its client stopped waiting for it)
CANCELLED_BODY: dict[str, Any] = {"error": "the request was cancelled", "category": "user"}


def _resolve(record: FutureRecord, body: dict[str, Any]) -> None:
    # close() and a lane may race to answer the same record; the first answer stands.
    try:
        record.future.set_result(body)
    except concurrent.futures.InvalidStateError:
        pass


class Lane:
    """A FIFO worker: operations of one training model run one at a time in submission order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"local-tinker-{name}", daemon=True)
        self._thread.start()

    def put(
        self, record: FutureRecord, fn: Callable[[], dict[str, Any]], on_done: Callable[[], None]
    ) -> None:
        self._queue.put((record, fn, on_done))

    def stop(self) -> None:
        self._queue.put(_STOP)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            record, fn, on_done = item
            if record.future.done():  # failed by close() while queued
                continue
            if record.cancel_flag.is_set():  # cancelled while queued: the engine never sees it
                record.state = "cancelled"
                _resolve(record, CANCELLED_BODY)
                on_done()
                continue
            record.state = "running"
            try:
                with cancellable(record.request_id, record.cancel_flag):
                    result = fn()
                record.state = "done"
            except SampleCancelled:
                record.state = "cancelled"
                result = CANCELLED_BODY
            except (
                BaseException
            ) as exc:  # an operation's failure is the client's answer, not the worker's end
                record.state = "done"
                if not isinstance(exc, USER_ERRORS):
                    logger.exception("local Tinker server: %s failed", record.request_id)
                result = error_body(exc)
            _resolve(record, result)
            on_done()


class FutureStore:
    """Submitted operations by request id, de-duplicated on keys such as `(model_id, seq_id)` or an idempotency key.

    A retried submission (same key) gets the first submission's future, so a gradient is never applied twice.
    """

    def __init__(
        self, *, long_poll_seconds: float = LONG_POLL_SECONDS, keep_seconds: float = KEEP_SECONDS
    ) -> None:
        self.long_poll_seconds = long_poll_seconds
        self.keep_seconds = keep_seconds
        self._lock = threading.Lock()
        self._records: dict[str, FutureRecord] = {}
        self._by_key: dict[Hashable, FutureRecord] = {}
        self._lanes: dict[str, Lane] = {}
        self._closed = False
        #: the ids of the requests `cancel` stopped, queued or running, in the order it did
        self.cancelled: list[str] = []

    def submit(
        self,
        lane: str,
        fn: Callable[[], dict[str, Any]],
        *,
        model_id: str | None = None,
        keys: Iterable[Hashable | None] = (),
        extra: dict[str, Any] | None = None,
        cancellable: bool = False,
    ) -> tuple[FutureRecord, bool]:
        """Enqueue `fn` on `lane` (before the submission is answered, which keeps per-model order); `extra` joins the
        record's answer.

        Returns the record and whether it is new; a key seen before returns the earlier record and enqueues nothing.
        """
        wanted = tuple(k for k in keys if k is not None)
        with self._lock:
            if self._closed:
                raise RuntimeError("the local Tinker server is stopping")
            self._expire()
            for key in wanted:
                existing = self._by_key.get(key)
                if existing is not None:
                    return existing, False
            record = FutureRecord(
                request_id=f"req-{uuid.uuid4().hex}",
                model_id=model_id,
                keys=wanted,
                extra=dict(extra or {}),
                cancellable=cancellable,
            )
            self._records[record.request_id] = record
            for key in wanted:
                self._by_key[key] = record
            worker = self._lanes.get(lane)
            if worker is None:
                worker = self._lanes[lane] = Lane(lane)

        def on_done() -> None:
            record.done_at = time.monotonic()

        worker.put(record, fn, on_done)
        return record, True

    def get(self, request_id: str) -> FutureRecord | None:
        with self._lock:
            return self._records.get(request_id)

    async def retrieve(self, request_id: str, timeout: float | None = None) -> tuple[int, dict[str, Any]]:
        """`(status, body)` for `retrieve_future`: 200 with the result, 408 while not ready, 410 if unknown.

        410 ("promise expired") makes the SDK resubmit a sample, e.g. after the server restarted.
        """
        record = self.get(request_id)
        if record is None:
            return 410, {"error": f"unknown or expired request_id {request_id!r}", "category": "user"}
        wait = self.long_poll_seconds if timeout is None else timeout
        # asyncio.wait never cancels what it waits on: a timed-out poll leaves the operation running.
        wrapped = asyncio.wrap_future(record.future)
        done, _ = await asyncio.wait({wrapped}, timeout=wait)
        if not done:
            return 408, {"queue_state": "active", "queue_state_reason": None}
        return 200, record.future.result()

    def cancel(self, request_id: str) -> str | None:
        """Stop a cancellable request that has not finished; returns its state (None for an unknown id)."""
        with self._lock:
            record = self._records.get(request_id)
            if record is None:
                return None
            if (
                record.cancellable
                and record.state in ("queued", "running")
                and not record.cancel_flag.is_set()
            ):
                record.cancel_flag.set()
                self.cancelled.append(request_id)
            return record.state

    def busy_samples(self) -> list[str]:
        """The cancellable requests (samples) queued or running now."""
        with self._lock:
            return [
                r.request_id
                for r in self._records.values()
                if r.cancellable and r.state in ("queued", "running")
            ]

    def _expire(self) -> None:
        now = time.monotonic()
        stale = [
            r for r in self._records.values() if r.done_at is not None and now - r.done_at > self.keep_seconds
        ]
        for record in stale:
            del self._records[record.request_id]
            for key in record.keys:
                if self._by_key.get(key) is record:
                    del self._by_key[key]

    def drop_lane(self, lane: str) -> None:
        """Stop a lane's worker after what it already holds (an unloaded model)."""
        with self._lock:
            worker = self._lanes.pop(lane, None)
        if worker is not None:
            worker.stop()

    def close(self, timeout: float = 5.0) -> None:
        """Fail what has not run (waking every long-poll) and stop the workers."""
        with self._lock:
            self._closed = True
            records = list(self._records.values())
            lanes = list(self._lanes.values())
            self._lanes.clear()
        for record in records:
            _resolve(record, {"error": "the local Tinker server stopped", "category": "server"})
        for worker in lanes:
            worker.stop()
        deadline = time.monotonic() + timeout
        for worker in lanes:
            worker.join(max(0.0, deadline - time.monotonic()))
