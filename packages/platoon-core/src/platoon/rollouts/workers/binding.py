"""The model binding: the trainer publishes its sampling client and policy version to
`model_binding.pkl`; a worker's `FollowingSampler` samples from the newest one it has read and remembers every
version it actually sampled, so the member's version is the oldest of them.
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
from platoon.rollouts.workers.ipc import PROTOCOL_VERSION, write_private

__all__ = ["FollowingSampler", "binding_blob", "load_binding", "publish_binding"]

log = logging.getLogger(__name__)


def binding_blob(sampler: Any, version: int) -> bytes:
    """The pickled binding: the Tinker SDK pickles a `SamplingClient` as its session, sampler id, URL and key."""
    return pickle.dumps({"protocol": PROTOCOL_VERSION, "version": int(version), "sampler": sampler})


def publish_binding(path: Path, sampler: Any, version: int) -> bytes:
    """Write the binding atomically (0600); returns the blob, which requests carry as their bootstrap copy."""
    blob = binding_blob(sampler, version)
    write_private(path, blob)
    return blob


def load_binding(blob: bytes) -> tuple[Any, int]:
    """(sampler, version) of a binding blob; ValueError when it is not one of this protocol."""
    payload = pickle.loads(blob)
    if not isinstance(payload, dict) or payload.get("protocol") != PROTOCOL_VERSION:
        raise ValueError("not a model binding of worker protocol 2")
    version = payload.get("version")
    if not isinstance(version, int) or "sampler" not in payload:
        raise ValueError("the model binding has no sampler or version")
    return payload["sampler"], version


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

    def refresh(self) -> None:
        """Reload the binding if the file changed and the poll interval has passed."""
        now = self._clock()
        if now < self._next_check:
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
                client, version = load_binding(handle.read())
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
        return response

    def __getattr__(self, name: str) -> Any:
        # anything else a caller asks of the sampler goes to the current client
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._client, name)
