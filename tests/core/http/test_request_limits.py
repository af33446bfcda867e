"""Bounded requests: the gateway reads a body only up to its cap (413, without reading the rest), refuses JSON nested
past its cap, a `max_tokens` past its cap and a prompt past its prompt limit (400), each in one line that names the
setting raising it; none of them is a 500, a traceback, or a model call."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from platoon.gateway.core import DEFAULT_TOKEN_LIMIT
from platoon.gateway.http import GatewayServer
from platoon.gateway.http.server import DEFAULT_MAX_BODY_BYTES
from platoon.gateway.mcp import mount_mcp
from platoon.request_limits import limit_from_env
from platoon.testing import make_gateway

from .conftest import Served, served

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "hi"}
#: the body cap the tests set: small, so that "over the cap" costs little to send
CAP = 64 << 10
#: a hang guard only
PATIENCE = 60.0


def one_line(message: str) -> str:
    assert "\n" not in message and "Traceback" not in message, message
    return message


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING)
    return caplog


def no_traceback_logged(caplog: pytest.LogCaptureFixture) -> None:
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR], [
        record.getMessage() for record in caplog.records
    ]


async def raw_exchange(s: Served, head: bytes, body: bytes = b"") -> bytes:
    """Send `head` (and `body`) on a fresh connection, stop sending, and read what the server sends until it closes
    the connection: a server that waited for the rest of a declared body would never answer (the hang guard)."""
    reader, writer = await asyncio.open_connection(s.server.host, s.server.port)
    try:
        writer.write(head + body)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), PATIENCE)
    finally:
        writer.close()


def post_head(s: Served, path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: gateway", f"Authorization: Bearer {s.agent.secret}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# ---- the body cap


async def test_a_declared_80_mb_body_is_413_before_a_byte_of_it_is_read(logged):
    async with served(server_kwargs={"max_body_bytes": CAP}) as s:
        head = post_head(
            s, "/v1/chat/completions", "Content-Type: application/json", "Content-Length: 80000000"
        )
        reply = await raw_exchange(s, head)  # not a byte of the body is sent
        status, _, body = reply.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 413 ")
        assert b"connection: close" in status.lower()
        message = one_line(openai_message(body))
        assert message == (
            f"the request body is 80000000 bytes, over the gateway's limit of {CAP} bytes "
            "(PLATOON_GATEWAY_MAX_BODY_BYTES raises it)"
        )
        assert s.agent.calls == [] and s.agent.gateway_errors == 0
    no_traceback_logged(logged)


async def test_a_chunked_body_is_cut_off_at_the_cap_without_waiting_for_its_end(logged):
    """No Content-Length: the gateway reads up to the cap and answers then; this body never ends."""
    piece = b"x" * (16 << 10)
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    async with served(server_kwargs={"max_body_bytes": CAP}) as s:
        head = post_head(s, "/v1/chat/completions", "Transfer-Encoding: chunked")
        reply = await raw_exchange(s, head, chunk * 5)  # 80 KiB of an endless body, then silence
        status, _, body = reply.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 413 "), reply[:200]
        assert one_line(openai_message(body)) == (
            f"the request body is over the gateway's limit of {CAP} bytes (PLATOON_GATEWAY_MAX_BODY_BYTES raises it)"
        )
    no_traceback_logged(logged)


async def test_real_clients_sending_80_mb_get_one_413_line_and_the_gateway_keeps_serving(logged):
    """The async clients send their whole body before they read the answer: the gateway keeps the answer for them
    (dropping the rest of the body, never keeping it) instead of a reset connection they would retry."""
    over = {"role": "user", "content": "x" * (80 << 20)}
    async with served(["fine"]) as s:
        with pytest.raises(openai.APIStatusError) as chat:
            await s.openai().chat.completions.create(model="m", messages=[over])
        assert chat.value.status_code == 413
        assert one_line(error_message(chat.value)).startswith("the request body is ")
        assert error_message(chat.value).endswith(
            "bytes, over the gateway's limit of 33554432 bytes (PLATOON_GATEWAY_MAX_BODY_BYTES raises it)"
        )
        with pytest.raises(anthropic.APIStatusError) as messages:
            await s.anthropic().messages.create(model="m", max_tokens=8, messages=[over])
        assert messages.value.status_code == 413
        assert messages.value.body["error"]["type"] == "request_too_large"
        assert s.agent.calls == [] and s.agent.gateway_errors == 0
        reply = await s.openai().chat.completions.create(model="m", messages=[USER])
        assert reply.choices[0].message.content == "fine"
    no_traceback_logged(logged)


def test_the_default_body_cap_is_32_mib_and_the_variable_changes_it(monkeypatch):
    assert DEFAULT_MAX_BODY_BYTES == 32 << 20
    gateway = make_gateway()
    assert GatewayServer(gateway).max_body_bytes == DEFAULT_MAX_BODY_BYTES
    monkeypatch.setenv("PLATOON_GATEWAY_MAX_BODY_BYTES", "1048576")
    monkeypatch.setenv("PLATOON_GATEWAY_MAX_JSON_DEPTH", "8")
    server = GatewayServer(gateway)
    assert (server.max_body_bytes, server.max_json_depth) == (1 << 20, 8)
    monkeypatch.setenv("PLATOON_GATEWAY_MAX_BODY_BYTES", "32MB")
    with pytest.raises(
        ValueError, match="PLATOON_GATEWAY_MAX_BODY_BYTES must be a positive integer; got '32MB'"
    ):
        GatewayServer(gateway)
    assert limit_from_env("X", 5, {"X": " 7 "}) == 7
    assert limit_from_env("X", 5, {"X": "7"}, given=3) == 3  # a caller's value wins over the variable
    assert limit_from_env("X", 5, {"X": "0"}, minimum=0) == 0
    with pytest.raises(ValueError, match="X must be an integer >= 0; got -1"):
        limit_from_env("X", 5, {"X": "-1"}, minimum=0)


# ---- nesting


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [64, 100_000])
async def test_json_nested_past_the_cap_is_one_400_line_not_a_500(depth, logged):
    """64 levels of JSON in a body that already nests 2 (the object, the field) are past the cap; 100 000 levels
    once made the JSON reader raise a RecursionError, answered 500 with a traceback in the log."""
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": '
    body += b"[" * depth + b"]" * depth + b"}"
    async with served() as s:
        async with httpx.AsyncClient(timeout=PATIENCE) as client:
            answer = await client.post(
                f"{s.v1}/chat/completions", content=body, headers={"Content-Type": "application/json"}
            )
        assert answer.status_code == 400, answer.text
        assert one_line(answer.json()["error"]["message"]) == (
            "the request body's JSON is nested more than 64 levels deep, the gateway's limit "
            "(PLATOON_GATEWAY_MAX_JSON_DEPTH raises it)"
        )
        assert s.agent.calls == [] and s.agent.gateway_errors == 0
    no_traceback_logged(logged)


async def test_json_nested_within_the_cap_is_read():
    async with served(["fine"]) as s:
        reply = await s.openai().chat.completions.create(
            model="m", messages=[USER], extra_body={"metadata": nested(60)}
        )
        assert reply.choices[0].message.content == "fine"


@contextlib.asynccontextmanager
async def with_mcp(**server_kwargs: Any) -> AsyncIterator[Served]:
    gateway = make_gateway()
    rollout = gateway.open_rollout()
    agent = gateway.open_agent(rollout)
    server = GatewayServer(gateway, **server_kwargs)
    mount_mcp(server)
    await server.astart()
    try:
        yield Served(gateway, rollout, agent, server)
    finally:
        await server.astop()


async def test_the_mcp_plane_is_held_to_the_same_caps(logged):
    async with with_mcp(max_body_bytes=CAP) as s:
        url = f"{s.server.base_url}/s/{s.agent.secret}/mcp"
        async with httpx.AsyncClient(timeout=PATIENCE) as client:
            deep = (
                b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": '
                + b"[" * 500
                + b"]" * 500
                + b"}"
            )
            answer = await client.post(url, content=deep, headers={"Content-Type": "application/json"})
            assert answer.status_code == 400
            assert one_line(answer.json()["error"]["message"]) == (
                "Parse error: the request body's JSON is nested more than 64 levels deep"
            )
            answer = await client.post(url, content=b"[" + b" " * CAP + b"]")
            assert answer.status_code == 413
            assert "over the gateway's limit of 65536 bytes" in one_line(answer.json()["error"]["message"])
    no_traceback_logged(logged)


# ---- max_tokens and the prompt


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
async def test_a_max_tokens_past_the_cap_is_refused_before_sampling(key):
    async with served() as s:
        with pytest.raises(openai.BadRequestError) as caught:
            await s.openai().chat.completions.create(model="m", messages=[USER], **{key: 10_000_000})
        assert one_line(error_message(caught.value)) == (
            f"{key} is 10000000, over the gateway's limit of {DEFAULT_TOKEN_LIMIT} tokens "
            "(PLATOON_GATEWAY_MAX_TOKENS raises it)"
        )
        assert s.agent.calls == [] and s.agent.gateway_errors == 0


async def test_an_anthropic_max_tokens_past_the_cap_is_refused_before_sampling():
    async with served() as s:
        with pytest.raises(anthropic.BadRequestError) as refused:
            # streamed: the SDK itself refuses a large max_tokens without a stream before sending it
            await s.anthropic().messages.create(
                model="m", max_tokens=10_000_000, messages=[USER], stream=True
            )
        assert "max_tokens is 10000000, over the gateway's limit" in one_line(refused.value.message)
        assert s.agent.calls == [] and s.agent.gateway_errors == 0


async def test_the_token_caps_follow_their_variables(monkeypatch):
    monkeypatch.setenv("PLATOON_GATEWAY_MAX_TOKENS", "100")
    monkeypatch.setenv("PLATOON_GATEWAY_MAX_PROMPT_TOKENS", "40")
    async with served(["fine", "fine"]) as s:
        client = s.openai()
        with pytest.raises(
            openai.BadRequestError, match=r"max_tokens is 101, over the gateway's limit of 100"
        ):
            await client.chat.completions.create(model="m", messages=[USER], max_tokens=101)
        reply = await client.chat.completions.create(model="m", messages=[USER], max_tokens=100)
        assert reply.choices[0].message.content == "fine"
        long = {"role": "user", "content": "word " * 60}
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="m", messages=[long])
        assert re.fullmatch(
            r"the prompt is \d+ tokens, over the gateway's limit of 40 prompt tokens "
            r"\(PLATOON_GATEWAY_MAX_PROMPT_TOKENS raises it\)",
            one_line(error_message(caught.value)),
        )
        assert caught.value.code == "context_length_exceeded"  # what harnesses compact on
        assert len(s.agent.calls) == 1


async def test_a_prompt_far_past_the_limit_is_refused_before_it_renders():
    """A lower bound on the prompt's length refuses it without tokenizing megabytes."""
    async with served(max_prompt_tokens=1000) as s:
        with pytest.raises(openai.BadRequestError) as caught:
            await s.openai().chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x" * 1_000_000}]
            )
        assert one_line(error_message(caught.value)).startswith("the prompt is at least ")
        assert s.agent.calls == []


def openai_message(body: bytes) -> str:
    return str(json.loads(body)["error"]["message"])


def error_message(error: openai.APIStatusError) -> str:
    """The gateway's own message (the client's `message` prefixes the status)."""
    assert isinstance(error.body, dict)
    return str(error.body["message"])


def test_a_bad_limit_variable_stops_validate_and_the_run_before_any_gateway(monkeypatch, capsys) -> None:
    """Every check a run makes before starting, `platoon config validate` makes too: a limit variable that is not
    an integer it takes is one line naming it, exit 78, not an error once the gateway is made."""
    from pathlib import Path

    from platoon.cli import main
    from platoon.request_limits import gateway_limit_problems

    assert gateway_limit_problems({}) == []
    assert (
        gateway_limit_problems({"PLATOON_MAX_MINTED_AGENTS": "0", "PLATOON_GATEWAY_MAX_TOKENS": " 8 "}) == []
    )
    monkeypatch.setenv("PLATOON_GATEWAY_MAX_TOKENS", "abc")
    monkeypatch.setenv("PLATOON_MAX_MINTED_AGENTS", "-1")
    example = Path(__file__).resolve().parents[3] / "examples" / "bandit" / "train.yaml"
    assert main(["config", "validate", str(example)]) == 78
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [
        "  PLATOON_GATEWAY_MAX_TOKENS must be a positive integer; got 'abc' (unset it for the default)",
        "  PLATOON_MAX_MINTED_AGENTS must be an integer >= 0; got -1 (unset it for the default)",
    ]
