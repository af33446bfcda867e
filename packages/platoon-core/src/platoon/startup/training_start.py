"""The start of `platoon train` in this process, in order: the local server's child started early when the start
will use it, the heartbeat, every check of `training_preflight` (a stale cached listing listed afresh), the Tinker
key and sample timeout read, then `train.tinker.trainer.run_training` from the resume point, which makes the
capability check (`startup.capabilities`) as its Tinker session opens.

A supervised child start (`python -m platoon.startup.supervised_start`) runs the same start.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from platoon.gateway.core import sample_timeout_with_source
from platoon.gateway.tinker_service import check_tinker_key, uses_local_server
from platoon.rollouts.records import read_identity
from platoon.startup.capabilities import TrainingServiceCheck
from platoon.startup.training import run_dir_of, start_problems
from platoon.startup.training_preflight import finished, preflight, relist_if_stale
from platoon.train.tinker.checkpoints import CheckpointLog
from platoon.train.tinker.heartbeat import doing, say, start_heartbeat, started_training
from platoon.train.tinker.trainer import run_training, start_local_server

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig
    from platoon.config.training import PlatoonTinkerRLTrainerConfig
    from platoon.local_server.process import LocalServerChild

__all__ = ["train"]


async def train(config: PlatoonTinkerRLTrainerConfig, *, loaded: LoadedConfig | None = None) -> int:
    """Train `config` to the end; returns the exit status. User errors raise ConfigError (78).

    A run dir whose `checkpoints.jsonl` has a resumable row resumes from it: its identity is checked (a changed
    model, renderer or hold-out is refused before any service opens), then training goes on at the next step.

    With the local server, its child starts first, once the start's own checks pass (`early_local_server`), so
    its start-up (importing torch, building the model) overlaps the listing, the records and the SDK's import.
    """
    began = time.monotonic()
    server = early_local_server(config)
    start_heartbeat()
    try:
        base_dir = loaded.path.parent if loaded is not None else Path.cwd()
        doing("listing tasks")
        checked = await preflight(config, base_dir=base_dir)
        checked = await relist_if_stale(config, checked, base_dir=base_dir)
        api_key = check_tinker_key(config.tinker_base_url)
        timeout, source = sample_timeout_with_source(
            config.train.sample_timeout_seconds, "train.sample_timeout_seconds"
        )
        say(f"sample timeout {timeout:g} s ({source})")
        service_check = TrainingServiceCheck(config)
        if server is None and not uses_local_server(config.tinker_base_url) and not finished(config, checked):
            # A service in reach now is asked before the run dir is held: a refusal leaves nothing written.
            doing("asking the Tinker service what it can do")
            base_url = config.tinker_base_url or os.environ.get("TINKER_BASE_URL") or None
            await service_check.before_training_client(base_url, api_key, early=True)
        return await run_training(
            config,
            checked,
            loaded=loaded,
            api_key=api_key,
            sample_timeout_seconds=timeout,
            server=server,
            began=began,
            service_check=service_check,
        )
    finally:
        started_training()  # the heartbeat stops, if the first step did not stop it
        if server is not None:
            await asyncio.to_thread(server.stop)


def early_local_server(config: PlatoonTinkerRLTrainerConfig) -> LocalServerChild | None:
    """The local server's child, started now when this start will use it: no refusal of the config or the
    machine, no resume that changes model or renderer, no run that looks finished (its last row is `final`: it
    would say "nothing to train"). Otherwise None, and the start starts it where it needs it, if it gets there."""
    if not uses_local_server(config.tinker_base_url) or start_problems(config):
        return None
    run_dir = run_dir_of(config)
    identity = read_identity(run_dir)
    if identity is not None and (
        identity.model != config.train.model_name or identity.renderer != config.train.renderer_name
    ):
        return None
    latest = CheckpointLog(run_dir).latest_resumable()
    if latest is not None and latest.kind == "final":
        return None
    return start_local_server(config)
