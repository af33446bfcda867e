"""platoon-harbor's hook implementations: the light module its entry points name (imported only when named)."""

from __future__ import annotations

from platoon.hookspecs import CommandGroup, ServiceFactory, hookimpl


@hookimpl
def platoon_register_commands(name: str) -> CommandGroup | None:
    if name == "harbor":
        return CommandGroup("harbor", "the Harbor service (fetch, verify, images)", "platoon_harbor.cli:app")
    return None


@hookimpl
def platoon_register_services(name: str) -> ServiceFactory | None:
    if name == "harbor":
        return ServiceFactory(
            "harbor",
            "Harbor task directories graded by their own tests",
            "platoon_harbor.service:HarborService",
        )
    return None
