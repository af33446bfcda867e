"""The MCP plane's fixtures: a real openreward environment served in process, a gateway with one rollout, and the
plane under uvicorn on 127.0.0.1 in the test's own event loop.

`PLATOON_TEST_MCP_PLANE=sdk` serves the `mcp` SDK's plane instead (benchmarks/mcp_sdk_plane.py), the alternative
measured against the hand-written one (docs/architecture.md, "Dependencies")."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openreward.environments import Environment, TextBlock, ToolOutput, terminal, tool
from pydantic import BaseModel

from platoon.envs.ors.inprocess import InProcessOrsService, InProcessOrsSession
from platoon.task import Task

TASKS = {"train": [{"task_name": "t0", "target": 3}]}


class Guess(BaseModel):
    number: int


class Answer(BaseModel):
    answer: str


class GuessEnv(Environment):
    """Guess the target (`guess`), read-only `peek`, terminal `submit` (reward 1 on the target), `crash` raises."""

    def __init__(self, task_spec: dict[str, Any] = {}, secrets: dict[str, str] = {}) -> None:  # noqa: B006
        super().__init__(task_spec, secrets)
        self.target = task_spec["target"]
        self.guesses: list[int] = []

    @classmethod
    def list_splits(cls) -> list[str]:
        return list(TASKS)

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return TASKS[split]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Find the number.")]

    @tool
    async def guess(self, params: Guess) -> ToolOutput:
        """Guess a number."""
        self.guesses.append(params.number)
        await asyncio.sleep(0)
        text = "right" if params.number == self.target else "wrong"
        return ToolOutput(blocks=[TextBlock(text=text)], reward=0.0)

    @tool
    async def peek(self) -> ToolOutput:
        """How many guesses so far."""
        return ToolOutput(blocks=[TextBlock(text=str(len(self.guesses)))])

    @tool
    async def slow(self) -> ToolOutput:
        """Takes a while."""
        await asyncio.sleep(0.6)
        return ToolOutput(blocks=[TextBlock(text="slept")])

    @terminal
    @tool
    async def submit(self, params: Answer) -> ToolOutput:
        """Submit the answer; ends the episode."""
        reward = 1.0 if params.answer == str(self.target) else 0.0
        return ToolOutput(blocks=[TextBlock(text=f"submitted {params.answer}")], reward=reward, finished=True)


SERVICE_OPTIONS = {"read_only_tools": ["peek"]}


async def open_session() -> InProcessOrsSession:
    service = InProcessOrsService(GuessEnv, **SERVICE_OPTIONS)
    task: Task = await service.get_task("train:0")
    return await service.open(task, rollout_id="r")


@dataclass
class Served:
    url: str  # http://127.0.0.1:<port>
    gateway: Any
    rollout: Any
    plane: Any


@contextlib.asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Run `app` under uvicorn on 127.0.0.1 (a random port) in this loop; yields the origin."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def make_gateway() -> Any:
    """A gateway over a renderer nothing calls (the plane never samples)."""
    from platoon.gateway import ModelGateway

    class _Renderer:
        tokenizer = None

        def stop_token_ids(self) -> list[int]:
            return [0]

        def render_prompt(self, messages: Any, tools: Any = None) -> list[int]:
            return [1]

    return ModelGateway(object(), _Renderer(), model_name="fake/model")


def plane_factories() -> tuple[Any, Any]:
    """`(mcp_app, mount_mcp)` of the plane under test: the product's, or the SDK's with PLATOON_TEST_MCP_PLANE=sdk."""
    if os.environ.get("PLATOON_TEST_MCP_PLANE") == "sdk":
        path = Path(__file__).parents[3] / "benchmarks" / "mcp_sdk_plane.py"
        spec = importlib.util.spec_from_file_location("_platoon_mcp_sdk_plane", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.sdk_mcp_app, module.mount_sdk_mcp
    from platoon.gateway.mcp import mcp_app, mount_mcp

    return mcp_app, mount_mcp


@contextlib.asynccontextmanager
async def plane_server(keepalive_s: float = 10.0) -> AsyncIterator[Served]:
    mcp_app, _ = plane_factories()
    gateway = make_gateway()
    rollout = gateway.open_rollout("r")
    app = mcp_app(gateway, keepalive_s=keepalive_s)
    async with serve(app) as url:
        yield Served(url, gateway, rollout, app.state.mcp_plane)
