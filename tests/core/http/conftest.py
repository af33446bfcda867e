"""Fixtures for the HTTP gateway tests: a real `GatewayServer` on 127.0.0.1 over a `ScriptedPolicy` gateway."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from platoon.gateway.core import ModelGateway, RolloutRecorder
from platoon.gateway.http import GatewayServer
from platoon.gateway.records import AgentRecord
from platoon.testing import make_gateway


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Served:
    gateway: ModelGateway
    rollout: RolloutRecorder
    agent: AgentRecord
    server: GatewayServer
    clients: list[Any] = field(default_factory=list)

    @property
    def v1(self) -> str:
        """The agent's path-scoped OpenAI base URL."""
        return self.server.endpoint(self.agent).base_url

    def openai(self, agent: AgentRecord | None = None, **kwargs: Any) -> Any:
        import openai

        agent = agent or self.agent
        endpoint = self.server.endpoint(agent)
        client = openai.AsyncOpenAI(
            base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0, **kwargs
        )
        self.clients.append(client)
        return client

    def anthropic(self, agent: AgentRecord | None = None) -> Any:
        import anthropic

        agent = agent or self.agent
        client = anthropic.AsyncAnthropic(
            base_url=f"{self.server.base_url}/s/{agent.secret}", api_key=agent.secret, max_retries=0
        )
        self.clients.append(client)
        return client


class GatedSampler:
    """Wraps a gateway's sampler: each call sets `entered`, then waits for `release` before it samples; a call
    cancelled while it waits sets `cancelled`. Tests order events with it instead of sleeping."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def sample_async(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return await self.inner.sample_async(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def gate(state: Served) -> GatedSampler:
    """Put a `GatedSampler` in front of the served gateway's sampler."""
    gated = GatedSampler(state.gateway.sampler)
    state.gateway.sampler = gated
    return gated


@contextlib.asynccontextmanager
async def served(
    script: Any = (), *, keepalive: float = 10.0, server_kwargs: dict[str, Any] | None = None, **settings: Any
) -> AsyncIterator[Served]:
    """A gateway over `script` served on loopback, with one open rollout and its root agent."""
    gateway = make_gateway(script, **settings)
    rollout = gateway.open_rollout()
    agent = gateway.open_agent(rollout)
    server = GatewayServer(gateway, keepalive_seconds=keepalive, **(server_kwargs or {}))
    await server.astart()
    state = Served(gateway, rollout, agent, server)
    try:
        yield state
    finally:
        for client in state.clients:  # closed on this loop: a client collected on a later loop fails to close
            await client.close()
        await server.astop()


def _without_ids(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "tool_calls": [{**call, "id": None} for call in calls]}


def same_record(a: Any, b: Any) -> None:
    """Two CallRecords equal but for their ids (tool-call ids are minted per call) and times."""
    assert a.kind == b.kind and a.model == b.model
    assert _without_ids(a.message) == _without_ids(b.message)
    assert a.finish_reason == b.finish_reason and a.usage == b.usage and a.generation == b.generation


def same_tokens(a: Any, b: Any) -> None:
    """Two Interactions with the same exact tokens."""
    assert a.prompt_tokens == b.prompt_tokens and a.sampled_tokens == b.sampled_tokens
    assert a.logprobs == b.logprobs and a.stop_reason == b.stop_reason
