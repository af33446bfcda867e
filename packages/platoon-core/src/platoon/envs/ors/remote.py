"""`service: ors+http(s)://host:port[,host:port...]/EnvName[?variant=&split=&label=]`: ORS environments on
environment servers (the openreward SDK's `Server`), reached through the SDK's async client and, for a session's
own requests, platoon's keep-alive connections (`platoon.envs.ors.wire`).

Tasks and tool hints are the in-process service's (`platoon.envs.ors.inprocess`), and the session's accounting,
gate, grading and forks the base both share (`platoon.envs.ors.lease`); what differs is where the environment lives:

- The pool: the URI's hosts or `urls`, else `OPENREWARD_SESSION_URLS_<LABEL>` (or `session_urls_env_var`), the
  legacy `OPENREWARD_SESSION_URLS` (when `legacy_global_pool`), `OPENREWARD_SESSION_URL`, `http://localhost:8080`;
  read at each open. A rollout's server is SHA-1(rollout id) mod the pool size; a server that does not take the
  session (refused, timed out) is skipped for `DOWN_FOR_S` and the next one in the pool tries, so a run goes on
  on the servers left. A `fresh` fork opens on its parent's server.
- Failures never score 0: a server that dies or a call that outlives `call_timeout_s` ends the session as an
  infrastructure failure; a submit that raised on the server likewise.
- Sessions are registered while open (`platoon.envs.ors.sessions`) so no exit path leaves one on a server.

A session is the SDK's `AsyncSession` (`_PlatoonSdkSession`): its state, ping, death and errors are the SDK's.
Its requests (creation, prompt, tools, calls, deletes) go on the wire, at half the client CPU of the SDK's aiohttp;
what the wire does not complete is handed to the SDK, whose retries and errors then decide (see `_plain` and
`_call_on_wire`). The wire is skipped, and every request is the SDK's, without httptools or with a proxy or netrc
setting to honour, or with `PLATOON_ORS_WIRE=0` (`wire_usable`).

`/call` never goes through the SDK's `AsyncSession.call_tool`, which re-posts a call that failed before the server
named its task (so a submit could run twice) and always retries five times (about 15 s against a dead server): a
call the wire cannot finish is resumed with the SDK's own `resumable_sse` and `resumable_only=True` (a call that
may have run is only ever resumed, never re-sent). Task listings and the server check (`GET /list_environments`)
stay on the SDK's client.

The SDK is imported on first use: this module is what the `ors+http` service entry point names.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import inspect
import json
import logging
import os
import re
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Any

from platoon.envs.gate import DEFAULT_QUEUE_TIMEOUT_S, EnvBusy, Gate, GateClosed
from platoon.envs.ors import bridge, wire
from platoon.envs.ors.inprocess import (
    ROUTING_KEY,
    InProcessOrsService,
    ToolTable,
    join_prompt_text,
    load_env_class,
    name_set,
    says_read_only,
    strip_titles,
    tool_meta,
)
from platoon.envs.ors.lease import OrsLease, OrsSession, as_number, error_result
from platoon.envs.ors.sessions import OpenSession, delete_sessions, registry
from platoon.envs.service import EnvSetupError, SessionNeeds, ToolResult, ToolSpec
from platoon.task import Task

__all__ = ["OrsUri", "Pool", "RemoteOrsService", "RemoteOrsSession", "describe", "parse_uri", "resolve_pool"]

log = logging.getLogger(__name__)

SCHEMES = {"ors+http": "http", "ors+https": "https"}
QUERY_KEYS = ("variant", "split", "label")
DEFAULT_URL = "http://localhost:8080"
LABEL_VARIABLE_PREFIX = "OPENREWARD_SESSION_URLS_"
#: how long a server that did not take a session is passed over by later opens
DOWN_FOR_S = 30.0
#: task specs fetched at once around one asked for (by index)
SPEC_WINDOW = 256
#: environments already warned about declaring no terminal tool (once per process)
_WARNED_NO_TERMINAL: set[str] = set()
#: resumptions of a `/call` stream cut after the server named its task (a call is never sent twice)
CALL_RESUMES = 3
#: a `/call` stream silent this long is given up (the SDK's heartbeat; servers send a comment every 10 s)
SSE_HEARTBEAT_S = 30.0
#: `_call_on_wire`'s answer for a call the SDK should post itself
_TO_SDK: Any = object()


# -- the URI and the pool ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OrsUri:
    """`ors+http://h1:p1,h2:p2/EnvName?variant=v`, taken apart."""

    scheme: str  # http | https
    hosts: tuple[str, ...]
    environment: str
    query: dict[str, str]


def parse_uri(uri: str) -> OrsUri:
    """Parse an `ors+http(s)://` service reference; a malformed one is a ValueError naming what is wrong."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(
            f"service {uri!r}: write ors+http://HOST:PORT[,HOST:PORT...]/EnvName (or ors+https://)"
        )
    rest, _, query_text = rest.partition("?")
    netloc, _, path = rest.partition("/")
    environment = path.strip("/")
    if "/" in environment:
        raise ValueError(f"service {uri!r}: the path is one environment name, not {environment!r}")
    hosts: list[str] = []
    for host in filter(None, (h.strip() for h in netloc.split(","))):
        name, colon, port = host.rpartition(":")
        if not colon or not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"service {uri!r}: {host!r} is not HOST:PORT")
        hosts.append(host)
    query: dict[str, str] = {}
    for pair in filter(None, query_text.split("&")):
        key, eq, value = pair.partition("=")
        if key not in QUERY_KEYS:
            raise ValueError(f"service {uri!r}: unknown query key {key!r} (keys: {', '.join(QUERY_KEYS)})")
        if not eq or not value:
            raise ValueError(f"service {uri!r}: query key {key!r} needs a value")
        if key in query:
            raise ValueError(f"service {uri!r}: query key {key!r} is given twice")
        query[key] = value
    return OrsUri(SCHEMES[scheme], tuple(hosts), environment, query)


@dataclasses.dataclass(frozen=True)
class Pool:
    """The servers a session may open on, and where the list came from (for messages and `platoon env show`)."""

    urls: tuple[str, ...]
    source: str


def label_variable(label: str) -> str:
    """`OPENREWARD_SESSION_URLS_<LABEL>`: the label upper-cased, every non-alphanumeric character as `_`."""
    return LABEL_VARIABLE_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", label).upper()


def _url_list(value: Any, default_scheme: str = "http") -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value or [])
    urls = []
    for item in (str(i).strip() for i in items):
        if item:
            urls.append((item if "://" in item else f"{default_scheme}://{item}").rstrip("/"))
    return urls


def resolve_pool(
    static: Sequence[str],
    *,
    static_source: str = "urls",
    label: str,
    session_urls_env_var: str | None = None,
    legacy_global_pool: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Pool:
    """The pool, first found first: static URLs, the label's variable, the legacy pool, the single URL, localhost."""
    if static:
        return Pool(tuple(static), static_source)
    env = os.environ if environ is None else environ
    names = [session_urls_env_var or label_variable(label)]
    if legacy_global_pool:
        names.append("OPENREWARD_SESSION_URLS")
    names.append("OPENREWARD_SESSION_URL")
    for name in names:
        urls = _url_list(env.get(name) or "")
        if urls:
            return Pool(tuple(urls), f"${name}")
    return Pool((DEFAULT_URL,), "the default")


def server_order(urls: Sequence[str], rollout_id: str) -> list[str]:
    """The pool from the rollout's own server (SHA-1 of the rollout id mod the pool size) onwards."""
    start = int(hashlib.sha1(rollout_id.encode()).hexdigest(), 16) % len(urls)
    return [*urls[start:], *urls[:start]]


# -- the SDK, per event loop ---------------------------------------------------------------------------------------


class ServerRefused(Exception):
    """The server answers but cannot serve this entry (a config problem: wrong name, variant or class)."""


def _sdk_client() -> Any:
    os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
    try:
        from openreward.api.environments import client
    except ImportError as exc:
        raise ImportError(
            f"ors+http:// services need the openreward SDK ({exc}); install it with: pip install 'platoon-core[ors]'"
        ) from exc
    return client


@functools.cache
def _session_class() -> type:
    """The SDK's `AsyncSession` with its requests on the wire and `/call` as the module docstring describes."""
    client = _sdk_client()
    from openreward.api._session.http import USER_AGENT, _RemoteSSEError, request_retryable, resumable_sse
    from openreward.api._session.ping import ErrorResponse
    from openreward.api.errors import HeartbeatTimeoutError, SessionTerminatedError, ToolCallError, ToolFailed

    class _PlatoonSdkSession(client.AsyncSession):  # type: ignore[name-defined]
        def __init__(self, *args: Any, wire: wire.Wire | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            #: the requests running under `_run_or_die`, cancelled when the session dies
            self._watched: set[asyncio.Task[Any]] = set()
            #: the server's keep-alive connections (`platoon.envs.ors.wire`); None: every request through the SDK
            self._wire = wire

        async def _run_or_die(self, coro: Any) -> Any:
            """The SDK's `_run_or_die` (a request ends with the session's death), at one task per request.

            The SDK races every request against the session's death with a second task and `asyncio.wait`; here
            the session cancels the requests it watches when it dies (`_mark_dead`), which is the same outcome
            for a third of the scheduling work, on every one of an episode's dozen requests.
            """
            if self._dead_exception is not None:
                coro.close()
                raise self._dead_exception
            task = asyncio.ensure_future(coro)
            self._watched.add(task)
            try:
                return await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if self._dead_exception is not None and not (current and current.cancelling()):
                    raise self._dead_exception from None  # cancelled by the death, not by the caller
                raise
            except SessionTerminatedError as exc:
                self._mark_dead(ErrorResponse(type="error", message=str(exc)))
                raise
            except Exception as exc:
                raise self._annotate_error(exc) from exc.__cause__
            finally:
                self._watched.discard(task)

        def _mark_dead(self, exc: Any) -> None:
            super()._mark_dead(exc)
            for task in list(self._watched):
                task.cancel()

        async def _run_ping(self, url: str, sid: str, *args: Any, **kwargs: Any) -> None:
            # The SDK pings at once, then every 10 s; a session was just made: its first ping can wait a round
            # (the server reaps after 900 s without one), which spares short episodes a request each.
            await asyncio.sleep(kwargs.get("sleep_time", 10))
            await super()._run_ping(url, sid, *args, **kwargs)

        # -- requests on the wire, each handed to the SDK when the wire does not complete it

        def _headers(
            self, sid: str | None, deployment: str | None, extra: Mapping[str, str] | None = None
        ) -> dict[str, str]:
            headers = {"User-Agent": USER_AGENT, "X-API-Key": self.api_key}
            if sid:
                headers["X-Session-ID"] = sid
            if deployment:
                headers["X-Deployment"] = deployment
            return {**headers, **(extra or {})}

        async def _plain(
            self,
            method: str,
            path: str,
            *,
            expect_json: bool,
            sid: str | None,
            deployment: str | None = None,
            body: Any = None,
            extra_headers: Mapping[str, str] | None = None,
        ) -> Any:
            """A request answered with JSON (or nothing): on the wire, else the SDK's `request_retryable`.

            An answer the wire does not complete (a status other than 2xx, a lost connection) is asked again of the
            SDK, whose retries and errors then decide: these requests are reads, or repeat harmlessly."""
            if self._wire is not None:
                try:
                    answer = await self._wire.request(
                        method, path, self._headers(sid, deployment, extra_headers), body
                    )
                except wire.WireError as exc:
                    log.debug("%s %s went to the SDK: %s", method, path, exc)
                else:
                    return json.loads(answer) if expect_json else None
            return await request_retryable(
                self.client,
                method,
                path,
                expect_json=expect_json,
                token=self.api_key,
                json=body,
                sid=sid,
                deployment=deployment,
                extra_headers=dict(extra_headers) if extra_headers else None,
            )

        async def __aenter__(self) -> Any:
            if self._wire is None or self._external_client is None:
                return await super().__aenter__()
            try:
                answer = await self._wire.request(
                    "POST",
                    self._creation_endpoint,
                    self._headers(
                        None,
                        self.deployment,
                        {"Accept": "text/event-stream", **(self._creation_headers or {})},
                    ),
                    self._creation_payload,
                )
            except wire.WireError as exc:
                answer = exc.body
            # The SDK's server names the new session in its `task_id` event (a hosted one may in `end`'s `sid`).
            events = wire.sse_events(answer)
            sid = next((data.strip() for event, data in events if event == "task_id"), None)
            for event, data in events:
                if event == "end" and data.strip().startswith("{"):
                    sid = json.loads(data).get("sid") or sid
            if not sid:
                return await super().__aenter__()  # the SDK creates it, with its retries and its errors
            self.sid = sid
            try:
                await self._post_create()
            except Exception as exc:
                raise self._annotate_error(exc) from exc.__cause__
            self._ping_task = asyncio.create_task(
                self._run_ping(
                    url=f"{self.base_url}/ping",
                    sid=self.sid,
                    api_key=self.api_key,
                    sleep_time=10,
                    deployment=self.deployment,
                )
            )
            return self

        async def _post_create(self) -> None:
            if self.task is not None or self.toolset_name is not None:
                return await super()._post_create()  # not what platoon opens: the SDK's own
            payload: dict[str, Any] = {"split": self.split, "index": self.index}
            if self.env.variant is not None:
                payload["env_name"] = self.env.variant
            await self._plain(
                "POST",
                "/create",
                expect_json=True,
                sid=self.sid,
                deployment=self.deployment,
                body=payload,
                extra_headers=self._secrets_headers,
            )

        async def _pre_delete(self) -> None:
            if self.sid:
                await self._plain("POST", "/delete", expect_json=False, sid=self.sid)

        async def __aexit__(self, *exc_info: Any) -> None:
            if self._wire is None or self._own_client is not None:
                return await super().__aexit__(*exc_info)
            # The SDK's exit, with its requests on the wire: stop the ping, tear the environment down, delete.
            _stop_ping(self)
            self._ping_task = None  # type: ignore[assignment]
            with contextlib.suppress(Exception):
                await self._pre_delete()
            pending: str | None = getattr(self, "_pending_task_id", None)  # a creation the SDK left half done
            for sid in (pending, self.sid):
                if sid is not None:
                    with contextlib.suppress(Exception):
                        await self._plain("POST", "/delete_session", expect_json=False, sid=sid)
            self._pending_task_id = None

        async def list_tools(self, format: Any = None) -> Any:
            if self._wire is None or format is not None or not self._has_task_tools:
                return await super().list_tools(format)
            try:
                res = await self._run_or_die(
                    self._wire.request(
                        "GET", self._env_path("/task_tools"), self._headers(self.sid, self.deployment)
                    )
                )
            except wire.WireError:
                # a 404 (the server has no per-task tools) or a failure: the SDK's way, with its fallback and errors
                return await super().list_tools(format)
            listing = json.loads(res)
            self._terminal_tool = client.parse_terminal_tool(listing)
            self._supports_score_group = bool(listing.get("supports_score_group"))
            self._message_block_types = listing.get("message_block_types")
            self._score_group_fetched = True
            return client.convert_tool_response(listing, format=format)

        async def prompt_blocks(self) -> list[Any]:
            """The prompt's blocks as the server sent them (dicts, not the SDK's pydantic copies)."""
            blocks: list[Any] = await self._run_or_die(
                self._plain(
                    "GET",
                    self._env_path("/prompt"),
                    expect_json=True,
                    sid=self.sid,
                    deployment=self.deployment,
                )
            )
            return blocks

        async def _call_on_wire(self, payload: dict[str, Any]) -> Any:
            """`/call` on the wire: the `end` event's JSON, or `_TO_SDK` for a call the SDK should post itself.

            A call the server refused (a status other than 2xx) never ran, and nothing was sent on a connection that
            could not be made: both go to the SDK. A stream cut after the server named its task is resumed by the
            SDK; cut before, it raises, since the call may have run (it is never sent twice)."""
            assert self._wire is not None
            try:
                answer = await self._wire.request(
                    "POST",
                    self._env_path("/call"),
                    self._headers(self.sid, self.deployment, {"Accept": "text/event-stream"}),
                    payload,
                    idle_timeout_s=SSE_HEARTBEAT_S,
                )
                cut: wire.Lost | None = None
            except wire.Refused:
                return _TO_SDK
            except wire.Lost as exc:
                if not exc.sent:
                    return _TO_SDK
                if exc.timed_out:
                    raise HeartbeatTimeoutError() from None  # as the SDK's stream: not resumed
                answer, cut = exc.body, exc
            task_id = None
            chunks: list[str] = []
            for event, data in wire.sse_events(answer):
                if event == "task_id":
                    task_id = data.strip()
                elif event == "chunk":
                    chunks.append(data)
                elif event == "error":
                    raise _RemoteSSEError(data or "Unknown SSE error")
                elif event == "end":
                    text = "".join(chunks) + data
                    return json.loads(text) if text else None
            if task_id is None:
                raise ConnectionResetError(str(cut or "the call's stream ended without an answer"))
            return await self._call_through_sdk(payload, task_id)

        async def _call_through_sdk(self, payload: dict[str, Any], task_id: str | None = None) -> Any:
            """`/call` through the SDK's stream: posted (`task_id` None), or the task the server named resumed."""
            return await resumable_sse(
                self.client,
                self._env_path("/call"),
                sid=self.sid,
                deployment=self.deployment,
                token=self.api_key,
                json=payload,
                task_id=task_id,
                max_retries=CALL_RESUMES,
                resumable_only=True,
            )

        async def call_raw(self, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            """The call's output as the server sent it (`blocks`, `metadata`, `reward`, `finished`)."""
            payload = {"name": tool_name, "input": arguments}
            try:
                res = _TO_SDK
                if self._wire is not None:
                    res = await self._run_or_die(self._call_on_wire(payload))
                if res is _TO_SDK:
                    res = await self._run_or_die(self._call_through_sdk(payload))
            except _RemoteSSEError as exc:
                # The tool raised on the server; as the SDK does, the session is over.
                self._mark_dead(ErrorResponse(type="error", message=str(exc)))
                raise ToolFailed(str(exc)) from exc
            if res["ok"]:
                output: dict[str, Any] = res["output"]
                return output
            reason = res.get("reason") or client._infer_invalid_reason(res["error"])
            raise ToolCallError(reason=reason, detail=res["error"])

    return _PlatoonSdkSession


def warm_sdk() -> None:
    """Import the SDK's client and build the session class, starting nothing (a fork server calls it)."""
    _session_class()


class _LoopClients:
    """The SDK clients of one event loop, closed when the loop shuts down (`asyncio.run` closes async generators
    before it closes the loop: a suspended generator is the one hook a loop's end offers)."""

    def __init__(self) -> None:
        self.apis: dict[tuple[str, str | None], Any] = {}
        self.envs: dict[tuple[int, str, str, str | None], Any] = {}
        #: per server URL: its keep-alive connections for sessions' requests
        self.wires: dict[str, wire.Wire] = {}
        self.holder: AsyncIterator[None] | None = None

    async def _hold(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            for api in list(self.apis.values()):
                try:
                    await api.aclose()
                except Exception as exc:  # the loop is ending: say it, do not raise
                    log.debug("closing an ORS client: %s", exc)
            self.apis.clear()
            self.envs.clear()
            for connections in self.wires.values():
                connections.close()
            self.wires.clear()


_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClients] = weakref.WeakKeyDictionary()
os.register_at_fork(after_in_child=_loops.clear)


async def _loop_clients() -> _LoopClients:
    loop = asyncio.get_running_loop()
    clients = _loops.get(loop)
    if clients is None:
        clients = _loops[loop] = _LoopClients()
        holder = clients._hold()
        await holder.__anext__()  # registers it with the loop, which closes it at shutdown
        clients.holder = holder
    return clients


#: how long a response's unread end (an SSE stream's last bytes after its `end` event) is waited for
DRAIN_TIMEOUT_S = 1.0
#: the most bytes read past what the SDK read, to keep a connection (more than that: the connection is closed)
DRAIN_LIMIT = 64 * 1024


@functools.cache
def _draining_response() -> type:
    """aiohttp's response, reading what is left of its body before it is released.

    The SDK returns from an SSE stream (`/create_session`, `/call`) at its `end` event, before the server's last
    chunk (the stream's close) has been read; aiohttp then closes the connection instead of keeping it. A
    session's nine streams each cost a new TCP connection on both sides (measured: 6.3 new connections per
    number-search episode, about a fifth of the server's CPU). Reading the rest, a few bytes sent together with the
    end or just after it, keeps the connection for the next request. A failing request is not drained.
    """
    import aiohttp

    class _DrainingResponse(aiohttp.ClientResponse):
        async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
            if exc_type is None and not self.closed and not self.content.at_eof():
                try:
                    async with asyncio.timeout(DRAIN_TIMEOUT_S):
                        left = DRAIN_LIMIT
                        while left > 0 and not self.content.at_eof():
                            left -= len(await self.content.readany())
                except (TimeoutError, aiohttp.ClientError, OSError) as exc_drain:
                    log.debug("the rest of a response was not read (%s); its connection closes", exc_drain)
            await super().__aexit__(exc_type, exc, tb)

    return _DrainingResponse


@functools.cache
def _env_config_matters() -> bool:
    """Whether a proxy variable or a netrc file is there for aiohttp's `trust_env` to read (checked once)."""
    proxies = ("http_proxy", "https_proxy", "ws_proxy", "wss_proxy", "all_proxy", "no_proxy")
    if any(os.environ.get(name) or os.environ.get(name.upper()) for name in proxies):
        return True
    netrc = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    return os.path.exists(netrc)


#: `PLATOON_ORS_WIRE=0`: every request of remote sessions through the SDK's client (a way around the wire)
WIRE_VARIABLE = "PLATOON_ORS_WIRE"


def wire_usable() -> bool:
    """Whether sessions' requests take `platoon.envs.ors.wire`: not turned off with `PLATOON_ORS_WIRE=0`,
    httptools is installed, and no proxy variable or netrc file is there for the SDK's aiohttp to honour."""
    if os.environ.get(WIRE_VARIABLE, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    return _wire_possible()


@functools.cache
def _wire_possible() -> bool:
    return wire.available() and not _env_config_matters()


async def _bounded(awaitable: Any, timeout_s: float | None) -> Any:
    return await (asyncio.wait_for(awaitable, timeout_s) if timeout_s is not None else awaitable)


_SESSION_PREFIX = re.compile(r"^\((?:environment|sandbox) session sid=[^)]*\)\s*")


def _text(message: str) -> str:
    """A server's or the SDK's message on one line, without the SDK's `(environment session sid=...)` prefix."""
    lines = message.strip().splitlines()
    return _SESSION_PREFIX.sub("", lines[0]) if lines else ""


def _why(exc: BaseException) -> str:
    """One line for a failure: the SDK wraps connection errors in retries; the last of them is what happened."""
    errors = getattr(exc, "errors", None)
    if errors:
        exc = errors[-1]
    if isinstance(exc, TimeoutError):
        return "timed out"
    # aiohttp's ClientConnectorError: the socket's own error says it
    os_error = getattr(exc, "os_error", None)
    if isinstance(os_error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(os_error, OSError):
        return f"cannot connect ({os_error.strerror or os_error})"
    text = _text(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_config_status(exc: BaseException) -> bool:
    """An HTTP 4xx other than the session ones: the request was wrong (an invalid split or index, a bad name)."""
    status = getattr(exc, "status", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (404, 408, 410, 429)


# -- options -------------------------------------------------------------------------------------------------------


def _options(
    service: str,
    /,
    *,
    environment: str | None = None,
    env_name: str | None = None,
    urls: list[str] | str | None = None,
    split: str = "train",
    variant: str | None = None,
    api_key: str | None = None,
    api_url: str | None = None,
    label: str | None = None,
    session_urls_env_var: str | None = None,
    legacy_global_pool: bool = True,
    max_tool_calls: int = 0,
    task_names: list[str] | None = None,
    task_indices: list[int] | None = None,
    terminal_tools: list[str] | None = None,
    read_only_tools: list[str] | None = None,
    concurrent_tools: list[str] | None = None,
    queue_timeout_s: float | None = DEFAULT_QUEUE_TIMEOUT_S,
    tool_meta: Mapping[str, Mapping[str, Any]] | None = None,
    tool_routing_overrides: Mapping[str, Any] | None = None,
    result_format: str = "blocks",
    bridge_tools: bool = False,
    log_dir: str | None = None,
    close_timeout_s: float = 30.0,
    secrets: Mapping[str, str] | None = None,
    name: str | None = None,
    prompt_filter: Callable[[str], str] | str | None = None,
    env_class: str | type | None = None,
    connect_timeout_s: float = 10.0,
    call_timeout_s: float | None = 600.0,
) -> None:
    """The options of an ors+http(s):// service (its signature is the service's, for binding checks)."""


_SIGNATURE = inspect.signature(_options)
_KNOWN = tuple(p for p in _SIGNATURE.parameters if p != "service")


def _positive(value: Any, what: str, *, none_ok: bool = False) -> float | None:
    if value is None and none_ok:
        return None
    number = as_number(value)
    if number is None or number <= 0:
        raise ValueError(f"{what} must be a positive number{' or null' if none_ok else ''}; got {value!r}")
    return number


# -- the service ---------------------------------------------------------------------------------------------------


class RemoteOrsService(InProcessOrsService):
    """The `ors+http(s)://` service: tasks and sessions of an environment served by ORS servers."""

    def __init__(self, service: str, /, **options: Any) -> None:
        for key in options:
            if key not in _KNOWN:
                raise ValueError(
                    f"service_kwargs.{key} is not an option of ors+http(s):// services (options: {', '.join(_KNOWN)})"
                )
        bound = _SIGNATURE.bind(service, **options)
        bound.apply_defaults()
        o = dict(bound.arguments)
        if not isinstance(service, str):
            raise ValueError(f"an ors+http(s):// service is a URI string; got {service!r}")
        uri = parse_uri(service)
        self.uri = service
        for key, value in uri.query.items():
            given = o[key] if key != "split" or "split" in options else None
            if given is not None and given != value:
                raise ValueError(
                    f"service {service!r}: ?{key}={value} and service_kwargs.{key}={given!r} differ"
                )
            o[key] = value
        named = [v for v in (o["environment"], o["env_name"]) if v is not None]
        if o["environment"] is not None and o["env_name"] is not None:
            raise ValueError(f"service {service!r}: give environment or env_name, not both")
        if uri.environment and named and named[0] != uri.environment:
            raise ValueError(
                f"service {service!r}: the URI names {uri.environment!r}, the options {named[0]!r}"
            )
        environment = uri.environment or (named[0] if named else "")
        if not isinstance(environment, str) or not environment:
            raise ValueError(f"service {service!r}: name the environment: ors+http://HOST:PORT/EnvName")
        self.environment: str = environment
        self.variant: str | None = o["variant"]
        self.label: str = o["label"] or environment
        self.name = o["name"] or environment
        where = f"service {self.name!r}"
        if uri.hosts and o["urls"]:
            raise ValueError(f"{where}: give the servers in the URI or in urls, not both")
        self._static = tuple(f"{uri.scheme}://{h}" for h in uri.hosts) or tuple(
            _url_list(o["urls"], uri.scheme)
        )
        self._pool_source = "the service URI" if uri.hosts else "urls"
        self.session_urls_env_var: str | None = o["session_urls_env_var"]
        self.legacy_global_pool = bool(o["legacy_global_pool"])
        self.api_key: str = o["api_key"] or os.environ.get("OPENREWARD_API_KEY") or "local"
        self.api_url: str | None = o["api_url"] or os.environ.get("OPENREWARD_API_URL")
        # The checks the in-process service makes of the options both understand.
        self._task_options(o, where)
        if o["result_format"] not in ("blocks", "bridge_json"):
            raise ValueError(
                f"{where}: result_format must be 'blocks' or 'bridge_json'; got {o['result_format']!r}"
            )
        self.result_format: str = o["result_format"]
        self.log_dir, self.bridge_tools = bridge.bridge_options(o["log_dir"], o["bridge_tools"], where)
        self.close_timeout_s = _positive(o["close_timeout_s"], f"{where}: close_timeout_s") or 30.0
        self.connect_timeout_s = _positive(o["connect_timeout_s"], f"{where}: connect_timeout_s") or 10.0
        self.call_timeout_s = _positive(o["call_timeout_s"], f"{where}: call_timeout_s", none_ok=True)
        tool_meta = self._session_options(o, where)
        routing = o["tool_routing_overrides"] or {}
        if not isinstance(routing, Mapping):
            raise ValueError(f"{where}: tool_routing_overrides must map tool names to routing")
        self._hints = _Hints(
            terminal=name_set(o["terminal_tools"], "terminal_tools"),
            terminal_given=o["terminal_tools"] is not None,
            read_only=name_set(o["read_only_tools"], "read_only_tools"),
            concurrent=name_set(o["concurrent_tools"], "concurrent_tools"),
            meta={str(k): dict(v) for k, v in tool_meta.items()},
            routing={str(k): v for k, v in routing.items()},
            where=where,
        )
        self.env_class: Any = None if o["env_class"] is None else load_env_class(_class_ref(o["env_class"]))
        self._learned_terminal: set[str] = set()
        self._splits: list[str] | None = None
        self._task_specs: dict[str, list[dict[str, Any]]] = {}
        self._counts: dict[str, int] = {}
        self._one_specs: dict[tuple[str, int], dict[str, Any]] = {}
        self._checked: set[str] = set()
        #: the environment each server serves by default (named in paths instead of the redirect to it)
        self._serving: dict[str, str] = {}
        self._down_until: dict[str, float] = {}
        self._tables: dict[str, ToolTable] = {}
        #: lookups under way (`_single_flight`), by what they fetch
        self._flights: dict[tuple[str, ...], asyncio.Task[None]] = {}

    async def _single_flight(
        self, key: tuple[str, ...], fetch: Callable[[], Coroutine[Any, Any, None]]
    ) -> None:
        """`fetch()` once for the callers that ask at the same time on this loop: a run's first rollouts all look up
        the same task window (and before it the server, its splits and counts) at once, and one request serves
        them all. Its failure reaches every caller waiting; the next caller asks again."""
        loop = asyncio.get_running_loop()
        flight = self._flights.get(key)
        if flight is None or flight.done() or flight.get_loop() is not loop:
            flight = self._flights[key] = loop.create_task(fetch())
            flight.add_done_callback(functools.partial(self._landed, key))
        await asyncio.shield(flight)  # a caller cancelled does not cancel the others' lookup

    def _landed(self, key: tuple[str, ...], flight: asyncio.Task[None]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled():
            flight.exception()  # each waiting caller got it; none left means nobody needs it

    # -- the pool ------------------------------------------------------------------------------------------------

    def pool(self, environ: Mapping[str, str] | None = None) -> Pool:
        """The servers now (the variables are read on every call)."""
        if self._static:
            return Pool(self._static, self._pool_source)
        return resolve_pool(
            (),
            label=self.label,
            session_urls_env_var=self.session_urls_env_var,
            legacy_global_pool=self.legacy_global_pool,
            environ=environ,
        )

    def _order(self, urls: Sequence[str], rollout_id: str) -> list[str]:
        """The rollout's servers to try, those that recently did not take a session last."""
        now = time.monotonic()
        order = server_order(urls, rollout_id)
        return [u for u in order if self._down_until.get(u, 0) <= now] + [
            u for u in order if self._down_until.get(u, 0) > now
        ]

    async def _environment(self, url: str) -> Any:
        """The SDK's `AsyncEnvironment` of this entry on `url`, on the running loop's client."""
        clients = await _loop_clients()
        # Without a variant the SDK sends bare paths (`/call`) that the server redirects to its default
        # environment: a second round trip for every call. Once the server said which one that is, name it.
        variant = self.variant or self._serving.get(url)
        key = (id(self), url, self.environment, variant)
        env = clients.envs.get(key)
        if env is None:
            api = clients.apis.get((self.api_key, self.api_url))
            if api is None:
                client = _sdk_client()
                api = clients.apis[(self.api_key, self.api_url)] = client.AsyncEnvironmentsAPI(
                    base_url=url, api_key=self.api_key, api_base_url=self.api_url
                )
            env = clients.envs[key] = api.get(self.environment, variant=variant, base_url=url)
            if not _env_config_matters():
                # The SDK's sessions trust the environment (proxy variables, ~/.netrc), which aiohttp reads again
                # for every request: most of a local call's client time. With none of them set it changes nothing.
                env.client._trust_env = False
            env.client._response_class = _draining_response()
        return env

    async def _wire(self, url: str) -> wire.Wire | None:
        """The keep-alive connections to `url` its sessions' requests take, on the running loop; None (every
        request through the SDK's aiohttp) when httptools is missing or a proxy or netrc setting is there to
        honour (the wire connects straight to the server)."""
        if not wire_usable():
            return None
        clients = await _loop_clients()
        connections = clients.wires.get(url)
        if connections is None:
            connections = clients.wires[url] = wire.Wire(url)
        return connections

    async def _check_server(self, url: str) -> None:
        """Until it once succeeds, per server: it answers, and serves this entry (`ServerRefused` when not)."""
        if url in self._checked:
            return
        await self._single_flight(("check", url), functools.partial(self._check, url))
        self._checked.add(url)

    async def _check(self, url: str) -> None:
        import aiohttp

        env = await self._environment(url)
        # A busy server still accepts connections (the kernel does): only connecting is bounded this tightly.
        timeout = aiohttp.ClientTimeout(sock_connect=self.connect_timeout_s, total=self.call_timeout_s)
        async with env.client.get("/list_environments", timeout=timeout) as response:
            response.raise_for_status()
            served = [str(n).lower() for n in await response.json()]
        where = f"{self.name}: the server at {url}"
        if self.variant is not None:
            if self.variant.lower() not in served:
                raise ServerRefused(
                    f"{where} serves no environment {self.variant!r} (it serves: {', '.join(served)})"
                )
            serving = self.variant.lower()
        else:
            if (
                len(served) > 1
                and self.environment.lower() in served
                and self.environment.lower() != served[0]
            ):
                raise ServerRefused(
                    f"{where} serves {', '.join(served)}; {self.environment!r} is not its default ({served[0]!r}): "
                    f"name it with ?variant={self.environment.lower()}"
                )
            serving = served[0] if served else ""
            if serving:
                self._serving[url] = serving
        if self.env_class is not None:
            if self.env_class.__name__.lower() != serving:
                raise ServerRefused(
                    f"{where} serves {serving!r}, not env_class {self.env_class.__name__} "
                    f"(environment {self.env_class.__name__.lower()!r})"
                )
            listing = await env.list_tools()
            terminal = await env.terminal_tool()
            served_tools = {t.name for t in listing} | ({terminal.name} if terminal is not None else set())
            ours = set(
                ToolTable(
                    self.env_class,
                    terminal=set(),
                    read_only=set(),
                    concurrent=set(),
                    meta={},
                    where=self._hints.where,
                ).specs
            )
            if served_tools != ours:
                raise ServerRefused(
                    f"{where} serves tools {sorted(served_tools)}, env_class {self.env_class.__name__} has "
                    f"{sorted(ours)}"
                )

    async def _listing_env(self) -> Any:
        """The SDK environment of the first server that answers, for task listings (ValueError when none does)."""
        await registry.sweep()
        pool = self.pool()
        failures = []
        for url in pool.urls:
            try:
                await self._check_server(url)
            except ServerRefused as exc:
                raise ValueError(str(exc)) from None
            except Exception as exc:
                failures.append(f"{url}: {_why(exc)}")
                continue
            return await self._environment(url)
        raise ValueError(
            f"{self.name}: no ORS server answers (servers from {pool.source}): {'; '.join(failures)}"
        )

    # -- tasks ---------------------------------------------------------------------------------------------------

    async def list_splits(self) -> list[str]:
        async def fetch() -> None:
            env = await self._listing_env()
            try:
                self._splits = [str(s) for s in await env.list_splits()]
            except Exception as exc:
                raise ValueError(f"{self.name}: listing the splits failed: {_why(exc)}") from None

        if self._splits is None:
            await self._single_flight(("splits",), fetch)
        return list(self._splits or ())

    async def _specs(self, split: str) -> Sequence[Mapping[str, Any]]:
        """Every task spec of `split` (one listing, kept): only task names need them all."""

        async def fetch() -> None:
            env = await self._listing_env()
            try:
                tasks = await env.list_tasks(split)
            except Exception as exc:
                raise ValueError(f"{self.name}: listing split {split!r} failed: {_why(exc)}") from None
            self._task_specs[split] = [dict(t.task_spec) for t in tasks]
            self._counts[split] = len(self._task_specs[split])

        await self._check_split(split)
        if split not in self._task_specs:
            await self._single_flight(("listing", split), fetch)
        return self._task_specs[split]

    async def _check_split(self, split: str) -> None:
        splits = await self.list_splits()
        if split not in splits:
            raise ValueError(f"{self.name} has no split {split!r} (splits: {', '.join(splits)})")

    async def _count(self, split: str) -> int:
        """How many tasks `split` has, asked of the server (a task list of 50,000 specs is megabytes)."""

        async def fetch() -> None:
            env = await self._listing_env()
            try:
                self._counts[split] = int(await env.num_tasks(split))
            except Exception as exc:
                raise ValueError(f"{self.name}: counting split {split!r} failed: {_why(exc)}") from None

        await self._check_split(split)
        if split not in self._counts:
            await self._single_flight(("count", split), fetch)
        return self._counts[split]

    async def _spec(self, split: str, index: int) -> Mapping[str, Any]:
        """One task's spec: from the listing when it was made, else asked of the server alone."""
        listed = self._task_specs.get(split)
        if listed is not None:
            return listed[index]
        # A window of tasks at once: rollouts ask for task after task, and each lookup is a session's worth of
        # requests on the server.
        start = index - index % SPEC_WINDOW

        async def fetch() -> None:
            stop = min(start + SPEC_WINDOW, await self._count(split))
            env = await self._listing_env()
            try:
                tasks = await env.get_task_range(split, start, stop)
            except Exception as exc:
                raise ValueError(f"{self.name}: getting task {split}:{index} failed: {_why(exc)}") from None
            for offset, found in enumerate(tasks):
                self._one_specs[(split, start + offset)] = dict(found.task_spec)

        key = (split, index)
        if key not in self._one_specs:
            await self._single_flight(("window", split, str(start)), fetch)
        return self._one_specs[key]

    async def list_tasks(self, split: str) -> list[str]:
        if split == self.split and (self.task_names is not None or self.task_indices is not None):
            return await super().list_tasks(split)  # narrowed: checked against the listing as in process
        return [f"{split}:{i}" for i in range(await self._count(split))]

    async def _locate(self, task_id: str) -> tuple[str, int]:
        split, sep, index_text = task_id.rpartition(":") if isinstance(task_id, str) else ("", "", "")
        if sep and index_text.isdigit() and split in await self.list_splits():
            index, count = int(index_text), await self._count(split)
            if index >= count:
                raise ValueError(f"{self.name} has no task {task_id!r}: split {split!r} has {count} tasks")
            return split, index
        return await super()._locate(task_id)  # a task name or a reference: the listing decides

    def _reference_names(self) -> set[str]:
        names = {self.name.lower(), self.environment.lower(), self.label.lower()}
        if self.variant:
            names.add(self.variant.lower())
        if self.env_class is not None:
            names.add(self.env_class.__name__.lower())
        return names

    # -- sessions ------------------------------------------------------------------------------------------------

    async def open(
        self,
        task: Task,
        *,
        rollout_id: str,
        needs: SessionNeeds | None = None,
        server: str | None = None,
        forked_from: str | None = None,
    ) -> RemoteOrsSession:
        """Open a session on the rollout's server (or `server`), fetch the prompt (failures: `EnvSetupError`).

        `forked_from`: the session a `fresh` fork is taken from (named in the event log)."""
        try:
            split, index = self._task_position(task)
        except ValueError as exc:
            raise EnvSetupError("env_config", f"{self.name}: {exc}") from None
        label = f"{self.name} {split}:{index}"
        if registry.shut_down:
            raise EnvSetupError("env_connect", f"{label}: the process is shutting down; no new ORS session")
        await registry.sweep()
        order = [server] if server else self._order(self.pool().urls, rollout_id)
        failures: list[str] = []
        sdk_session: Any = None
        url = ""
        for url in order:
            try:
                await self._check_server(url)
            except ServerRefused as exc:
                raise EnvSetupError("env_config", str(exc)) from None
            except Exception as exc:
                self._down_until[url] = time.monotonic() + DOWN_FOR_S
                failures.append(f"{url}: {_why(exc)}")
                continue
            sdk_session = _session_class()(
                await self._environment(url),
                split=split,
                index=index,
                api_key=self.api_key,
                secrets=dict(self._secrets) or None,
                wire=await self._wire(url),
            )
            try:
                await _bounded(sdk_session.__aenter__(), self.call_timeout_s)
            except Exception as exc:
                await _quiet_exit(sdk_session, self.close_timeout_s)
                if _is_config_status(exc):
                    raise EnvSetupError("env_config", f"{label} on {url}: {_why(exc)}") from None
                self._down_until[url] = time.monotonic() + DOWN_FOR_S
                failures.append(f"{url}: {_why(exc)}")
                sdk_session = None
                continue
            break
        if sdk_session is None:
            raise EnvSetupError(
                "env_connect", f"{label}: no ORS server took the session ({'; '.join(failures)})"
            )
        self._down_until.pop(url, None)
        registry.add(
            OpenSession(url, sdk_session.sid, self.api_key, sdk_session.deployment or self.environment)
        )
        lease = _RemoteLease(
            self, sdk_session, Gate(queue_timeout_s=self.queue_timeout_s, name=label), label, url
        )
        # Asked beside the prompt: a harness lists the tools before its first turn, and a request sent now is a
        # round trip the episode's start does not wait for one after the other.
        lease.listing_ahead = asyncio.ensure_future(_bounded(sdk_session.list_tools(), self.call_timeout_s))
        try:
            blocks = [
                _wire_block(b) for b in await _bounded(sdk_session.prompt_blocks(), self.call_timeout_s)
            ]
            text = join_prompt_text(blocks)
            if self.prompt_filter is not None:
                text = str(self.prompt_filter(text))
        except Exception as exc:
            await lease.release()
            raise EnvSetupError(
                "env_setup", f"{label}: getting the prompt on {url} failed: {_why(exc)}"
            ) from exc
        log.debug("ors session opened: %s on %s (rollout %s)", label, url, rollout_id)
        return self._first_view(
            RemoteOrsSession,
            lease,
            task,
            text,
            blocks,
            rollout_id,
            forked_from,
            sid=str(sdk_session.sid),
            server=url,
        )

    def table_for(self, server: str, listing: Sequence[Any], terminal: Any) -> ToolTable:
        """The tool table of a session's listing (kept per server; listings of one server rarely differ)."""
        known = self._tables.get(server)
        names = [t.name for t in listing] + ([terminal.name] if terminal is not None else [])
        if known is not None and list(known.specs) == names:
            return known
        table = self._hints.table(listing, terminal, self.env_class)
        if not table.declares_terminal and self.environment not in _WARNED_NO_TERMINAL:
            _WARNED_NO_TERMINAL.add(self.environment)
            log.warning(
                "%s: the server declares no terminal tool and no terminal_tools or env_class is given: any tool "
                "may end an episode, and a failing one is an infrastructure error",
                self.name,
            )
        self._tables[server] = table
        return table

    def __repr__(self) -> str:
        return f"RemoteOrsService({self.uri!r})"


setattr(  # noqa: B010 - config checks bind service_kwargs against this signature
    RemoteOrsService.__init__,
    "__signature__",
    _SIGNATURE.replace(
        parameters=[
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
            *_SIGNATURE.parameters.values(),
        ]
    ),
)


def describe(service: str, service_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """What `platoon env show` says of a remote entry, without reaching a server: the environment, its variant,
    split and label, and the servers a session opened now would use (and where that list comes from)."""
    built = RemoteOrsService(service, **dict(service_kwargs))
    pool = built.pool()
    described: dict[str, Any] = {
        "environment": built.environment,
        "variant": built.variant,
        "split": built.split,
        "label": built.label,
        "servers": list(pool.urls),
        "servers_from": pool.source,
    }
    if not built._static:
        described["session_urls_variable"] = built.session_urls_env_var or label_variable(built.label)
    described["call_timeout_s"] = built.call_timeout_s
    return described


def mixture_problems(entries: Sequence[Any]) -> list[str]:
    """Entries of a mixture without a variant that would reach one server under different environment names
    (each would get the server's default environment), as problem lines; nothing is reached."""
    seen: dict[str, tuple[int, str]] = {}  # server url -> (entry index, environment name)
    problems: list[str] = []
    for index, entry in enumerate(entries):
        service = getattr(entry, "service", None)
        if not isinstance(service, str) or not service.startswith(("ors+http://", "ors+https://")):
            continue
        try:
            built = RemoteOrsService(service, **dict(getattr(entry, "service_kwargs", None) or {}))
        except (ValueError, TypeError):
            continue  # the entry's own problem, reported where it is built
        if built.variant is not None:
            continue
        for url in built.pool().urls:
            first = seen.setdefault(url, (index, built.environment))
            if first[1].lower() != built.environment.lower():
                problems.append(
                    f"environments.{index}.service: {built.environment!r} and environments.{first[0]}'s "
                    f"{first[1]!r} reach {url} without ?variant=, so both would get its default environment: "
                    "name each with ?variant=<name>"
                )
                break
    return problems


def _class_ref(value: Any) -> Any:
    if isinstance(value, str) and not value.startswith("python://"):
        return f"python://{value}"
    return value


def _wire_block(block: Any) -> dict[str, Any]:
    """A content block as the in-process service gives it (the SDK's model dump without null fields)."""
    if not isinstance(block, Mapping):
        block = block.model_dump(exclude_none=True)
    return {k: v for k, v in block.items() if v is not None}


async def _quiet_exit(sdk_session: Any, timeout_s: float) -> None:
    """Close an SDK session (stop its ping, delete it on the server), never raising."""
    try:
        await asyncio.wait_for(sdk_session.__aexit__(None, None, None), timeout_s)
    except Exception as exc:
        log.debug("closing an ORS session: %s", _why(exc))


def _stop_ping(sdk_session: Any) -> None:
    task = getattr(sdk_session, "_ping_task", None)
    if task is not None:
        task.cancel()


# -- tool hints ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Hints:
    """The hints the options give, applied to a server's listing (remote servers send names, schemas, @terminal)."""

    terminal: set[str]
    terminal_given: bool
    read_only: set[str]
    concurrent: set[str]
    meta: dict[str, dict[str, Any]]
    routing: dict[str, Any]
    where: str

    def table(self, listing: Sequence[Any], terminal: Any, env_class: Any) -> ToolTable:
        specs: list[tuple[str, str, Any]] = [(t.name, t.description, t.input_schema) for t in listing]
        if terminal is not None:
            arg = terminal.arg
            schema: dict[str, Any] = {"type": "object", "properties": {}}
            if arg:
                schema = {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}
            specs.append((terminal.name, terminal.description or "", schema))
        names = {name for name, _, _ in specs}
        for option, given in (
            ("terminal_tools", self.terminal),
            ("read_only_tools", self.read_only),
            ("concurrent_tools", self.concurrent),
        ):
            unknown = sorted(given - names)
            if unknown:
                raise EnvSetupError(
                    "env_config",
                    f"{self.where}: {option} names unknown tools {unknown} (tools: {', '.join(sorted(names))})",
                )
        cls_table = None
        if env_class is not None:
            cls_table = ToolTable(
                env_class, terminal=set(), read_only=set(), concurrent=set(), meta={}, where=self.where
            )
        declared = set(self.terminal) | (cls_table.declared_terminal if cls_table else set())
        if terminal is not None:
            declared.add(terminal.name)
        table = ToolTable.__new__(ToolTable)  # the in-process table's shape, filled from the listing
        table.declared_terminal = declared
        table.declares_terminal = (
            bool(declared) or self.terminal_given or bool(cls_table and cls_table.declares_terminal)
        )
        table.specs = {}
        table.read_only = set()
        for name, description, schema in specs:
            class_meta = cls_table.specs[name][2] if cls_table and name in cls_table.specs else None
            merged = tool_meta(name, schema, terminal, class_meta, self.meta.get(name))
            if name in self.routing:  # `tool_routing_overrides` wins over the server's schema
                merged[ROUTING_KEY] = self.routing[name]
            class_read_only = bool(cls_table and name in cls_table.read_only)
            if name not in declared and (name in self.read_only or class_read_only or says_read_only(merged)):
                table.read_only.add(name)
            table.specs[name] = (description, strip_titles(schema), merged)
        concurrent = set(self.concurrent) | (cls_table.concurrent if cls_table else set())
        table.concurrent = concurrent - declared
        return table


# -- leases and sessions -------------------------------------------------------------------------------------------


class _RemoteLease(OrsLease):
    """One session on a server and its accounting, shared by every view forked `shared`."""

    service: RemoteOrsService

    def __init__(
        self, service: RemoteOrsService, sdk_session: Any, gate: Gate, label: str, server: str
    ) -> None:
        super().__init__(service, sdk_session, gate, f"{label} on {server}")
        self.server = server
        self._table: ToolTable | None = None
        #: why the session cannot take calls any more (the server died, the call timed out, a tool raised)
        self.dead: str | None = None
        #: the server stopped answering: closing it is one attempt, not the SDK's retries
        self.unreachable = False
        #: the tool listing, asked for when the session opened (taken by the first listing)
        self.listing_ahead: asyncio.Future[Any] | None = None

    @property
    def table(self) -> ToolTable:
        if self._table is None:
            raise RuntimeError("the tools of a remote session are listed before its first call")
        return self._table

    def refusal(self) -> ToolResult | None:
        if registry.shut_down and not self.closed:
            return error_result("Not run: the process is shutting down.", "session_closed")
        if self.dead is not None and not self.closed and not self.finished:
            return error_result(f"Not run: the environment session is over ({self.dead}).", "session_dead")
        return super().refusal()

    async def _run_call(self, name: str, arguments: dict[str, Any], ending: bool) -> ToolResult:
        from openreward.api.errors import ToolCallError, ToolFailed

        kind = self.tool_kind(name)
        timeout = self.service.call_timeout_s
        log.debug("%s: tool call %d: %s", self.label, self.turns, name)
        try:
            output = await _bounded(self.env.call_raw(name, arguments), timeout)
        except ToolCallError as exc:  # a call the policy got wrong, or one after the episode ended
            return error_result(exc.detail or f"Invalid call to {name!r}.", exc.reason or "invalid_call")
        except ToolFailed as exc:
            what = _text(exc.message) or "the tool raised"
            self.dead = f"tool {name!r} raised on the server"
            return self.tool_raised(name, what, ending, infra=f"{kind} {name!r} raised on the server: {what}")
        except TimeoutError:
            self.dead = f"tool {name!r} did not answer within {timeout:g} s"
            self.infra.append(f"{kind} {name!r} did not answer within {timeout:g} s")
            return error_result(f"Tool {name!r} did not answer within {timeout:g} s.", "env_timeout")
        except Exception as exc:  # the server went away or ended the session: the measurement failed
            what = _why(exc)
            self.dead = f"the server stopped answering ({what})"
            self.unreachable = True
            self.infra.append(f"{kind} {name!r}: the server at {self.server} stopped answering ({what})")
            return error_result(
                f"Tool {name!r} was not answered: the environment server failed ({what}).", "env_error"
            )
        metadata = dict(output.get("metadata") or {})
        blocks = [_wire_block(b) for b in output.get("blocks") or []]
        result = self.landed(name, blocks, metadata, output.get("finished"), output.get("reward"))
        if self.service.result_format == "bridge_json":
            return _bridged(result)
        return result

    async def _end_session(self) -> None:
        if self.listing_ahead is not None:  # closed before anything listed the tools
            self.listing_ahead.cancel()  # (also a listing that failed: its error is not reported as unread)
            self.listing_ahead = None
        timeout = self.service.close_timeout_s
        await self._drain_gate(timeout, log, then="cancelling them")
        session = self.env
        record = OpenSession(self.server, session.sid, self.service.api_key, session.deployment or "")
        if self.unreachable:
            # One plain attempt: the SDK would retry for seconds against a server that is gone.
            _stop_ping(session)
            failed = await delete_sessions([record], timeout_s=min(timeout, 5.0))
        else:
            await _quiet_exit(session, timeout)
            failed = []
        if not failed:
            registry.remove(record.sid)
        log.debug("%s: closed after %d tool call(s)", self.label, self.turns)


def _bridged(result: ToolResult) -> ToolResult:
    """`result_format: bridge_json`: one text block with the whole result as JSON."""
    payload = {
        "finished": result.finished,
        "reward": result.reward,
        "text": result.as_text(),
        "blocks": result.content,
        "metadata": result.metadata,
    }
    try:
        text = json.dumps(payload)
    except (TypeError, ValueError):
        text = json.dumps({"raw": repr(payload)})
    bridged = ToolResult.text(text, is_error=result.is_error)
    bridged.finished, bridged.reward, bridged.metadata = result.finished, result.reward, result.metadata
    return bridged


class RemoteOrsSession(OrsSession):
    """A view of a session on an ORS server: tools, calls through the gate, grading, forks (`shared`, `fresh`)."""

    _lease: _RemoteLease

    @property
    def server(self) -> str:
        """The URL of the server this session lives on."""
        return self._lease.server

    @property
    def env(self) -> Any:
        """The SDK's session object (for tests and debugging)."""
        return self._lease.env

    async def _env_tools(self) -> list[ToolSpec]:
        lease = self._lease
        if lease.tools is None:
            service = lease.service

            async def listing() -> list[ToolSpec]:
                if lease.tools is not None:  # listed while this one waited for its turn
                    return lease.tools
                session = lease.env
                ahead, lease.listing_ahead = lease.listing_ahead, None
                try:
                    specs = await (ahead or _bounded(session.list_tools(), service.call_timeout_s))
                    terminal = session._terminal_tool  # read by list_tools (terminal_tool() would list again)
                except Exception as exc:
                    lease.dead = f"listing the tools failed ({_why(exc)})"
                    lease.unreachable = True
                    lease.infra.append(f"listing the tools on {lease.server} failed: {_why(exc)}")
                    return []
                lease._table = service.table_for(lease.server, specs, terminal)
                return lease._table.listing(service._learned_terminal)

            try:
                lease.tools = await lease.gate.run(listing, "exclusive", caller=self, what="tool listing")
            except (EnvBusy, GateClosed):
                return []
        return list(lease.tools)

    async def call_tool(
        self, name: str, arguments: Mapping[str, Any], *, on_behalf_of: str | None = None
    ) -> ToolResult:
        if self._lease._table is None and not self._closed and self._lease.dead is None:
            await self.tools()
        if self._lease._table is None:
            reason = self._lease.dead or "the session is closed"
            return self._lease.not_run(
                name, error_result(f"Not run: the environment session is over ({reason}).", "session_dead")
            )
        return await super().call_tool(name, arguments, on_behalf_of=on_behalf_of)

    async def _fork_fresh(self, task: Task) -> OrsSession:
        lease = self._lease  # a fresh session opens on its parent's server
        return await lease.service.open(
            task, rollout_id=self._rollout_id, server=lease.server, forked_from=lease.session_id
        )

    async def _copy(self, task: Task | None) -> OrsSession:
        # The environment's state lives on the server, where platoon cannot snapshot it.
        raise EnvSetupError(
            "env_config",
            f"{self._lease.label}: a copy fork needs the environment in process; fork shared or fresh",
        )
