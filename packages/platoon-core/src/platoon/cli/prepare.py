"""`platoon prepare` and the `--prepare` of train, eval and rollout: make what a config needs once per site."""

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
    from platoon.prepare import run_prepare

    return run_prepare(config, overrides or [], dry_run=dry_run)


def prepare_first(config: str, overrides: list[str] | None) -> int:
    """`--prepare` of train, eval and rollout: prepare with its lines on stderr; 0 when ready."""
    from platoon.prepare import run_prepare

    return run_prepare(config, overrides or [], out=err)
