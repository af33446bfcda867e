"""The policy handle: the sampler rollouts sample now, its policy version, the versions that
running rollouts still sample (which `checkpoint.keep_recovery` must not prune), and the publication of every new
sampler to rollout workers in process isolation.

The version counts batches that applied at least one optimizer step; a step whose objective was zero keeps it, so
it does not age other rollouts.
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
        self, sampler: Any, version: int, *, publish: Callable[[Any, int], None] | None = None
    ) -> None:
        self.sampler = sampler
        self.version = version
        self._publish = publish
        self._sampling: Counter[int] = Counter()
        if publish is not None:
            publish(sampler, version)

    def update(self, sampler: Any, *, advanced: bool) -> None:
        """Make `sampler` the current one; `advanced` (the batch applied an optimizer step) bumps the version."""
        if advanced:
            self.version += 1
        self.sampler = sampler
        self.republish()

    def republish(self) -> None:
        """Publish the current sampler again (the evaluation loop does before its rollouts)."""
        if self._publish is None:
            return
        try:
            self._publish(self.sampler, self.version)
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
        """The versions running rollouts sample, and the current one."""
        return sorted({self.version, *self._sampling})
