"""A user's own ORS environment class and function harness, written to a temporary module, run through run_episode."""

from __future__ import annotations

import sys
import textwrap

import pytest

from platoon.testing import tool_call
from platoon.testing.episode import run_episode

USER_MODULE = '''
"""A guess-the-number environment and a harness for it, as a user would write them."""

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

import platoon as pt


class Guess(BaseModel):
    value: int


class GuessEnv(Environment):
    def __init__(self, task_spec={}, secrets={}):
        super().__init__(task_spec, secrets)
        self.secret = int(task_spec["secret"])

    @classmethod
    def list_splits(cls):
        return ["train"]

    @classmethod
    def list_tasks(cls, split):
        return [{"id": f"g{n}", "secret": n} for n in (3, 7)]

    def get_prompt(self):
        return [TextBlock(text="Guess my number between 0 and 9.")]

    @tool
    async def guess(self, params: Guess) -> ToolOutput:
        """Guess the number."""
        if params.value == self.secret:
            return ToolOutput(blocks=[TextBlock(text="right")], reward=1.0, finished=True)
        hint = "higher" if params.value < self.secret else "lower"
        return ToolOutput(blocks=[TextBlock(text=hint)], reward=0.0)


@pt.harness("usertest-guesser")
async def guesser(ctx):
    """Ask the model for a guess until the environment says it is right."""
    tools = [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}}
        for t in await ctx.list_tools()
    ]
    messages = [{"role": "user", "content": ctx.instruction}]
    while True:
        if pt.harness.agent.out_of_steps(ctx, len(messages) // 2):
            return pt.AgentResult("limit")
        reply = await ctx.chat(messages, tools=tools)
        messages.append({"role": "assistant", "content": reply.text, "tool_calls": list(reply.tool_calls)})
        for call in reply.tool_calls:
            import json

            result = await ctx.call_tool(call["function"]["name"], json.loads(call["function"]["arguments"]))
            ctx.annotate_step(seen=result.as_text())
            if result.finished:
                return pt.AgentResult(final_message=result.as_text())
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result.as_text()})
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "usertest_guess.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "usertest_guess"
    sys.modules.pop("usertest_guess", None)
    from platoon.harness.function import REGISTRY

    REGISTRY._records.pop("usertest-guesser@1", None)


def test_a_user_environment_and_harness_run_through_run_episode(user_module):
    replies = iter([5, 2, 3])
    run = run_episode(
        "train:0",
        service=f"python://{user_module}:GuessEnv",
        harness=f"{user_module}:guesser",
        policy=lambda prompt: "\n" + tool_call("guess", {"value": next(replies)}),
        max_steps=5,
    )
    assert run.outcome["status"] == "scored" and run.reward == 1.0
    assert run.root.finish_message == "right"
    assert [step.misc["seen"] for step in run.root.steps] == ["lower", "higher", "right"]
    assert (
        run.root.task.goal == "Guess my number between 0 and 9."
    )  # ORS tasks get their goal from the session
    assert run.root.misc["harness"]["spec"] == "usertest-guesser@1"
    assert "Guess my number between 0 and 9." in run.policy.prompts[0]


def test_a_user_harness_that_runs_out_of_steps_is_graded_not_crashed(user_module):
    run = run_episode(
        "train:1",
        service=f"python://{user_module}:GuessEnv",
        harness=f"{user_module}:guesser",
        policy=lambda prompt: "\n" + tool_call("guess", {"value": 0}),
        max_steps=2,
    )
    assert run.root.misc["agent_result"]["status"] == "limit"
    assert run.outcome["status"] == "scored" and run.outcome["reason"] == "no_submit" and run.reward == 0.0
