"""The CodeAct executor: cell functions from tool schemas, the shell thread, capture, checks, closing."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from platoon.envs.service import ToolResult, ToolSpec
from platoon_harnesses.codeact.checks import CellChecks, check_cell, stuck_in_loop
from platoon_harnesses.codeact.executor import CodeActExecutor, clean_text, result_value
from platoon_harnesses.codeact.functions import annotation, tool_function_spec


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

SCHEMA = {
    "type": "object",
    "properties": {
        "note": {"type": "string", "default": "hi"},
        "count": {"type": "integer"},
        "items": {"type": "array", "items": {"type": "number"}},
        "flag": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
        "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
        "ref": {"$ref": "#/defs/x"},
        "class": {"type": "string"},
    },
    "required": ["count", "items"],
}


def run_with(
    body: Callable[[CodeActExecutor, Any], Awaitable[Any]],
    *,
    tools: list[Any] | None = None,
    launch: Any = None,
    **kwargs: Any,
) -> Any:
    """Run `body(executor, ctx)` on a fresh loop, closing the executor afterwards."""
    ctx = fakes.FakeContext(tools=tools if tools is not None else fakes.number_tools())

    async def main() -> Any:
        specs = await ctx.list_tools()
        terminal = next((t for t in specs if t.terminal), None)
        executor = CodeActExecutor(specs, ctx.call_tool, terminal=terminal, launch=launch, **kwargs)
        await executor.start()
        try:
            return await body(executor, ctx)
        finally:
            await executor.aclose()

    return asyncio.run(main())


# ----------------------------------------------------------------------------------------------- signatures


def test_signature_required_first_then_optional_in_schema_order_with_defaults() -> None:
    spec = tool_function_spec("do", "Does it.", SCHEMA)
    assert str(spec.signature) == (
        "(count: int, items: list[float], note: str = 'hi', flag: bool | None = None, "
        "pair: tuple[str, int] = None, ref: dict = None, class_: str = None)"
    )
    assert spec.arguments is not None and spec.arguments["class_"] == "class"


def test_annotations_from_schema_types() -> None:
    assert annotation({"type": "object"}) is dict
    assert annotation({"type": ["string", "null"]}) == str | None
    assert annotation({"oneOf": [{"type": "integer"}, {"type": "string"}]}) == int | str
    assert annotation({"type": "array"}) is list
    assert annotation({}) is inspect.Parameter.empty


def test_tool_function_binds_like_python_and_sends_only_passed_arguments() -> None:
    seen: list[dict[str, Any]] = []

    def do(arguments: Any) -> ToolResult:
        seen.append(dict(arguments))
        return ToolResult.text("ok")

    tools = [fakes.FakeTool(ToolSpec("do", "Does it.", SCHEMA), do)]

    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        assert (await executor.run("do(1, [2.0], class_='x')")).output == "'ok'\n"
        error = (await executor.run("do(items=[1])")).error
        assert (
            error is not None and "TypeError: do() missing 1 required positional argument: 'count'" in error
        )
        error = (await executor.run("do(1, [1], nope=3)")).error
        assert error is not None and "got an unexpected keyword argument 'nope'" in error
        # Python's own binding error, without the executor's frames.
        assert "cell function" not in error and "executor.py" not in error

    run_with(body, tools=tools)
    assert seen == [{"count": 1, "items": [2.0], "class": "x"}]


def test_result_value_prefers_structured_content_and_joins_text_blocks() -> None:
    assert (
        result_value(
            ToolResult([{"text": "a"}, {"type": "image", "data": "x"}, {"type": "text", "text": "b"}])
        )
        == "a\nb"
    )
    assert result_value(
        ToolResult([{"type": "text", "text": "a"}], metadata={"structured_content": {"n": 1}})
    ) == {"n": 1}


# -------------------------------------------------------------------------------------------------- running


def test_cell_calls_tool_synchronously_and_keeps_state_between_cells() -> None:
    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        first = await executor.run("r = guess(3)\nprint(r)")
        assert first.output == "Too low, try again.\n" and first.error is None
        second = await executor.run("r")
        assert second.output == "'Too low, try again.'\n"  # no Out[n]: prompt
        assert ctx.tool_calls == [("guess", {"number": 3})]
        assert not executor.ended

    run_with(body)


def test_tool_output_never_leaks_into_the_cell_and_stderr_is_captured() -> None:
    def noisy(arguments: Any) -> str:
        print("printed by the tool")
        return "quiet"

    tools = [fakes.FakeTool(ToolSpec("noisy", "", {"type": "object", "properties": {}}), noisy)]

    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        outcome = await executor.run("import sys\nprint('a')\nprint('b', file=sys.stderr)\nnoisy()")
        assert outcome.output == "a\nb\n'quiet'\n"

    run_with(body, tools=tools)


def wait_for_file_cell(path: Path) -> str:
    """A cell that blocks its thread until `path` exists (a minute at most, a hang guard) and shows whether it
    does."""
    return (
        "import pathlib, time\n"
        f"marker = pathlib.Path({str(path)!r})\n"
        "for _ in range(6000):\n"
        "    if marker.exists():\n"
        "        break\n"
        "    time.sleep(0.01)\n"
        "marker.exists()"
    )


async def file_appears(path: Path) -> None:
    async with asyncio.timeout(60):  # a hang guard only
        while not path.exists():
            await asyncio.sleep(0.01)


def test_cells_run_off_the_agent_loop(tmp_path: Path) -> None:
    started, loop_ran = tmp_path / "started", tmp_path / "loop-ran"

    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        async def answer() -> None:
            await file_appears(started)
            loop_ran.touch()

        answering = asyncio.create_task(answer())
        code = f"import pathlib\npathlib.Path({str(started)!r}).touch()\n" + wait_for_file_cell(loop_ran)
        outcome = await executor.run(code)
        await answering
        # the agent's loop ran while the cell blocked its own thread: the cell saw what the loop wrote
        assert outcome.output == "True\n"
        outcome = await executor.run("import threading\nthreading.current_thread().name")
        assert outcome.output == "'platoon-codeact-cells'\n"
        assert threading.current_thread() is threading.main_thread()

    run_with(body)


def test_tracebacks_are_the_error_without_ansi_or_install_paths() -> None:
    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        outcome = await executor.run("print('before')\nimport json\njson.loads('{')")
        assert outcome.output == "before\n"
        assert outcome.error is not None
        assert outcome.error.startswith("Traceback (most recent call last):")
        assert "JSONDecodeError" in outcome.error and "\x1b[" not in outcome.error
        assert sys.base_prefix not in outcome.error and "json/decoder.py" in outcome.error

    run_with(body)


def test_clean_text_strips_prompts_ansi_paths_and_source_locations() -> None:
    text = "Out[3]: \x1b[31m5\x1b[0m <Task pending coro=<f() running at /x/y/mod.py:12>> /lib/py/pkg/m.py"
    assert clean_text(text, ["/lib/py/"]) == "5 <Task pending coro=<f() running>> pkg/m.py"


def test_display_is_dropped_and_input_does_not_block() -> None:
    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        assert (await executor.run("display('x')\nprint('y')")).output == "y\n"
        error = (await executor.run("input('name? ')")).error
        assert error is not None and "EOFError" in error

    run_with(body)


# --------------------------------------------------------------------------------------------------- asyncio


def test_asyncio_facade_allows_scheduling_and_refuses_the_rest() -> None:
    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        ok = await executor.run(
            "import asyncio\nasync def f(x):\n    await asyncio.sleep(0)\n    return x\n"
            "await asyncio.gather(f(1), f(2))"
        )
        assert ok.output == "[1, 2]\n" and ok.error is None
        refused = await executor.run("import asyncio\nasyncio.new_event_loop()")
        assert refused.error is not None
        assert "RuntimeError: asyncio.new_event_loop is disabled in sandbox" in refused.error
        submodule = await executor.run("import asyncio.events\nasyncio.get_event_loop()")
        assert (
            submodule.error is not None and "asyncio.get_event_loop is disabled in sandbox" in submodule.error
        )

    run_with(body)


# ------------------------------------------------------------------------------------------ finish, subagents


def test_finish_calls_the_terminal_tool_and_ends_with_its_message() -> None:
    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        outcome = await executor.run("finish('the answer is 7')")
        assert outcome.error is None
        assert executor.ended and executor.final_message == "the answer is 7"
        assert ctx.tool_calls == [("submit", {"answer": "the answer is 7"})]

    run_with(body)


def test_finish_none_ends_only_when_the_terminal_tool_finished() -> None:
    def never(arguments: Any) -> ToolResult:
        return ToolResult.text("not yet")

    tools = [
        fakes.FakeTool(
            ToolSpec("submit", "Submit.", {"type": "object", "properties": {}}, terminal=True), never
        )
    ]

    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        await executor.run("finish(None)")
        assert not executor.ended
        assert ctx.tool_calls == [("submit", {})]

    run_with(body, tools=tools)


def test_finish_without_terminal_tool_uses_the_fixed_description() -> None:
    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        finish = next(spec for spec in executor.specs if spec.name == "finish")
        assert finish.description.startswith("End the agent trajectory")
        await executor.run("finish('bye')")
        assert executor.ended and executor.final_message == "bye" and ctx.tool_calls == []

    run_with(body, tools=[])


def test_a_finished_tool_result_ends_the_agent_with_its_text() -> None:
    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        await executor.run("guess(7)")
        assert executor.ended and executor.final_message == "You guessed the number 7 correctly!"

    run_with(body)


def test_builtin_names_win_over_environment_tools() -> None:
    tools = [
        fakes.FakeTool(
            ToolSpec("finish", "Env finish.", {"type": "object", "properties": {}}), lambda a: "env"
        )
    ]

    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        await executor.run("finish('mine')")
        assert ctx.tool_calls == [] and executor.final_message == "mine"

    run_with(body, tools=tools)


def test_launch_subagent_awaits_the_launch_and_checks_num_steps() -> None:
    launched: list[tuple[Any, Any, str]] = []

    async def launch(targets: Any, num_steps: int | None, context: str) -> str:
        launched.append((targets, num_steps, context))
        await asyncio.sleep(0.01)
        return f"done {targets}"

    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        spec = next(s for s in executor.specs if s.name == "launch_subagent")
        assert spec.is_async and spec.signature_text == (
            "async launch_subagent(targets, num_steps: int, context: str = '') -> str"
        )
        ok = await executor.run(
            "import asyncio\nawait asyncio.gather(launch_subagent('a', 3), launch_subagent('b', 4, context='c'))"
        )
        assert ok.output == "['done a', 'done b']\n"
        bad = await executor.run("await launch_subagent('a', 2.5)")
        assert bad.error is not None and "TypeError: num_steps must be an int, got float" in bad.error
        flag = await executor.run("await launch_subagent('a', True)")
        assert flag.error is not None and "got bool" in flag.error
        refused = await executor.run("launch_subagent('a', 3)")
        assert refused.error is not None and refused.error.startswith(
            "Execution failed: launch_subagent() is an async function and was called without await"
        )

    run_with(body, launch=launch)
    assert launched == [("a", 3, ""), ("b", 4, "c")]


def test_fixed_budget_launch_has_no_num_steps() -> None:
    async def launch(targets: Any, num_steps: int | None, context: str) -> str:
        return f"{targets} {num_steps}"

    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        assert (await executor.run("await launch_subagent('t')")).output == "'t None'\n"

    run_with(body, launch=launch, subagent_budget="fixed")


# ------------------------------------------------------------------------------------------ timeouts, closing


def test_a_timed_out_cell_is_retired_and_its_later_calls_refused(tmp_path: Path) -> None:
    go, called = tmp_path / "go", tmp_path / "called"

    async def body(executor: CodeActExecutor, ctx: Any) -> None:
        # the cell waits for `go`, which comes only after its timeout, then tries a tool call
        code = (
            wait_for_file_cell(go)
            + f"\ntry:\n    guess(1)\nfinally:\n    pathlib.Path({str(called)!r}).touch()"
        )
        outcome = await executor.run(code, timeout=0.2)
        assert outcome.timed_out and outcome.error == "Cell timed out after 0.2 s."
        go.touch()
        await file_appears(called)
        assert ctx.tool_calls == []

    run_with(body)


def test_closing_refuses_further_calls_and_cancels_in_flight_ones() -> None:
    started = asyncio.Event()

    async def slow_launch(targets: Any, num_steps: int | None, context: str) -> str:
        started.set()
        await asyncio.sleep(30)
        return "never"

    holder: dict[str, Any] = {}

    async def main() -> None:
        ctx = fakes.FakeContext(tools=fakes.number_tools())
        executor = CodeActExecutor(await ctx.list_tools(), ctx.call_tool, launch=slow_launch)
        await executor.start()
        cell = asyncio.create_task(executor.run("r = await launch_subagent('x', 2)", timeout=10))
        await started.wait()
        await executor.aclose()
        holder["outcome"] = await cell
        holder["late"] = executor.namespace["guess"]

    asyncio.run(main())
    late = holder["late"]
    with pytest.raises(RuntimeError, match=r"^The agent has ended: guess\(\) can no longer be called\.$"):
        late(3)


# ---------------------------------------------------------------------------------------------------- checks


def test_pre_run_checks() -> None:
    on = CellChecks(while_loops=True, interactive_input=True)
    assert check_cell("x = (", checks=on) == (
        "Execution failed. Traceback:\nSyntax error in line:\nx = (\nMessage: '(' was never closed"
    )
    assert check_cell("  \n", checks=on) == "No code available to execute."
    assert check_cell("while True:\n    pass", checks=on) is not None
    assert check_cell("while True:\n    pass", checks=CellChecks()) is None
    assert check_cell("x = input()", checks=on) is not None
    assert check_cell("x = input()", checks=CellChecks()) is None
    for allowed in (
        "await f(1)",
        "await asyncio.gather(f(1), f(2))",
        "await asyncio.gather(*[f(i) for i in range(3)])",
        "t = asyncio.create_task(f(1))",
        "await asyncio.wait_for(f(1), 5)",
        "for c in asyncio.as_completed([f(1)]):\n    pass",
    ):
        assert check_cell(allowed, checks=on, async_names=["f"]) is None, allowed
    assert check_cell("x = f(1)", checks=on, async_names=["f"]) is not None
    assert check_cell("x = f(1)", checks=CellChecks(unawaited_async_calls=False), async_names=["f"]) is None


def test_loop_detection() -> None:
    assert stuck_in_loop(["a"] * 4, threshold=4, window=3)
    assert not stuck_in_loop(["a"] * 3, threshold=4, window=3)
    assert stuck_in_loop(["x", "a", "b"] * 4, threshold=4, window=3)
    assert not stuck_in_loop(["a", "b", "c", "d"] * 4, threshold=4, window=3)  # period 4 > window
    assert not stuck_in_loop(["a"] * 10, threshold=4, window=0)  # window 0 disables
    assert stuck_in_loop([" a\n", "a"], threshold=2, window=1)  # compared stripped


def test_closing_forgets_cell_sources() -> None:
    import linecache

    async def body(executor: CodeActExecutor, ctx: Any) -> list[str]:
        await executor.run("x = 1")
        return [key for key in linecache.cache if key.startswith("<")]

    before = {key for key in linecache.cache if key.startswith("<")}
    during = run_with(body)
    assert any(key.startswith("<ipython-input") for key in during)
    assert any(key.startswith("<cell function guess") for key in during)
    assert {key for key in linecache.cache if key.startswith("<")} <= before
