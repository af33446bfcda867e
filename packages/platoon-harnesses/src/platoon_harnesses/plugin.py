"""platoon-harnesses's hook implementations: the light module its entry points name (imported only when named)."""

from __future__ import annotations

from platoon.hookspecs import CommandGroup, hookimpl


@hookimpl
def platoon_register_commands(name: str) -> CommandGroup | None:
    if name == "toolchain":
        return CommandGroup("toolchain", "toolchain builds", "platoon_harnesses.cli:app")
    return None
