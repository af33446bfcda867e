"""Fakes for the episode runtime's tests: a real `ModelGateway` over a character renderer and a scripted sampler,
and an in-memory environment session that records forks, closes and tool calls."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from platoon.config.environments import AgentsConfig, HarnessExitPolicy
from platoon.config_defs import RolloutConfig
from platoon.envs.service import ForkMode, Outcome, ToolResult, ToolSpec
from platoon.episode.program import Episode
from platoon.episode.rollout import Route
from platoon.harness.function import FunctionHarness
from platoon.task import Task

EOS = 256


class CharTokenizer:
    def encode(self, text: str) -> list[int]:
        return [min(ord(ch), 255) for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join("" if i == EOS else chr(i) for i in ids)


@dataclass
class Parsed:
    message: dict[str, Any]
    ok: bool
    finish_reason: str
    parsed_tool_calls: int = 0
    emitted_tool_calls: int = 0
    recovered_tool_calls: int = 0
    unparsed_tool_calls: Any = 0


class CharRenderer:
    """`role:content` lines then `assistant:`; a completion line `CALL {"name":..,"arguments":..}` is a tool call."""

    def __init__(self) -> None:
        self.tokenizer = CharTokenizer()

    def render_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
        text = "".join(f"{m['role']}:{m.get('content') or ''}\n" for m in messages) + "assistant:"
        return self.tokenizer.encode(text)

    def stop_token_ids(self) -> list[int]:
        return [EOS]

    def parse_completion(self, tokens: list[int], stop_reason: str) -> Parsed:
        text = self.tokenizer.decode(tokens)
        calls = []
        lines = []
        for line in text.split("\n"):
            if line.startswith("CALL "):
                data = json.loads(line[5:])
                calls.append({"type": "function", "function": data})
            else:
                lines.append(line)
        message = {"role": "assistant", "content": "\n".join(lines), "tool_calls": calls or None}
        finish = "tool_calls" if calls else "stop"
        return Parsed(message, True, finish, len(calls), len(calls))


@dataclass
class Sampler:
    """Answers every prompt with `answer(prompt)` (default "ok"); may sleep or raise."""

    answer: Callable[[str], str] = lambda prompt: "ok"
    delay: float = 0.0
    prompts: list[str] = field(default_factory=list)

    async def sample_async(self, *, prompt: Any, num_samples: int, sampling_params: Any) -> Any:
        from platoon.testing import sample_response

        text = CharTokenizer().decode(prompt.to_ints())
        self.prompts.append(text)
        if self.delay:
            await asyncio.sleep(self.delay)
        out = [*CharTokenizer().encode(self.answer(text)), EOS]
        return sample_response(out, logprob=-0.5)


def make_gateway(sampler: Sampler | None = None, **settings: Any) -> Any:
    from platoon.gateway import ModelGateway

    return ModelGateway(sampler or Sampler(), CharRenderer(), model_name="fake/model", **settings)


TOOLS = [
    ToolSpec("look", "look around", {"type": "object", "properties": {}}, read_only=True),
    ToolSpec("write", "write a file", {"type": "object", "properties": {"text": {"type": "string"}}}),
    ToolSpec(
        "submit", "submit", {"type": "object", "properties": {"answer": {"type": "string"}}}, terminal=True
    ),
]


class FakeSession:
    """An in-memory session: tools per TOOLS, a grade from `grader` (default scored 1.0), forks and closes recorded."""

    def __init__(
        self,
        task: Task,
        *,
        service: FakeService,
        instruction: str | None = None,
        agent_timeout_s: float | None = None,
        parent: FakeSession | None = None,
        mode: str | None = None,
    ) -> None:
        self.task = task
        self.service = service
        self.instruction = instruction
        self.agent_timeout_s = agent_timeout_s
        self.sandbox = None
        self.parent = parent
        self.mode = mode
        self.closed = False
        self.calls: list[tuple[str, dict[str, Any]]] = []
        service.sessions.append(self)

    async def tools(self) -> list[ToolSpec]:
        return list(TOOLS)

    async def call_tool(self, name: str, arguments: Any) -> ToolResult:
        if self.service.dead:
            raise ConnectionError("the sandbox is gone")
        self.calls.append((name, dict(arguments)))
        result = ToolResult.text(f"{name} done")
        if name == "submit":
            result.finished = True
        return result

    async def grade(self) -> Outcome:
        return await self.service.grade(self)

    async def fork(self, mode: ForkMode | str = ForkMode.SHARED, *, task: Task | None = None) -> FakeSession:
        if self.service.fork_error is not None:
            raise self.service.fork_error
        return FakeSession(
            task or self.task, service=self.service, parent=self, mode=None if mode is None else str(mode)
        )

    async def close(self) -> None:
        self.closed = True


class FakeService:
    name = "fake"

    def __init__(self, **session_kwargs: Any) -> None:
        self.sessions: list[FakeSession] = []
        self.session_kwargs = session_kwargs
        self.fork_error: BaseException | None = None
        self.dead = False
        self.grader: Callable[[FakeSession], Any] = lambda session: Outcome("scored", rewards={"reward": 1.0})
        self.open_error: BaseException | None = None

    async def list_tasks(self, split: str) -> list[str]:
        return ["t1"]

    async def get_task(self, task_id: str) -> Task:
        return Task(goal="solve it", id=task_id)

    async def open(self, task: Task, *, rollout_id: str) -> FakeSession:
        if self.open_error is not None:
            raise self.open_error
        return FakeSession(task, service=self, **self.session_kwargs)

    async def grade(self, session: FakeSession) -> Outcome:
        if self.dead:
            raise ConnectionError("the sandbox is gone")
        value = self.grader(session)
        if asyncio.iscoroutine(value):
            value = await value
        return value


def route(harness: Any = None, **kwargs: Any) -> Route:
    agents = kwargs.pop("agents", None)
    exit_policy = kwargs.pop("on_harness_exit", None)
    return Route(
        harness=harness,
        agents=AgentsConfig(**(agents or {})),
        on_harness_exit=HarnessExitPolicy(**(exit_policy or {})),
        **kwargs,
    )


@pytest.fixture
def service() -> FakeService:
    return FakeService()


_COUNTER = itertools.count()


def fh(fn: Callable[..., Any], *, executes_model_code: bool = False) -> FunctionHarness:
    """A function harness record for a test function, under a unique name."""
    name = f"test-{fn.__name__.replace('_', '-').strip('-')}-{next(_COUNTER)}"
    return FunctionHarness(name, "1", "inline", executes_model_code, fn)


async def open_episode(
    service: FakeService,
    harness: Any = None,
    *,
    config: RolloutConfig | None = None,
    task: Task | None = None,
    gateway: Any = None,
    **route_kwargs: Any,
) -> Episode:
    """An episode on a fresh session of `service`, as harness_rollout builds it."""
    gateway = gateway or make_gateway()
    config = config or RolloutConfig()
    rollout = gateway.open_rollout(judges=config.judges)
    task = task or Task(goal="solve it", id="t1")
    session = await service.open(task, rollout_id=rollout.rollout_id)
    return Episode(
        task=task,
        session=session,
        config=config,
        route=route(harness, **route_kwargs),
        gateway=gateway,
        rollout=rollout,
    )


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(autouse=True)
def _forget_test_harnesses() -> Any:
    """Test harnesses register themselves when run; drop them after each test so no listing elsewhere shows them."""
    from platoon.harness.function import REGISTRY

    yield
    with REGISTRY._lock:
        for ref in [ref for ref in REGISTRY._records if ref.startswith("test-")]:
            del REGISTRY._records[ref]
