"""Commands whose machinery is built in a later release step: each says so in one line and exits 1.

They are registered now so that `platoon --help` shows the whole command line; none of them pretends to work.
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


def prepare(config: ConfigArg, overrides: Overrides = None, dry_run: bool = False) -> int:
    """Make what a config needs once per site (datasets, images, toolchains, tokenizer)."""
    return not_available("prepare", "site preparation")


def viz(argv: list[str]) -> int:
    """`platoon viz tail|replay|show-dump` bypasses typer."""
    return not_available("viz", "the trajectory viewer")
