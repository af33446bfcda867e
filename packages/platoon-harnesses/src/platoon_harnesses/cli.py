"""`platoon toolchain ...`: registered so the command line is complete; `build` says it is not available yet."""

from __future__ import annotations

from platoon.cli.output import new_app
from platoon.cli.pending import not_available

app = new_app("Toolchains for harnesses that run inside task sandboxes.")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def build() -> int:
    """Build the toolchains of TOML-spec harnesses."""
    return not_available("toolchain build", "toolchain building")
