"""`platoon-oracle`: runs the task's reference solution through the session's `run_solution()`.

No model calls. Run beside `platoon-noop` to check a dataset: a sound task scores 1 with the oracle.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from platoon.harness.agent import AgentContext, AgentResult
from platoon.harness.function import harness

#: how much of the solution's output the trajectory keeps
OUTPUT_CHARS = 2000


def _field(result: Any, name: str) -> Any:
    # Sessions may return a mapping or an object (Harbor's ExecResult-like record); read either.
    if isinstance(result, Mapping):
        return result.get(name)
    return getattr(result, name, None)


def _output(result: Any) -> str:
    """The solution's output: an `output` field, else stdout then stderr."""
    output = _field(result, "output")
    if output is None:
        output = "".join(str(part) for part in (_field(result, "stdout"), _field(result, "stderr")) if part)
    return str(output)


@harness("platoon-oracle")
async def oracle(ctx: AgentContext) -> AgentResult:
    """Run the task's `solution/solve.sh` in the session; the session is graded whatever the exit code."""
    run_solution = getattr(ctx.session, "run_solution", None)
    if not callable(run_solution):
        return AgentResult(
            "error",
            error=(
                f"platoon-oracle needs a session with run_solution() (Harbor sessions have it); "
                f"{type(ctx.session).__name__} has none"
            ),
        )
    result = run_solution()
    if inspect.isawaitable(result):
        result = await result
    exit_code = _field(result, "exit_code")
    timed_out = bool(_field(result, "timed_out"))
    ctx.annotate(
        oracle={"exit_code": exit_code, "timed_out": timed_out, "output": _output(result)[-OUTPUT_CHARS:]}
    )
    if timed_out:
        return AgentResult("timeout")
    return AgentResult("completed", final_message=f"solve.sh exited with {exit_code}")
