"""`POST /v1/platoon/agents` (minting a child of the calling agent), `GET /v1/models` and `GET /healthz`.

Minted children share their parent's gateway-enforced step budget; minting is capped per rollout
(`PLATOON_MAX_MINTED_AGENTS`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from platoon.gateway.core import AgentClosed, GatewayError, PermissionDenied
from platoon.gateway.http.openai_chat import handle_errors

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from platoon.gateway.http.common import DialectServer
    from platoon.gateway.records import AgentRecord

__all__ = ["health_endpoint", "mint_endpoint", "models_endpoint"]


def health_endpoint(server: DialectServer) -> Callable[[Request], Awaitable[Response]]:
    """`GET /healthz` (no auth): `{"status": "ok", "model": <model>}`."""
    body = {"status": "ok", "model": server.gateway.model_name}

    async def healthz(request: Request) -> Response:
        return server.json(body)

    return healthz


def models_endpoint(server: DialectServer) -> Callable[[Request], Awaitable[Response]]:
    """`GET /v1/models` (authenticated): the one served model."""
    body = {
        "object": "list",
        "data": [{"id": server.gateway.model_name, "object": "model", "created": 0, "owned_by": "platoon"}],
    }

    async def models(request: Request, seen: list[AgentRecord | None]) -> Response:
        seen[0] = server.authenticate(request)
        return server.json(body)

    return handle_errors(server, models)


def mint_endpoint(server: DialectServer) -> Callable[[Request], Awaitable[Response]]:
    """`POST /v1/platoon/agents` `{role, goal?}` -> 201 `{agent_id, api_key, base_url}`: a child of the caller."""

    async def mint(request: Request, seen: list[AgentRecord | None]) -> Response:
        parent = seen[0] = server.authenticate(request)
        body = await server.json_body(request)
        role = body.get("role", "policy")
        if not isinstance(role, str) or not role:
            raise GatewayError("role must be a non-empty string")
        goal = body.get("goal")
        if goal is not None and not isinstance(goal, str):
            raise GatewayError("goal must be a string")
        gateway = server.gateway
        try:
            rollout = gateway.rollout(parent.rollout_id)
        except KeyError:
            raise AgentClosed("this agent's rollout is no longer open") from None
        minted = server.minted.get(rollout.rollout_id, 0)
        if minted >= server.max_minted_agents:
            raise PermissionDenied(
                f"this rollout already minted {minted} agents over HTTP, the cap (PLATOON_MAX_MINTED_AGENTS)"
            )
        child = gateway.open_agent(rollout, parent=parent, role=role, goal=goal)
        gateway.share_call_cap(parent, child)
        server.minted[rollout.rollout_id] = minted + 1
        # The child's URL as the parent reached the server: the same origin, the path form if the parent used it.
        host = request.headers.get("host") or f"{server.host}:{server.port}"
        scoped = f"/s/{child.secret}" if "secret" in request.path_params else ""
        base_url = f"{request.url.scheme}://{host}{scoped}/v1"
        return server.json(
            {"agent_id": child.agent_id, "api_key": child.secret, "base_url": base_url}, status=201
        )

    return handle_errors(server, mint)
