"""The MCP tool plane on the `mcp` SDK: the measured alternative to `platoon.gateway.mcp` (not used by the product).

The SDK's low-level `Server` behind its `StreamableHTTPSessionManager` in stateless mode, mounted inside the gateway
exactly where the hand-written plane goes (`/mcp`, `/s/{secret}/mcp`). Tool shapes, access filtering, the
one-call-at-a-time gate and recording are the hand-written plane's own helpers, so the two differ only in the
protocol layer. The SDK serves one response mode per manager, so two managers run: SSE when the client accepts it,
JSON otherwise. benchmarks/mcp_plane.py measures it; `PLATOON_TEST_MCP_PLANE=sdk` runs tests/core/mcp against it.
docs/architecture.md ("Dependencies") records why the product keeps the hand-written plane.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import McpError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from platoon.envs.service import ToolResult
from platoon.gateway.core import AgentClosed, AuthenticationFailed, GatewayError
from platoon.gateway.mcp import (
    AGENT_ERROR,
    INVALID_PARAMS,
    KEEPALIVE_SECONDS,
    SERVER_INFO,
    call_result,
    tool_binding,
    tool_entry,
)
from platoon.gateway.tools import run_tool, visible_tools

_AGENT_SCOPE_KEY = "platoon.agent"
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class SdkMcpPlane:
    """An ASGI app: platoon's auth, then the SDK's stateless streamable-HTTP transport and server."""

    def __init__(
        self,
        gateway: Any,
        *,
        authenticate: Callable[[Request], Any] | None = None,
        keepalive_s: float = KEEPALIVE_SECONDS,
    ) -> None:
        self.gateway = gateway
        self._authenticate = authenticate
        self.keepalive_s = keepalive_s
        #: kept for the tests' probes; the SDK's stateless mode never fills it (see `_call_tool`)
        self._inflight: dict[tuple[str, str], asyncio.Task[Any]] = {}
        self.server: Server[Any, Any] = Server(SERVER_INFO["name"], SERVER_INFO["version"])
        # Raw handlers, not the `@call_tool()` decorator: the decorator turns every exception (an unknown tool's
        # McpError included) into an `isError` result and validates arguments with jsonschema, which the
        # hand-written plane leaves to the environment.
        self.server.request_handlers[types.ListToolsRequest] = self._list_tools
        self.server.request_handlers[types.CallToolRequest] = self._call_tool
        self._json = StreamableHTTPSessionManager(self.server, stateless=True, json_response=True)
        self._sse = StreamableHTTPSessionManager(self.server, stateless=True, json_response=False)
        self._runner: asyncio.Task[None] | None = None
        self._started = asyncio.Event()

    # ---- lifecycle: the managers need a running task group; started with the first request

    async def _ensure_started(self) -> None:
        if self._runner is None:
            # The SDK's SSE replies (sse-starlette) wait on a process-global anyio Event made in the first event
            # loop that served one; under a second loop (another GatewayServer thread, the next test) every SSE
            # reply fails ("ASGI callable returned without completing response"). Forget it per plane.
            from sse_starlette.sse import AppStatus

            AppStatus.should_exit_event = None

            async def run() -> None:
                async with self._json.run(), self._sse.run():
                    self._started.set()
                    await asyncio.Event().wait()

            self._runner = asyncio.ensure_future(run())
        await self._started.wait()

    async def aclose(self) -> None:
        if self._runner is not None:
            self._runner.cancel()

    # ---- ASGI

    def routes(self) -> list[Route]:
        return [
            Route("/mcp", self, methods=_ALL_METHODS),
            Route("/s/{secret}/mcp", self, methods=_ALL_METHODS),
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        if request.method != "POST":
            # In stateless mode the SDK would open a standalone SSE stream for GET; the plane serves POST only.
            await Response(status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return
        try:
            agent = self._agent_of(request)
        except GatewayError as exc:
            status = 410 if exc.status == 410 else 401
            body = {"jsonrpc": "2.0", "id": None, "error": {"code": AGENT_ERROR, "message": exc.message}}
            await JSONResponse(body, status_code=status)(scope, receive, send)
            return
        await self._ensure_started()
        scope[_AGENT_SCOPE_KEY] = agent
        accept = request.headers.get("accept", "")
        if "text/event-stream" in accept:
            await self._sse.handle_request(scope, receive, send)
            return
        if "application/json" not in accept:
            # The SDK answers 406 unless the client names application/json; the hand-written plane takes */*.
            headers = [(k, v) for k, v in scope["headers"] if k != b"accept"]
            scope = {**scope, "headers": [*headers, (b"accept", b"application/json")]}
        await self._json.handle_request(scope, receive, send)

    def _agent_of(self, request: Request) -> Any:
        if self._authenticate is not None:
            return self._authenticate(request)
        key = request.path_params.get("secret")
        if not key:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            key = token.strip() if scheme.lower() == "bearer" else ""
        if not key:
            key = request.headers.get("x-api-key", "").strip()
        if not key:
            raise AuthenticationFailed("no agent key: send Authorization: Bearer <agent key>")
        agent = self.gateway.agent_for_key(key)
        if agent.closed:
            raise AgentClosed("this agent is closed: its rollout has finished")
        return agent

    # ---- the SDK handlers

    def _agent(self) -> Any:
        request = self.server.request_context.request
        assert isinstance(request, Request)
        return request.scope[_AGENT_SCOPE_KEY]

    async def _tools(self, agent: Any) -> list[Any]:
        binding = tool_binding(agent)
        if binding is None:
            return []
        return await visible_tools(binding.session, agent.access, binding.transform)

    async def _list_tools(self, req: types.ListToolsRequest) -> types.ServerResult:
        tools = [types.Tool.model_validate(tool_entry(tool)) for tool in await self._tools(self._agent())]
        return types.ServerResult(types.ListToolsResult(tools=tools))

    async def _call_tool(self, req: types.CallToolRequest) -> types.ServerResult:
        agent = self._agent()
        context = self.server.request_context
        name, arguments = req.params.name, req.params.arguments or {}
        binding = tool_binding(agent)
        if binding is None or name not in {tool.name for tool in await self._tools(agent)}:
            raise McpError(types.ErrorData(code=INVALID_PARAMS, message=f"Unknown tool: {name}"))

        async def run() -> ToolResult:
            try:
                if getattr(binding.session, "manages_concurrency", False):
                    return await run_tool(agent, binding.session, name, arguments)
                async with binding.lock:
                    return await run_tool(agent, binding.session, name, arguments)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                return ToolResult.text(f"Tool {name!r} raised {type(exc).__name__}: {exc}", is_error=True)

        # A `notifications/cancelled` for this call arrives in another POST, hence at another (stateless) server
        # session, which drops it: it never reaches this task, so `_inflight` is not filled here.
        task = asyncio.ensure_future(run())
        token = context.meta.progressToken if context.meta is not None else None
        started = asyncio.get_running_loop().time()
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.keepalive_s)
                if done:
                    break
                if token is not None:  # progress through the SDK; without a token it has no keepalive to send
                    elapsed = round(asyncio.get_running_loop().time() - started, 3)
                    await context.session.send_progress_notification(
                        token, elapsed, related_request_id=context.request_id
                    )
        finally:
            if not task.done():
                task.cancel()
        result = call_result(task.result(), uuid.uuid4().hex)
        return types.ServerResult(types.CallToolResult.model_validate(result))


def sdk_mcp_app(
    gateway: Any,
    *,
    authenticate: Callable[[Request], Any] | None = None,
    keepalive_s: float = KEEPALIVE_SECONDS,
) -> Any:
    """A standalone starlette app serving the SDK plane at `/mcp` and `/s/{secret}/mcp` (as `mcp_app`)."""
    from starlette.applications import Starlette

    plane = SdkMcpPlane(gateway, authenticate=authenticate, keepalive_s=keepalive_s)
    app = Starlette(routes=plane.routes())
    app.state.mcp_plane = plane
    return app


def mount_sdk_mcp(server: Any, *, keepalive_s: float = KEEPALIVE_SECONDS) -> SdkMcpPlane:
    """Serve the SDK plane on a `GatewayServer` (as `mount_mcp`), with the server's own auth. Before it starts."""
    plane = SdkMcpPlane(server.gateway, authenticate=server.authenticate, keepalive_s=keepalive_s)
    server._extra_routes.extend(plane.routes())
    return plane


__all__ = ["SdkMcpPlane", "mount_sdk_mcp", "sdk_mcp_app"]
