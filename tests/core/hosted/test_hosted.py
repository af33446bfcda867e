"""Hosted inference against a scripted OpenAI-compatible server on 127.0.0.1: retries and
`retry-after`, refusals, the probe, key redaction, normalization, streams, provider records and cost."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from platoon.errors import ConfigError
from platoon.eval.config_defs import HostedConfig
from platoon.gateway.hosted import HostedBackend, HostedContextExceeded, HostedRefusal, hosted_gateway

KEY = "sk-test-0123456789abcdef"
ENV = {"HOSTED_KEY": KEY}


def completion(text: str = "OK", **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "served-model-2025",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 1000,
            "completion_tokens": 200,
            "prompt_tokens_details": {"cached_tokens": 400},
        },
        **extra,
    }


@dataclass
class Script:
    """Replies in order (status, body, headers); each request's path, headers and body are kept."""

    replies: list[tuple[int, Any, dict[str, str]]] = field(default_factory=list)
    seen: list[dict[str, Any]] = field(default_factory=list)

    def then(self, status: int, body: Any = None, **headers: str) -> Script:
        self.replies.append((status, body, {k.replace("_", "-"): v for k, v in headers.items()}))
        return self


@contextlib.asynccontextmanager
async def provider(script: Script) -> AsyncIterator[str]:
    """The scripted server under uvicorn on 127.0.0.1; yields its base URL (`.../v1`)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def answer(request: Request) -> Response:
        body = json.loads(await request.body())
        script.seen.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
        status, reply, headers = script.replies.pop(0) if script.replies else (200, completion(), {})
        if callable(reply):
            reply = reply(request)
        if isinstance(reply, bytes):
            return Response(reply, status_code=status, headers=headers, media_type="text/event-stream")
        return Response(json.dumps(reply), status_code=status, headers=headers, media_type="application/json")

    paths = ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"]
    app = Starlette(routes=[Route(p, answer, methods=["POST"]) for p in paths])
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        await task


def backend(url: str, *, delays: list[float] | None = None, **config: Any) -> HostedBackend:
    async def sleep(seconds: float) -> None:
        if delays is not None:
            delays.append(seconds)

    settings = {"base_url": url, "api_key_env": "HOSTED_KEY", **config}
    inference = settings.pop("inference_params", None)
    precedence = settings.pop("sampling_precedence", "request")
    return HostedBackend(
        HostedConfig(**settings),
        model="my-model",
        inference_params=inference,
        sampling_precedence=precedence,
        environ=ENV,
        sleep=sleep,
    )


USER = [{"role": "user", "content": "hi"}]


def run(script: Script, body: Any) -> None:
    async def main() -> None:
        async with provider(script) as url:
            await body(url)

    asyncio.run(main())


def test_retries_on_429_and_5xx_honour_retry_after_then_succeed():
    script = (
        Script()
        .then(429, {"error": {"message": "slow down"}}, retry_after="2")
        .then(503, {})
        .then(200, completion())
    )

    async def body(url: str) -> None:
        delays: list[float] = []
        reply = await backend(url, delays=delays).forward("openai_chat", {"messages": USER})
        assert reply.status == 200 and len(script.seen) == 3
        assert delays[0] == 2.0 and 1.0 <= delays[1] <= 1.25  # the second retry: 0.5 * 2^1 plus jitter
        assert reply.record is not None
        assert reply.record["attempts"] == 3 and reply.record["rate_limited"] is True

    run(script, body)


def test_retry_after_ms_is_capped_and_backoff_doubles_to_the_cap():
    script = Script().then(429, {}, retry_after_ms="120000")
    for _ in range(5):
        script.then(500, {})

    async def body(url: str) -> None:
        delays: list[float] = []
        reply = await backend(url, delays=delays, max_retries=5).forward("openai_chat", {"messages": USER})
        # After the last attempt the provider's reply comes back as it was.
        assert reply.status == 500 and len(script.seen) == 6
        assert delays[0] == 60.0
        assert [
            round(d / b, 2) <= 1.25 and d >= b for d, b in zip(delays[1:], [1, 2, 4, 8], strict=True)
        ] == [True] * 4

    run(script, body)


@pytest.mark.parametrize("status", [401, 402, 403, 404, 307])
def test_refusals_are_never_retried(status: int):
    script = Script().then(status, {"error": {"message": f"bad key {KEY}"}}, location="http://elsewhere/")

    async def body(url: str) -> None:
        with pytest.raises(HostedRefusal) as info:
            await backend(url).forward("openai_chat", {"messages": USER})
        assert len(script.seen) == 1 and info.value.provider_status == status
        assert KEY not in info.value.message and "[redacted]" in info.value.message

    run(script, body)


def test_other_4xx_are_returned_and_context_errors_mapped():
    script = (
        Script()
        .then(422, {"error": {"message": "bad field"}})
        .then(400, {"error": {"message": "This model's maximum context length is 10 tokens.", "code": "x"}})
    )

    async def body(url: str) -> None:
        b = backend(url)
        reply = await b.forward("openai_chat", {"messages": USER})
        assert (
            reply.status == 422 and reply.json()["error"]["message"] == "bad field" and len(script.seen) == 1
        )
        gateway = hosted_gateway(b.config, model="my-model", environ=ENV)
        rollout = gateway.open_rollout()
        agent = gateway.open_agent(rollout)
        with pytest.raises(HostedContextExceeded) as info:
            await b.forward("openai_chat", {"messages": USER}, agent=agent)
        assert info.value.code == "context_length_exceeded" and agent.context_overflows == 1

    run(script, body)


def test_the_key_is_sent_upstream_redacted_from_replies_and_never_recorded():
    def echo(request: Any) -> dict[str, Any]:
        return completion(f"your header was {request.headers['authorization']}")

    script = Script().then(200, echo)

    async def body(url: str) -> None:
        b = backend(url)
        gateway = hosted_gateway(b.config, model="my-model", environ=ENV)
        b.gateway = gateway
        rollout = gateway.open_rollout()
        agent = gateway.open_agent(rollout)
        reply = await b.forward("openai_chat", {"messages": USER}, agent=agent)
        assert script.seen[0]["headers"]["authorization"] == f"Bearer {KEY}"
        assert KEY.encode() not in reply.body and b"[redacted]" in reply.body
        assert KEY not in repr(agent) and KEY not in repr(rollout)
        assert KEY not in b.redact(f"x {KEY} y") and b.redact("short") == "short"

    run(script, body)


def test_normalization_replaces_the_model_drops_top_k_and_reduces_tools():
    script = Script()

    async def body(url: str) -> None:
        b = backend(
            url, inference_params={"temperature": 0.3, "top_p": 0.9, "top_k": 5, "max_completion_tokens": 77}
        )
        request = {
            "model": "gpt-whatever",
            "messages": USER,
            "top_k": 40,
            "temperature": 0.7,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "functions": [{"name": "legacy"}],
            "web_search_options": {},
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "description": "d", "parameters": {}, "strict": True},
                }
            ],
        }
        await b.forward(
            "openai_chat", request, headers={"OpenAI-Beta": "x", "anthropic-version": "no", "X-Other": "1"}
        )
        sent = script.seen[0]
        assert sent["body"] == {
            "model": "my-model",
            "messages": USER,
            "temperature": 0.7,
            "top_p": 0.9,
            "max_completion_tokens": 77,
            "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}],
        }
        assert sent["headers"]["openai-beta"] == "x"
        assert "anthropic-version" not in sent["headers"] and "x-other" not in sent["headers"]
        with pytest.raises(Exception, match="tool_choice"):
            await b.forward("openai_chat", {"messages": USER, "tool_choice": "required"})
        assert len(script.seen) == 1  # refused before forwarding

        # sampling_precedence: config strips a policy call's own sampling (and budget); aux calls keep theirs.
        c = backend(
            url,
            inference_params={"temperature": 0.3, "max_completion_tokens": 77},
            sampling_precedence="config",
        )
        await c.forward("openai_chat", {"messages": USER, "temperature": 1.5, "max_tokens": 5, "top_p": 0.5})
        assert script.seen[-1]["body"]["temperature"] == 0.3 and "top_p" not in script.seen[-1]["body"]
        assert (
            script.seen[-1]["body"]["max_completion_tokens"] == 77
            and "max_tokens" not in script.seen[-1]["body"]
        )
        await c.forward("openai_chat", {"messages": USER, "temperature": 1.5}, kind="aux")
        assert script.seen[-1]["body"]["temperature"] == 1.5

    run(script, body)


def test_responses_and_messages_dialects_normalize_and_authenticate_their_way():
    message = {
        "id": "msg_1",
        "model": "claude-x",
        "type": "message",
        "content": [{"type": "text", "text": "OK"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 2, "cache_read_input_tokens": 5},
    }
    response = {
        "id": "resp_1",
        "model": "gpt-r",
        "status": "completed",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "OK"}]}],
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    script = Script().then(200, response).then(200, message)

    async def body(url: str) -> None:
        b = backend(url)
        request = {
            "input": "hi",
            "previous_response_id": "r0",
            "store": True,
            "truncation": "auto",
            "tools": [
                {"type": "web_search"},
                {"type": "function", "name": "f", "parameters": {}, "strict": True},
            ],
        }
        reply = await b.forward("openai_responses", request)
        sent = script.seen[0]
        assert sent["path"] == "/v1/responses"
        assert "previous_response_id" not in sent["body"] and "truncation" not in sent["body"]
        assert sent["body"]["tools"] == [
            {"type": "function", "name": "f", "description": "", "parameters": {}}
        ]
        assert reply.record is not None and reply.record["response_id"] == "resp_1"
        assert reply.record["stop_reason"] == "completed"

        reply = await b.forward(
            "anthropic_messages",
            {
                "messages": USER,
                "tools": [{"name": "t", "input_schema": {"type": "object"}}, {"type": "bash"}],
            },
            headers={"anthropic-beta": "b1", "openai-beta": "no"},
        )
        sent = script.seen[1]
        assert sent["path"] == "/v1/messages" and sent["headers"]["x-api-key"] == KEY
        assert "authorization" not in sent["headers"] and "openai-beta" not in sent["headers"]
        assert sent["headers"]["anthropic-beta"] == "b1" and sent["body"]["max_tokens"] == 4096
        assert sent["body"]["tools"] == [{"name": "t", "description": "", "input_schema": {"type": "object"}}]
        assert reply.record is not None and reply.record["usage"]["input_tokens"] == 15
        assert reply.record["usage"]["cached_input_tokens"] == 5 and reply.record["model"] == "claude-x"
        with pytest.raises(Exception, match="stop_sequences"):
            await b.forward("anthropic_messages", {"messages": USER, "stop_sequences": ["x"]})

    run(script, body)


def test_streams_are_read_whole_and_a_cut_stream_is_retried():
    cut = b'data: {"id":"c1","model":"m","choices":[{"delta":{"content":"O"}}]}\n\n'
    whole = (
        cut
        + b'data: {"id":"c1","model":"m","choices":[{"delta":{"content":"K"},"finish_reason":"stop"}]}\n\n'
        + b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}\n\ndata: [DONE]\n\n'
    )
    script = Script().then(200, cut).then(200, b'event: error\ndata: {"error":{"message":"overloaded"}}\n\n')
    script.then(200, whole)

    async def body(url: str) -> None:
        reply = await backend(url, delays=[]).forward("openai_chat", {"messages": USER, "stream": True})
        assert (
            reply.status == 200 and reply.body == whole and reply.content_type.startswith("text/event-stream")
        )
        assert reply.record is not None and reply.record["attempts"] == 3
        assert reply.record["usage"]["input_tokens"] == 4 and reply.record["stop_reason"] == "stop"

    run(script, body)


def test_pricing_cost_and_the_provider_record_on_an_in_process_call():
    script = Script().then(200, completion("hello"), x_request_id="req-9")

    async def body(url: str) -> None:
        config = HostedConfig(
            base_url=url,
            api_key_env="HOSTED_KEY",
            pricing={"input": 2.0, "output": 10.0, "cached_input": 0.5},
        )
        gateway = hosted_gateway(config, model="my-model", environ=ENV)
        rollout = gateway.open_rollout()
        agent = gateway.open_agent(rollout)
        reply = await gateway.chat(agent, list(USER), tools=None, temperature=0.2)
        assert reply.message["content"] == "hello" and reply.finish_reason == "stop"
        assert script.seen[0]["body"]["stream"] is False and script.seen[0]["body"]["model"] == "my-model"
        (call,) = agent.calls
        assert call.call_id == reply.call_id and call.model == "served-model-2025"
        assert rollout.interactions == {}  # no tokens: it never trains
        provider = call.generation["provider"]
        assert provider["dialect"] == "openai_chat" and provider["request_id"] == "req-9"
        assert provider["response_id"] == "chatcmpl-1" and provider["attempts"] == 1
        assert provider["rate_limited"] is False and provider["refusal"] is None
        # 600 fresh input * 2 + 400 cached * 0.5 + 200 output * 10, per million
        assert provider["cost"] == pytest.approx((600 * 2.0 + 400 * 0.5 + 200 * 10.0) / 1e6)
        assert call.usage == {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}
        assert KEY not in repr(agent.calls)

    run(script, body)


def test_the_http_seam_refuses_like_the_gateway_and_relays_the_provider_reply():
    script = Script().then(200, completion())

    async def body(url: str) -> None:
        b = backend(url)
        gateway = hosted_gateway(b.config, model="my-model", environ=ENV)
        b.gateway = gateway
        rollout = gateway.open_rollout(judges=False)
        agent = gateway.open_agent(rollout)
        response = await b.chat(agent, {"messages": USER}, "chat", kind="policy")
        assert response.status_code == 200 and json.loads(response.body)["model"] == "served-model-2025"
        assert response.headers["x-platoon-call-id"] == agent.calls[0].call_id
        with pytest.raises(Exception, match="judge calls are disabled"):
            await b.chat(agent, {"messages": USER}, "chat", kind="judge")
        gateway.close_agent(agent)
        with pytest.raises(Exception, match="closed"):
            await b.chat(agent, {"messages": USER}, "chat", kind="policy")
        assert len(script.seen) == 1

    run(script, body)


def test_the_probe_passes_or_fails_in_one_line():
    script = Script().then(200, completion()).then(401, {"error": {"message": f"invalid key {KEY}"}})

    async def body(url: str) -> None:
        b = backend(url)
        await b.probe(["openai_chat"])
        sent = script.seen[0]["body"]
        assert sent["messages"][0]["content"] == "Reply with OK." and sent["max_completion_tokens"] == 16
        with pytest.raises(ConfigError) as info:
            await b.probe(["openai_chat"])
        line = str(info.value)
        assert "\n" not in line and "openai_chat" in line and url.removesuffix("/v1") in line
        assert "invalid key" in line and KEY not in line

    run(script, body)


def test_the_probe_reports_an_unreachable_server():
    async def main() -> None:
        b = backend("http://127.0.0.1:9/v1", delays=[])
        with pytest.raises(ConfigError) as info:
            await b.probe(["anthropic_messages"])
        assert "anthropic_messages" in str(info.value) and "http://127.0.0.1:9" in str(info.value)

    asyncio.run(main())
