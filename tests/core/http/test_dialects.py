"""The experimental dialects over the real server: Responses via `openai.responses`, Messages via `anthropic`."""

from __future__ import annotations

import json

import anthropic
import pytest

from platoon.gateway.http.responses import decode_reasoning, encode_reasoning, parse_request
from platoon.testing import Completion, tool_call

from .conftest import same_record, served

pytestmark = pytest.mark.anyio

CALL = "\n" + tool_call("guess", number=4)
FN_TOOL = {"type": "function", "name": "guess", "description": "Guess.", "parameters": {"type": "object"}}
ANT_TOOL = {"name": "guess", "description": "Guess.", "input_schema": {"type": "object"}}


async def test_responses_plain_tools_and_round_trip():
    async with served(["hello", CALL, "done", Completion("truncated text", stop_reason="length")]) as s:
        client = s.openai()
        first = await client.responses.create(model="x", instructions="Be brief.", input="hi")
        assert first.output_text == "hello" and first.status == "completed"
        assert first.output[0].id.startswith("msg_") and first.usage.input_tokens > 0
        calls = await client.responses.create(model="x", input="guess", tools=[FN_TOOL])
        fc = calls.output[0]
        assert fc.type == "function_call" and fc.name == "guess" and json.loads(fc.arguments) == {"number": 4}
        assert fc.id == f"fc_{fc.call_id}" and len(calls.output) == 1
        follow = [
            {"role": "user", "content": "guess"},
            {"type": "function_call", "call_id": fc.call_id, "name": "guess", "arguments": fc.arguments},
            {"type": "function_call_output", "call_id": fc.call_id, "output": "too low"},
        ]
        done = await client.responses.create(model="x", input=follow, tools=[FN_TOOL])
        assert done.output_text == "done"
        assert "too low" in s.gateway.sampler.calls[-1].prompt
        cut = await client.responses.create(model="x", input="more")
        assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


async def test_responses_stream_events_end_with_completed_even_when_truncated():
    async with served([CALL, Completion("cut", stop_reason="length")]) as s:
        stream = await s.openai().responses.create(model="x", input="go", tools=[FN_TOOL], stream=True)
        kinds = [event.type async for event in stream]
        assert kinds == [
            "response.created",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        stream = await s.openai().responses.create(model="x", input="go", stream=True)
        events = [event async for event in stream]
        assert events[-1].type == "response.completed" and events[-1].response.status == "incomplete"
        assert [e.delta for e in events if e.type == "response.output_text.delta"] == ["cut"]


def test_responses_input_items_become_turns():
    item = {"type": "reasoning", "encrypted_content": encode_reasoning("because"), "summary": []}
    assert decode_reasoning(item) == "because"
    body = {
        "instructions": "sys",
        "input": [
            {"role": "developer", "content": "dev"},
            {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
            item,
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "message", "role": "assistant", "content": "b"},
            {"type": "function_call_output", "call_id": "c1", "output": "r"},
        ],
        "tools": [FN_TOOL, {"type": "web_search"}],
        "max_output_tokens": 5,
        "reasoning": {"effort": "none"},
    }
    messages, tools, sampling = parse_request(body)
    assert messages == [
        {"role": "system", "content": "sys"},
        {"role": "system", "content": "dev"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "reasoning_content": "because",
            "content": "a",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "assistant", "content": "b"},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    assert tools is not None and [t["function"]["name"] for t in tools] == ["guess"]
    assert sampling == {"max_tokens": 5, "reasoning_effort": "none"}
    with pytest.raises(Exception, match="only text"):
        parse_request({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})


async def test_anthropic_messages_tool_use_round_trip_and_records():
    async with served(["hi", CALL, "thanks", "hi"]) as s:
        client = s.anthropic()
        message = await client.messages.create(
            model="x", max_tokens=500, system="Be brief.", messages=[{"role": "user", "content": "hello"}]
        )
        assert message.content[0].text == "hi" and message.stop_reason == "end_turn"
        assert message.usage.input_tokens == s.agent.calls[0].usage["prompt_tokens"]
        used = await client.messages.create(
            model="x", max_tokens=500, tools=[ANT_TOOL], messages=[{"role": "user", "content": "guess"}]
        )
        block = used.content[0]
        assert used.stop_reason == "tool_use" and block.type == "tool_use" and block.input == {"number": 4}
        back = await client.messages.create(
            model="x",
            max_tokens=500,
            tools=[ANT_TOOL],
            messages=[
                {"role": "user", "content": "guess"},
                {"role": "assistant", "content": [b.model_dump() for b in used.content]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": block.id, "content": "too low"},
                        {"type": "text", "text": "again"},
                    ],
                },
            ],
        )
        assert back.content[0].text == "thanks"
        prompt = s.gateway.sampler.calls[-1].prompt
        assert prompt.index("too low") < prompt.index("again")
        # the same conversation in process records the same call
        twin = s.gateway.open_agent(s.rollout, parent=s.agent)
        await s.gateway.chat(
            twin,
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}],
            max_tokens=500,
        )
        same_record(s.agent.calls[0], twin.calls[0])


async def test_anthropic_stream_count_tokens_and_errors():
    async with served([CALL], context_window_length=1000) as s:
        client = s.anthropic()
        async with client.messages.stream(
            model="x", max_tokens=500, tools=[ANT_TOOL], messages=[{"role": "user", "content": "go"}]
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert final.content[0].input == {"number": 4} and final.stop_reason == "tool_use"
        counted = await client.messages.count_tokens(
            model="x", tools=[ANT_TOOL], messages=[{"role": "user", "content": "go"}]
        )
        assert counted.input_tokens == len(s.gateway.sampler.calls[0].prompt_tokens)
        with pytest.raises(anthropic.BadRequestError) as overflow:
            await client.messages.create(
                model="x", max_tokens=5, messages=[{"role": "user", "content": "x " * 999}]
            )
        assert "prompt is too long:" in overflow.value.message and "> 1000 maximum" in overflow.value.message
        with pytest.raises(anthropic.BadRequestError, match="stop_sequences"):
            await client.messages.create(
                model="x", max_tokens=5, stop_sequences=["x"], messages=[{"role": "user", "content": "go"}]
            )
        bad = anthropic.AsyncAnthropic(base_url=s.server.base_url, api_key="nope", max_retries=0)
        s.clients.append(bad)
        with pytest.raises(anthropic.AuthenticationError) as auth:
            await bad.messages.create(model="x", max_tokens=5, messages=[{"role": "user", "content": "go"}])
        assert auth.value.body["error"]["type"] == "authentication_error"
