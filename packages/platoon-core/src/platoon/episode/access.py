"""Tool access levels ordered, and the clamp a subagent's access goes through (below the agent context and the
subagents, which both use it)."""

from __future__ import annotations

from platoon.harness.agent import ToolAccess

__all__ = ["ACCESS_RANK", "clamp_access"]

#: Tool access from the most restrictive to the least.
ACCESS_RANK = {ToolAccess.READ_ONLY: 0, ToolAccess.NO_TERMINAL: 1, ToolAccess.FULL: 2}


def clamp_access(wanted: ToolAccess | str, ceiling: ToolAccess | str) -> ToolAccess:
    """The more restrictive of `wanted` and `ceiling` (read_only < no_terminal < full)."""
    a, b = ToolAccess(wanted), ToolAccess(ceiling)
    return a if ACCESS_RANK[a] <= ACCESS_RANK[b] else b
