"""In-flight sampling for rollouts (`train.sampling_client_kind: inflight`): a rollout keeps the sampling client it
started with (and so its session's cache) while the trainer publishes new weights under it, and records, for every
sample, the policy versions that sample may have run on.

A sample's record is a range: at least the version its client was created at (the service guarantees that or
newer), at most the newest version published when it completed; with the sequence ids the service answered, the
trainer narrows it to the exact version where the service says (platoon's local server does).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from platoon.gateway import tinker_sdk

__all__ = ["InflightSampler", "RolloutSamples", "SampledCall", "record_sample", "recording_samples"]


@dataclass(frozen=True)
class SampledCall:
    """One sample of a rollout: the policy versions it may have run on, and the sequence ids the service answered."""

    lowest: int
    highest: int
    sequence_ids: tuple[str, ...] = ()


#: the samples of the rollout that runs in this context, and the client it samples (None: nobody records)
_ROLLOUT: contextvars.ContextVar[RolloutSamples | None] = contextvars.ContextVar(
    "platoon_inflight_rollout", default=None
)


@dataclass
class RolloutSamples:
    """One rollout's in-flight client (and the policy version it was created at) and its recorded samples."""

    client: Any = None
    version: int = 0
    calls: list[SampledCall] = field(default_factory=list)


@contextlib.contextmanager
def recording_samples(client: Any = None, version: int = 0) -> Iterator[RolloutSamples]:
    """Record the samples of the rollout run inside: the gateway binds the rollout it opens in this context to
    `client` (None: the newest client when it opens), whatever is published meanwhile."""
    samples = RolloutSamples(client, version)
    token = _ROLLOUT.set(samples)
    try:
        yield samples
    finally:
        _ROLLOUT.reset(token)


def record_sample(response: Any, lowest: int, highest: int, into: list[SampledCall]) -> None:
    """Record one answered sample: the versions it may have run on, and its sequence ids."""
    sequences: Sequence[Any] = getattr(response, "sequences", None) or ()
    ids = tuple(str(i) for i in (getattr(seq, "sequence_id", None) for seq in sequences) if i)
    into.append(SampledCall(lowest, max(lowest, highest), ids))


class _BoundSampler:
    """A rollout's view of the in-flight sampler: its own client throughout, each sample recorded."""

    def __init__(self, samples: RolloutSamples, newest: Callable[[], int]) -> None:
        self._samples = samples
        self._newest = newest

    async def sample_async(self, *args: Any, **kwargs: Any) -> Any:
        samples = self._samples
        response = await tinker_sdk.sample(samples.client, *args, **kwargs)
        record_sample(response, samples.version, self._newest(), samples.calls)
        return response

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._samples.client, name)


class InflightSampler:
    """The trainer's sampler for in-process rollouts: the gateway binds each rollout it opens (`for_rollout`) to the
    in-flight client of that moment, which the rollout keeps; samples outside a rollout go to the newest client.

    `current()` gives the newest (client, version) published; `newest()` the newest version that may be live, which
    the trainer raises before it publishes (so a sample completing during a publication counts it).
    """

    def __init__(self, current: Callable[[], tuple[Any, int]], newest: Callable[[], int]) -> None:
        self._current = current
        self._newest = newest

    def for_rollout(self) -> _BoundSampler:
        samples = _ROLLOUT.get()
        if samples is None:
            samples = RolloutSamples()  # a rollout nobody records (an evaluation's): bound all the same
        if samples.client is None:
            samples.client, samples.version = self._current()
        return _BoundSampler(samples, self._newest)

    async def sample_async(self, *args: Any, **kwargs: Any) -> Any:
        client, _ = self._current()
        return await tinker_sdk.sample(client, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # anything else a caller asks of the sampler goes to the newest client
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._current()[0], name)
