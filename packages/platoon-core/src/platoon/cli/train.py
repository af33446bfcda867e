"""`platoon train CONFIG [k=v ...] [--prepare]`: resolve the config, refuse what cannot train (exit
78) before anything is written, then run the Tinker training loop (`platoon.train.tinker.trainer`) in process, or
in supervised child starts that restart from the newest checkpoint when `watchdog.max_restarts > 0`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from platoon.cli.output import err
from platoon.errors import EX_CONFIG, ConfigError

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig
    from platoon.config.training import PlatoonTinkerRLTrainerConfig

ConfigArg = Annotated[
    str, typer.Argument(metavar="CONFIG", help="The run's config file.", show_default=False)
]
Overrides = Annotated[
    list[str] | None, typer.Argument(metavar="[K=V]...", help="k=v overrides.", show_default=False)
]


def train(
    config: ConfigArg,
    overrides: Overrides = None,
    prepare: Annotated[
        bool, typer.Option(help="Prepare what the run needs on this site first (platoon prepare).")
    ] = False,
) -> int:
    """Train on a config through a Tinker-compatible service (`tinker_base_url: local` needs no key)."""
    import asyncio
    import threading

    from platoon.config import load_config
    from platoon.config.training import PlatoonTinkerRLTrainerConfig
    from platoon.gateway.tinker_service import check_tinker_key
    from platoon.startup.preamble import start_run
    from platoon.train.tinker.supervised import install_signal_contract, restore_signals
    from platoon.train.tinker.trainer import train as run_training

    loaded = load_config(config, overrides or [], kind="train")
    resolved = loaded.config
    if not isinstance(resolved, PlatoonTinkerRLTrainerConfig):
        err(f"{config}: not a training config (its schema is {loaded.schema_name})")
        return EX_CONFIG
    # The key is refused before anything is prepared or written, with --prepare or without.
    status = start_run(
        loaded,
        config,
        overrides or [],
        say=err,
        prepare=prepare,
        check_key=lambda: check_tinker_key(resolved.tinker_base_url),
    )
    if status != 0:
        return status
    if resolved.watchdog.max_restarts > 0:
        return _supervised(resolved, loaded)
    # The trainer's signal contract in process too: the first SIGINT/SIGTERM stops at the next step boundary with
    # a checkpoint (exit 130), a second one (or SIGUSR1) exits now.
    previous = install_signal_contract() if threading.current_thread() is threading.main_thread() else None
    try:
        return asyncio.run(run_training(resolved, loaded=loaded))
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    finally:
        if previous is not None:
            restore_signals(previous)


def _supervised(resolved: PlatoonTinkerRLTrainerConfig, loaded: LoadedConfig) -> int:
    """Hold the run dir, write its records, then run supervised child starts from the snapshot."""
    import os
    from pathlib import Path

    from platoon.rollouts import records
    from platoon.train.tinker.supervisor import supervise

    stats = resolved.stats
    run_dir = Path(os.path.abspath(resolved.log_path)) / stats.experiment_name / stats.trial_name
    # Refused (78) before anything is written; the child starts find this process as their parent and go on.
    problem = records.writable_dir_problem(run_dir, key="log_path")
    if problem is not None:
        raise ConfigError(problem)
    records.check_run_dir_free(run_dir)
    records.write_resolved_config(run_dir, loaded)
    records.write_lock(run_dir, loaded, [])
    records.hold_run_dir(run_dir)
    try:
        return supervise(run_dir, max_restarts=resolved.watchdog.max_restarts)
    finally:
        held = records.read_process(run_dir)
        if held is not None and held.pid == os.getpid():
            (run_dir / records.PROCESS_FILE).unlink(missing_ok=True)
