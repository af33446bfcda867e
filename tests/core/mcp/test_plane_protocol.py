"""The MCP plane's JSON-RPC and streamable-HTTP edges over raw HTTP: methods, 405, 202, batches,
protocol versions, errors, SSE keepalives and progress, cancellation, tool exceptions and listing shapes."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any

import httpx

from platoon.envs.service import ToolResult, ToolSpec
from platoon.gateway.mcp import bind_tools

from .conftest import open_session, plane_server

SSE = {"Accept": "application/json, text/event-stream"}


class ScriptedSession:
    """A session without its own gate: one tool raises, one blocks until released, one has platoon schema keys."""

    manages_concurrency = False

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.ran: list[str] = []

    async def tools(self) -> list[ToolSpec]:
        schema = {"properties": {"x": {"type": "string", "x-platoon-route": "a"}}, "x-platoon-hidden": True}
        return [
            ToolSpec("boom", "raises", None),
            ToolSpec("wait", "blocks", {"type": "object", "properties": {}}),
            ToolSpec("shaped", "schema", schema, meta={"k": "v"}),
            ToolSpec("blocks", "many blocks", None),
        ]

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        self.ran.append(name)
        if name == "boom":
            raise RuntimeError("kaput")
        if name == "wait":
            await self.release.wait()
            return ToolResult.text("released")
        content = [
            {"type": "image", "data": "aGk=", "mimeType": "image/png"},
            {"type": "resource_link", "uri": "file:///x", "name": "x"},
            {"type": "weird", "n": 1},
            "plain",
        ]
        return ToolResult(content, metadata={"m": 1})


def rpc(method: str, request_id: Any = 1, **params: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if request_id is not None:
        message["id"] = request_id
    return message


def sse_messages(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


async def until(condition: Any, what: str) -> None:
    """Wait until `condition()` holds (the state a step needs), polling the loop; the timeout is a hang guard."""
    try:
        async with asyncio.timeout(60):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"never happened: {what}") from None


async def stream_releasing(
    http: httpx.AsyncClient, call: dict[str, Any], release: Any, when: Any
) -> list[str]:
    """POST `call` for SSE and read the stream's lines; `release()` once, at the first line `when(line)` holds."""
    lines: list[str] = []
    async with (
        asyncio.timeout(60),
        http.stream("POST", "/mcp", json=call, headers=SSE) as reply,
    ):  # hang guard
        assert reply.headers["content-type"].startswith("text/event-stream")
        async for line in reply.aiter_lines():
            lines.append(line)
            if when(line):
                release()
    return lines


def run_with(session_factory: Any, body: Any, keepalive_s: float = 10.0) -> None:
    async def main() -> None:
        async with plane_server(keepalive_s=keepalive_s) as served:
            session = await session_factory()
            root = served.gateway.open_agent(served.rollout)
            bind_tools(root, session)
            headers = {"Authorization": f"Bearer {root.secret}"}
            async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=30) as http:
                await body(http, root, session, served)
            close = getattr(session, "close", None)
            if close is not None:
                await close()

    asyncio.run(main())


async def scripted() -> ScriptedSession:
    return ScriptedSession()


def test_only_post_and_notifications_get_202():
    async def body(http: httpx.AsyncClient, root: Any, session: Any, served: Any) -> None:
        for method in ("GET", "DELETE"):
            reply = await http.request(method, "/mcp")
            assert reply.status_code == 405 and reply.headers["allow"] == "POST"
        reply = await http.post("/mcp", json=rpc("notifications/initialized", None))
        assert reply.status_code == 202 and reply.content == b""
        reply = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 9, "result": {}})
        assert reply.status_code == 202

    run_with(scripted, body)


def test_protocol_versions_and_errors():
    async def body(http: httpx.AsyncClient, root: Any, session: Any, served: Any) -> None:
        reply = await http.post("/mcp", json=rpc("initialize", protocolVersion="1999-01-01"))
        assert reply.json()["result"]["protocolVersion"] == "2025-11-25"
        reply = await http.post("/mcp", json=rpc("initialize", protocolVersion="2025-03-26"))
        result = reply.json()["result"]
        assert result["protocolVersion"] == "2025-03-26"
        assert result["capabilities"] == {"tools": {"listChanged": False}}
        assert result["serverInfo"] == {"name": "platoon-gateway", "version": "1"}
        reply = await http.post("/mcp", json=rpc("ping"), headers={"MCP-Protocol-Version": "2030-01-01"})
        assert reply.status_code == 400
        reply = await http.post("/mcp", json=rpc("ping"), headers={"MCP-Protocol-Version": "2024-11-05"})
        assert reply.status_code == 200
        reply = await http.post("/mcp", content=b"{nope", headers={"content-type": "application/json"})
        assert reply.status_code == 400 and reply.json()["error"]["code"] == -32700
        reply = await http.post("/mcp", json={"id": 1, "method": "ping"})
        assert reply.json()["error"]["code"] == -32600
        reply = await http.post("/mcp", json=rpc("resources/list"))
        assert reply.json() == {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": reply.json()[
            "error"]["message"]}}  # fmt: skip
        reply = await http.post("/mcp", json=rpc("tools/call", arguments={}))
        assert reply.json()["error"]["code"] == -32602
        reply = await http.post("/mcp", json=[])
        assert reply.status_code == 400 and reply.json()["error"]["code"] == -32600

    run_with(scripted, body)


def test_batches_answer_requests_in_order_and_skip_notifications():
    async def body(http: httpx.AsyncClient, root: Any, session: Any, served: Any) -> None:
        batch = [
            rpc("ping", 1),
            rpc("notifications/initialized", None),
            rpc("tools/list", "b"),
            rpc("nope", 3),
            7,
        ]
        reply = await http.post("/mcp", json=batch)
        out = reply.json()
        assert reply.status_code == 200 and [m["id"] for m in out] == [1, "b", 3, None]
        assert [t["name"] for t in out[1]["result"]["tools"]] == ["boom", "wait", "shaped", "blocks"]
        assert out[2]["error"]["code"] == -32601 and out[3]["error"]["code"] == -32600
        reply = await http.post("/mcp", json=[rpc("notifications/initialized", None)])
        assert reply.status_code == 202

    run_with(scripted, body)


def test_listing_shapes_and_result_blocks():
    async def body(http: httpx.AsyncClient, root: Any, session: Any, served: Any) -> None:
        tools = (await http.post("/mcp", json=rpc("tools/list"))).json()["result"]["tools"]
        shaped = next(t for t in tools if t["name"] == "shaped")
        assert shaped["inputSchema"] == {"type": "object", "properties": {"x": {"type": "string"}}}
        assert shaped["_meta"] == {"k": "v"} and "annotations" not in shaped
        assert next(t for t in tools if t["name"] == "boom")["inputSchema"] == {"type": "object"}
        result = (await http.post("/mcp", json=rpc("tools/call", name="blocks"))).json()["result"]
        assert result["content"] == [
            {"type": "image", "data": "aGk=", "mimeType": "image/png"},
            {"type": "resource_link", "uri": "file:///x", "name": "x"},
            {"type": "text", "text": json.dumps({"type": "weird", "n": 1})},
            {"type": "text", "text": "plain"},
        ]
        platoon = result["_meta"]["platoon"]
        assert platoon["metadata"] == {"m": 1} and platoon["finished"] is False and platoon["reward"] is None
        boom = (await http.post("/mcp", json=rpc("tools/call", name="boom"))).json()["result"]
        assert boom["isError"] is True and "kaput" in boom["content"][0]["text"]

    run_with(scripted, body)


def test_sse_keepalives_then_the_reply():
    async def body(http: httpx.AsyncClient, root: Any, session: ScriptedSession, served: Any) -> None:
        # the tool is released only once the client has seen a keepalive: the reply comes after it
        call = rpc("tools/call", 5, name="wait")
        lines = await stream_releasing(http, call, session.release.set, lambda line: line == ": keepalive")
        text = "\n".join(lines)
        first_message = next(i for i, line in enumerate(lines) if line.startswith("data: "))
        assert ": keepalive" in lines[:first_message]
        (message,) = sse_messages(text)
        assert message["id"] == 5 and message["result"]["content"][0]["text"] == "released"
        assert "event: message" in text

    run_with(scripted, body, keepalive_s=0.1)


def test_sse_progress_notifications_for_a_progress_token():
    async def body(http: httpx.AsyncClient, root: Any, session: ScriptedSession, served: Any) -> None:
        # the tool is released only once the client has seen a progress notification
        call = rpc("tools/call", 6, name="wait", _meta={"progressToken": "tok"})
        lines = await stream_releasing(
            http, call, session.release.set, lambda line: "notifications/progress" in line
        )
        messages = sse_messages("\n".join(lines))
        progress = [m for m in messages if m.get("method") == "notifications/progress"]
        assert progress and all(m["params"]["progressToken"] == "tok" for m in progress)
        assert progress[0]["params"]["progress"] > 0
        assert messages[-1]["id"] == 6

    run_with(scripted, body, keepalive_s=0.1)


def test_a_cancelled_queued_call_never_runs_and_gets_no_reply():
    async def body(http: httpx.AsyncClient, root: Any, session: ScriptedSession, served: Any) -> None:
        # The first call holds the provider's one-at-a-time slot; the second queues behind it and is cancelled.
        first = asyncio.ensure_future(http.post("/mcp", json=rpc("tools/call", 1, name="wait"), headers=SSE))
        await until(lambda: session.ran == ["wait"], "the first call runs")
        second = asyncio.ensure_future(
            http.post("/mcp", json=rpc("tools/call", 2, name="blocks"), headers=SSE)
        )
        await until(lambda: (root.agent_id, "2") in served.plane._inflight, "the second call is queued")
        cancel = rpc("notifications/cancelled", None, requestId=2, reason="changed my mind")
        assert (await http.post("/mcp", json=cancel)).status_code == 202
        reply = await second
        assert sse_messages(reply.text) == []
        session.release.set()
        assert sse_messages((await first).text)[0]["id"] == 1
        assert session.ran == ["wait"]
        assert [c["name"] for c in root.misc["tool_calls"]] == ["wait"]

    run_with(scripted, body)


def test_a_disconnect_cancels_the_call():
    async def body(http: httpx.AsyncClient, root: Any, session: ScriptedSession, served: Any) -> None:
        request = asyncio.ensure_future(http.post("/mcp", json=rpc("tools/call", 1, name="wait")))
        await until(lambda: session.ran == ["wait"], "the call runs")
        request.cancel()  # the client goes away mid-call
        with contextlib.suppress(asyncio.CancelledError):
            await request
        await until(lambda: served.plane._inflight == {}, "the disconnect cancels the call")
        session.release.set()
        # a later call is answered and recorded; the cancelled one never is
        later = await http.post("/mcp", json=rpc("tools/call", 2, name="blocks"))
        assert later.json()["id"] == 2
        assert [c["name"] for c in root.misc["tool_calls"]] == ["blocks"]

    run_with(scripted, body)


def test_ors_sessions_queue_on_their_gate_with_the_agent_named():
    async def body(http: httpx.AsyncClient, root: Any, session: Any, served: Any) -> None:
        calls = [rpc("tools/call", i, name="guess", arguments={"number": i}) for i in range(1, 4)]
        replies = await asyncio.gather(*(http.post("/mcp", json=c) for c in calls))
        assert [r.json()["result"]["content"][0]["text"] for r in replies] == ["wrong", "wrong", "right"]
        assert sorted(session.env.guesses) == [1, 2, 3]
        assert len(root.misc["tool_calls"]) == 3

    run_with(open_session, body)
