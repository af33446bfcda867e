"""The MCP tool plane against the real `mcp` SDK client: initialize, listing by tool access, calls
with `_meta.platoon`, finishing, unknown tools, auth, and the call recorded exactly as an in-process call."""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from platoon.episode.budget import BudgetTracker
from platoon.episode.context import Agent, EpisodeState
from platoon.gateway.mcp import bind_tools, tool_binding

from .conftest import Served, open_session, plane_server


@contextlib.asynccontextmanager
async def client(url: str, key: str | None, *, path: bool = False) -> AsyncIterator[Any]:
    """A real MCP `ClientSession` over streamable HTTP: Bearer auth, or the `/s/<secret>/mcp` path form."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {} if key is None or path else {"Authorization": f"Bearer {key}"}
    endpoint = f"{url}/s/{key}/mcp" if path else f"{url}/mcp"
    async with (
        httpx.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(endpoint, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        yield session


def _agent(served: Served, record: Any, session: Any) -> Agent:
    """An in-process agent context over `record` (its constructor binds its tools for the plane)."""
    tracker = BudgetTracker()
    episode = EpisodeState(served.gateway, served.rollout, tracker, route=None, config=None)
    budget = tracker.add_agent(record.agent_id, max_steps=None, steps=lambda: 0)
    return Agent(episode, record, session=session, task=session.task, harness=None, budget=budget)


def test_initialize_list_and_call_with_the_sdk_client():
    async def main() -> None:
        async with plane_server() as served:
            session = await open_session()
            root = served.gateway.open_agent(served.rollout)
            bind_tools(root, session)
            async with client(served.url, root.secret) as mcp:
                init = await mcp.initialize()
                assert init.serverInfo.name == "platoon-gateway" and init.serverInfo.version == "1"
                assert init.capabilities.tools is not None and init.capabilities.tools.listChanged is False
                await mcp.send_ping()
                listed = await mcp.list_tools()
                names = [t.name for t in listed.tools]
                assert names == ["guess", "peek", "slow", "submit"]
                peek = next(t for t in listed.tools if t.name == "peek")
                assert peek.annotations is not None and peek.annotations.readOnlyHint is True
                guess = next(t for t in listed.tools if t.name == "guess")
                assert guess.inputSchema["type"] == "object" and "number" in guess.inputSchema["properties"]

                result = await mcp.call_tool("guess", {"number": 5})
                assert not result.isError
                assert [c.text for c in result.content] == ["wrong"]
                meta = result.meta["platoon"]
                assert meta["finished"] is False and meta["reward"] == 0.0 and meta["event_id"]

                result = await mcp.call_tool("submit", {"answer": "3"})
                assert result.meta["platoon"]["finished"] is True and result.meta["platoon"]["reward"] == 1.0
                # Finished latches as through ctx.call_tool: a later call is refused as an error result.
                after = await mcp.call_tool("guess", {"number": 3})
                assert after.isError and "finished" in after.content[0].text.lower()
            await session.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("access", "expected"),
    [
        ("full", ["guess", "peek", "slow", "submit"]),
        ("no_terminal", ["guess", "peek", "slow"]),
        ("read_only", ["peek"]),
    ],
)
def test_tools_are_filtered_by_access_and_hidden_ones_are_unknown(access: str, expected: list[str]):
    from mcp.shared.exceptions import McpError

    async def main() -> None:
        async with plane_server() as served:
            session = await open_session()
            root = served.gateway.open_agent(served.rollout, access=access)
            bind_tools(root, session)
            async with client(served.url, root.secret, path=True) as mcp:
                await mcp.initialize()
                assert [t.name for t in (await mcp.list_tools()).tools] == expected
                if "submit" not in expected:
                    with pytest.raises(McpError) as info:
                        await mcp.call_tool("submit", {"answer": "3"})
                    assert info.value.error.code == -32602
                    assert root.misc.get("tool_calls") is None  # neither sent nor recorded
                    assert not session.finished
            await session.close()

    asyncio.run(main())


def test_unknown_tool_is_invalid_params():
    from mcp.shared.exceptions import McpError

    async def main() -> None:
        async with plane_server() as served:
            session = await open_session()
            root = served.gateway.open_agent(served.rollout)
            bind_tools(root, session)
            async with client(served.url, root.secret) as mcp:
                await mcp.initialize()
                with pytest.raises(McpError) as info:
                    await mcp.call_tool("nope", {})
                assert info.value.error.code == -32602 and "nope" in info.value.error.message
            await session.close()

    asyncio.run(main())


def test_the_call_is_recorded_exactly_as_an_in_process_call():
    async def main() -> None:
        async with plane_server() as served:
            session = await open_session()
            root_record = served.gateway.open_agent(served.rollout)
            ctx = _agent(served, root_record, session)  # binds the plane through the Agent context
            assert tool_binding(root_record) is not None and tool_binding(root_record).session is session
            await ctx.call_tool("guess", {"number": 1})
            async with client(served.url, root_record.secret) as mcp:
                await mcp.initialize()
                await mcp.call_tool("guess", {"number": 1})
            first, second = root_record.misc["tool_calls"]
            assert first == second
            assert first == {"name": "guess", "arguments": {"number": 1}, "is_error": False, "finished": False,
                             "step": 0, "reward": 0.0}  # fmt: skip
            await session.close()

    asyncio.run(main())


def test_children_minted_over_http_inherit_the_provider_and_record_on_themselves():
    async def main() -> None:
        async with plane_server() as served:
            session = await open_session()
            root = served.gateway.open_agent(served.rollout)
            bind_tools(root, session)
            child = served.gateway.open_agent(
                served.rollout, parent=root, role="subagent", access="read_only"
            )
            assert tool_binding(child) is tool_binding(root)
            async with client(served.url, child.secret) as mcp:
                await mcp.initialize()
                assert [t.name for t in (await mcp.list_tools()).tools] == ["peek"]
                result = await mcp.call_tool("peek", {})
                assert result.content[0].text == "0"
            assert [c["name"] for c in child.misc["tool_calls"]] == ["peek"]
            assert "tool_calls" not in root.misc
            # Rebinding the child (e.g. to a forked session) stops the inheritance.
            fork = await session.fork("copy")
            bind_tools(child, fork)
            assert tool_binding(child).session is fork and tool_binding(root).session is session
            await fork.close()
            await session.close()

    asyncio.run(main())


def test_unknown_and_closed_keys_get_401_and_410():
    async def main() -> None:
        async with plane_server() as served:
            session = await open_session()
            root = served.gateway.open_agent(served.rollout)
            bind_tools(root, session)
            body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            async with httpx.AsyncClient(base_url=served.url) as http:
                bad = await http.post("/mcp", json=body, headers={"Authorization": "Bearer nope"})
                assert bad.status_code == 401 and bad.json()["error"]["code"] == -32001
                none = await http.post("/mcp", json=body)
                assert none.status_code == 401
                ok = await http.post("/mcp", json=body, headers={"x-api-key": root.secret})
                assert ok.status_code == 200 and ok.json() == {"jsonrpc": "2.0", "id": 1, "result": {}}
                served.gateway.close_agent(root)
                gone = await http.post(f"/s/{root.secret}/mcp", json=body)
                assert gone.status_code == 410 and gone.json()["error"]["code"] == -32001
            await session.close()

    asyncio.run(main())


def test_the_deprecated_sdk_entry_point_with_headers_works_too():
    async def main() -> None:
        from mcp import ClientSession
        from mcp.client.streamable_http import streamablehttp_client

        async with plane_server() as served:
            session = await open_session()
            root = served.gateway.open_agent(served.rollout)
            bind_tools(root, session)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                transport = streamablehttp_client(
                    f"{served.url}/mcp", headers={"Authorization": f"Bearer {root.secret}"}
                )
            async with transport as (read, write, _), ClientSession(read, write) as mcp:
                await mcp.initialize()
                result = await mcp.call_tool("peek", {})
                assert result.content[0].text == "0"
            await session.close()

    asyncio.run(main())


def test_ctx_mcp_points_next_to_the_model_endpoint():
    from platoon.harness.agent import ModelEndpoint

    class Served_(Agent):
        @property
        def endpoint(self) -> ModelEndpoint:
            return ModelEndpoint(f"http://127.0.0.1:1/s/{self.record.secret}/v1", self.record.secret, "m")

    async def main() -> None:
        async with plane_server() as served:
            session = await open_session()
            record = served.gateway.open_agent(served.rollout)
            assert _agent(served, record, session).mcp is None  # no HTTP server: no MCP plane
            tracker = BudgetTracker()
            episode = EpisodeState(served.gateway, served.rollout, tracker, route=None, config=None)
            budget = tracker.add_agent("x", max_steps=None, steps=lambda: 0)
            ctx = Served_(episode, record, session=session, task=session.task, harness=None, budget=budget)
            endpoint = ctx.mcp
            assert endpoint is not None
            assert endpoint.url == f"http://127.0.0.1:1/s/{record.secret}/mcp"
            assert endpoint.headers == {"Authorization": f"Bearer {record.secret}"}
            await session.close()

    asyncio.run(main())


def test_the_plane_on_the_gateway_http_server_with_the_sdk_client():
    http_server = pytest.importorskip("platoon.gateway.http")
    from .conftest import plane_factories

    _, mount_mcp = plane_factories()

    async def main() -> None:
        from .conftest import make_gateway

        gateway = make_gateway()
        rollout = gateway.open_rollout("r")
        session = await open_session()
        root = gateway.open_agent(rollout)
        bind_tools(root, session)
        server = http_server.GatewayServer(gateway, rollouts=["r"])
        mount_mcp(server)
        await server.astart()
        try:
            for path in (False, True):
                async with client(server.base_url, root.secret, path=path) as mcp:
                    await mcp.initialize()
                    assert (await mcp.list_tools()).tools[0].name == "guess"
                    assert (await mcp.call_tool("peek", {})).content[0].text == "0"
            # The server's own auth: a key of a rollout it does not serve is unknown here too.
            other = gateway.open_rollout("other")
            stranger = gateway.open_agent(other)
            async with httpx.AsyncClient(base_url=server.base_url) as http:
                reply = await http.post(
                    "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                    headers={"Authorization": f"Bearer {stranger.secret}"},
                )  # fmt: skip
                assert reply.status_code == 401
        finally:
            await server.astop()
            await session.close()

    asyncio.run(main())
