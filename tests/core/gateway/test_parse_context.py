"""A renderer that reads replies better knowing the prompt and the tools (the chat-template one) is given both."""

from __future__ import annotations

import asyncio
from typing import Any

from platoon.gateway import ModelGateway

TOOLS = [
    {"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}}
]


def test_the_prompt_and_tools_reach_a_renderer_that_takes_them(renderer, sampler):
    seen: dict[str, Any] = {}
    plain_parse = renderer.parse_completion

    def parse_with_context(tokens: list[int], stop_reason: str, *, prompt=None, tools=None):  # type: ignore[no-untyped-def]
        seen["prompt"], seen["tools"] = prompt, tools
        return plain_parse(tokens, stop_reason)

    renderer.parse_completion = parse_with_context
    sampler.script = ["hello"]
    gateway = ModelGateway(sampler, renderer, model_name="fake/model")
    agent = gateway.open_agent(gateway.open_rollout())
    asyncio.run(gateway.chat(agent, [{"role": "user", "content": "hi"}], tools=TOOLS))
    assert seen["prompt"] == sampler.requests[0]["prompt"]
    assert seen["tools"] == TOOLS


def test_a_renderer_without_them_is_called_as_before(make_gateway, sampler):
    sampler.script = ["hello"]
    gateway = make_gateway()
    agent = gateway.open_agent(gateway.open_rollout())
    reply = asyncio.run(gateway.chat(agent, [{"role": "user", "content": "hi"}], tools=TOOLS))
    assert reply.text == "hello"
