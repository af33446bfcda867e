"""`platoon train CONFIG [k=v ...] [--prepare]` (core.md 3.3): resolve the config, refuse what cannot train (exit
78) before anything is written, then run the Tinker training loop (`platoon.train.tinker.trainer`) in process.
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

    from platoon.cli.config import deprecation_lines
    from platoon.config import load_config
    from platoon.config.site import describe_site
    from platoon.train.tinker.config_defs import PlatoonTinkerRLTrainerConfig
    from platoon.train.tinker.credentials import check_tinker_key
    from platoon.train.tinker.trainer import train as run_training

    loaded = load_config(config, overrides or [], kind="train")
    for line in deprecation_lines(loaded):
        err(line)
    for line in describe_site(loaded.site, loaded.site_gave, looked_at=loaded.site_looked_at):
        err(line)
    resolved = loaded.config
    if not isinstance(resolved, PlatoonTinkerRLTrainerConfig):
        err(f"{config}: not a training config (its schema is {loaded.schema_name})")
        return EX_CONFIG
    # The key check comes before anything is prepared or written (core.md 3.3 step 3).
    check_tinker_key(resolved.tinker_base_url)
    if prepare:
        err("--prepare: `platoon prepare` is not available yet in this build; run without --prepare")
        return 1
    try:
        return asyncio.run(run_training(resolved, loaded=loaded))
    except KeyboardInterrupt:
        err("interrupted")
        return 130
