"""`platoon prepare`, and commands whose machinery is built in a later release step: each of those says so in one
line and exits 1. They are registered now so that `platoon --help` shows the whole command line; none of them
pretends to work.
"""

from __future__ import annotations

from typing import Annotated

import typer

from platoon.cli.output import err

NOT_AVAILABLE = 1


def not_available(command: str, what: str) -> int:
    err(f"`platoon {command}` is not available yet in this build; it arrives with {what}")
    return NOT_AVAILABLE


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


def viz(argv: list[str]) -> int:
    """`platoon viz tail|replay|show-dump` bypasses typer: the viewer parses its own arguments."""
    from platoon.viz.cli import main

    return main(argv, prog="platoon viz")
