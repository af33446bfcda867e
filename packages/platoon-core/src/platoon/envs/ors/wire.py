"""Keep-alive HTTP/1.1 connections to one environment server, for the requests of its sessions.

An episode on an ORS server is about fourteen requests: the session's creation (two), its prompt and tools, one
`/call` per tool call and two deletes. Through aiohttp each costs the client about 0.26 ms of CPU; here, a plain
asyncio protocol with httptools' parser (the C parser uvicorn uses), about 0.12 ms. Measured on the session
requests alone, against one local server: 3.6 ms of client CPU per number-search episode through aiohttp, 1.6 ms
here. Remote episodes are bound by the client's CPU, so this is most of what separates an episode on a server from
one in process (`benchmarks/episodes.py --remote`).

It does the plain case only: `http://` or `https://` straight to the server, a JSON body or none, the response read
whole. What it does not do it raises, and the caller (`platoon.envs.ors.remote`) hands that request to the SDK:

- `Refused`: the server answered with a status other than 2xx (its body kept);
- `Lost`: the connection failed. `sent` says whether the request may have reached the server, `body` holds what
  had arrived, `timed_out` that nothing arrived for `idle_timeout_s`.

httptools is imported when the first `Wire` is made (`available()` says whether it can be).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Lost", "Refused", "Wire", "WireError", "available", "sse_events"]

#: idle connections kept per server (more are closed when they come back)
MAX_IDLE = 256


class WireError(Exception):
    """A request this client does not complete; the caller decides what the SDK does with it."""

    def __init__(self, message: str, body: bytes = b"") -> None:
        super().__init__(message)
        self.body = body


class Refused(WireError):
    """The server answered with a status other than 2xx."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}", body)
        self.status = status


class Lost(WireError):
    """The connection failed before the whole response arrived."""

    def __init__(self, message: str, *, sent: bool, body: bytes = b"", timed_out: bool = False) -> None:
        super().__init__(message, body)
        self.sent = sent
        self.timed_out = timed_out


def available() -> bool:
    """Whether httptools can be imported (it comes with platoon's `ors` extra)."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return False
    return True


def sse_events(body: bytes) -> list[tuple[str, str]]:
    """The `(event, data)` pairs of a server-sent-events body (data lines joined with newlines, comments skipped)."""
    events: list[tuple[str, str]] = []
    text = body.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    for block in text.split("\n\n"):
        event = ""
        data: list[str] = []
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            if field == "event":
                event = value.lstrip(" ")
            elif field == "data":
                data.append(value.removeprefix(" "))
        if event or data:
            events.append((event or "message", "\n".join(data)))
    return events


class _Connection(asyncio.Protocol):
    """One connection and httptools' parser of its responses, one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        import httptools

        self.loop = loop
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.last_activity = 0.0
        self._body: list[bytes] = []
        self._keep_alive = False
        self._done: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_activity = self.loop.time()
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # httptools' HttpParserError: the stream cannot be read on
            self._fail(Lost(f"unreadable response ({exc})", sent=True, body=b"".join(self._body)))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        why = f"the connection was lost ({exc})" if exc else "the server closed the connection"
        self._fail(Lost(why, sent=True, body=b"".join(self._body)))

    # -- httptools' callbacks

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        # read here: once the callback returns, the parser is reset for the next message
        self._keep_alive = self.parser.should_keep_alive()
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    # -- one exchange

    async def exchange(self, request: bytes, idle_timeout_s: float | None) -> tuple[int, bytes]:
        """Send `request`; the response's status and body (a `Lost` when the connection fails first)."""
        assert self.transport is not None
        if self.closed:  # closed by the server since it was checked: nothing was sent on it
            raise Lost("the server closed the connection", sent=False)
        self._body = []
        self._keep_alive = False
        self._done = self.loop.create_future()
        self.last_activity = self.loop.time()
        if idle_timeout_s is not None:
            self._timer = self.loop.call_later(idle_timeout_s, self._check_idle, idle_timeout_s)
        try:
            self.transport.write(request)
            await self._done
        except BaseException:
            self.abort()  # a response read in part leaves the connection unusable
            raise
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._done = None
        return self.parser.get_status_code(), b"".join(self._body)

    def _check_idle(self, idle_timeout_s: float) -> None:
        quiet = self.loop.time() - self.last_activity
        if quiet < idle_timeout_s:
            self._timer = self.loop.call_later(idle_timeout_s - quiet, self._check_idle, idle_timeout_s)
            return
        self._fail(
            Lost(
                f"nothing arrived for {idle_timeout_s:g} s",
                sent=True,
                body=b"".join(self._body),
                timed_out=True,
            )
        )
        self.abort()

    def _fail(self, error: Lost) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(error)

    def keep_alive(self) -> bool:
        """Whether the last response left the connection open for another request."""
        return self._keep_alive and not self.closed and not self.transport.is_closing()  # type: ignore[union-attr]

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Wire:
    """Keep-alive connections to one server (`http://host:port` or `https://...`) on one event loop."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) server URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self._host_header = parts.netloc
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        self._idle: list[_Connection] = []
        #: connections opened so far (a session's requests should need one)
        self.opened = 0

    async def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: Any = None,
        *,
        idle_timeout_s: float | None = None,
    ) -> bytes:
        """The body of a 2xx answer to `method path` with `body` (JSON-encoded unless bytes) and `headers`."""
        content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self._host_header}"]
        for name, value in headers.items():
            if "\n" in value or "\r" in value:
                raise ValueError(f"header {name} holds a line break")
            lines.append(f"{name}: {value}")
        if content is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(content)}"]
        elif method != "GET":
            lines.append("Content-Length: 0")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (content or b"")
        connection = await self._connection()
        status, answer = await connection.exchange(request, idle_timeout_s)
        if connection.keep_alive() and len(self._idle) < MAX_IDLE:
            self._idle.append(connection)
        else:
            connection.abort()
        if not 200 <= status < 300:
            raise Refused(status, answer)
        return answer

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if connection.keep_alive():
                return connection
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(
                lambda: _Connection(loop), self.host, self.port, ssl=self._ssl
            )
        except OSError as exc:
            raise Lost(f"cannot connect to {self.host}:{self.port} ({exc})", sent=False) from exc
        self.opened += 1
        return connection

    def close(self) -> None:
        """Close the idle connections (those in use close when their request ends)."""
        while self._idle:
            self._idle.pop().abort()
