"""`platoon-noop`: returns `completed` at once, without a model call or a tool call.

Run beside `platoon-oracle` to check a dataset: a sound task scores 0 when nothing was done.
"""

from __future__ import annotations

from platoon.harness.agent import AgentContext, AgentResult
from platoon.harness.function import harness


@harness("platoon-noop")
async def noop(ctx: AgentContext) -> AgentResult:
    """Do nothing and finish: the environment grades the untouched task (a sound task scores 0)."""
    return AgentResult("completed")
