"""platoon-sandbox's hook implementations: the light module its entry points name (imported only when named)."""

from __future__ import annotations

from platoon.hookspecs import CommandGroup, hookimpl


@hookimpl
def platoon_register_commands(name: str) -> CommandGroup | None:
    if name == "sandbox":
        return CommandGroup("sandbox", "sandbox reaping", "platoon_sandbox.cli:app")
    return None
