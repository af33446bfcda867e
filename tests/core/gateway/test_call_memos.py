"""What the gateway remembers between an agent's calls is never taken for what the harness sends now.

An agent sends the same tools on every call, so the gateway remembers, by their exact content, the digest its
history matching starts from and their JSON size (which decides whether a render leaves the event loop). A harness
that edits its tools or its messages in place between calls must get the prompt a fresh gateway renders for what
it sends, and history must not be reused across the edit.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from typing import Any

import platoon.renderers as renderers
import platoon.testing.policy as policy_module
from platoon.gateway import ModelGateway
from platoon.gateway.history import AgentHistory, build_prompt
from platoon.gateway.measure import OFF_LOOP_CHARS
from platoon.renderers.qwen3 import Qwen3InstructRenderer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "guess",
            "description": "Guess the hidden number.",
            "parameters": {
                "type": "object",
                "properties": {"number": {"type": "integer"}},
                "required": ["number"],
            },
        },
    }
]
GUESS = policy_module.tool_call("guess", {"number": 50})


class ThreadNotingRenderer:
    """The `qwen3_instruct` renderer over the toy tokenizer, noting the thread each prompt renders on."""

    def __init__(self) -> None:
        self.inner = renderers.get_renderer("qwen3_instruct", renderers.get_tokenizer("platoon/toy"))
        self.tokenizer = self.inner.tokenizer
        self.threads: list[int] = []

    def render_prompt(self, messages: Any, tools: Any = None) -> list[int]:
        self.threads.append(threading.get_ident())
        return list(self.inner.render_prompt(messages, tools=tools))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def gateway(script: list[str]) -> tuple[ModelGateway, Any, Any]:
    renderer = ThreadNotingRenderer()
    policy = policy_module.ScriptedPolicy(script, tokenizer=renderer.tokenizer)
    gateway = ModelGateway(policy, renderer, model_name="platoon/toy")
    rollout = gateway.open_rollout()
    return gateway, rollout, gateway.open_agent(rollout, goal="guess")


def two_calls(
    gateway: ModelGateway, agent: Any, tools: list[dict[str, Any]], edit: Any
) -> list[dict[str, Any]]:
    """A guess, its result, then `edit(tools, messages)` in place and a second call with the same objects."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Guess a number from 1 to 100."}]

    async def run() -> None:
        reply = await gateway.chat(agent, messages, tools=tools)
        messages.append({k: v for k, v in reply.message.items() if v is not None})
        messages.append({"role": "tool", "tool_call_id": reply.tool_calls[0]["id"], "content": "Too low."})
        edit(tools, messages)
        await gateway.chat(agent, messages, tools=tools)

    asyncio.run(run())
    return messages


def second_prompt(rollout: Any, agent: Any) -> list[int]:
    return list(rollout.interactions[agent.calls[1].call_id].prompt_tokens)


def test_unedited_tools_extend_the_first_call():
    gw, rollout, agent = gateway([GUESS, "It is 75."])
    messages = two_calls(gw, agent, copy.deepcopy(TOOLS), lambda tools, messages: None)
    assert agent.calls[1].generation["history"]["extends"] == agent.calls[0].call_id
    first = rollout.interactions[agent.calls[0].call_id]
    assert second_prompt(rollout, agent)[: len(first.prompt_tokens)] == list(first.prompt_tokens)
    assert gw.renderer.tokenizer.decode(second_prompt(rollout, agent)).count("Guess the hidden number.") == 1
    assert len(messages) == 3


def test_tools_edited_in_place_render_as_edited_and_start_a_new_segment():
    def edit(tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> None:
        tools[0]["function"]["description"] = "Guess the hidden number; it is odd."

    gw, rollout, agent = gateway([GUESS, "It is 75."])
    tools = copy.deepcopy(TOOLS)
    messages = two_calls(gw, agent, tools, edit)
    # The first call's tools are not those of the second: its tokens are not reused.
    assert agent.calls[1].generation["history"]["segment"] == "no_matching_call"
    prompt = second_prompt(rollout, agent)
    fresh = renderers.get_renderer("qwen3_instruct", renderers.get_tokenizer("platoon/toy"))
    assert prompt == fresh.render_prompt(messages, tools=copy.deepcopy(tools))
    assert "it is odd." in gw.renderer.tokenizer.decode(prompt)


def test_tools_grown_in_place_past_the_threshold_render_off_the_event_loop():
    def grow(tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> None:
        tools[0]["function"]["description"] = "x" * OFF_LOOP_CHARS

    gw, _rollout, agent = gateway([GUESS, "It is 75."])
    two_calls(gw, agent, copy.deepcopy(TOOLS), grow)
    first, second = gw.renderer.threads
    assert first == threading.get_ident()  # asyncio.run runs its loop on this thread
    assert second != first


def test_a_message_edited_in_place_after_it_was_sent_is_not_matched():
    # The reply's calls are the recorded reply's own objects (only its top level is copied for the harness): the
    # turn must be known by what the reply held when it was recorded.
    def edit(tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> None:
        messages[1]["tool_calls"][0]["function"]["arguments"] = '{"number": 51}'

    gw, rollout, agent = gateway([GUESS, "It is 75."])
    messages = two_calls(gw, agent, copy.deepcopy(TOOLS), edit)
    assert agent.calls[1].generation["history"]["segment"] == "no_matching_call"
    fresh = renderers.get_renderer("qwen3_instruct", renderers.get_tokenizer("platoon/toy"))
    assert second_prompt(rollout, agent) == fresh.render_prompt(messages, tools=TOOLS)


class KwargsRenderer(Qwen3InstructRenderer):
    """`qwen3_instruct` taking a render kwarg (as a chat-template renderer takes `enable_thinking`) it ignores."""

    def render_prompt(self, openai_messages: Any, tools: Any = None, **kwargs: Any) -> list[int]:
        return super().render_prompt(openai_messages, tools)


def test_the_request_digest_follows_the_render_kwargs_and_the_tools_content():
    renderer = KwargsRenderer(renderers.get_tokenizer("platoon/toy"))
    messages = [{"role": "user", "content": "Guess."}]
    history = AgentHistory()

    def digest(tools: Any, kwargs: dict[str, Any], memo: AgentHistory = history) -> bytes:
        return build_prompt(renderer, memo, messages, tools, kwargs).request_digest

    tools = copy.deepcopy(TOOLS)
    plain = digest(tools, {})
    assert digest(tools, {}) == plain == digest(copy.deepcopy(TOOLS), {}, AgentHistory())
    assert digest(tools, {"enable_thinking": False}) != plain
    assert digest(tools, {"enable_thinking": False}) == digest(
        tools, {"enable_thinking": False}, AgentHistory()
    )
    assert digest(None, {}) == digest([], {}) != plain
    tools[0]["function"]["name"] = "pick"
    assert digest(tools, {}) == digest(copy.deepcopy(tools), {}, AgentHistory()) != plain
