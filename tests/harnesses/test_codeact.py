"""platoon-codeact with a fake AgentContext: options, the step loop, finishing, subagents, prompt modes."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from platoon.harness.agent import LIMIT_MESSAGE, AgentResult
from platoon.harness.codeact import CodeActPromptBuilder
from platoon_harnesses.codeact.harness import CodeActOptionError, CodeActOptions, codeact


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


def cell(code: str, thought: str = "Next.") -> str:
    # Sampling stops at </python>, so replies arrive without it.
    return f"<thought>{thought}</thought>\n<python>{code}\n"


def run(ctx: Any) -> AgentResult:
    return asyncio.run(codeact(ctx))


def make(replies: list[Any], **kwargs: Any) -> Any:
    kwargs.setdefault("tools", fakes.number_tools(7))
    return fakes.FakeContext(replies=list(replies), **kwargs)


# ---------------------------------------------------------------------------------------------------- options


def test_defaults() -> None:
    options = CodeActOptions.parse({})
    assert options.prompt_builder is CodeActPromptBuilder
    assert options.prompt_mode == "sequence_extension" and options.include_reasoning
    assert options.cell_timeout_s == 300 and options.max_output_chars is None
    assert options.subagents and options.subagent_budget == "argument"
    assert options.checks.unawaited_async_calls and not options.checks.while_loops
    assert not options.checks.interactive_input
    assert (options.stuck_in_loop_threshold, options.stuck_in_loop_window) == (4, 3)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": 1}, "unknown platoon-codeact option(s) temperature"),
        ({"checks": {"loops": True}}, "unknown platoon-codeact option(s) checks.loops"),
        ({"prompt_mode": "chat"}, "prompt_mode must be one of sequence_extension, no_sequence_extension"),
        ({"include_reasoning": "yes"}, "include_reasoning must be true or false"),
        ({"cell_timeout_s": 0}, "cell_timeout_s must be a positive number or null"),
        ({"max_output_chars": True}, "max_output_chars must be a positive int or null"),
        ({"subagent_budget": "auto"}, "subagent_budget must be one of argument, fixed"),
        ({"checks": {"stuck_in_loop_threshold": 0}}, "checks.stuck_in_loop_threshold must be an int >= 1"),
        ({"checks": {"stuck_in_loop_window": -1}}, "checks.stuck_in_loop_window must be an int >= 0"),
        ({"sampling": {"stop": ["x"]}}, "sampling may not set 'stop'"),
        ({"prompt_builder": "platoon.harness.agent:AgentResult"}, "is not a CodeActPromptBuilder subclass"),
    ],
)
def test_bad_options_raise(options: dict[str, Any], message: str) -> None:
    with pytest.raises(CodeActOptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CodeActOptions.parse(options)


def test_unknown_option_fails_the_run() -> None:
    with pytest.raises(ValueError, match="unknown platoon-codeact option"):
        run(make([], options={"nope": 1}))


# ------------------------------------------------------------------------------------------------------- loop


def test_cell_calls_tool_and_a_finished_result_ends_the_agent() -> None:
    ctx = make([cell("print(guess(3))"), cell("guess(7)")])
    result = run(ctx)
    assert result == AgentResult("completed", final_message="You guessed the number 7 correctly!")
    assert ctx.tool_calls == [("guess", {"number": 3}), ("guess", {"number": 7})]
    assert ctx.step_misc[0] == {
        "thought": "Next.",
        "code": "print(guess(3))",
        "output": "Too low, try again.\n",
        "error": None,
    }
    second_prompt = ctx.chats[1]["messages"]
    # The reply goes back as the model wrote it (not re-rendered), so the next prompt extends its sampled tokens.
    assert second_prompt[-2] == {
        "role": "assistant",
        "content": "<thought>Next.</thought>\n<python>print(guess(3))\n",
    }
    assert second_prompt[-1]["content"].startswith("[Cell 1 Output]\nToo low, try again.")
    assert ctx.chats[0]["sampling"] == {"stop": ["</python>"]}
    assert ctx.agents.kept  # keep_children() on exit


def test_finish_ends_with_its_message_after_the_terminal_tool() -> None:
    ctx = make([cell("finish('it is 7')")])
    assert run(ctx) == AgentResult("completed", final_message="it is 7")
    assert ctx.tool_calls == [("submit", {"answer": "it is 7"})]


def test_finish_leaves_a_terminal_tool_the_environment_offers_to_the_model() -> None:
    # an ORS `exclusive` submit is a cell function the model calls itself; finish does not call it for the model
    ctx = make([cell("submit('7'); finish('done')")], tools=fakes.number_tools(7, submit_hidden=False))
    assert run(ctx) == AgentResult("completed", final_message="done")
    assert ctx.tool_calls == [("submit", {"answer": "7"})]


def test_signature_binding_errors_come_from_python() -> None:
    ctx = make([cell("guess()"), cell("guess(7)")])
    run(ctx)
    error = ctx.step_misc[0]["error"]
    assert "TypeError: guess() missing 1 required positional argument: 'number'" in error
    assert "Error: Traceback" in ctx.chats[1]["messages"][-1]["content"]


def test_syntax_error_and_empty_cell_texts() -> None:
    ctx = make([cell("x = ("), "no tags here", cell("guess(7)")])
    run(ctx)
    assert ctx.step_misc[0]["error"] == (
        "Execution failed. Traceback:\nSyntax error in line:\nx = (\nMessage: '(' was never closed"
    )
    assert ctx.step_misc[1]["code"] == "" and ctx.step_misc[1]["error"] == "No code available to execute."


def test_out_of_steps_is_limit() -> None:
    ctx = make([cell("print(1)"), cell("print(2)")], max_steps=2)
    assert run(ctx) == AgentResult("limit", error=LIMIT_MESSAGE)
    assert len(ctx.chats) == 2


def test_budget_in_the_task_text_and_action_space() -> None:
    ctx = make([cell("guess(7)")], max_steps=5, instruction="Find it.")
    run(ctx)
    first = ctx.chats[0]["messages"]
    assert first[0]["role"] == "system" and "<thought>" in first[0]["content"]
    user = first[1]["content"]
    assert user.startswith(
        "Your Goal: Find it.\nBudget: You have a total budget of 5 steps to complete this task."
    )
    assert "1. guess(number: int)\n    Guess the number." in user
    assert "async launch_subagent(targets, num_steps: int, context: str = '') -> str" in user
    assert "finish(message: str = '')\n    Submit the final answer." in user


def test_loop_detection_ends_without_a_model_call() -> None:
    ctx = make([cell("guess(1)")] * 4, options={"checks": {"stuck_in_loop_threshold": 3}})
    result = run(ctx)
    assert result == AgentResult("completed", final_message="Stuck in a loop, terminating early.")
    assert len(ctx.chats) == 3 and len(ctx.step_misc) == 3
    assert ctx.tool_calls[-1] == ("submit", {"answer": "Stuck in a loop, terminating early."})


def test_loop_detection_ends_even_when_finish_was_redefined() -> None:
    replies = [cell("def finish(message=''):\n    print('mine')")] + [cell("guess(1)")] * 4
    ctx = make(replies)
    assert run(ctx).final_message == "Stuck in a loop, terminating early."
    assert ("submit", {"answer": "Stuck in a loop, terminating early."}) not in ctx.tool_calls


def test_a_timed_out_cell_ends_the_agent_with_timeout() -> None:
    ctx = make([cell("import time\ntime.sleep(2)")], options={"cell_timeout_s": 0.2})
    result = run(ctx)
    assert result.status == "timeout" and result.error == "Cell timed out after 0.2 s."
    assert ctx.step_misc[0]["error"] == "Cell timed out after 0.2 s."


def test_output_is_cut_at_max_output_chars() -> None:
    ctx = make([cell("print('x' * 50)"), cell("guess(7)")], options={"max_output_chars": 10})
    run(ctx)
    assert ctx.step_misc[0]["output"] == "xxxxxxxxxx\n... (truncated: 41 more characters)"


def test_unawaited_async_call_is_refused_and_asyncio_is_restricted() -> None:
    ctx = make([cell("launch_subagent('a', 2)"), cell("import asyncio\nasyncio.run(None)"), cell("guess(7)")])
    run(ctx)
    assert ctx.step_misc[0]["error"].startswith(
        "Execution failed: launch_subagent() is an async function and was called without await"
    )
    assert "RuntimeError: asyncio.run is disabled in sandbox" in ctx.step_misc[1]["error"]
    assert ctx.agents.spawns == []


def test_while_loops_and_input_when_enabled() -> None:
    ctx = make(
        [cell("while False:\n    pass"), cell("input()"), cell("guess(7)")],
        options={"checks": {"while_loops": True, "interactive_input": True}},
    )
    run(ctx)
    assert ctx.step_misc[0]["error"].startswith("Execution failed: while loops are not allowed")
    assert ctx.step_misc[1]["error"].startswith("Execution failed: input() is not available")


# -------------------------------------------------------------------------------------------------- subagents


def test_launch_subagent_spawns_with_the_goal_text_and_returns_the_message() -> None:
    code = (
        "r = await launch_subagent({'item': 2}, 5, context='use the table')\nprint(r)\n"
        "import asyncio\nprint(await asyncio.gather(launch_subagent('x', 1), launch_subagent('y', 1)))"
    )
    ctx = make([cell(code), cell("guess(7)")])
    run(ctx)
    goal = "{'item': 2}\n\nContext provided from parent agent: use the table"
    assert [(s.goal, s.kwargs) for s in ctx.agents.spawns] == [
        (goal, {"max_steps": 5, "task_misc": None}),
        ("x", {"max_steps": 1, "task_misc": None}),
        ("y", {"max_steps": 1, "task_misc": None}),
    ]
    assert (
        ctx.step_misc[0]["output"] == f"child finished: {goal}\n['child finished: x', 'child finished: y']\n"
    )


def test_num_steps_must_be_an_int() -> None:
    ctx = make([cell("await launch_subagent('a', '3')"), cell("guess(7)")])
    run(ctx)
    assert "TypeError: num_steps must be an int, got str" in ctx.step_misc[0]["error"]
    assert ctx.agents.spawns == []


def test_fixed_budget_and_no_subagents() -> None:
    ctx = make([cell("await launch_subagent('a')"), cell("guess(7)")], options={"subagent_budget": "fixed"})
    run(ctx)
    assert ctx.agents.spawns[0].kwargs["max_steps"] is None
    ctx = make([cell("launch_subagent"), cell("guess(7)")], options={"subagents": False})
    run(ctx)
    assert "NameError" in ctx.step_misc[0]["error"]
    assert "launch_subagent" not in ctx.chats[0]["messages"][1]["content"]


# ------------------------------------------------------------------------------------------------ prompt modes


def test_no_sequence_extension_rebuilds_one_user_message() -> None:
    ctx = make(
        [cell("print(guess(3))"), "<python>guess(7)"],
        options={"prompt_mode": "no_sequence_extension", "include_reasoning": False},
    )
    run(ctx)
    messages = ctx.chats[1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "<thought>" not in messages[0]["content"]
    assert (
        "Cell 1:\n<python>\nprint(guess(3))\n</python>\n<output>\nToo low, try again.\n\n</output>"
        in (messages[1]["content"])
    )


class ShoutingBuilder(CodeActPromptBuilder):
    def __init__(self, *, shout: str = "!", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shout = shout

    def system_prompt(self) -> str:
        return f"SYSTEM{self.shout}"

    def subagent_task_misc(
        self, targets: Any, context: str = "", *, parent_misc: Any = None
    ) -> dict[str, Any]:
        return {**(parent_misc or {}), "targets": targets}


def test_prompt_builder_by_import_path_with_options() -> None:
    ctx = make(
        [cell("await launch_subagent('t', 2)"), cell("guess(7)")],
        options={
            "prompt_builder": f"{__name__}:ShoutingBuilder",
            "prompt_builder_options": {"shout": "!!"},
        },
    )
    ctx.task.misc["level"] = 1
    run(ctx)
    assert ctx.chats[0]["messages"][0] == {"role": "system", "content": "SYSTEM!!"}
    assert ctx.agents.spawns[0].kwargs["task_misc"] == {"level": 1, "targets": "t"}


def test_end_to_end_on_number_search() -> None:
    from platoon.envs.number_search import SERVICE
    from platoon.testing.episode import run_episode

    run = run_episode(
        "train:0",  # the target is 228
        service=SERVICE,
        harness="platoon-codeact",
        policy=["<python>\nprint(guess(100))\n", "<python>\nguess(228)\n"],
        harness_options={
            "prompt_builder": "platoon.envs.number_search.prompts:NumberSearchPromptBuilder",
            "include_reasoning": False,
            "subagents": False,
        },
    )
    assert run.outcome is not None and run.outcome["status"] == "scored" and run.reward == 1.0
    assert run.root.finish_message == "You guessed the number 228 correctly!"
    first = run.root.steps[0].misc
    assert (first["code"], first["output"], first["error"]) == (
        "print(guess(100))",
        "Too low, try again.\n",
        None,
    )
    assert "[Cell 1 Output]\nToo low, try again." in run.policy.prompts[1]


def test_parent_and_children_run_cells_at_once_with_their_own_shells_and_output() -> None:
    parent = make(
        [
            cell(
                "import asyncio\nprint('parent before')\n"
                "r = await asyncio.gather(launch_subagent('a', 3), launch_subagent('b', 3))\nprint(r)"
            ),
            cell("guess(7)"),
        ]
    )

    async def spawn(goal: str, **kwargs: Any) -> Any:
        parent.agents.spawns.append(fakes.Spawn(goal, kwargs))
        child = make(
            [cell(f"import time\nx = {goal!r}\ntime.sleep(0.2)\nprint('child', x)"), cell("finish(x * 2)")],
            instruction=goal,
        )
        result = await codeact(child)
        assert child.step_misc[0]["output"] == f"child {goal}\n"
        assert child.step_misc[1]["error"] is None
        from platoon.harness.agent import SubagentResult

        return SubagentResult(goal, goal, goal, result, None, result.final_message or "")

    parent.agents.spawn = spawn
    result = run(parent)
    assert result.final_message == "You guessed the number 7 correctly!"
    assert parent.step_misc[0]["output"] == "parent before\n['aa', 'bb']\n"
    assert parent.step_misc[0]["error"] is None


# ------------------------------------------------------------------------------------------ checked at validation


def test_config_validate_checks_the_options_a_run_would_refuse_at_its_first_rollout(tmp_path, capsys) -> None:
    from platoon.cli import main

    config = tmp_path / "envs.yaml"
    config.write_text(
        "environments:\n"
        "  - env: platoon-number-search\n"
        "    harness: platoon-codeact\n"
        "    harness_options: {prompt_builder_options: {colour: red}}\n"
        "    eval_overrides: {harness_options: {prompt_mode: sideways}}\n"
    )
    assert main(["config", "validate", str(config)]) == 78
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [
        "  environments.0.harness_options: prompt_builder_options: NumberSearchPromptBuilder got unknown options "
        "colour (prompt_builder_options must match the builder's constructor)",
        "  environments.0.eval_overrides.harness_options: prompt_mode must be one of sequence_extension, "
        "no_sequence_extension; got 'sideways'",
    ]
    config.write_text(
        "environments:\n  - env: platoon-number-search\n    harness: platoon-codeact\n"
        "    harness_options: {nope: 1}\n"
    )
    assert main(["config", "validate", str(config)]) == 78
    assert (
        "environments.0.harness_options: unknown platoon-codeact option(s) nope;" in capsys.readouterr().out
    )
