"""What the gateway's HTTP server and its dialect modules share: the wire's JSON bytes, the disconnect error and
`DialectServer`, the part of the server the dialect endpoints call.

It sits below both, so the dialects never import the server, not even for types (the server imports the
dialects for its routes).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

    from starlette.requests import Request
    from starlette.responses import Response

    from platoon.gateway.core import ModelGateway
    from platoon.gateway.records import AgentRecord, Interaction
    from platoon.harness.agent import ChatReply

__all__ = ["ClientGone", "DialectServer", "dumps"]


class ClientGone(Exception):
    """The client disconnected before the reply was ready: the call was cancelled and nothing recorded."""


def dumps(value: Any) -> bytes:
    """Compact JSON bytes (the wire format of every reply and event)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


class DialectServer(Protocol):
    """What the dialect endpoints use of `GatewayServer` (which satisfies it): its request helpers and the state
    the agents endpoint reads. Attributes are read-only here: the dialects never rebind them."""

    @property
    def gateway(self) -> ModelGateway: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def backend(self) -> object: ...

    @property
    def minted(self) -> dict[str, int]: ...

    @property
    def max_minted_agents(self) -> int: ...

    def authenticate(self, request: Request) -> AgentRecord: ...

    def call_kind(self, request: Request) -> str: ...

    async def json_body(self, request: Request) -> dict[str, Any]: ...

    def start_chat(
        self,
        agent: AgentRecord,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kind: str,
        sampling: dict[str, Any],
    ) -> asyncio.Task[ChatReply]: ...

    async def until_disconnect(self, request: Request, task: asyncio.Task[Any]) -> Any: ...

    def stream_events(
        self,
        task: asyncio.Task[Any],
        events: Callable[[Any], Iterable[bytes]],
        failure: Callable[[BaseException], bytes],
    ) -> AsyncIterator[bytes]: ...

    def server_error(self, exc: BaseException, agent: AgentRecord | None = None) -> None: ...

    def interaction(self, agent: AgentRecord, call_id: str) -> Interaction | None: ...

    def usage(self, agent: AgentRecord, call_id: str) -> tuple[int, int]: ...

    async def forward(
        self, agent: AgentRecord, body: dict[str, Any], dialect: str, kind: str
    ) -> Response: ...

    def json(self, value: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response: ...

    def sse(self, stream: AsyncIterator[bytes], headers: Mapping[str, str] | None = None) -> Response: ...

    def call_headers(self, call_id: str) -> dict[str, str]: ...
