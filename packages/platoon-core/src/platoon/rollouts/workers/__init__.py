"""Rollout workers: with `rollout_isolation: process`, each rollout runs `run_member` in an OS process
of its own, forked from a fork server (or started by exec), sampling the trainer's published sampling client.

`RolloutWorkers` is what the trainer uses; `sweep_orphans` stops workers whose trainer is gone. Names are
imported on first use. In a worker process this package's import also arms the startup alarm, before anything
heavy loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platoon._lazy import lazy_exports
from platoon.rollouts.workers.startup import arm_from_environment

arm_from_environment()

_EXPORTS: dict[str, str] = {
    "RolloutWorkers": "platoon.rollouts.workers.pool",
    "classify_exit": "platoon.rollouts.workers.pool",
    "rollout_budget_seconds": "platoon.rollouts.workers.pool",
    "WorkerSetupError": "platoon.rollouts.workers.ipc",
    "scratch_dir": "platoon.rollouts.workers.ipc",
    "sweep_orphans": "platoon.rollouts.workers.ipc",
    "patch_response_models": "platoon.rollouts.workers.response_patch",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)


if TYPE_CHECKING:
    from platoon.rollouts.workers.ipc import WorkerSetupError as WorkerSetupError
    from platoon.rollouts.workers.ipc import scratch_dir as scratch_dir
    from platoon.rollouts.workers.ipc import sweep_orphans as sweep_orphans
    from platoon.rollouts.workers.pool import RolloutWorkers as RolloutWorkers
    from platoon.rollouts.workers.pool import classify_exit as classify_exit
    from platoon.rollouts.workers.pool import rollout_budget_seconds as rollout_budget_seconds
    from platoon.rollouts.workers.response_patch import patch_response_models as patch_response_models
