"""`platoon-react`: the model answers with Chat Completions tool calls until it replies without one.

Options `system_prompt` and `sampling`. Every tool the environment offers is offered to the model; the one tool the
environment keeps from the model (the ORS SDK's `@terminal`, `final_answer_tool`) receives the final no-tool answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from platoon.harness.agent import (
    LIMIT_MESSAGE,
    AgentContext,
    AgentResult,
    final_answer_tool,
    out_of_steps,
    terminal_arguments,
)
from platoon.harness.function import harness

OPTIONS = ("system_prompt", "sampling")


def _options(options: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The checked options: function harnesses get theirs unchecked, so an unknown key is refused here."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"platoon-react: unknown harness option(s) {', '.join(map(repr, unknown))}; "
            f"the options are {', '.join(OPTIONS)}"
        )
    system_prompt = options.get("system_prompt")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ValueError(f"platoon-react: system_prompt must be a string, got {type(system_prompt).__name__}")
    sampling = options.get("sampling")
    if sampling is None:
        sampling = {}
    if not isinstance(sampling, Mapping):
        raise ValueError(f"platoon-react: sampling must be a mapping, got {type(sampling).__name__}")
    return system_prompt, dict(sampling)


def _arguments(text: str) -> dict[str, Any]:
    """The tool call's arguments as a JSON object; anything else raises `ValueError` with the reason."""
    value = json.loads(text or "{}")
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


@harness("platoon-react")
async def react(ctx: AgentContext) -> AgentResult:
    """A tool-calling loop: Chat Completions tools until the model answers without one."""
    system_prompt, sampling = _options(ctx.options)
    tools = await ctx.list_tools()
    # The model ends by answering without a tool call; that answer goes to the tool the environment keeps from the
    # model, if it has one. Other terminal tools (an ORS `exclusive` submit) are the model's to call.
    terminal = final_answer_tool(tools)
    offered = [tool.as_openai_tool() for tool in tools if tool is not terminal]
    messages: list[dict[str, Any]] = []
    if system_prompt is not None:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": ctx.instruction})

    steps = 0
    while True:
        if out_of_steps(ctx, steps):
            return AgentResult("limit", error=LIMIT_MESSAGE)
        reply = await ctx.chat(messages, tools=offered or None, **sampling)
        steps += 1
        # Dropping None fields keeps the transcript in the shape renderers expect (no "tool_calls": None).
        messages.append({key: value for key, value in reply.message.items() if value is not None})

        calls = reply.tool_calls
        if not calls:
            if terminal is not None:
                await ctx.call_tool(terminal.name, terminal_arguments(terminal, reply.text))
            return AgentResult("completed", final_message=reply.text)

        for call in calls:
            function = call["function"]
            try:
                arguments = _arguments(function["arguments"])
            except ValueError as exc:  # json.JSONDecodeError is a ValueError
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": f"Invalid arguments: {exc}"}
                )
                continue
            result = await ctx.call_tool(function["name"], arguments)
            text = result.as_text()
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
            if result.finished:
                return AgentResult("completed", final_message=text)
