"""An agent's tool path, shared by `ctx.call_tool` in process and the MCP plane, so both filter and record alike:
`visible_tools` (the session's tools after the listing transform, filtered by the agent's access) and `run_tool`
(one call, recorded in the agent's misc `tool_calls`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from platoon import rollout_progress
from platoon.harness.agent import ToolAccess

if TYPE_CHECKING:
    from platoon.envs.service import EnvSession, ToolResult, ToolSpec
    from platoon.gateway.records import AgentRecord

__all__ = ["run_tool", "visible_tools"]


def _visible(tool: ToolSpec, access: ToolAccess) -> bool:
    if access is ToolAccess.FULL:
        return True
    if access is ToolAccess.NO_TERMINAL:
        return not tool.terminal
    return bool(tool.read_only)


async def visible_tools(
    session: EnvSession, access: ToolAccess | str, transform: Any = None
) -> list[ToolSpec]:
    """The session's tools after the listing transform, filtered by `access` (shared with the MCP plane)."""
    tools = await session.tools()
    if transform is not None:
        transformed = transform(tools)
        tools = await transformed if inspect.isawaitable(transformed) else transformed
    level = ToolAccess(access)
    return [tool for tool in tools if _visible(tool, level)]


async def run_tool(
    record: AgentRecord, session: EnvSession, name: str, arguments: Mapping[str, Any]
) -> ToolResult:
    """Run a tool on `session` for the agent of `record` and record the call in its misc `tool_calls`.

    The one path for tool calls, in process (`ctx.call_tool`) and over the MCP plane, so both record alike.
    """
    if getattr(session, "manages_concurrency", False):
        # Sessions with their own gate queue each agent's calls fairly: name the calling agent.
        result = await session.call_tool(name, arguments, on_behalf_of=record.agent_id)  # type: ignore[call-arg]
    else:
        result = await session.call_tool(name, arguments)
    rollout_progress.note()
    entry: dict[str, Any] = {
        "name": name,
        "arguments": dict(arguments),
        "is_error": result.is_error,
        "finished": result.finished,
        "step": len(record.calls),  # the number of model calls made before this tool call
    }
    if result.reward is not None:
        entry["reward"] = result.reward
    record.misc.setdefault("tool_calls", []).append(entry)
    return result
