"""In-flight sampling and sample cancellation on the local server.

A training model's in-flight sampling sessions share one mutable weights target: each `kind: inflight` save puts a
frozen copy of the current weights there and counts a new weights version (1, 2, ... per training model). A sample
request of an in-flight session runs on the target's weights as they are when the request starts on the engine, and
the server keeps the version it ran on under the request's id (its sequence ids are `<request id>:<index>`), for
platoon's trainer to read back by sequence id (SDK 0.38 reads sample answers as protobuf, which has no room for it). A cancelled sample request is skipped while
queued and stopped between two decoded tokens.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "InflightSampler",
    "InflightTarget",
    "SampleCancelled",
    "SampleVersions",
    "cancellable",
    "raise_if_cancelled",
    "running_request",
]

#: the requests whose versions are kept for lookup: a trainer reads a rollout's back when the rollout ends
KEPT_REQUESTS = 200_000

#: the id and cancel flag of the request the current lane thread runs
_RUNNING: contextvars.ContextVar[tuple[str, threading.Event] | None] = contextvars.ContextVar(
    "local_tinker_running_request", default=None
)


class SampleCancelled(Exception):
    """The sample request was cancelled (`/cancel_future`) while it ran: its answer is this error."""


@contextlib.contextmanager
def cancellable(request_id: str, flag: threading.Event) -> Iterator[None]:
    """Run request `request_id` under `flag`: `raise_if_cancelled` inside it stops once the flag is set."""
    token = _RUNNING.set((request_id, flag))
    try:
        yield
    finally:
        _RUNNING.reset(token)


def raise_if_cancelled() -> None:
    """Raise `SampleCancelled` when the running request was cancelled (the decode loop asks after each token)."""
    running = _RUNNING.get()
    if running is not None and running[1].is_set():
        raise SampleCancelled("the sample request was cancelled")


def running_request() -> str | None:
    """The id of the request the current lane thread runs."""
    running = _RUNNING.get()
    return running[0] if running is not None else None


class InflightTarget:
    """The shared weights of one training model's in-flight sessions and the version they are at."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backend: Any = None
        self.version = 0

    def publish(self, backend: Any) -> int:
        """Make `backend` (a frozen copy of the trained weights) the target's weights; returns its version."""
        with self._lock:
            self._backend = backend
            self.version += 1
            return self.version

    def current(self) -> tuple[Any, int]:
        """The weights sample requests starting now run on, and their version."""
        with self._lock:
            return self._backend, self.version


class SampleVersions:
    """The weights versions each in-flight sample request ran on, by request id; the oldest are forgotten first."""

    def __init__(self, keep: int = KEPT_REQUESTS) -> None:
        self._lock = threading.Lock()
        self._keep = keep
        self._versions: OrderedDict[str, list[int]] = OrderedDict()
        #: the request each answered sequence id belongs to (the ids a sample's answer gave its sequences)
        self._requests: OrderedDict[str, str] = OrderedDict()

    def record(self, request_id: str, versions: list[int]) -> None:
        with self._lock:
            self._versions[request_id] = list(versions)
            while len(self._versions) > self._keep:
                self._versions.popitem(last=False)

    def name(self, request_id: str, sequence_ids: Iterable[str]) -> None:
        """Remember that `sequence_ids` are the sequences of request `request_id` (as its answer said)."""
        with self._lock:
            for sequence_id in sequence_ids:
                self._requests[sequence_id] = request_id
            while len(self._requests) > self._keep:
                self._requests.popitem(last=False)

    def lookup(self, sequence_ids: Iterable[str]) -> dict[str, list[int] | None]:
        """Each sequence's versions (by its request); None for one the server does not know (not in-flight, or
        forgotten)."""
        with self._lock:
            return {
                sequence_id: self._versions.get(self._requests.get(sequence_id, ""))
                for sequence_id in sequence_ids
            }


class InflightSampler:
    """What an in-flight sampling session samples with: the target's weights of the moment, version recorded."""

    def __init__(self, target: InflightTarget, versions: SampleVersions) -> None:
        self.target = target
        self.versions = versions
        #: the version the session was created at: its samples run on it or newer
        self.created_version = target.version
        #: the version each of its finished samples ran on, in order
        self.served: list[int] = []

    def sample(self, prompt_tokens: list[int], **kwargs: Any) -> dict[str, Any]:
        backend, version = self.target.current()
        out: dict[str, Any] = backend.sample(prompt_tokens, **kwargs)
        # Recorded only once the sample finished: a cancelled or failed request has no versions to read.
        request_id = running_request()
        if request_id is not None:
            self.versions.record(request_id, [version])
        self.served.append(version)
        return {**out, "weights_versions": [version]}
