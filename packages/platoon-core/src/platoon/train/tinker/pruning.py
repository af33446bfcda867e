"""`checkpoint.keep_recovery` pruning: after each recovery save, delete older recovery checkpoints
through the REST delete call of a separate Tinker session. `CheckpointLog.plan` decides what may go; this module
deletes, records `checkpoints_deleted.jsonl`, and stops for the start when the service cannot delete.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from platoon.train.tinker.checkpoints import CheckpointLog

__all__ = ["Pruner"]

log = logging.getLogger("platoon.train")

#: HTTP answers meaning the service has no delete route: pruning stops for this start
_NO_DELETE = (405, 501)
_DELETE_TIMEOUT_SECONDS = 330.0
_MAX_DELETE_FAILURES = 3


def _http_status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


class Pruner:
    """`checkpoint.keep_recovery` pruning: after each recovery save, delete older recovery
    checkpoints through the REST delete call; the protected ones (permanent, the resume point, the newest
    `keep_recovery`, those rollouts may still sample) are never planned for deletion by `CheckpointLog.plan`.

    `delete(path)` deletes one checkpoint (`tinker_sdk.checkpoint_deleter`: the SDK's REST delete call)."""

    def __init__(
        self,
        log_: CheckpointLog,
        keep: int | None,
        max_staleness: int | None,
        delete: Callable[[str], Awaitable[Any]],
    ) -> None:
        self.log = log_
        self.keep = keep
        self.max_staleness = max_staleness
        self._delete_checkpoint = delete
        self.active = keep is not None
        self.deleted = 0
        self.failures = 0
        self._consecutive = 0
        self._deleted_something = False
        self.recovery_kept = 0.0

    async def prune(self, current_version: int, versions_in_use: Iterable[int] | None = None) -> None:
        """One pass: plan against the current version and the versions running rollouts sample, then delete."""
        if not self.active or self.keep is None:
            return
        plan = self.log.plan(
            self.keep,
            sampling_versions_in_use=list(versions_in_use)
            if versions_in_use is not None
            else [current_version],
            current_version=current_version,
            max_staleness=self.max_staleness,
        )
        self.recovery_kept = float(plan.recovery_kept)
        for deletion in plan.delete:
            for path in deletion.paths:
                if not self.active:
                    return
                await self._delete(path, deletion.name, deletion.policy_version)

    async def _delete(self, path: str, name: str, version: int | None) -> None:
        try:
            await asyncio.wait_for(self._delete_checkpoint(path), _DELETE_TIMEOUT_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            status = _http_status(exc)
            if status in _NO_DELETE:
                self._stop(f"the service does not delete checkpoints (HTTP {status})")
                return
            # A 404 means "already gone" only once this service has shown it deletes at all.
            if status == 404 and self._deleted_something:
                self.log.record_deleted(path, name=name, policy_version=version, result="absent")
                self._consecutive = 0
                return
            self.failures += 1
            self._consecutive += 1
            log.warning("deleting checkpoint %s failed: %s: %s", path, type(exc).__name__, exc)
            if self._consecutive >= _MAX_DELETE_FAILURES:
                self._stop(f"{_MAX_DELETE_FAILURES} deletions failed in a row")
            return
        self.log.record_deleted(path, name=name, policy_version=version, result="deleted")
        self.deleted += 1
        self._deleted_something = True
        self._consecutive = 0

    def _stop(self, why: str) -> None:
        log.warning("checkpoint pruning stops for this start: %s", why)
        self.active = False

    def metrics(self) -> dict[str, float]:
        if self.keep is None:
            return {}
        return {
            "checkpoint/deleted": float(self.deleted),
            "checkpoint/delete_failures": float(self.failures),
            "checkpoint/pruning": 1.0 if self.active else 0.0,
            "checkpoint/recovery_kept": self.recovery_kept,
        }
