"""`platoon prepare`: make what a config needs once per site (`platoon.startup.prepare`; the `--prepare` of train,
eval and rollout runs the same through the start-up preamble)."""

from __future__ import annotations

from typing import Annotated

import typer

from platoon.cli.output import err

ConfigArg = Annotated[
    str, typer.Argument(metavar="CONFIG", help="The run's config file.", show_default=False)
]
Overrides = Annotated[
    list[str] | None, typer.Argument(metavar="[K=V]...", help="k=v overrides.", show_default=False)
]


def prepare(
    config: ConfigArg,
    overrides: Overrides = None,
    dry_run: Annotated[bool, typer.Option(help="Say what would be made; change nothing.")] = False,
) -> int:
    """Make what a config needs once per site (datasets, images, toolchains, tokenizer)."""
    from platoon.startup.prepare import run_prepare

    return run_prepare(config, overrides or [], dry_run=dry_run, err=err)
