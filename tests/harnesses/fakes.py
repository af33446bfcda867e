"""A fake `AgentContext` for the function-harness tests: scripted replies, in-memory tools, a spawn fake.

Loaded by path from the test modules (`load_fakes()` there), so it needs no package and no runtime.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from platoon.envs.service import ToolResult, ToolSpec
from platoon.harness.agent import FINAL_ANSWER_META_KEY, AgentResult, ChatReply, SubagentResult, ToolAccess
from platoon.task import Task

Reply = str | Mapping[str, Any] | Callable[[Sequence[Mapping[str, Any]]], Any]


def tool_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    """An OpenAI tool call; `arguments` is sent as given when it is a string, else as JSON."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": call_id or f"call-{name}",
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


class FakeBudget:
    def __init__(self, ctx: FakeContext) -> None:
        self.ctx = ctx

    def remaining(self) -> float:
        if self.ctx.budget_left is not None:
            return self.ctx.budget_left - len(self.ctx.chats)
        return math.inf

    def used(self) -> int:
        return len(self.ctx.chats)


@dataclass
class Spawn:
    goal: str
    kwargs: dict[str, Any]


class FakeAgents:
    def __init__(self, ctx: FakeContext) -> None:
        self.ctx = ctx
        self.spawns: list[Spawn] = []
        self.kept = False
        self.delay = 0.0
        self.message: Callable[[str], str] = lambda goal: f"child finished: {goal}"

    async def spawn(self, goal: str, **kwargs: Any) -> SubagentResult:
        self.spawns.append(Spawn(goal, kwargs))
        if self.delay:
            await asyncio.sleep(self.delay)
        message = self.message(goal)
        return SubagentResult(
            "child-1", "traj-1", goal, AgentResult("completed", final_message=message), None, message
        )

    def keep_children(self) -> None:
        self.kept = True


@dataclass
class FakeTool:
    spec: ToolSpec
    fn: Callable[[Mapping[str, Any]], ToolResult | str]


@dataclass
class FakeContext:
    """Scripted `chat` replies (text, a message mapping, or a function of the messages) and in-memory tools."""

    replies: list[Reply] = field(default_factory=list)
    tools: list[FakeTool] = field(default_factory=list)
    options: Mapping[str, Any] = field(default_factory=dict)
    instruction: str = "Guess the number."
    max_steps: int | None = None
    budget_left: float | None = None
    session: Any = None
    depth: int = 0
    agent_id: str = "agent-0"
    trajectory_id: str = "traj-0"
    parent_agent_id: str | None = None
    role: str = "policy"
    access: ToolAccess = ToolAccess.FULL
    chats: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    misc: dict[str, Any] = field(default_factory=dict)
    step_misc: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.options = MappingProxyType(dict(self.options))
        self.budget = FakeBudget(self)
        self.agents = FakeAgents(self)
        self.task = Task(goal=self.instruction, id="task-0", max_steps=self.max_steps)

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Any = None,
        kind: str = "policy",
        **sampling: Any,
    ) -> ChatReply:
        snapshot = json.loads(json.dumps(list(messages)))
        self.chats.append({"messages": snapshot, "tools": tools, "kind": kind, "sampling": sampling})
        self.step_misc.append({})
        if not self.replies:
            raise AssertionError(f"no scripted reply left for call {len(self.chats)}")
        reply = self.replies.pop(0)
        if callable(reply):
            reply = reply(snapshot)
        message = {"role": "assistant", "content": reply} if isinstance(reply, str) else dict(reply)
        return ChatReply(f"call-{len(self.chats)}", message, "stop")

    async def list_tools(self) -> list[ToolSpec]:
        return [tool.spec for tool in self.tools]

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        self.tool_calls.append((name, dict(arguments)))
        for tool in self.tools:
            if tool.spec.name == name:
                result = tool.fn(arguments)
                return ToolResult.text(result) if isinstance(result, str) else result
        return ToolResult.text(f"Unknown tool {name!r}", is_error=True)

    def annotate(self, **misc: Any) -> None:
        self.misc.update(misc)

    def annotate_step(self, **misc: Any) -> None:
        if not self.step_misc:
            raise RuntimeError("no call recorded yet")
        self.step_misc[-1].update(misc)


def number_tools(target: int = 7, *, submit_hidden: bool = True) -> list[FakeTool]:
    """A `guess(number)` tool that finishes on the target, and a terminal `submit(answer)`: kept from the model as
    the ORS SDK's `@terminal` tool is (its final-answer meta), or, with `submit_hidden=False`, offered to it as an
    ORS `exclusive` submit is."""

    def guess(arguments: Mapping[str, Any]) -> ToolResult:
        number = arguments["number"]
        if number == target:
            return ToolResult(
                [{"type": "text", "text": f"You guessed the number {number} correctly!"}], finished=True
            )
        return ToolResult.text("Too low, try again." if number < target else "Too high, try again.")

    def submit(arguments: Mapping[str, Any]) -> ToolResult:
        return ToolResult([{"type": "text", "text": f"submitted {arguments}"}], finished=True)

    return [
        FakeTool(
            ToolSpec(
                "guess",
                "Guess the number.",
                {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]},
            ),
            guess,
        ),
        FakeTool(
            ToolSpec(
                "submit",
                "Submit the final answer.",
                {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
                terminal=True,
                meta={FINAL_ANSWER_META_KEY: {"arg": "answer"}} if submit_hidden else None,
            ),
            submit,
        ),
    ]
