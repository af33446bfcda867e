"""`platoon-bandit-answer`: one model call, whose reply text is submitted as the answer (`platoon-bandit@1`).

The reply is kept to `max_tokens` tokens (option, default 1): the bandit's answer is one token, so a policy learns
it from the reward alone.
"""

from __future__ import annotations

from typing import Any

from platoon.harness.agent import AgentResult
from platoon.harness.function import harness

__all__ = ["NAME", "answer"]

NAME = "platoon-bandit-answer"


@harness(NAME)
async def answer(ctx: Any) -> AgentResult:
    """Ask the model the task's question once (option `max_tokens`, default 1) and submit its reply."""
    max_tokens = int(ctx.options.get("max_tokens", 1))
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=max_tokens)
    text = reply.text or ""
    await ctx.call_tool("answer", {"letter": text})
    return AgentResult(final_message=text)
