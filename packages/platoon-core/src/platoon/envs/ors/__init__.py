"""ORS (OpenReward) environment services: `python://pkg.mod:EnvClass` runs an environment class in process;
`ors+http(s)://host:port[,host:port...]/EnvName` opens sessions on environment servers.

This module is what the `python`, `ors+http` and `ors+https` entry points of `platoon.services` name, so it stays
light: the services live in `platoon.envs.ors.inprocess` and `platoon.envs.ors.remote`, imported when a rollout
builds one, and the openreward SDK only when a class loads or a server is reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platoon._lazy import lazy_exports
from platoon.hookspecs import ServiceFactory, hookimpl

if TYPE_CHECKING:  # pragma: no cover
    from platoon.envs.ors.inprocess import InProcessOrsService as InProcessOrsService
    from platoon.envs.ors.inprocess import InProcessOrsSession as InProcessOrsSession
    from platoon.envs.ors.inprocess import InvalidCall as InvalidCall

__all__ = ["InProcessOrsService", "InProcessOrsSession", "InvalidCall"]

__getattr__, __dir__ = lazy_exports(globals(), dict.fromkeys(__all__, "platoon.envs.ors.inprocess"))


@hookimpl
def platoon_register_services(name: str) -> ServiceFactory | None:
    """The `python://` scheme (an OpenReward environment class run in process) and `ors+http(s)://` (servers)."""
    if name == "python":
        return ServiceFactory(
            "python",
            "an OpenReward environment class run in process: python://pkg.module:Class",
            "platoon.envs.ors.inprocess:InProcessOrsService",
        )
    if name in ("ors+http", "ors+https"):
        return ServiceFactory(
            name,
            f"OpenReward environments on ORS servers: {name}://HOST:PORT[,HOST:PORT...]/EnvName",
            "platoon.envs.ors.remote:RemoteOrsService",
        )
    return None
