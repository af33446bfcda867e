"""`GatewayServer`: one `ModelGateway` served over HTTP on loopback, on starlette + uvicorn.

It owns routing, auth (Bearer, `x-api-key` or the `/s/<secret>` path form), the call-kind header, request limits
(body size and JSON nesting), disconnect cancellation and the synthetic SSE streams; the dialect modules translate
requests and replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from platoon.gateway.core import AuthenticationFailed, GatewayError
from platoon.gateway.http import agents, anthropic, openai_chat, responses
from platoon.gateway.http.common import ClientGone, dumps
from platoon.harness.agent import CALL_KIND_HEADER, ChatReply, ModelEndpoint
from platoon.request_limits import (
    DEFAULT_MAX_JSON_DEPTH,
    MAX_BODY_BYTES_ENV,
    MAX_JSON_DEPTH_ENV,
    MAX_MINTED_AGENTS_ENV,
    MIB,
    BodyCap,
    JSONTooDeep,
    limit_from_env,
    loads_within_depth,
)

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from platoon.gateway.core import ModelGateway
    from platoon.gateway.records import AgentRecord, CallRecord, Interaction

__all__ = [
    "DEFAULT_KEEPALIVE_SECONDS",
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_BODY_BYTES_ENV",
    "MAX_JSON_DEPTH_ENV",
    "MAX_MINTED_AGENTS_ENV",
    "ChatBackend",
    "ClientGone",
    "GatewayServer",
    "RequestTooLarge",
    "serving",
]

log = logging.getLogger(__name__)

#: The largest request body the gateway reads: a chat request of 200k tokens of text is about 1 MiB.
DEFAULT_MAX_BODY_BYTES = 32 * MIB
#: The request line and headers h11 buffers before it answers 400 (an agent key and a few headers fit many times).
MAX_HEADER_BYTES = 64 << 10
#: The synthetic stream's keepalive comment period; `GatewayServer(keepalive_seconds=)` for tests.
DEFAULT_KEEPALIVE_SECONDS = 10.0
DEFAULT_MAX_MINTED_AGENTS = 64
_KEEPALIVE = b": keepalive\n\n"
_CALL_ID_HEADER = "x-platoon-call-id"
_KIND_HEADER = CALL_KIND_HEADER.lower()

#: gateway -> the server serving it, so `ctx.endpoint` can find its URL (weak: a server does not keep a gateway)
_SERVING: weakref.WeakKeyDictionary[Any, GatewayServer] = weakref.WeakKeyDictionary()
#: gateway -> a server that starts when `serving` is first asked for it (`GatewayServer.serve_on_demand`)
_ON_DEMAND: weakref.WeakKeyDictionary[Any, GatewayServer] = weakref.WeakKeyDictionary()


def serving(gateway: Any) -> GatewayServer | None:
    """The server serving `gateway`, started now if it waited to be asked for; None when there is none (then
    `ctx.endpoint` is unavailable)."""
    server = _SERVING.get(gateway)
    if server is None:
        waiting = _ON_DEMAND.pop(gateway, None)
        if waiting is not None:
            server = waiting._start_on_this_loop()
    return server


class ChatBackend(Protocol):
    """The seam for hosted inference: when a server has a backend, the dialect handlers hand it the
    authenticated agent, the request body and the dialect (`chat`, `responses`, `messages`, `count_tokens`) instead
    of calling `ModelGateway.chat`. It returns the dialect-native JSON body (a mapping, sent with 200) or a
    starlette `Response` (a stream, say); `GatewayError`s it raises are answered in the dialect's error shape."""

    async def chat(self, agent: AgentRecord, body: dict[str, Any], dialect: str, *, kind: str) -> Any: ...


class RequestTooLarge(GatewayError):
    """A request body over the gateway's cap (HTTP 413); raised by the body's read, before the cap is passed."""

    status = 413
    kind = "invalid_request_error"
    code = "request_too_large"

    def __init__(self, limit: int, declared: int | None = None) -> None:
        size = "is over" if declared is None else f"is {declared} bytes, over"
        super().__init__(
            f"the request body {size} the gateway's limit of {limit} bytes ({MAX_BODY_BYTES_ENV} raises it)"
        )


def _error_json(exc: Exception) -> bytes:
    """An error the routes did not answer themselves (a mounted app's), in the OpenAI error shape."""
    kind = getattr(exc, "kind", "invalid_request_error")
    return dumps({"error": {"message": str(exc), "type": kind, "code": getattr(exc, "code", None)}})


@functools.cache
def _server_class() -> type:
    """The uvicorn server class every `GatewayServer` runs, defined once (uvicorn is imported on first use)."""
    import uvicorn

    class _Server(uvicorn.Server):
        """uvicorn without signal capture (the rollout's process owns its signals) and without the polling
        main loop and the fixed 0.1 s shutdown sleep (a server per episode must stop fast)."""

        exit_event: asyncio.Event

        def capture_signals(self) -> Any:
            import contextlib

            return contextlib.nullcontext()

        async def main_loop(self) -> None:
            self.exit_event = getattr(self, "exit_event", None) or asyncio.Event()
            if not self.should_exit:
                await self.exit_event.wait()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            for server in self.servers:
                server.close()
            for sock in sockets or []:
                sock.close()
            for connection in list(self.server_state.connections):
                connection.shutdown()
            # In-flight requests get a moment to finish; then their tasks are cancelled.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 2.0
            while (self.server_state.connections or self.server_state.tasks) and loop.time() < deadline:
                await asyncio.sleep(0.005)
            for task in self.server_state.tasks:
                task.cancel()
            for server in self.servers:
                await server.wait_closed()

    return _Server


_uvicorn_logging_done = False


def _uvicorn_logging() -> dict[str, Any]:
    """uvicorn's logging settings for the next server: its default config at level warning for the first server of
    the process, then none (uvicorn then leaves logging alone). Each application of the config walks every logger of
    the process, which made up most of a server's start, and a server starts per episode; what it sets stays set."""
    global _uvicorn_logging_done
    if _uvicorn_logging_done:
        return {"log_config": None, "log_level": None}
    _uvicorn_logging_done = True
    return {"log_level": "warning"}


class GatewayServer:
    """Serves a `ModelGateway` on `http://<host>:<port>` (port 0: a free one, known once started).

    `astart()`/`astop()` run uvicorn as a task on the running loop: the gateway's state (agents, call caps,
    in-flight counts) is single-threaded and its sampler's async client is bound to the loop, so HTTP calls and
    in-process `ctx.chat` calls share one loop and see each other's budget at once. In-process callers must use
    async clients then (a blocking client on that loop would wait for itself). `start()`/`stop()` run the server
    on a loop of its own in a background thread, for code that drives the gateway only over HTTP (scripts,
    external harness processes, blocking clients).

    Seams: `extra_routes` (or `mount()` before start) add routes such as the MCP plane at `/mcp`, each also under
    `/s/{secret}` unless `scoped=False`; a `backend` (`ChatBackend`) answers model calls instead of the gateway.
    `rollouts`: when given, only keys of those rollout ids are accepted (`accept_rollout` adds more).

    `unix_socket`: serve on that Unix socket (mode 0600) instead of TCP; `upstream` is then `unix://<path>`. A
    sandbox without a network reaches such a server through its route: one server per
    rollout, on the same `ModelGateway` as the TCP one, created with `rollouts=[that rollout]`.

    `max_body_bytes` (413 past it; `$PLATOON_GATEWAY_MAX_BODY_BYTES`, else 32 MiB) and `max_json_depth` (400 past
    it; `$PLATOON_GATEWAY_MAX_JSON_DEPTH`, else 64) bound what one request may hold.
    """

    def __init__(
        self,
        gateway: ModelGateway,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        backend: ChatBackend | None = None,
        extra_routes: Sequence[BaseRoute] = (),
        keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS,
        rollouts: Iterable[str] | None = None,
        max_minted_agents: int | None = None,
        unix_socket: str | os.PathLike[str] | None = None,
        max_body_bytes: int | None = None,
        max_json_depth: int | None = None,
    ) -> None:
        if keepalive_seconds <= 0:
            raise ValueError(f"keepalive_seconds must be positive; got {keepalive_seconds!r}")
        self.max_body_bytes = limit_from_env(MAX_BODY_BYTES_ENV, DEFAULT_MAX_BODY_BYTES, given=max_body_bytes)
        self.max_json_depth = limit_from_env(MAX_JSON_DEPTH_ENV, DEFAULT_MAX_JSON_DEPTH, given=max_json_depth)
        self.gateway = gateway
        self.host = host
        self.port = port
        self.unix_socket = Path(unix_socket) if unix_socket is not None else None
        self.backend = backend
        self.keepalive_seconds = float(keepalive_seconds)
        #: agents one rollout may mint over HTTP (0: none)
        self.max_minted_agents = limit_from_env(
            MAX_MINTED_AGENTS_ENV, DEFAULT_MAX_MINTED_AGENTS, given=max_minted_agents, minimum=0
        )
        self._rollouts: set[str] | None = None if rollouts is None else set(rollouts)
        self._extra: list[tuple[str, Any, bool]] = []
        self._extra_routes: list[BaseRoute] = list(extra_routes)
        #: agents minted over HTTP per rollout id (capped by `max_minted_agents`)
        self.minted: dict[str, int] = {}
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- seams ---------------------------------------------------------------------------------------------

    def mount(self, path: str, app: Callable[..., Awaitable[None]], *, scoped: bool = True) -> None:
        """Mount an ASGI app at `path` (e.g. the MCP plane at `/mcp`) and, with `scoped`, at `/s/{secret}<path>`
        too (the secret is then in `scope["path_params"]["secret"]`; `authenticate` reads it). Before start."""
        if self._server is not None:
            raise RuntimeError("mount() before the server starts")
        self._extra.append((path, app, scoped))

    def accept_rollout(self, rollout_id: str) -> None:
        """Accept the keys of this rollout too (a server created with `rollouts=` accepts only those)."""
        if self._rollouts is not None:
            self._rollouts.add(rollout_id)

    def drop_rollout(self, rollout_id: str) -> None:
        """Stop accepting this rollout's keys (they get 401)."""
        if self._rollouts is not None:
            self._rollouts.discard(rollout_id)

    # ---- addresses -----------------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """`http://<host>:<port>` (no `/v1`); the port is the bound one once started."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def upstream(self) -> str:
        """What a sandbox spec names this server by: `unix://<path>` for a Unix-socket server, else `base_url`."""
        return f"unix://{self.unix_socket}" if self.unix_socket is not None else self.base_url

    def endpoint(self, agent: AgentRecord) -> ModelEndpoint:
        """The agent's OpenAI-compatible endpoint: `<base_url>/s/<secret>/v1`, the secret as key."""
        return ModelEndpoint(
            base_url=f"{self.base_url}/s/{agent.secret}/v1",
            api_key=agent.secret,
            model=self.gateway.model_name,
        )

    # ---- request helpers (shared by the dialects and the seams) ----------------------------------------------

    def authenticate(self, request: Request) -> AgentRecord:
        """The calling agent: the `/s/<secret>` path secret, else `Authorization: Bearer`, else `x-api-key`.

        Raises `AuthenticationFailed` (401) for a missing or unknown key, `AgentClosed` (410) for a closed agent.
        """
        key = request.path_params.get("secret")
        if not key:
            headers = request.headers
            auth = headers.get("authorization")
            is_bearer = auth is not None and auth[:7].lower() == "bearer "
            key = auth[7:].strip() if is_bearer and auth else headers.get("x-api-key")
        if not key:
            raise AuthenticationFailed(
                "no agent key: send Authorization: Bearer <key>, x-api-key or /s/<key>/"
            )
        agent = self.gateway.agent_for_key(key)
        if self._rollouts is not None and agent.rollout_id not in self._rollouts:
            raise AuthenticationFailed("unknown agent key")
        return agent

    @staticmethod
    def call_kind(request: Request) -> str:
        """The `X-Platoon-Call-Kind` header (default `policy`); the gateway refuses unknown kinds."""
        kind = request.headers.get(_KIND_HEADER)
        return "policy" if not kind else kind.strip().lower()

    async def json_body(self, request: Request) -> dict[str, Any]:
        """The request's JSON object body: 400 when it is not one or nests past `max_json_depth`; the app around the
        routes holds it to `max_body_bytes` while it is read (413)."""
        raw = await request.body()
        try:
            body = loads_within_depth(raw, self.max_json_depth)
        except JSONTooDeep as exc:
            raise GatewayError(
                f"{exc}, the gateway's limit ({MAX_JSON_DEPTH_ENV} raises it)", code="json_too_deep"
            ) from None
        except ValueError as exc:
            raise GatewayError(f"the request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise GatewayError("the request body must be a JSON object")
        return body

    def start_chat(
        self,
        agent: AgentRecord,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kind: str,
        sampling: dict[str, Any],
    ) -> asyncio.Task[ChatReply]:
        """`ModelGateway.chat` as an eagerly started task: its refusals and budget check run before this returns,
        so a concurrent request sees the call in flight, and a refusal can still be answered with its status."""
        coro = self.gateway.chat(agent, messages, tools=tools, kind=kind, **sampling)
        return asyncio.Task(coro, loop=asyncio.get_running_loop(), eager_start=True)

    @staticmethod
    async def until_disconnect(request: Request, task: asyncio.Task[Any]) -> Any:
        """The task's result; if the client disconnects first, the task is cancelled (nothing is recorded)."""
        if task.done():
            return task.result()
        receive = request.receive

        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        watcher = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not watcher.done():
                watcher.cancel()
        if not task.done():
            task.cancel()
            raise ClientGone()
        return task.result()

    async def stream_events(
        self,
        task: asyncio.Task[Any],
        events: Callable[[Any], Iterable[bytes]],
        failure: Callable[[BaseException], bytes],
    ) -> AsyncIterator[bytes]:
        """The synthetic stream: `: keepalive` comments while the call samples, then the reply's events (or the
        dialect's error event). Closing the stream (a disconnect) cancels the call."""
        try:
            while not task.done():
                done, _ = await asyncio.wait((task,), timeout=self.keepalive_seconds)
                if not done:
                    yield _KEEPALIVE
            exc = task.exception()
            if exc is not None:
                if not isinstance(exc, GatewayError):
                    self.server_error(exc)
                yield failure(exc)
                return
            for event in events(task.result()):
                yield event
        finally:
            if not task.done():
                task.cancel()

    def server_error(self, exc: BaseException, agent: AgentRecord | None = None) -> None:
        """Log an unexpected failure (with the exception) and count it as the agent's gateway error."""
        log.error("gateway HTTP handler failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        if agent is not None:
            agent.gateway_errors += 1

    def record_of(self, agent: AgentRecord, call_id: str) -> CallRecord | None:
        """The agent's record of this call (None for a budget stop or a call made after the agent closed)."""
        for call in reversed(agent.calls):
            if call.call_id == call_id:
                return call
        return None

    def interaction(self, agent: AgentRecord, call_id: str) -> Interaction | None:
        """The exact tokens of this call, while its rollout is open."""
        try:
            rollout = self.gateway.rollout(agent.rollout_id)
        except KeyError:
            return None
        result: Interaction | None = rollout.interactions.get(call_id)
        return result

    def usage(self, agent: AgentRecord, call_id: str) -> tuple[int, int]:
        """(prompt tokens, completion tokens) of a recorded call; (0, 0) for an unrecorded one."""
        record = self.record_of(agent, call_id)
        if record is None:
            return 0, 0
        return int(record.usage.get("prompt_tokens", 0)), int(record.usage.get("completion_tokens", 0))

    async def forward(self, agent: AgentRecord, body: dict[str, Any], dialect: str, kind: str) -> Response:
        """Hand a call to the backend (hosted inference): its mapping is sent as JSON, a `Response` as is."""
        from starlette.responses import Response

        assert self.backend is not None
        result = await self.backend.chat(agent, body, dialect, kind=kind)
        return result if isinstance(result, Response) else self.json(result)

    @staticmethod
    def json(value: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
        from starlette.responses import Response

        return Response(dumps(value), status_code=status, headers=headers, media_type="application/json")

    @staticmethod
    def sse(stream: AsyncIterator[bytes], headers: Mapping[str, str] | None = None) -> Response:
        from starlette.responses import StreamingResponse

        return StreamingResponse(
            stream,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})},
        )

    @staticmethod
    def call_headers(call_id: str) -> dict[str, str]:
        return {_CALL_ID_HEADER: call_id}

    # ---- the app -------------------------------------------------------------------------------------------

    def app(self) -> Any:
        """The ASGI app: a starlette router (no middleware stack: the handlers answer their own errors) inside the
        body cap."""
        from starlette.routing import Mount, Route, Router

        v1: list[BaseRoute] = [
            Route("/v1/chat/completions", openai_chat.endpoint(self), methods=["POST"]),
            Route("/v1/responses", responses.endpoint(self), methods=["POST"]),
            Route("/v1/messages", anthropic.endpoint(self), methods=["POST"]),
            Route("/v1/messages/count_tokens", anthropic.count_tokens_endpoint(self), methods=["POST"]),
            Route("/v1/models", agents.models_endpoint(self), methods=["GET"]),
            Route("/v1/platoon/agents", agents.mint_endpoint(self), methods=["POST"]),
        ]
        scoped: list[BaseRoute] = list(v1)
        top: list[BaseRoute] = [Route("/healthz", agents.health_endpoint(self), methods=["GET"])]
        for path, app, in_scope in self._extra:
            top.append(Mount(path, app=app))
            if in_scope:
                scoped.append(Mount(path, app=app))
        top.extend(self._extra_routes)
        router = Router(routes=[*top, *v1, Mount("/s/{secret}", routes=scoped)])
        return BodyCap(router, limit=self.max_body_bytes, too_large=RequestTooLarge, render=_error_json)

    # ---- life cycle ----------------------------------------------------------------------------------------

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets it can tell are TCP, and without it
        # Nagle's algorithm against the client's delayed ACK adds ~40 ms to every reply on a kept-alive connection.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(2048)
        sock.setblocking(False)
        self.port = int(sock.getsockname()[1])
        return sock

    def _bind_unix(self, path: Path) -> socket.socket:
        if path.is_socket():  # a socket a dead server left: nothing listens on it any more
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            os.chmod(path, 0o600)  # only this user's processes (and the sandbox's bind of the directory)
            sock.listen(2048)
        except BaseException:
            sock.close()
            raise
        sock.setblocking(False)
        return sock

    def _preload(self) -> None:
        import starlette.routing  # noqa: F401

        _server_class()
        warm_up = getattr(self.gateway, "warm_up", None)
        if warm_up is not None and self.backend is None and self.gateway.backend is None:
            warm_up()  # hosted inference samples nothing: no Tinker SDK

    def _make_server(self) -> Any:
        import uvicorn

        config = uvicorn.Config(
            self.app(),
            lifespan="off",
            **_uvicorn_logging(),
            access_log=False,
            http="h11",
            proxy_headers=False,
            server_header=False,
            date_header=False,
            timeout_keep_alive=30,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        )
        return _server_class()(config)

    async def astart(self) -> GatewayServer:
        """Serve on the running loop (see the class docstring); returns once the socket accepts connections."""
        if self._server is not None:
            raise RuntimeError("the gateway server is already started")
        # The heavy one-time imports (the Tinker SDK takes seconds, uvicorn and starlette less) happen here, in a
        # thread, before the server serves: not in its first call, on the event loop other rollouts share.
        await asyncio.to_thread(self._preload)
        sock = self._bind() if self.unix_socket is None else self._bind_unix(self.unix_socket)
        server = self._make_server()
        server.exit_event = asyncio.Event()
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name=f"platoon-gateway-{self.port}")
        while not server.started:
            if self._task.done():
                self._server = None
                self._task.result()  # raises the startup failure
                raise RuntimeError("the gateway server stopped while starting")
            await asyncio.sleep(0.001)
        if self.unix_socket is None:  # the gateway's own server, which in-process endpoints name
            _SERVING[self.gateway] = self
        return self

    def serve_on_demand(self) -> GatewayServer:
        """Serve on the running loop from the first time `serving(gateway)` is asked (`ctx.endpoint`, a
        command-line harness), not before: an episode whose harness only calls `ctx.chat` never starts a server.
        The start is synchronous (the socket is bound and listening at once; uvicorn begins accepting on the loop's
        next turns), so the endpoint's URL is known when it is asked for. `astop` stops it, started or not. As with
        `astart`, the gateway's latest server is the one `serving` answers with."""
        if self._server is not None:
            raise RuntimeError("the gateway server is already started")
        asyncio.get_running_loop()  # its start needs this loop
        _ON_DEMAND[self.gateway] = self
        return self

    def _start_on_this_loop(self) -> GatewayServer:
        sock = self._bind() if self.unix_socket is None else self._bind_unix(self.unix_socket)
        server = self._make_server()
        server.exit_event = asyncio.Event()
        self._server = server
        self._task = asyncio.get_running_loop().create_task(
            server.serve(sockets=[sock]), name=f"platoon-gateway-{self.port}"
        )
        if self.unix_socket is None:
            _SERVING[self.gateway] = self
        return self

    async def astop(self) -> None:
        """Stop serving: in-flight requests get up to 2 s, then are cancelled."""
        if _ON_DEMAND.get(self.gateway) is self:  # never asked for: nothing was started
            del _ON_DEMAND[self.gateway]
        server, task = self._server, self._task
        if server is None or task is None:
            return
        if _SERVING.get(self.gateway) is self:
            del _SERVING[self.gateway]
        server.should_exit = True
        server.exit_event.set()
        try:
            await task
        finally:
            self._server = self._task = None
            if self.unix_socket is not None:
                with contextlib.suppress(OSError):
                    self.unix_socket.unlink()

    def start(self) -> GatewayServer:
        """Serve from a background thread with its own event loop; returns once the socket accepts connections."""
        if self._server is not None or self._thread is not None:
            raise RuntimeError("the gateway server is already started")
        ready = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            try:
                await self.astart()
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                raise
            ready.set()
            assert self._task is not None
            await self._task

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException:  # reported through `failure` to the starting thread
                if not failure:
                    log.exception("the gateway server thread failed")

        self._thread = threading.Thread(target=run, name="platoon-gateway", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self) -> None:
        """Stop a server started with `start()` (one started with `astart()` needs `await astop()`)."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            if self._server is not None:
                raise RuntimeError("this server runs on an event loop: stop it with `await server.astop()`")
            return
        asyncio.run_coroutine_threadsafe(self.astop(), loop).result()
        thread.join()
        self._thread = self._loop = None

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> GatewayServer:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()

    def __repr__(self) -> str:
        state = "serving" if self._server is not None else "stopped"
        return f"GatewayServer({self.base_url!r}, {state})"
