"""`run_episode` serves the gateway over HTTP: a harness reaching the model through `ctx.endpoint`."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from platoon.episode.context import EndpointUnavailable
from platoon.harness.agent import AgentResult
from platoon.harness.function import FunctionHarness
from platoon.testing import make_gateway
from platoon.testing.episode import run_episode


async def _over_http(ctx: Any) -> AgentResult:
    endpoint = ctx.endpoint
    assert endpoint.base_url.endswith(f"/s/{endpoint.api_key}/v1") and endpoint.model == "platoon/toy"
    async with openai.AsyncOpenAI(
        base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0
    ) as client:
        reply = await client.chat.completions.create(
            model=endpoint.model, messages=[{"role": "user", "content": ctx.instruction}]
        )
        judged = await client.chat.completions.create(
            model=endpoint.model,
            messages=[{"role": "user", "content": "aux?"}],
            extra_headers=endpoint.headers("aux"),
        )
    local = await ctx.chat([{"role": "user", "content": "in process"}])
    return AgentResult(
        final_message=f"{reply.choices[0].message.content}|{judged.choices[0].message.content}|{local.text}"
    )


def test_a_harness_uses_ctx_endpoint_with_the_openai_client(tmp_path):
    run = run_episode(
        "t1",
        service="table",
        service_kwargs={"rows": [{"id": "t1", "goal": "say hi"}]},
        harness=FunctionHarness("test-over-http", "1", "inline", False, _over_http),
        policy=["hi over http", "aux reply", "local reply"],
        output_dir=tmp_path,
    )
    assert run.root.finish_message == "hi over http|aux reply|local reply"
    assert len(run.interactions) == 3


def test_ctx_endpoint_without_a_server_is_unavailable():
    from platoon.episode.context import Agent

    gateway = make_gateway()
    record = gateway.open_agent(gateway.open_rollout())

    class Episode:
        agents: dict[str, Any] = {}

    Episode.gateway = gateway  # type: ignore[attr-defined]
    agent = Agent.__new__(Agent)
    agent.episode = Episode()  # type: ignore[assignment]
    agent.record = record
    with pytest.raises(EndpointUnavailable):
        _ = agent.endpoint
    assert agent.mcp is None
