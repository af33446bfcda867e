"""platoon-harbor's hook implementations: the light module its entry points name (imported only when named)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


# `platoon prepare` and the run-start check (platoon_harbor.prepare), through core's service seams.


@hookimpl
def platoon_service_prepare(
    service: str, options: Mapping[str, Any], cache_root: str | None, dry_run: bool, config: str | None
) -> Any:
    """A Harbor entry's `dataset`, `images` and `check` steps, yielded one by one."""
    if service != "harbor":
        return None
    from platoon_harbor.prepare import prepare_steps

    return prepare_steps(options, cache_root, dry_run=dry_run, config=config)


@hookimpl
def platoon_service_problems(
    service: str, options: Mapping[str, Any], cache_root: str | None, config: str | None
) -> list[str] | None:
    """Why a run of a Harbor entry cannot start here: its dataset not fetched, its images not built."""
    if service != "harbor":
        return None
    from platoon_harbor.prepare import run_problems

    return run_problems(options, cache_root, config=config)
