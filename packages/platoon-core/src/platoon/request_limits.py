"""Bounds on one HTTP request to platoon's services: the model gateway and the local Tinker server.

Both hold request bodies to a size cap while reading them (`BodyCap`, an ASGI wrapper, for the gateway; the local
server's own reader) and parse them with `loads_within_depth`, which refuses JSON nested deeper than a cap: no parser
or later walk over the body can then recurse without bound. `BodyCap` also makes a refusal sent before its request's
body was read (413, 401) reach the client. `limit_from_env` reads a cap's variable once, when a server is made.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "DEFAULT_MAX_JSON_DEPTH",
    "MIB",
    "BodyCap",
    "JSONTooDeep",
    "limit_from_env",
    "loads_within_depth",
    "nested_deeper_than",
]

MIB = 1 << 20
#: objects and lists inside one another; no request platoon's clients send comes near it (a chat request is ~6 deep)
DEFAULT_MAX_JSON_DEPTH = 64
#: After an answer sent before its request's body was read to the end, the rest of the body is read and dropped for
#: this long at most, with at most `LINGER_IDLE_SECONDS` between two pieces, and at most `LINGER_BYTES` of it; then
#: the connection is closed. An asyncio client (httpx's async client, the Tinker SDK, AsyncOpenAI) sends its whole
#: body before it reads the answer and drops the answer when its send fails: a connection closed on an unread body
#: (the kernel then resets it) would reach it as a connection error, retried, instead of the one-line refusal.
LINGER_SECONDS = 5.0
LINGER_IDLE_SECONDS = 1.0
LINGER_BYTES = 1 << 30


class JSONTooDeep(ValueError):
    """A JSON body nested deeper than the cap; the message names the cap."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body's JSON is nested more than {limit} levels deep")
        self.limit = limit


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether decoded JSON holds objects and lists more than `limit` levels deep (the top level is level 1).

    Iterative, so a deep value cannot exhaust the stack; a list is scanned element by element only when it holds a
    container, so the long number lists of a training request cost one pass in C.
    """
    if not isinstance(value, list | dict):
        return False
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        kinds = set(map(type, children))
        if list in kinds or dict in kinds:
            pending.extend((child, depth + 1) for child in children if isinstance(child, list | dict))
    return False


def loads_within_depth(raw: bytes | str, max_depth: int) -> Any:
    """`json.loads(raw)`, refusing nesting deeper than `max_depth` with `JSONTooDeep`; any other malformed body
    raises `ValueError` (as `json.loads` does)."""
    try:
        value = json.loads(raw)
    except RecursionError:  # deeper than the interpreter's own limit: far past any cap
        raise JSONTooDeep(max_depth) from None
    if nested_deeper_than(value, max_depth):
        raise JSONTooDeep(max_depth)
    return value


#: The variables that set the gateway's limits (read where each limit is made), with the least value each takes.
MAX_BODY_BYTES_ENV = "PLATOON_GATEWAY_MAX_BODY_BYTES"
MAX_JSON_DEPTH_ENV = "PLATOON_GATEWAY_MAX_JSON_DEPTH"
MAX_TOKENS_ENV = "PLATOON_GATEWAY_MAX_TOKENS"
MAX_PROMPT_TOKENS_ENV = "PLATOON_GATEWAY_MAX_PROMPT_TOKENS"
MAX_MINTED_AGENTS_ENV = "PLATOON_MAX_MINTED_AGENTS"
GATEWAY_LIMIT_VARIABLES = {
    MAX_BODY_BYTES_ENV: 1,
    MAX_JSON_DEPTH_ENV: 1,
    MAX_TOKENS_ENV: 1,
    MAX_PROMPT_TOKENS_ENV: 1,
    MAX_MINTED_AGENTS_ENV: 0,
}


def gateway_limit_problems(env: Mapping[str, str] | None = None) -> list[str]:
    """One line per gateway limit variable set to something other than an integer it takes: the run-start check
    (and `platoon config validate`'s), so a bad value stops the run before its gateway is made."""
    problems: list[str] = []
    for name, minimum in GATEWAY_LIMIT_VARIABLES.items():
        try:
            limit_from_env(name, minimum, env, minimum=minimum)
        except ValueError as exc:
            problems.append(f"{exc} (unset it for the default)")
    return problems


def limit_from_env(
    name: str,
    default: int,
    env: Mapping[str, str] | None = None,
    *,
    given: int | None = None,
    minimum: int = 1,
) -> int:
    """`given` when the caller set one, else the integer in `$name`, else `default`; a value in the variable that is
    not an integer of at least `minimum` raises ValueError naming the variable."""
    if given is not None:
        return given
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return default
    wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be {wanted}; got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be {wanted}; got {value}")
    return value


class BodyCap:
    """An ASGI app around another that holds every request body to `limit` bytes while it is read, and delivers an
    answer sent before its request's body was read to the end.

    With a `limit`, a Content-Length over it fails the body's first read (`too_large(limit, declared)` is raised from
    `receive`) before a byte of the body is taken, and a body without one (chunked) fails the read that passes the
    limit (`too_large(limit, None)`): nothing past the limit is kept. The wrapped app answers the error in its own
    shape; if it lets the error through before answering, `render(error)` gives the body of a 413.

    An answer that starts before the body was read to the end (the refusal of a body over the limit, of a request
    without a key) closes the connection after it. Its last piece is held back while the rest of the body is read and
    dropped (`LINGER_SECONDS`, `LINGER_IDLE_SECONDS`, `LINGER_BYTES`), so a client that sends its whole body before it
    reads finds the complete answer waiting; a body that goes on past that bound is cut off by the close.
    """

    def __init__(
        self,
        app: Any,
        *,
        limit: int | None = None,
        too_large: Callable[[int, int | None], Exception] | None = None,
        render: Callable[[Exception], bytes] | None = None,
    ) -> None:
        if limit is not None and too_large is None:
            raise ValueError("a BodyCap with a limit needs too_large")
        self.app = app
        self.limit = limit
        self.too_large = too_large
        self.render = render

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, too_large = self.limit, self.too_large
        declared: int | None = None
        has_body = False
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit():
                declared = int(value)
                has_body = declared > 0
            elif name == b"transfer-encoding":
                has_body = True
        over = limit is not None and declared is not None and declared > limit
        received = 0
        complete = not has_body  # the body was read to its end (or there is none)
        started = early = False
        refused: list[Exception] = []

        async def bounded_receive() -> Any:
            nonlocal received, complete
            if refused:
                raise refused[0]
            if over:
                assert limit is not None and too_large is not None
                refused.append(too_large(limit, declared))
                raise refused[0]
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if limit is not None and received > limit:
                    assert too_large is not None
                    refused.append(too_large(limit, None))
                    raise refused[0]
                if not message.get("more_body", False):
                    complete = True
            return message

        async def drain() -> None:
            """Read and drop the rest of the body, within the linger bounds."""
            nonlocal complete
            loop = asyncio.get_running_loop()
            deadline = loop.time() + LINGER_SECONDS
            dropped = 0
            while not complete and dropped <= LINGER_BYTES:
                left = deadline - loop.time()
                if left <= 0:
                    return
                try:
                    message = await asyncio.wait_for(receive(), min(left, LINGER_IDLE_SECONDS))
                except (TimeoutError, asyncio.CancelledError):
                    # a stopping server cancels its requests: the answer's end goes out at once, then the close
                    return
                if message["type"] != "http.request":
                    return  # the client went away
                dropped += len(message.get("body", b""))
                complete = not message.get("more_body", False)

        async def answering_send(message: Any) -> None:
            nonlocal started, early
            if message["type"] == "http.response.start":
                started = True
                early = not complete
                if early:
                    headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
            elif message["type"] == "http.response.body" and early and not message.get("more_body", False):
                await send({**message, "more_body": True})
                await drain()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await send(message)

        try:
            await self.app(scope, bounded_receive, answering_send)
        except Exception as exc:
            if started or not refused or exc is not refused[0]:
                raise
            body = self.render(exc) if self.render is not None else json.dumps({"error": str(exc)}).encode()
            await answering_send(
                {
                    "type": "http.response.start",
                    "status": 413,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await answering_send({"type": "http.response.body", "body": body})
