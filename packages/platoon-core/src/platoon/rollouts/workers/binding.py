"""The model binding: the trainer publishes its sampling client and policy version to
`model_binding.pkl`; a worker's `FollowingSampler` samples from the newest one it has read and remembers every
version it actually sampled, so the member's version is the oldest of them. With in-flight sampling the worker keeps
the client its rollout started with (the service moves it to new weights) and records each sample's range of
versions, up to the `newest` version the trainer announced (before each publication) when the sample completed.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from platoon.gateway import tinker_sdk
from platoon.rollouts.inflight import SampledCall, record_sample
from platoon.rollouts.workers.ipc import PROTOCOL_VERSION, write_private

__all__ = ["FollowingSampler", "binding_blob", "load_binding", "publish_binding"]

log = logging.getLogger(__name__)


def binding_blob(sampler: Any, version: int, *, newest: int | None = None, inflight: bool = False) -> bytes:
    """The pickled binding: the Tinker SDK pickles a `SamplingClient` as its session, sampler id, URL and key.
    `inflight`: the client is an in-flight one; `newest`: the newest version that may be live under it."""
    payload: dict[str, Any] = {"protocol": PROTOCOL_VERSION, "version": int(version)}
    if inflight:
        # The client pickled apart: a worker reads the newest version after every sample without unpickling it.
        payload.update(
            inflight=True,
            newest=int(version if newest is None else newest),
            sampler_pickle=pickle.dumps(sampler),
        )
    else:
        payload["sampler"] = sampler
    return pickle.dumps(payload)


def publish_binding(
    path: Path, sampler: Any, version: int, *, newest: int | None = None, inflight: bool = False
) -> bytes:
    """Write the binding atomically (0600); returns the blob, which requests carry as their bootstrap copy."""
    blob = binding_blob(sampler, version, newest=newest, inflight=inflight)
    write_private(path, blob)
    return blob


def load_binding(blob: bytes) -> tuple[Any, int]:
    """(sampler, version) of a binding blob; ValueError when it is not one of this protocol."""
    payload = pickle.loads(blob)
    if not isinstance(payload, dict) or payload.get("protocol") != PROTOCOL_VERSION:
        raise ValueError("not a model binding of worker protocol 2")
    version = payload.get("version")
    if isinstance(version, int) and isinstance(payload.get("sampler_pickle"), bytes):
        return pickle.loads(payload["sampler_pickle"]), version
    if not isinstance(version, int) or "sampler" not in payload:
        raise ValueError("the model binding has no sampler or version")
    return payload["sampler"], version


def binding_newest(blob: bytes) -> int | None:
    """The newest version an in-flight binding announces; None for a snapshot binding."""
    payload = pickle.loads(blob)
    newest = payload.get("newest") if isinstance(payload, dict) and payload.get("inflight") else None
    return newest if isinstance(newest, int) else None


class FollowingSampler:
    """A sampler that follows the published binding: re-checks the file's (inode, mtime, size) at most every
    `poll_seconds` and reloads it on change; a file that cannot be read keeps the previous client."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        client: Any,
        version: int,
        poll_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = os.fspath(path)
        self._client = client
        self._version = version
        self._poll = poll_seconds
        self._clock = clock
        self._next_check = 0.0
        self._seen: tuple[int, int, int] | None = None
        self._sampled: set[int] = set()
        self.reloads = 0
        #: in-flight: the newest version announced (None: snapshot samplers, swapped on each publication)
        self.newest: int | None = None
        #: in-flight: every sample's range of versions and sequence ids
        self.calls: list[SampledCall] = []

    @property
    def version(self) -> int:
        """The version of the client the next sample goes to."""
        return self._version

    @property
    def versions_sampled(self) -> tuple[int, ...]:
        return tuple(sorted(self._sampled))

    def oldest_version(self) -> int:
        """The oldest version a sample came from; the current version when nothing was sampled."""
        return min(self._sampled) if self._sampled else self._version

    def follow_inflight(self, newest: int | None) -> None:
        """Keep the current client for good (an in-flight one) and record samples' versions up to `newest`."""
        self.newest = newest

    def refresh(self, *, now_or_never: bool = False) -> None:
        """Reload the binding if the file changed and the poll interval has passed (`now_or_never`: at once)."""
        now = self._clock()
        if now < self._next_check and not now_or_never:
            return
        self._next_check = now + self._poll
        try:
            info = os.stat(self._path)
        except OSError:
            return  # not published yet, or being replaced: keep what we have
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        if key == self._seen:
            return
        self._seen = key
        try:
            with open(self._path, "rb") as handle:
                blob = handle.read()
            if self.newest is not None:  # in-flight: the client stays; only the newest version moves
                self.newest = max(self.newest, binding_newest(blob) or self.newest)
                return
            client, version = load_binding(blob)
        except Exception as exc:  # a corrupt or foreign file keeps the previous client
            log.warning(
                "the published sampling client is unreadable (%s: %s); keeping version %d",
                type(exc).__name__,
                exc,
                self._version,
            )
            return
        if version == self._version:
            return
        log.info("following the sampling client of policy version %d (was %d)", version, self._version)
        self._client, self._version = client, version
        self.reloads += 1

    async def sample_async(self, *args: Any, **kwargs: Any) -> Any:
        self.refresh()
        client, version = self._client, self._version
        response = await tinker_sdk.sample(client, *args, **kwargs)
        self._sampled.add(version)
        if self.newest is not None:
            self.refresh(now_or_never=True)  # the newest version announced by the time the sample came back
            record_sample(response, version, self.newest, self.calls)
        return response

    def __getattr__(self, name: str) -> Any:
        # anything else a caller asks of the sampler goes to the current client
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._client, name)
