"""The MCP tool plane: each agent's environment tools over MCP streamable HTTP, per agent key.

A small stateless JSON-RPC 2.0 handler (no MCP SDK, no session ids), plus the registry binding an agent to the
session whose tools it is served; starlette is imported only when the plane is built.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from platoon.envs.service import ToolResult
from platoon.gateway.core import AgentClosed, AuthenticationFailed, GatewayError
from platoon.gateway.tools import run_tool, visible_tools
from platoon.request_limits import DEFAULT_MAX_JSON_DEPTH, JSONTooDeep, loads_within_depth

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from platoon.envs.service import EnvSession, ToolSpec
    from platoon.gateway.core import ModelGateway
    from platoon.gateway.records import AgentRecord

__all__ = [
    "LATEST_PROTOCOL_VERSION",
    "PROTOCOL_VERSIONS",
    "McpPlane",
    "ToolBinding",
    "bind_tools",
    "mcp_app",
    "mount_mcp",
    "tool_binding",
]

log = logging.getLogger(__name__)

PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_PROTOCOL_VERSION = PROTOCOL_VERSIONS[-1]
SERVER_INFO = {"name": "platoon-gateway", "version": "1"}
KEEPALIVE_SECONDS = 10.0

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
AGENT_ERROR = -32001

_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_PASSED_BLOCKS = frozenset(("text", "image", "audio", "resource", "resource_link"))


# --------------------------------------------------------------------------------------------------------------
# Agent -> tool provider binding


@dataclass(eq=False)
class ToolBinding:
    """The session (and listing transform) whose tools an agent is served; shared by children that inherit it."""

    session: EnvSession
    transform: Any = None
    #: one call at a time per provider for sessions without their own gate
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


#: agent id -> its own binding; an entry goes with its agent record (a weakref finalizer), so nothing leaks.
_BINDINGS: dict[str, ToolBinding] = {}


def bind_tools(record: AgentRecord, session: EnvSession, *, transform: Any = None) -> ToolBinding:
    """Bind `record`'s agent to `session`'s tools; its children inherit the binding until they are bound."""
    binding = ToolBinding(session, transform)
    if record.agent_id not in _BINDINGS:
        weakref.finalize(record, _BINDINGS.pop, record.agent_id, None)
    _BINDINGS[record.agent_id] = binding
    return binding


def tool_binding(record: AgentRecord) -> ToolBinding | None:
    """The agent's own binding, else its nearest bound ancestor's (agents minted over HTTP inherit); None if none."""
    node: AgentRecord | None = record
    while node is not None:
        binding = _BINDINGS.get(node.agent_id)
        if binding is not None:
            return binding
        node = node.parent
    return None


# --------------------------------------------------------------------------------------------------------------
# Tool shapes


def _strip_platoon_keys(schema: Any) -> Any:
    if isinstance(schema, Mapping):
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if isinstance(key, str) and key.startswith("x-platoon-"):
                continue
            if key == "properties" and isinstance(value, Mapping):
                # Property names are data, not schema keywords: keep them all, strip inside each.
                out[key] = {name: _strip_platoon_keys(sub) for name, sub in value.items()}
            else:
                out[key] = _strip_platoon_keys(value)
        return out
    if isinstance(schema, list):
        return [_strip_platoon_keys(item) for item in schema]
    return schema


def tool_entry(tool: ToolSpec) -> dict[str, Any]:
    """One `tools/list` entry: name, description, inputSchema (platoon keys stripped), hints and `_meta`."""
    schema = _strip_platoon_keys(dict(tool.input_schema or {}))
    schema.setdefault("type", "object")
    entry: dict[str, Any] = {"name": tool.name, "description": tool.description or "", "inputSchema": schema}
    if tool.read_only:
        entry["annotations"] = {"readOnlyHint": True}
    if tool.meta:
        entry["_meta"] = dict(tool.meta)
    return entry


def _content_block(block: Any) -> dict[str, Any]:
    if isinstance(block, str):
        return {"type": "text", "text": block}
    if not isinstance(block, Mapping):
        dump = getattr(block, "model_dump", None)  # SDK block objects (openreward TextBlock, ImageBlock)
        block = dump(exclude_none=True) if callable(dump) else {"type": "text", "text": str(block)}
    kind = block.get("type")
    if kind is None and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if kind == "image":
        out = {"type": "image", "data": block.get("data", ""), "mimeType": block.get("mimeType", "")}
        return out
    if kind in _PASSED_BLOCKS:
        return dict(block)
    return {"type": "text", "text": json.dumps(block, ensure_ascii=False, default=str)}


def call_result(result: ToolResult, event_id: str) -> dict[str, Any]:
    """A `tools/call` result: content blocks, `isError`, and `_meta.platoon` (hidden from the model)."""
    platoon: dict[str, Any] = {"finished": result.finished, "reward": result.reward, "event_id": event_id}
    if result.metadata:
        platoon["metadata"] = result.metadata
    return {
        "content": [_content_block(block) for block in result.content],
        "isError": bool(result.is_error),
        "_meta": {"platoon": platoon},
    }


# --------------------------------------------------------------------------------------------------------------
# JSON-RPC


class _RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def _valid_id(value: Any) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _sse(message: Mapping[str, Any]) -> bytes:
    return f"event: message\ndata: {json.dumps(message, ensure_ascii=False)}\n\n".encode()


@dataclass
class _Call:
    """One request of a POST: its id, and the task answering it (None for notifications and responses)."""

    request_id: Any
    task: asyncio.Task[Any] | None
    tool_call: bool = False
    progress_token: Any = None


class McpPlane:
    """The MCP tool plane over a gateway: authenticates a key, then answers JSON-RPC for that agent.

    `authenticate(request) -> AgentRecord` replaces the default auth (path secret, Bearer or x-api-key through
    `gateway.agent_for_key`): an HTTP server that serves only some rollouts passes its own. It raises the
    gateway's `AuthenticationFailed` (401) or `AgentClosed` (410).
    """

    def __init__(
        self,
        gateway: ModelGateway,
        *,
        authenticate: Callable[[Request], AgentRecord] | None = None,
        keepalive_s: float = KEEPALIVE_SECONDS,
        max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
    ) -> None:
        self.gateway = gateway
        self._authenticate = authenticate
        self.keepalive_s = keepalive_s
        self.max_json_depth = max_json_depth
        #: (agent id, request id) -> the running call, for `notifications/cancelled`
        self._inflight: dict[tuple[str, str], asyncio.Task[Any]] = {}

    # ---- routes

    def routes(self) -> list[Route]:
        """`/mcp` and `/s/{secret}/mcp`, every method (all but POST answer 405)."""
        from starlette.routing import Route

        return [
            Route("/mcp", self.handle, methods=_ALL_METHODS),
            Route("/s/{secret}/mcp", self.handle, methods=_ALL_METHODS),
        ]

    async def asgi(self, scope: Any, receive: Any, send: Any) -> None:
        """The plane as a path-independent ASGI app, for `GatewayServer.mount("/mcp", plane.asgi)` (the scoped
        mount's `secret` path parameter is read from the scope)."""
        from starlette.requests import Request

        if scope["type"] != "http":
            return
        response = await self.handle(Request(scope, receive))
        await response(scope, receive, send)

    def agent_of(self, request: Request) -> AgentRecord:
        """The calling agent: the path secret, else `Authorization: Bearer`, else `x-api-key`."""
        if self._authenticate is not None:
            return self._authenticate(request)
        key = request.path_params.get("secret")
        if not key:
            auth = request.headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            key = token.strip() if scheme.lower() == "bearer" else ""
        if not key:
            key = request.headers.get("x-api-key", "").strip()
        if not key:
            raise AuthenticationFailed("no agent key: send Authorization: Bearer <agent key>")
        agent = self.gateway.agent_for_key(key)
        if agent.closed:
            raise AgentClosed("this agent is closed: its rollout has finished")
        return agent

    # ---- the handler

    async def handle(self, request: Request) -> Response:
        """One HTTP request to the plane (a starlette endpoint)."""
        from starlette.responses import JSONResponse, Response

        if request.method != "POST":
            return Response(status_code=405, headers={"Allow": "POST"})
        version = request.headers.get("mcp-protocol-version")
        if version is not None and version not in PROTOCOL_VERSIONS:
            return JSONResponse(
                _error(None, INVALID_REQUEST, f"Unsupported MCP-Protocol-Version: {version!r}"),
                status_code=400,
            )
        try:
            agent = self.agent_of(request)
        except GatewayError as exc:
            status = 410 if exc.status == 410 else 401
            return JSONResponse(_error(None, AGENT_ERROR, exc.message), status_code=status)
        raw = await request.body()  # held to the server's body cap as it is read (413 past it)
        try:
            payload = loads_within_depth(raw, self.max_json_depth)
        except JSONTooDeep as exc:
            return JSONResponse(_error(None, PARSE_ERROR, f"Parse error: {exc}"), status_code=400)
        except ValueError:
            return JSONResponse(
                _error(None, PARSE_ERROR, "Parse error: the body is not JSON"), status_code=400
            )
        batch = isinstance(payload, list)
        messages = payload if batch else [payload]
        if batch and not messages:
            return JSONResponse(
                _error(None, INVALID_REQUEST, "Invalid Request: empty batch"), status_code=400
            )

        calls = [self._dispatch(agent, message) for message in messages]
        answered = [call for call in calls if call.task is not None or call.request_id is not _NO_REPLY]
        if not answered:
            return Response(status_code=202)  # only notifications and responses
        stream = "text/event-stream" in request.headers.get("accept", "") and any(
            call.tool_call for call in answered
        )
        if stream:
            return self._stream(request, agent, answered, batch)
        replies = await self._gather(request, agent, answered)
        if replies is None:
            return Response(status_code=202)  # cancelled or disconnected: nothing is sent
        body = [reply for reply in replies if reply is not None]
        if not body:
            return Response(status_code=202)
        if not batch:
            status = 400 if body[0].get("error", {}).get("code") in (PARSE_ERROR, INVALID_REQUEST) else 200
            return JSONResponse(body[0], status_code=status)
        return JSONResponse(body)

    def _dispatch(self, agent: AgentRecord, message: Any) -> _Call:
        """Start answering one JSON-RPC message; notifications are acted on at once."""
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _Call(
                None, _done(_error(None, INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message"))
            )
        method = message.get("method")
        if "id" not in message:
            if isinstance(method, str):
                self._notify(agent, method, message.get("params"))
                return _Call(_NO_REPLY, None)
            return _Call(None, _done(_error(None, INVALID_REQUEST, "Invalid Request: no method")))
        request_id = message["id"]
        if method is None and ("result" in message or "error" in message):
            return _Call(_NO_REPLY, None)  # a client's response to a server request: nothing to answer
        if not _valid_id(request_id) or not isinstance(method, str):
            return _Call(None, _done(_error(None, INVALID_REQUEST, "Invalid Request: bad id or method")))
        params = message.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return _Call(
                request_id, _done(_error(request_id, INVALID_PARAMS, "Invalid params: not an object"))
            )
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        task = asyncio.ensure_future(self._answer(agent, request_id, method, params))
        if method == "tools/call":
            self._inflight[(agent.agent_id, json.dumps(request_id))] = task
            return _Call(request_id, task, True, token)
        return _Call(request_id, task)

    def _notify(self, agent: AgentRecord, method: str, params: Any) -> None:
        if method == "notifications/cancelled" and isinstance(params, dict):
            task = self._inflight.get((agent.agent_id, json.dumps(params.get("requestId"))))
            if task is not None:
                task.cancel()  # a queued call never runs; a running one finishes in the env, unanswered

    async def _answer(self, agent: AgentRecord, request_id: Any, method: str, params: dict[str, Any]) -> Any:
        try:
            result = await self._method(agent, method, params)
        except _RpcError as exc:
            return _error(request_id, exc.code, exc.message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("MCP %s failed", method)
            return _error(request_id, INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}")
        finally:
            self._inflight.pop((agent.agent_id, json.dumps(request_id)), None)
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    async def _method(self, agent: AgentRecord, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = asked if asked in PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION
            return {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": dict(SERVER_INFO),
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": [tool_entry(tool) for tool in await self._tools(agent)]}
        if method == "tools/call":
            return await self._call(agent, params)
        raise _RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")

    async def _tools(self, agent: AgentRecord) -> list[ToolSpec]:
        binding = tool_binding(agent)
        if binding is None:
            return []
        return await visible_tools(binding.session, agent.access, binding.transform)

    async def _call(self, agent: AgentRecord, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise _RpcError(
                INVALID_PARAMS, "Invalid params: tools/call needs a tool name and object arguments"
            )
        binding = tool_binding(agent)
        # A tool the agent cannot see is an unknown tool (as in process: neither sent nor recorded).
        if binding is None or name not in {tool.name for tool in await self._tools(agent)}:
            raise _RpcError(INVALID_PARAMS, f"Unknown tool: {name}")
        event_id = uuid.uuid4().hex
        try:
            if getattr(binding.session, "manages_concurrency", False):
                result = await run_tool(agent, binding.session, name, arguments)
            else:
                async with binding.lock:
                    result = await run_tool(agent, binding.session, name, arguments)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a tool that raised is an error result the model sees, not a protocol error
            result = ToolResult.text(f"Tool {name!r} raised {type(exc).__name__}: {exc}", is_error=True)
        return call_result(result, event_id)

    # ---- replies

    async def _gather(self, request: Request, agent: AgentRecord, calls: list[_Call]) -> list[Any] | None:
        """The replies in order, or None when the client went away (the calls are cancelled)."""
        tasks = [call.task for call in calls if call.task is not None]
        everything = asyncio.ensure_future(asyncio.gather(*tasks, return_exceptions=True))
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({everything, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not everything.done():
            for task in tasks:
                task.cancel()
            return None
        replies = [None if isinstance(r, BaseException) else r for r in everything.result()]
        return replies if any(reply is not None for reply in replies) else None

    def _stream(self, request: Request, agent: AgentRecord, calls: list[_Call], batch: bool) -> Response:
        """Answer as SSE: keepalives (or progress notifications) every period, then each reply as an event."""
        from starlette.responses import StreamingResponse

        keepalive = self.keepalive_s

        async def events() -> Any:
            started = time.monotonic()
            pending = {call.task for call in calls if call.task is not None}
            try:
                while pending:
                    done, pending = await asyncio.wait(pending, timeout=keepalive)
                    if pending and not done:
                        tokens = [c.progress_token for c in calls if c.progress_token is not None]
                        if tokens:
                            elapsed = round(time.monotonic() - started, 3)
                            for token in tokens:
                                yield _sse(
                                    {
                                        "jsonrpc": "2.0",
                                        "method": "notifications/progress",
                                        "params": {"progressToken": token, "progress": elapsed},
                                    }
                                )
                        else:
                            yield b": keepalive\n\n"
                for call in calls:
                    assert call.task is not None
                    if call.task.cancelled():
                        continue  # cancelled by the client: no response is sent
                    reply = call.task.result()
                    if reply is not None:
                        yield _sse(reply)
            finally:
                for call in calls:  # a disconnect cancels what is still running
                    if call.task is not None and not call.task.done():
                        call.task.cancel()

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )


class _Sentinel:
    def __repr__(self) -> str:
        return "<no reply>"


_NO_REPLY: Any = _Sentinel()


def _done(value: Any) -> asyncio.Task[Any]:
    async def ready() -> Any:
        return value

    return asyncio.ensure_future(ready())


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so `receive` waits for the disconnect)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


def mount_mcp(server: Any, *, keepalive_s: float = KEEPALIVE_SECONDS) -> McpPlane:
    """Serve the plane on a `platoon.gateway.http.GatewayServer` at `/mcp` and `/s/<secret>/mcp`, with the
    server's own auth (so a per-rollout server accepts only its rollouts' keys here too). Before it starts."""
    plane = McpPlane(
        server.gateway,
        authenticate=server.authenticate,
        keepalive_s=keepalive_s,
        max_json_depth=getattr(server, "max_json_depth", DEFAULT_MAX_JSON_DEPTH),
    )
    extra = getattr(server, "_extra_routes", None)
    if isinstance(extra, list):
        # Exact routes, not `server.mount`: a starlette Mount at /mcp answers POST /mcp with a 307 to /mcp/,
        # which MCP clients do not follow. The server puts extra routes before its /s/{secret} mount.
        extra.extend(plane.routes())
    else:
        server.mount("/mcp", plane.asgi)
    return plane


def mcp_app(
    gateway: ModelGateway,
    *,
    authenticate: Callable[[Request], AgentRecord] | None = None,
    keepalive_s: float = KEEPALIVE_SECONDS,
) -> Any:
    """A standalone starlette app serving the plane at `/mcp` and `/s/{secret}/mcp`."""
    from starlette.applications import Starlette

    plane = McpPlane(gateway, authenticate=authenticate, keepalive_s=keepalive_s)
    app = Starlette(routes=plane.routes())
    app.state.mcp_plane = plane
    return app
