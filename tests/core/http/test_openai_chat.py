"""Chat Completions over the real server with the real `openai` client: records, tools, streams, logprobs, errors."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import openai
import pytest

from platoon.testing import Completion, tool_call

from .conftest import gate, same_record, same_tokens, served

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "guess", "description": "Guess.", "parameters": {"type": "object"}},
    }
]


async def test_a_call_is_recorded_exactly_as_the_in_process_call():
    async with served(["hello", "hello"]) as s:
        twin = s.gateway.open_agent(s.rollout, parent=s.agent)
        local = await s.gateway.chat(twin, list(USER))
        reply = await s.openai().chat.completions.create(model="x", messages=USER)
        assert reply.id == s.agent.calls[0].call_id and reply.object == "chat.completion"
        assert reply.choices[0].message.content == "hello" and reply.choices[0].finish_reason == "stop"
        assert reply.model == "platoon/toy"
        assert reply.usage.prompt_tokens == s.agent.calls[0].usage["prompt_tokens"]
        assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
        same_record(s.agent.calls[0], twin.calls[0])
        same_tokens(s.rollout.interactions[reply.id], s.rollout.interactions[local.call_id])


async def test_parallel_tool_calls_and_content_null():
    text = "\n" + tool_call("guess", number=1) + "\n" + tool_call("guess", number=2)
    async with served([text, text]) as s:
        twin = s.gateway.open_agent(s.rollout, parent=s.agent)
        await s.gateway.chat(twin, list(USER), tools=TOOLS)
        raw = await s.openai().chat.completions.with_raw_response.create(
            model="x", messages=USER, tools=TOOLS
        )
        reply = raw.parse()
        assert raw.headers["x-platoon-call-id"] == reply.id
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        calls = choice.message.tool_calls
        assert [json.loads(c.function.arguments) for c in calls] == [{"number": 1}, {"number": 2}]
        assert all(c.id and c.type == "function" and c.function.name == "guess" for c in calls)
        same_record(s.agent.calls[0], twin.calls[0])


async def test_streaming_chunks_in_order_with_keepalive_while_sampling():
    text = "thinking aloud\n" + tool_call("guess", number=7)
    async with served([text, text], keepalive=0.1) as s:
        sampler = gate(s)  # the call samples only once the client has seen two keepalives
        body = {
            "model": "x",
            "messages": USER,
            "tools": TOOLS,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": True,
        }
        async with (
            httpx.AsyncClient() as http,
            http.stream(
                "POST", f"{s.v1}/chat/completions", json=body, headers={"Authorization": "Bearer x"}
            ) as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines: list[str] = []
            async with asyncio.timeout(60):  # a hang guard only
                async for line in response.aiter_lines():
                    if line:
                        lines.append(line)
                    if lines.count(": keepalive") == 2:
                        sampler.release.set()
        # keepalives while the call samples, then the reply's events (none before the call was released)
        assert lines[:2] == [": keepalive", ": keepalive"]
        first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
        assert set(lines[:first_data]) == {": keepalive"}
        data = [line[6:] for line in lines if line.startswith("data: ")]
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert all("usage" in c for c in chunks)
        deltas = [c["choices"][0]["delta"] if c["choices"] else None for c in chunks]
        assert deltas[0] == {"role": "assistant", "content": ""}
        assert deltas[1] == {"content": "thinking aloud"}
        assert deltas[2]["tool_calls"][0]["index"] == 0
        assert deltas[2]["tool_calls"][0]["function"]["name"] == "guess"
        finish = chunks[3]["choices"][0]
        assert finish["finish_reason"] == "tool_calls" and finish["logprobs"]["content"]
        assert chunks[4]["choices"] == [] and chunks[4]["usage"]["completion_tokens"] > 0
        # the openai client assembles the same stream
        stream = await s.openai().chat.completions.create(model="x", messages=USER, tools=TOOLS, stream=True)
        parts = [chunk async for chunk in stream]
        assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == "thinking aloud"
        assert parts[-1].choices[0].finish_reason == "tool_calls"
        assert len(s.agent.calls) == 2


async def test_logprobs_are_per_sampled_token():
    async with served([Completion("abc", logprob=-0.5)]) as s:
        reply = await s.openai().chat.completions.create(model="x", messages=USER, logprobs=True)
        entries = reply.choices[0].logprobs.content
        interaction = s.rollout.interactions[reply.id]
        assert len(entries) == len(interaction.sampled_tokens)
        assert all(e.logprob == -0.5 and e.top_logprobs == [] for e in entries)
        assert "".join(e.token for e in entries).startswith("abc")


async def test_auth_forms_and_errors():
    async with served(["a", "b", "c"], context_window_length=30) as s:
        root = s.server.base_url
        async with httpx.AsyncClient() as http:
            # Bearer and x-api-key on the unscoped routes
            ok = await http.get(f"{root}/v1/models", headers={"Authorization": f"Bearer {s.agent.secret}"})
            assert ok.json()["data"] == [
                {"id": "platoon/toy", "object": "model", "created": 0, "owned_by": "platoon"}
            ]
            ok = await http.get(f"{root}/v1/models", headers={"x-api-key": s.agent.secret})
            assert ok.status_code == 200
            assert (await http.get(f"{root}/v1/models")).status_code == 401
            health = await http.get(f"{root}/healthz")
            assert health.json() == {"status": "ok", "model": "platoon/toy"}
        bad = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key="nope", max_retries=0)
        s.clients.append(bad)
        with pytest.raises(openai.AuthenticationError) as auth:
            await bad.chat.completions.create(model="x", messages=USER)
        assert auth.value.code == "invalid_api_key"
        long = [{"role": "user", "content": "x" * 200}]
        with pytest.raises(openai.BadRequestError) as overflow:
            await s.openai().chat.completions.create(model="x", messages=long)
        assert overflow.value.code == "context_length_exceeded" and overflow.value.param == "messages"
        assert "maximum context length is 30 tokens" in overflow.value.message
        assert s.agent.context_overflows == 1
        for body, needle in [
            ({"n": 2}, "n must be 1"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"tools": [{"type": "custom", "name": "t"}]}, "custom"),
            ({"tools": [{"type": "function", "function": {}}]}, "names no function"),
            ({"temperature": 3}, "temperature"),
        ]:
            with pytest.raises(openai.BadRequestError) as refused:
                await s.openai().chat.completions.create(model="x", messages=USER, **body)
            assert needle in refused.value.message and refused.value.type == "invalid_request_error"
        with pytest.raises(openai.BadRequestError):
            await s.openai().chat.completions.create(model="x", messages=[])
        s.gateway.close_agent(s.agent)
        with pytest.raises(openai.APIStatusError) as closed:
            await s.openai().chat.completions.create(model="x", messages=USER)
        assert closed.value.status_code == 410 and closed.value.code == "agent_closed"
        assert s.agent.calls == []


async def test_call_kind_header_and_policy_only_keys():
    async with served(["p", "a", "j"]) as s:
        client = s.openai()
        endpoint = s.server.endpoint(s.agent)
        for kind in ("policy", "aux", "judge"):
            await client.chat.completions.create(
                model="x", messages=USER, extra_headers=endpoint.headers(kind)
            )
        assert [c.kind for c in s.agent.calls] == ["policy", "aux", "judge"]
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(
                model="x", messages=USER, extra_headers={"X-Platoon-Call-Kind": "bogus"}
            )
        sandboxed = s.gateway.open_agent(s.rollout, parent=s.agent, policy_only=True)
        with pytest.raises(openai.PermissionDeniedError) as denied:
            await s.openai(sandboxed).chat.completions.create(
                model="x", messages=USER, extra_headers=endpoint.headers("aux")
            )
        assert denied.value.code == "permission_denied" and denied.value.type == "permission_error"


async def test_a_disconnect_cancels_the_call_and_records_nothing():
    async with served(["late"]) as s:
        sampler = gate(s)  # the call waits in the sampler until the client has gone
        async with asyncio.timeout(60), httpx.AsyncClient() as http:  # a hang guard only
            request = asyncio.ensure_future(http.post(f"{s.v1}/chat/completions", json={"messages": USER}))
            await sampler.entered.wait()
            request.cancel()  # the client disconnects mid-call
            with contextlib.suppress(asyncio.CancelledError):
                await request
            await sampler.cancelled.wait()  # the disconnect cancelled the call in the sampler
        assert s.agent.calls == [] and s.rollout.interactions == {}


def test_a_threaded_server_serves_blocking_clients():
    from platoon.gateway.http import GatewayServer
    from platoon.testing import make_gateway

    gateway = make_gateway(["one"])
    agent = gateway.open_agent(gateway.open_rollout())
    with GatewayServer(gateway) as server:
        endpoint = server.endpoint(agent)
        client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
        assert client.chat.completions.create(model="x", messages=USER).choices[0].message.content == "one"
    assert len(agent.calls) == 1
