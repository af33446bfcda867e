"""The policy handle: the sampler rollouts sample now, its policy version, the versions that
running rollouts still sample (which `checkpoint.keep_recovery` must not prune), and the publication of every new
sampler to rollout workers in process isolation.

The version counts batches that applied at least one optimizer step; a step whose objective was zero keeps it, so
it does not age other rollouts. With in-flight sampling the sampler is the newest in-flight client (running rollouts
keep theirs, which the service moves to new weights) and `newest` is announced before each publication, so a sample
that completes while new weights go live counts them among the versions it may have run on.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["PolicyHandle"]

log = logging.getLogger("platoon.train")


class PolicyHandle:
    """The current sampler and its version, shared by the trainer, the rollouts and the evaluation loop.

    `publish(sampler, version)` (process isolation: the workers' binding file) is called for every new sampler;
    the first publication raising is fatal (the workers could sample nothing), later ones are logged.
    """

    def __init__(
        self,
        sampler: Any,
        version: int,
        *,
        publish: Callable[..., None] | None = None,
        inflight: bool = False,
    ) -> None:
        self.sampler = sampler
        self.version = version
        #: the newest version whose weights may be live (in-flight: raised before each publication)
        self.newest = version
        self.inflight = inflight
        self._publish = publish
        self._sampling: Counter[int] = Counter()
        if publish is not None:
            self._send()

    def _send(self) -> None:
        assert self._publish is not None
        if self.inflight:
            self._publish(self.sampler, self.version, newest=self.newest, inflight=True)
        else:
            self._publish(self.sampler, self.version)

    def announce(self, version: int) -> None:
        """In-flight: weights of `version` are about to go live under the clients rollouts already hold."""
        self.newest = max(self.newest, version)
        self.republish()

    def update(self, sampler: Any, *, advanced: bool) -> None:
        """Make `sampler` the current one; `advanced` (the batch applied an optimizer step) bumps the version."""
        if advanced:
            self.version += 1
        self.sampler = sampler
        self.newest = max(self.newest, self.version)
        self.republish()

    def republish(self) -> None:
        """Publish the current sampler again (the evaluation loop does before its rollouts)."""
        if self._publish is None:
            return
        try:
            self._send()
        except Exception as exc:  # the workers keep following the previous binding
            log.warning("publishing policy version %d to the rollout workers failed: %s", self.version, exc)

    @contextlib.contextmanager
    def sampling(self) -> Iterator[int]:
        """Hold the current version while a rollout samples it; yields the version."""
        version = self.version
        self._sampling[version] += 1
        try:
            yield version
        finally:
            self._sampling[version] -= 1
            if self._sampling[version] <= 0:
                del self._sampling[version]

    def versions_in_use(self) -> list[int]:
        """The versions running rollouts sample, and the current one (in-flight: only the current one, as no
        rollout samples a saved checkpoint)."""
        if self.inflight:
            return [self.version]
        return sorted({self.version, *self._sampling})
