"""The recording model gateway: render, sample, parse and record every model call.

Light to import: names are resolved from their modules on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platoon._lazy import lazy_exports

_CORE = "platoon.gateway.core"
_RECORDS = "platoon.gateway.records"

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        [
            "AgentClosed",
            "AuthenticationFailed",
            "ContextWindowExceeded",
            "GatewayError",
            "InvalidRequest",
            "ModelGateway",
            "PermissionDenied",
            "RolloutRecorder",
            "SampleTimeout",
            "SamplingFailed",
            "resolve_sample_timeout",
        ],
        _CORE,
    ),
    **dict.fromkeys(["AgentRecord", "CallRecord", "Interaction"], _RECORDS),
    "build_collection": "platoon.gateway.trace",
    # a harness runner serves its rollout's gateway to the agent process (HTTP, with the MCP plane mounted)
    "GatewayServer": "platoon.gateway.http.server",
    "mount_mcp": "platoon.gateway.mcp",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)


if TYPE_CHECKING:
    from platoon.gateway.core import AgentClosed as AgentClosed
    from platoon.gateway.core import AuthenticationFailed as AuthenticationFailed
    from platoon.gateway.core import ContextWindowExceeded as ContextWindowExceeded
    from platoon.gateway.core import GatewayError as GatewayError
    from platoon.gateway.core import InvalidRequest as InvalidRequest
    from platoon.gateway.core import ModelGateway as ModelGateway
    from platoon.gateway.core import PermissionDenied as PermissionDenied
    from platoon.gateway.core import RolloutRecorder as RolloutRecorder
    from platoon.gateway.core import SampleTimeout as SampleTimeout
    from platoon.gateway.core import SamplingFailed as SamplingFailed
    from platoon.gateway.core import resolve_sample_timeout as resolve_sample_timeout
    from platoon.gateway.http.server import GatewayServer as GatewayServer
    from platoon.gateway.mcp import mount_mcp as mount_mcp
    from platoon.gateway.records import AgentRecord as AgentRecord
    from platoon.gateway.records import CallRecord as CallRecord
    from platoon.gateway.records import Interaction as Interaction
    from platoon.gateway.trace import build_collection as build_collection
