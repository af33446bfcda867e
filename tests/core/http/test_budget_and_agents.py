"""Gateway-enforced step budgets and `POST /v1/platoon/agents` over the real server."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from platoon.gateway.core import BUDGET_STOP_MESSAGE

from .conftest import gate, served

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "go"}]


async def test_policy_calls_past_the_cap_get_the_stop_reply_then_400():
    async with served(["one", "two", "aux"]) as s:
        s.gateway.set_call_cap(s.agent, 2)
        client = s.openai()
        texts = [(await client.chat.completions.create(model="x", messages=USER)).choices[0].message.content]
        texts.append(
            (await client.chat.completions.create(model="x", messages=USER)).choices[0].message.content
        )
        stop = BUDGET_STOP_MESSAGE.format(n=2)
        assert stop == (
            "[platoon] The step budget of 2 model calls is used up: no turns are left. Stop here; the task is "
            "graded as it stands."
        )
        for _ in range(8):
            reply = await client.chat.completions.create(model="x", messages=USER)
            assert reply.choices[0].message.content == stop and reply.choices[0].message.tool_calls is None
            assert reply.choices[0].finish_reason == "stop"
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="x", messages=USER)
        assert texts == ["one", "two"] and len(s.agent.calls) == 2 and len(s.rollout.interactions) == 2
        assert s.agent.misc["budget"] == {"enforce": "gateway", "max_steps": 2, "stops": 8}
        # aux calls are not budgeted
        aux = await client.chat.completions.create(
            model="x", messages=USER, extra_headers={"X-Platoon-Call-Kind": "aux"}
        )
        assert aux.choices[0].message.content == "aux"
        assert len(s.gateway.sampler.calls) == 3  # stops are never sampled


async def test_in_flight_calls_count_and_a_failed_call_gives_its_step_back():
    async with served(["slow", "next"], context_window_length=40) as s:
        s.gateway.set_call_cap(s.agent, 1)
        client = s.openai()
        with pytest.raises(openai.BadRequestError):  # context overflow: not a step
            await client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x" * 100}])
        sampler = gate(s)  # the first call stays in flight until the second has its answer
        async with asyncio.timeout(60):  # a hang guard only
            first = asyncio.ensure_future(client.chat.completions.create(model="x", messages=USER))
            await sampler.entered.wait()
            second = await client.chat.completions.create(model="x", messages=USER)
            assert second.choices[0].message.content.startswith("[platoon] The step budget of 1")
            sampler.release.set()
            assert (await first).choices[0].message.content == "slow"


async def test_minting_children_shares_the_cap_and_is_capped_per_rollout():
    async with served(["parent", "child", "x"], server_kwargs={"max_minted_agents": 2}) as s:
        s.gateway.set_call_cap(s.agent, 2)
        async with httpx.AsyncClient() as http:
            minted = await http.post(f"{s.v1}/platoon/agents", json={"role": "explorer", "goal": "look"})
            assert minted.status_code == 201
            body = minted.json()
            child = s.rollout.agent(body["agent_id"])
            assert body["api_key"] == child.secret
            assert body["base_url"] == f"{s.server.base_url}/s/{child.secret}/v1"
            assert (
                child.parent is s.agent
                and child.role == "explorer"
                and child.goal == "look"
                and child.depth == 1
            )
            # header auth: the child's base URL is unscoped
            header = await http.post(
                f"{s.server.base_url}/v1/platoon/agents",
                json={"role": "helper"},
                headers={"Authorization": f"Bearer {s.agent.secret}"},
            )
            assert header.status_code == 201 and header.json()["base_url"] == f"{s.server.base_url}/v1"
            over = await http.post(f"{s.v1}/platoon/agents", json={"role": "third"})
            assert over.status_code == 403 and over.json()["error"]["type"] == "permission_error"
            bad = await http.post(
                f"{s.server.base_url}/v1/platoon/agents",
                json={"role": 3},
                headers={"x-api-key": child.secret},
            )
            assert bad.status_code == 400
        await s.openai().chat.completions.create(model="x", messages=USER)
        child_client = openai.AsyncOpenAI(base_url=body["base_url"], api_key=body["api_key"], max_retries=0)
        s.clients.append(child_client)
        reply = await child_client.chat.completions.create(model="x", messages=USER)
        assert reply.choices[0].message.content == "child" and [c.call_id for c in child.calls] == [reply.id]
        stopped = await child_client.chat.completions.create(model="x", messages=USER)
        assert stopped.choices[0].message.content.startswith("[platoon] The step budget of 2")
        assert s.agent.misc["budget"]["stops"] == 1
