"""The concrete `AgentContext` a function harness receives, and the per-episode state it shares.

Model calls go through the rollout's gateway (recorded on the agent); tool calls go to the agent's session,
filtered by its access; budgets come from the episode's `BudgetTracker`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from platoon.envs.service import ToolResult

# The access clamp moved below the subagents, which use it too; it stays importable from here.
from platoon.episode.access import ACCESS_RANK, clamp_access
from platoon.episode.budget import AgentBudget, BudgetTracker
from platoon.episode.subagents import Subagents
from platoon.gateway.http.server import serving
from platoon.gateway.mcp import bind_tools
from platoon.gateway.tools import run_tool, visible_tools
from platoon.harness.agent import (
    AgentAPI,
    CallKind,
    ChatReply,
    McpEndpoint,
    ModelEndpoint,
    ToolAccess,
)

if TYPE_CHECKING:
    from platoon.envs.service import EnvSession, ToolSpec
    from platoon.gateway.records import AgentRecord
    from platoon.harness.function import FunctionHarness
    from platoon.task import Task

__all__ = [
    "ACCESS_RANK",
    "Agent",
    "EndpointUnavailable",
    "EpisodeState",
    "clamp_access",
    "run_tool",
    "visible_tools",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class EndpointUnavailable(RuntimeError):
    """`ctx.endpoint` on a rollout that serves no HTTP."""


@dataclass(eq=False)
class EpisodeState:
    """What every agent of one episode shares: the gateway and its rollout recorder, the budget tracker, the
    entry's route (agents settings, exit policies) and the rollout config."""

    gateway: Any
    rollout: Any  # the gateway's RolloutRecorder
    tracker: BudgetTracker
    route: Any  # platoon.episode.rollout.Route
    config: Any  # RolloutConfig (or None in unit tests)
    #: every Agent context by agent id, so children and programs can find their parents' state
    agents: dict[str, Agent] = field(default_factory=dict)

    @property
    def judges(self) -> bool:
        return bool(getattr(self.rollout, "judges", True))

    @property
    def agents_config(self) -> Any:
        return self.route.agents

    def release(self) -> None:
        """Once the episode has ended: drop the registries whose entries point back here (each `Agent` holds this
        state). Otherwise the episode's gateway, recorder and records, a few hundred objects, stay alive in that
        cycle until a full garbage collection, which in a loop of episodes walks them all."""
        self.agents.clear()
        self.tracker.forget_nodes()


class Agent:
    """One running agent: implements `AgentContext` over its gateway record, session and budget node."""

    def __init__(
        self,
        episode: EpisodeState,
        record: AgentRecord,
        *,
        session: EnvSession,
        task: Task,
        harness: FunctionHarness | None,
        goal: str | None = None,
        options: Mapping[str, Any] | None = None,
        budget: AgentBudget,
        parent: Agent | None = None,
        tool_transform: Any = None,
    ) -> None:
        self.episode = episode
        self.record = record
        self._session = session
        self._task = task
        self.harness = harness
        self._goal = goal
        self._options: Mapping[str, Any] = (
            options if isinstance(options, MappingProxyType) else MappingProxyType(dict(options or {}))
        )
        self._budget = budget
        self.parent = parent
        self.tool_transform = tool_transform
        self._access = ToolAccess(record.access)
        # Run state: the children's life-cycle tasks, whether they survive a cancelled spawn, and whether this
        # agent finished (after which spawns are refused).
        self.children: set[asyncio.Task[Any]] = set()
        self.keep: bool = False
        self.finished: bool = False
        self._visible_tools: frozenset[str] | None = None
        self._api: AgentAPI | None = None
        episode.agents[record.agent_id] = self
        # The one registration of an agent's tools for the MCP plane; a child's context rebinds to its session.
        bind_tools(record, session, transform=tool_transform)

    # ---- identity

    @property
    def agent_id(self) -> str:
        return self.record.agent_id

    @property
    def trajectory_id(self) -> str:
        return self.record.trajectory_id

    @property
    def parent_agent_id(self) -> str | None:
        parent = self.record.parent
        return None if parent is None else parent.agent_id

    @property
    def depth(self) -> int:
        return self.record.depth

    @property
    def role(self) -> str:
        return self.record.role

    @property
    def task(self) -> Task:
        return self._task

    @property
    def session(self) -> EnvSession:
        return self._session

    @property
    def instruction(self) -> str:
        """The explicit goal, else the session's instruction, else the task goal, else `""`."""
        if self._goal:
            return self._goal
        instruction = getattr(self._session, "instruction", None)
        if instruction:
            return str(instruction)
        return self._task.goal or ""

    @property
    def max_steps(self) -> int | None:
        return self.record.max_steps

    @property
    def access(self) -> ToolAccess:
        return self._access

    @property
    def options(self) -> Mapping[str, Any]:
        return self._options

    @property
    def endpoint(self) -> ModelEndpoint:
        """`<gateway>/s/<secret>/v1` with the agent's secret as key, while a `GatewayServer` serves the gateway."""
        server = serving(self.episode.gateway)
        if server is None:
            raise EndpointUnavailable(
                "this rollout serves no HTTP: ctx.endpoint needs the gateway served by a GatewayServer "
                "(run_episode serves one); call the model with `await ctx.chat(...)`"
            )
        return server.endpoint(self.record)

    @property
    def mcp(self) -> McpEndpoint | None:
        """The MCP tool plane next to the agent's model endpoint (`<gateway>/s/<secret>/mcp`); None without HTTP."""
        try:
            endpoint = self.endpoint
        except EndpointUnavailable:
            return None
        base = endpoint.base_url.rstrip("/").removesuffix("/v1")
        # Bearer auth by default: the key then stays out of process listings.
        return McpEndpoint(url=f"{base}/mcp", headers={"Authorization": f"Bearer {self.record.secret}"})

    @property
    def budget(self) -> AgentBudget:
        return self._budget

    @property
    def agents(self) -> AgentAPI:
        if self._api is None:
            self._api = Subagents(self)
        return self._api

    def new_child(
        self,
        record: AgentRecord,
        *,
        session: EnvSession,
        task: Task,
        harness: FunctionHarness,
        goal: str,
        options: Mapping[str, Any],
        budget: AgentBudget,
    ) -> Agent:
        """A child of this agent in its episode, of this agent's class (what `ctx.agents.spawn` runs)."""
        return type(self)(
            self.episode,
            record,
            session=session,
            task=task,
            harness=harness,
            goal=goal,
            options=options,
            budget=budget,
            parent=self,
        )

    # ---- model calls

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        kind: CallKind | str = CallKind.POLICY,
        **sampling: Any,
    ) -> ChatReply:
        """One model call through the gateway's render -> sample -> parse -> record path, recorded here."""
        reply: ChatReply = await self.episode.gateway.chat(
            self.record,
            messages if isinstance(messages, list) else list(messages),
            tools=None if tools is None else list(tools),
            kind=str(kind),
            **sampling,
        )
        return reply

    # ---- tools

    async def list_tools(self) -> list[ToolSpec]:
        """The session's tools this agent may see (after the episode's tool transform for the root)."""
        visible = await visible_tools(self._session, self._access, self.tool_transform)
        self._visible_tools = frozenset(tool.name for tool in visible)
        return visible

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run a tool on the session; a tool hidden by access is refused unsent and unrecorded."""
        if self._access is not ToolAccess.FULL:
            if self._visible_tools is None:
                await self.list_tools()
            if name not in (self._visible_tools or ()):
                return ToolResult.text(
                    f"Tool {name!r} is not available to this agent (tool access: {self._access.value}).",
                    is_error=True,
                )
        return await run_tool(self.record, self._session, name, arguments)

    # ---- annotations

    def annotate(self, **misc: Any) -> None:
        """Merge into this agent's trajectory misc."""
        self.record.misc.update(misc)

    def annotate_step(self, **misc: Any) -> None:
        """Merge into the step misc of the last recorded call (`reward_misc` merges by key)."""
        call = self.record.last_call()
        if call is None:
            raise RuntimeError("annotate_step needs a recorded model call: this agent has made none yet")
        reward_misc = misc.pop("reward_misc", None)
        call.step_misc.update(misc)
        if isinstance(reward_misc, Mapping):
            call.step_misc.setdefault("reward_misc", {}).update(reward_misc)
        elif reward_misc is not None:
            call.step_misc["reward_misc"] = reward_misc

    def __repr__(self) -> str:
        return f"Agent(agent_id={self.agent_id!r}, role={self.role!r}, depth={self.depth})"
