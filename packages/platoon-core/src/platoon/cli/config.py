"""`platoon config show|validate` (placeholder until the loader lands)."""

from __future__ import annotations

from platoon.cli.output import new_app

app = new_app("Show and validate configs.")


@app.command()
def show(config: str) -> int:
    """Print a config as a run resolves it."""
    return 1
