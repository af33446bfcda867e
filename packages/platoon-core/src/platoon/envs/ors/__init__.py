"""ORS (OpenReward) environment services: `python://pkg.mod:EnvClass` runs an environment class in process.

This module is what the `python` entry point of `platoon.services` names, so it stays light: the service lives in
`platoon.envs.ors.inprocess`, imported when a rollout builds it, and the openreward SDK only when a class loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from platoon.hookspecs import ServiceFactory, hookimpl

if TYPE_CHECKING:  # pragma: no cover
    from platoon.envs.ors.inprocess import InProcessOrsService as InProcessOrsService
    from platoon.envs.ors.inprocess import InProcessOrsSession as InProcessOrsSession
    from platoon.envs.ors.inprocess import InvalidCall as InvalidCall

__all__ = ["InProcessOrsService", "InProcessOrsSession", "InvalidCall"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from platoon.envs.ors import inprocess

        return getattr(inprocess, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@hookimpl
def platoon_register_services(name: str) -> ServiceFactory | None:
    """The `python://` scheme: an OpenReward environment class run in process."""
    if name != "python":
        return None
    return ServiceFactory(
        "python",
        "an OpenReward environment class run in process: python://pkg.module:Class",
        "platoon.envs.ors.inprocess:InProcessOrsService",
    )
