"""The gateway over the real `qwen3_instruct` renderer, the toy tokenizer and the scripted policy.

The prefix property training relies on: each turn's prompt is the previous prompt, then exactly the sampled tokens,
then the new user or tool turn, so consecutive calls merge into one trained sequence.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import platoon.renderers as renderers
import platoon.testing.policy as policy_module
from platoon.gateway import ModelGateway

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the index.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]


def make(script: list[Any], **settings: Any) -> tuple[ModelGateway, Any, Any]:
    tokenizer = renderers.get_tokenizer("platoon/toy")
    renderer = renderers.get_renderer("qwen3_instruct", tokenizer)
    policy = policy_module.ScriptedPolicy(script, tokenizer=tokenizer)
    return ModelGateway(policy, renderer, model_name="platoon/toy", **settings), policy, tokenizer


def test_each_prompt_extends_the_previous_prompt_and_its_sampled_tokens():
    search = policy_module.tool_call("search", {"q": "needle"})
    gateway, policy, tokenizer = make([f"Let me look.\n{search}", "Found it: 42.", "Bye."])
    rollout = gateway.open_rollout()
    agent = gateway.open_agent(rollout, goal="find the needle")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": "Find the needle."},
    ]

    async def episode() -> None:
        first = await gateway.chat(agent, messages, tools=TOOLS)
        (call,) = first.tool_calls
        assert first.finish_reason == "tool_calls" and first.text == "Let me look."
        assert call["function"]["name"] == "search" and json.loads(call["function"]["arguments"]) == {
            "q": "needle"
        }
        messages.append(dict(first.message))
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "needle at 42"})
        second = await gateway.chat(agent, messages, tools=TOOLS)
        assert second.finish_reason == "stop" and second.text == "Found it: 42."
        messages.append(dict(second.message))
        messages.append({"role": "user", "content": "Thanks."})
        await gateway.chat(agent, messages, tools=TOOLS)

    asyncio.run(episode())
    turns = [rollout.interactions[call.call_id] for call in agent.calls]
    assert [list(turn.prompt_tokens) for turn in turns] == [call.prompt_tokens for call in policy.calls]
    for turn in turns:
        assert turn.sampled_tokens[-1] == tokenizer.eos_token_id  # every turn ended on <|im_end|>
        assert turn.logprobs == (-0.25,) * len(turn.sampled_tokens)
    new_turns = [
        "\n<|im_start|>user\n<tool_response>\nneedle at 42\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        "\n<|im_start|>user\nThanks.<|im_end|>\n<|im_start|>assistant\n",
    ]
    for previous, turn, text in zip(turns[:-1], turns[1:], new_turns, strict=True):
        prefix = previous.prompt_tokens + previous.sampled_tokens
        assert turn.prompt_tokens[: len(prefix)] == prefix
        assert tokenizer.decode(list(turn.prompt_tokens[len(prefix) :])) == text


def test_a_truncated_tool_call_is_not_run_and_stays_visible():
    search = policy_module.tool_call("search", {"q": "x"})
    gateway, _, _ = make([search], max_tokens=4096)
    rollout = gateway.open_rollout()
    agent = gateway.open_agent(rollout)
    reply = asyncio.run(gateway.chat(agent, [{"role": "user", "content": "go"}], tools=TOOLS, max_tokens=10))
    assert reply.finish_reason == "length" and reply.tool_calls == ()
    assert reply.text and search.startswith(reply.text)
    (call,) = agent.calls
    assert call.generation["stop_reason"] == "length" and call.generation["emitted_tool_calls"] == 0
    assert call.usage["completion_tokens"] == 10


def test_the_context_window_fits_the_real_prompt():
    gateway, policy, _ = make(["ok"], context_window_length=40)
    rollout = gateway.open_rollout()
    agent = gateway.open_agent(rollout)
    reply = asyncio.run(gateway.chat(agent, [{"role": "user", "content": "hi"}]))
    prompt_len = len(rollout.interactions[reply.call_id].prompt_tokens)
    assert policy.calls[0].sampling_params.max_tokens == 40 - prompt_len
    from platoon.gateway import ContextWindowExceeded

    with pytest.raises(ContextWindowExceeded):
        asyncio.run(gateway.chat(agent, [{"role": "user", "content": "x" * 40}]))
    assert agent.context_overflows == 1
