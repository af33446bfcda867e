"""In-flight sampling and sample cancellation on the local server.

A training model's in-flight sampling sessions share one mutable weights target: each `kind: inflight` save puts a
frozen copy of the current weights there and counts a new weights version (1, 2, ... per training model). A sample
request of an in-flight session runs on the target's weights as they are when the request starts on the engine, and
the server keeps the version it ran on under the request's sequence ids, for platoon's trainer to read back (SDK
0.38 reads sample answers as protobuf, which has no room for it). A cancelled sample request is skipped while
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
]

#: the versions kept for lookup: a trainer reads a rollout's back when the rollout ends
KEPT_SEQUENCES = 200_000

#: the cancel flag of the sample request the current lane thread runs
_CANCEL: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "local_tinker_sample_cancel", default=None
)


class SampleCancelled(Exception):
    """The sample request was cancelled (`/cancel_future`) while it ran: its answer is this error."""


@contextlib.contextmanager
def cancellable(flag: threading.Event) -> Iterator[None]:
    """Run a sample request under `flag`: `raise_if_cancelled` inside it stops once the flag is set."""
    token = _CANCEL.set(flag)
    try:
        yield
    finally:
        _CANCEL.reset(token)


def raise_if_cancelled() -> None:
    """Raise `SampleCancelled` when the running request was cancelled (the decode loop asks after each token)."""
    flag = _CANCEL.get()
    if flag is not None and flag.is_set():
        raise SampleCancelled("the sample request was cancelled")


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
    """The weights version each in-flight sample ran on, by sequence id; the oldest are forgotten first."""

    def __init__(self, keep: int = KEPT_SEQUENCES) -> None:
        self._lock = threading.Lock()
        self._keep = keep
        self._versions: OrderedDict[str, list[int]] = OrderedDict()

    def record(self, sequence_ids: Iterable[str], versions: list[int]) -> None:
        with self._lock:
            for sequence_id in sequence_ids:
                self._versions[sequence_id] = list(versions)
            while len(self._versions) > self._keep:
                self._versions.popitem(last=False)

    def lookup(self, sequence_ids: Iterable[str]) -> dict[str, list[int] | None]:
        """Each id's versions; None for an id the server does not know (not in-flight, or forgotten)."""
        with self._lock:
            return {sequence_id: self._versions.get(sequence_id) for sequence_id in sequence_ids}


class InflightSampler:
    """What an in-flight sampling session samples with: the target's weights of the moment, version recorded."""

    def __init__(self, target: InflightTarget, versions: SampleVersions) -> None:
        self.target = target
        self.versions = versions
        #: the version the session was created at: its samples run on it or newer
        self.created_version = target.version
        #: the version each of its finished samples ran on, in order
        self.served: list[int] = []

    def sample(self, prompt_tokens: list[int], *, sequence_ids: list[str], **kwargs: Any) -> dict[str, Any]:
        backend, version = self.target.current()
        out: dict[str, Any] = backend.sample(prompt_tokens, **kwargs)
        # Recorded only once the sample finished: a cancelled or failed request has no versions to read.
        self.versions.record(sequence_ids, [version])
        self.served.append(version)
        return {**out, "weights_versions": [version]}
