"""A responsive gateway: a large prompt renders off the event loop (other calls and `/healthz` are answered
meanwhile), a small one on it, a budgeted call counts while it renders, and the Tinker SDK is imported before
serving, in a thread.

Order and cause only: a gated renderer holds the large render until the test has seen what it waits for; were the
render on the event loop, the loop could not answer in the meantime and the recorded order would differ.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from platoon.gateway.core import BUDGET_STOP_CALL_PREFIX
from platoon.renderers.toy import toy_renderer

from .conftest import served

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "hi"}
FIVE_MB = "x" * 5_000_000
#: how long a held render waits for the test at most (a bound on a failing test's time, not a margin)
PATIENCE = 60.0


class GatedRenderer:
    """The toy renderer. A render of a message over a megabyte records "render started", waits for `release`, then
    renders a short stand-in for the message and records "render finished"; every render records its thread."""

    def __init__(self, events: list[str]) -> None:
        self.inner = toy_renderer()
        self.tokenizer = self.inner.tokenizer
        self.events = events
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[int] = []

    def render_prompt(self, messages: list[dict[str, Any]], tools: Any = None, **kwargs: Any) -> list[int]:
        self.threads.append(threading.get_ident())
        if any(len(str(m.get("content"))) > 1_000_000 for m in messages):
            self.events.append("render started")
            self.entered.set()
            self.release.wait(PATIENCE)
            self.events.append("render finished")
            messages = [{**m, "content": "(large)"} for m in messages]
        return list(self.inner.render_prompt(messages, tools=tools, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_healthz_and_other_agents_are_answered_while_a_5mb_prompt_renders():
    events: list[str] = []
    renderer = GatedRenderer(events)
    async with served(["sampled first", "sampled second"], renderer=renderer) as s:
        other = s.gateway.open_agent(s.rollout, parent=s.agent)
        big = asyncio.ensure_future(
            s.openai().chat.completions.create(model="x", messages=[{"role": "user", "content": FIVE_MB}])
        )
        assert await asyncio.to_thread(renderer.entered.wait, PATIENCE)
        async with httpx.AsyncClient() as http:
            health = await http.get(f"{s.server.base_url}/healthz")
        events.append("healthz answered")
        small = await s.openai(other).chat.completions.create(model="x", messages=[USER])
        events.append("other agent answered")
        renderer.release.set()
        reply = await big
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert events == ["render started", "healthz answered", "other agent answered", "render finished"]
    # The other agent's call was sampled while the large prompt rendered.
    assert small.choices[0].message.content == "sampled first"
    assert reply.choices[0].message.content == "sampled second"
    loop_thread = threading.get_ident()
    assert renderer.threads[0] != loop_thread and renderer.threads[1] == loop_thread


async def test_a_small_request_renders_on_the_event_loop():
    renderer = GatedRenderer([])
    async with served(["a"], renderer=renderer) as s:
        await s.openai().chat.completions.create(model="x", messages=[USER])
    assert renderer.threads == [threading.get_ident()]


async def test_a_budgeted_call_counts_while_its_large_prompt_renders():
    renderer = GatedRenderer([])
    async with served(["first", "second"], renderer=renderer) as s:
        s.gateway.set_call_cap(s.agent, 1)
        big = asyncio.ensure_future(s.gateway.chat(s.agent, [{"role": "user", "content": FIVE_MB}]))
        assert await asyncio.to_thread(renderer.entered.wait, PATIENCE)
        # The one budgeted step is taken by the call still rendering: this one gets the budget stop.
        stopped = await s.gateway.chat(s.agent, [USER])
        renderer.release.set()
        first = await big
    assert stopped.call_id.startswith(BUDGET_STOP_CALL_PREFIX)
    assert first.message["content"] == "first" and len(s.agent.calls) == 1


async def test_a_call_cancelled_while_its_large_prompt_renders_records_nothing():
    renderer = GatedRenderer([])
    async with served(["unused"], renderer=renderer) as s:
        s.gateway.set_call_cap(s.agent, 1)
        big = asyncio.ensure_future(s.gateway.chat(s.agent, [{"role": "user", "content": FIVE_MB}]))
        assert await asyncio.to_thread(renderer.entered.wait, PATIENCE)
        big.cancel()  # as a client disconnect cancels it
        with pytest.raises(asyncio.CancelledError):
            await big
        renderer.release.set()
        # The cancelled call gave its budgeted step back: the step samples this call.
        reply = await s.gateway.chat(s.agent, [USER])
    assert reply.message["content"] == "unused" and len(s.agent.calls) == 1


TINKER_IMPORT = """
import asyncio, sys
from platoon.gateway.http import GatewayServer
from platoon.testing import make_gateway

async def main():
    gateway = make_gateway(["hi", "there"])
    server = GatewayServer(gateway)
    await server.astart()
    rollout = gateway.open_rollout()
    reply = await gateway.chat(gateway.open_agent(rollout), [{"role": "user", "content": "x"}])
    assert reply.message["content"] == "hi"
    await server.astop()
    print("tinker loaded:", "tinker" in sys.modules)

asyncio.run(main())
"""


def test_a_gateway_over_a_scripted_policy_never_imports_the_tinker_sdk(run_python: Any):
    # No SDK client can exist where the SDK was never imported: the gateway hands the sampler plain types instead,
    # so neither serving nor a call pays the SDK's seconds of import (or torch's, which the SDK imports).
    result = run_python(TINKER_IMPORT)
    assert result.returncode == 0, result.stderr
    assert "tinker loaded: False" in result.stdout
