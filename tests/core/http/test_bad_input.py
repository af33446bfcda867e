"""Bad input is the client's error: a malformed field is a 400 that names it, in every dialect, streaming or not,
and a message the renderer refuses is a 400 too; none of them counts as a gateway error."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from platoon.gateway.core import GatewayError, InvalidRequest
from platoon.renderers.base import RendererError
from platoon.renderers.toy import toy_renderer

from .conftest import served

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "hi"}
CALL = {"id": "c1", "type": "function", "function": {"name": "guess", "arguments": "{}"}}

# (messages, the 400's message)
CHAT_CASES: list[tuple[list[Any], str]] = [
    (
        [{"role": "system", "content": "s"}, USER, {"role": "user", "content": 7}],
        "messages[2].content: expected a string or a list of content parts, got a number",
    ),
    ([{"role": 1, "content": "x"}], "messages[0].role: expected a string, got a number"),
    ([{"content": "x"}], "messages[0].role: expected a string, got null"),
    ([USER, "hello"], "messages[1]: expected a message object, got a string"),
    ([{"role": "user", "content": {"text": "x"}}], "messages[0].content: expected a string or a list"),
    (
        [{"role": "user", "content": [{"type": "text", "text": 3}]}],
        "messages[0].content[0].text: expected a string",
    ),
    (
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}],
        "messages[0].content[0].type: 'image_url' is not supported",
    ),
    (
        [{"role": "user", "content": [5]}],
        "messages[0].content[0]: expected a content part object, got a number",
    ),
    (
        [USER, {"role": "assistant", "content": None, "tool_calls": {"id": "c1"}}],
        "messages[1].tool_calls: expected a list of tool calls, got an object",
    ),
    (
        [USER, {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}]}],
        "messages[1].tool_calls[0].function.name: expected a string, got null",
    ),
    (
        [
            USER,
            {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "g", "arguments": 5}}]},
        ],
        "messages[1].tool_calls[0].function.arguments: expected a JSON string, got a number",
    ),
    (
        [USER, {"role": "assistant", "tool_calls": [{"id": "c1"}]}],
        "messages[1].tool_calls[0].function: expected",
    ),
    (
        [
            USER,
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": 9, "content": "r"},
        ],
        "messages[2].tool_call_id: expected a string or null, got a number",
    ),
    (
        [USER, {"role": "assistant", "content": "a", "reasoning_content": ["x"]}],
        "messages[1].reasoning_content: expected a string or null, got a list",
    ),
]


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_completions_malformed_messages_are_400_naming_the_field(stream: bool):
    async with served() as s:
        client = s.openai()
        for messages, expected in CHAT_CASES:
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="x", messages=messages, stream=stream)
            assert caught.value.status_code == 400
            assert expected in caught.value.message, (expected, caught.value.message)
            assert caught.value.body["type"] == "invalid_request_error"
        assert s.agent.gateway_errors == 0 and s.agent.calls == []


async def test_chat_completions_malformed_tools_are_400_naming_the_field():
    tool = {"type": "function", "function": {"name": "g", "parameters": "{}"}}
    async with served() as s:
        client = s.openai()
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="x", messages=[USER], tools=[tool])
        assert (
            "tools[0].function.parameters: expected a JSON schema object, got a string"
            in caught.value.message
        )
        tool = {"type": "function", "function": {"name": "g", "description": 3}}
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="x", messages=[USER], tools=[tool])
        assert (
            "tools[0].function.description: expected a string or null, got a number" in caught.value.message
        )
        assert s.agent.gateway_errors == 0


RESPONSES_CASES: list[tuple[list[Any], str]] = [
    (
        [{"role": "user", "content": 7}],
        "input[0].content: expected a string or a list of text parts, got a number",
    ),
    (
        [{"role": 3, "content": "x"}],
        "input[0].role: expected one of user, assistant, system, developer, got a number",
    ),
    (
        [{"role": "user", "content": [{"type": "input_text", "text": 1}]}],
        "input[0].content[0].text: expected a string",
    ),
    (
        [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}],
        "input[0].content[0].type: 'input_image' is not supported",
    ),
    (
        [
            {"role": "user", "content": "x"},
            {"type": "function_call", "call_id": "c", "name": 5, "arguments": "{}"},
        ],
        "input[1].name: expected a string, got a number",
    ),
    (
        [
            {"role": "user", "content": "x"},
            {"type": "function_call", "call_id": "c", "name": "g", "arguments": 5},
        ],
        "input[1].arguments: expected a JSON string, got a number",
    ),
    (
        [{"type": "function_call_output", "call_id": 4, "output": "r"}],
        "input[0].call_id: expected a string or null",
    ),
    (
        [{"type": "function_call_output", "call_id": "c", "output": 4}],
        "input[0].output: expected a string or a list",
    ),
    (["text"], "input[0]: expected an input item object, got a string"),
]


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_malformed_items_are_400_naming_the_field(stream: bool):
    async with served() as s:
        client = s.openai()
        for items, expected in RESPONSES_CASES:
            with pytest.raises(openai.BadRequestError) as caught:
                await client.responses.create(model="x", input=items, stream=stream)
            assert caught.value.status_code == 400
            assert expected in caught.value.message, (expected, caught.value.message)
        assert s.agent.gateway_errors == 0 and s.agent.calls == []


TOOL_USE = {"type": "tool_use", "id": "t1", "name": "guess", "input": {}}
MESSAGES_CASES: list[tuple[list[Any], str]] = [
    (
        [{"role": "user", "content": 7}],
        "messages[0].content: expected a string or a list of content blocks, got a number",
    ),
    (
        [{"role": "user", "content": [{"type": "text", "text": 2}]}],
        "messages[0].content[0].text: expected a string",
    ),
    (
        [{"role": "user", "content": ["hi"]}],
        "messages[0].content[0]: expected a content block object, got a string",
    ),
    (
        [{"role": "user", "content": [{"type": "image", "source": {}}]}],
        "messages[0].content[0].type: user block type 'image' is not supported",
    ),
    (
        [USER, {"role": "assistant", "content": [{**TOOL_USE, "input": "{}"}]}],
        "messages[1].content[0].input: expected an object, got a string",
    ),
    (
        [USER, {"role": "assistant", "content": [{**TOOL_USE, "name": None}]}],
        "messages[1].content[0].name: expected a string, got null",
    ),
    (
        [
            USER,
            {"role": "assistant", "content": [TOOL_USE]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": 5}]},
        ],
        "messages[2].content[0].content: expected a string or a list of text blocks, got a number",
    ),
    (
        [
            USER,
            {"role": "assistant", "content": [TOOL_USE]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": 1, "content": "r"}]},
        ],
        "messages[2].content[0].tool_use_id: expected a string or null, got a number",
    ),
    ([{"role": "robot", "content": "x"}], "messages[0].role: expected 'user' or 'assistant', got 'robot'"),
]


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_messages_malformed_blocks_are_400_naming_the_field(stream: bool):
    async with served() as s:
        client = s.anthropic()
        for messages, expected in MESSAGES_CASES:
            with pytest.raises(anthropic.BadRequestError) as caught:
                await client.messages.create(model="x", max_tokens=8, messages=messages, stream=stream)
            assert caught.value.status_code == 400
            assert expected in caught.value.message, (expected, caught.value.message)
            assert caught.value.body["error"]["type"] == "invalid_request_error"
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.count_tokens(model="x", messages=MESSAGES_CASES[0][0])
        assert MESSAGES_CASES[0][1] in caught.value.message
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(
                model="x", max_tokens=8, system=[{"type": "text", "text": 1}], messages=[USER]
            )
        assert "system[0].text: expected a string or null, got a number" in caught.value.message
        assert s.agent.gateway_errors == 0 and s.agent.calls == []


class RefusingRenderer:
    """The toy renderer, refusing any conversation that mentions "refuse" as a renderer does (`RendererError`)."""

    def __init__(self) -> None:
        self.inner = toy_renderer()
        self.tokenizer = self.inner.tokenizer

    def render_prompt(self, messages: list[dict[str, Any]], tools: Any = None, **kwargs: Any) -> list[int]:
        if any("refuse" in str(m.get("content")) for m in messages):
            raise RendererError("this renderer cannot render the word 'refuse'")
        return list(self.inner.render_prompt(messages, tools=tools, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_renderer_refusal_is_an_invalid_request_not_a_gateway_error():
    async with served(["fine", "fine"], renderer=RefusingRenderer()) as s:
        refused = [{"role": "user", "content": "please refuse"}]
        # In process: the gateway's invalid-request error, the renderer's reason kept.
        with pytest.raises(InvalidRequest) as caught:
            await s.gateway.chat(s.agent, refused)
        assert isinstance(caught.value, GatewayError) and caught.value.status == 400
        assert "cannot render the word 'refuse'" in caught.value.message
        assert isinstance(caught.value.__cause__, RendererError)
        # Over HTTP, in every dialect, streaming or not: 400, never 500.
        client = s.openai()
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as http:
                await client.chat.completions.create(model="x", messages=refused, stream=stream)
            assert "cannot render the word 'refuse'" in http.value.message
            with pytest.raises(openai.BadRequestError):
                await client.responses.create(model="x", input="please refuse", stream=stream)
            with pytest.raises(anthropic.BadRequestError):
                await s.anthropic().messages.create(model="x", max_tokens=8, messages=refused, stream=stream)
        with pytest.raises(anthropic.BadRequestError):
            await s.anthropic().messages.count_tokens(model="x", messages=refused)
        assert s.agent.gateway_errors == 0 and s.agent.calls == [] and s.agent.context_overflows == 0
        # The gateway still answers what it can render.
        reply = await client.chat.completions.create(model="x", messages=[USER])
        assert reply.choices[0].message.content == "fine"


async def test_an_in_process_renderer_refusal_gives_the_budgeted_step_back():
    async with served(["fine"]) as s:
        s.gateway.set_call_cap(s.agent, 1)
        with pytest.raises(InvalidRequest):
            await s.gateway.chat(s.agent, [{"role": "user", "content": 7}])  # type: ignore[dict-item]
        reply = await s.gateway.chat(s.agent, [USER])
        assert reply.message["content"] == "fine" and s.agent.gateway_errors == 0
