"""platoon-react with a fake AgentContext: the tool loop, the hidden terminal tool, bad arguments, limits."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from platoon.harness.agent import LIMIT_MESSAGE, AgentResult
from platoon_harnesses.react import react


def _load_fakes() -> Any:
    name = "platoon_harness_test_fakes"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("fakes.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


fakes = _load_fakes()


def calls(*tool_calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": list(tool_calls),
        "reasoning_content": None,
    }


def run(ctx: Any) -> AgentResult:
    return asyncio.run(react(ctx))


def test_tool_loop_then_final_answer_goes_to_the_hidden_terminal_tool() -> None:
    ctx = fakes.FakeContext(
        replies=[calls(fakes.tool_call("guess", {"number": 3}, "c1")), "It is above 3."],
        tools=fakes.number_tools(7),
        options={"system_prompt": "Be brief.", "sampling": {"temperature": 0.5}},
    )
    result = run(ctx)
    assert result == AgentResult("completed", final_message="It is above 3.")
    assert ctx.tool_calls == [("guess", {"number": 3}), ("submit", {"answer": "It is above 3."})]
    first = ctx.chats[0]
    assert [tool["function"]["name"] for tool in first["tools"]] == ["guess"]  # submit is hidden
    assert first["sampling"] == {"temperature": 0.5}
    assert first["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Guess the number."},
    ]
    second = ctx.chats[1]["messages"]
    # None-valued fields are dropped from the assistant message; the tool answer carries its call id.
    assert second[2] == {"role": "assistant", "tool_calls": [fakes.tool_call("guess", {"number": 3}, "c1")]}
    assert second[3] == {"role": "tool", "tool_call_id": "c1", "content": "Too low, try again."}


def test_a_terminal_tool_the_environment_offers_stays_offered_and_gets_no_final_answer() -> None:
    # An ORS `@tool(exclusive=True)` submit is terminal (it may end the episode) but the environment offers it:
    # the model sees it and calls it; a plain reply just completes.
    ctx = fakes.FakeContext(
        replies=[calls(fakes.tool_call("guess", {"number": 3}, "c1")), "It is above 3."],
        tools=fakes.number_tools(7, submit_hidden=False),
    )
    assert run(ctx) == AgentResult("completed", final_message="It is above 3.")
    assert [tool["function"]["name"] for tool in ctx.chats[0]["tools"]] == ["guess", "submit"]
    assert ctx.tool_calls == [("guess", {"number": 3})]


def test_without_terminal_tool_the_answer_just_completes() -> None:
    tools = [tool for tool in fakes.number_tools() if not tool.spec.terminal]
    ctx = fakes.FakeContext(replies=["done"], tools=tools)
    assert run(ctx) == AgentResult("completed", final_message="done")
    assert ctx.tool_calls == []
    assert ctx.chats[0]["messages"] == [{"role": "user", "content": "Guess the number."}]


def test_no_tools_are_offered_as_none() -> None:
    ctx = fakes.FakeContext(replies=["hi"], tools=[])
    run(ctx)
    assert ctx.chats[0]["tools"] is None


def test_invalid_arguments_are_answered_without_calling() -> None:
    ctx = fakes.FakeContext(
        replies=[
            calls(fakes.tool_call("guess", "{not json", "c1"), fakes.tool_call("guess", "[1]", "c2")),
            "gave up",
        ],
        tools=fakes.number_tools(7),
    )
    run(ctx)
    assert ctx.tool_calls == [("submit", {"answer": "gave up"})]
    tool_messages = [m for m in ctx.chats[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["c1", "c2"]
    assert all(m["content"].startswith("Invalid arguments: ") for m in tool_messages)
    assert tool_messages[1]["content"] == "Invalid arguments: expected a JSON object, got list"


def test_the_first_finished_result_stops_the_agent() -> None:
    ctx = fakes.FakeContext(
        replies=[
            calls(
                fakes.tool_call("guess", {"number": 7}, "c1"),
                fakes.tool_call("guess", {"number": 8}, "c2"),
            )
        ],
        tools=fakes.number_tools(7),
    )
    assert run(ctx) == AgentResult("completed", final_message="You guessed the number 7 correctly!")
    assert ctx.tool_calls == [("guess", {"number": 7})]  # the second call is never made


def test_out_of_steps_is_limit() -> None:
    looping = [calls(fakes.tool_call("guess", {"number": 1}, f"c{i}")) for i in range(5)]
    ctx = fakes.FakeContext(replies=looping, tools=fakes.number_tools(7), max_steps=2)
    assert run(ctx) == AgentResult("limit", error=LIMIT_MESSAGE)
    assert len(ctx.chats) == 2
    ctx = fakes.FakeContext(replies=looping, tools=fakes.number_tools(7), budget_left=0)
    assert run(ctx) == AgentResult("limit", error=LIMIT_MESSAGE)
    assert ctx.chats == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": 0}, "unknown harness option"),
        ({"sampling": [1]}, "sampling must be a mapping"),
        ({"system_prompt": 3}, "system_prompt must be a string"),
    ],
)
def test_bad_options_raise(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run(fakes.FakeContext(replies=["x"], options=options))


def test_end_to_end_on_number_search() -> None:
    from platoon.envs.number_search import REACT_SYSTEM_PROMPT, SERVICE
    from platoon.testing import tool_call
    from platoon.testing.episode import run_episode

    run = run_episode(
        "train:0",  # the target is 228
        service=SERVICE,
        harness="platoon-react",
        policy=[tool_call("guess", {"number": 100}), tool_call("guess", {"number": 228})],
        harness_options={"system_prompt": REACT_SYSTEM_PROMPT},
    )
    assert run.outcome is not None and run.outcome["status"] == "scored" and run.reward == 1.0
    assert run.root.finish_message == "You guessed the number 228 correctly!"
    assert len(run.root.steps) == 2
    assert "Too low, try again." in run.policy.prompts[1]
