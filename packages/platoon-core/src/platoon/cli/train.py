"""`platoon train CONFIG [k=v ...] [--prepare]`: resolve the config, refuse what cannot train (exit
78) before anything is written, then start the Tinker training loop (`platoon.startup.training_start`) in process, or
in supervised child starts that restart from the newest checkpoint when `watchdog.max_restarts > 0`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from platoon.cli.output import err
from platoon.errors import EX_CONFIG

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
    from platoon.startup.supervised_start import supervised_training
    from platoon.startup.training_start import train as run_training
    from platoon.train.tinker.supervised import install_signal_contract, restore_signals

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
        return supervised_training(resolved, loaded)
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
