"""`platoon sandbox ...`: registered so the command line is complete; `reap` says it is not available yet."""

from __future__ import annotations

from platoon.cli.output import new_app
from platoon.cli.pending import not_available

app = new_app("Sandboxes a run started: reap what a killed run left.")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def reap() -> int:
    """Reap the sandboxes labelled with a run directory."""
    return not_available("sandbox reap", "the sandbox providers")
