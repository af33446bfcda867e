"""The checks a CodeAct cell passes before it runs, and loop detection over the cells run so far.

A refusal's text becomes the cell's error and the cell does not run. Standard library only.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Sequence
from dataclasses import dataclass

EMPTY_CELL = "No code available to execute."

#: calls that may take an un-awaited coroutine: they schedule or await it themselves
_SCHEDULERS = frozenset({"gather", "wait", "wait_for", "create_task", "as_completed"})


@dataclass(frozen=True)
class CellChecks:
    """Which pre-run checks are on; loop detection has its own settings in the harness options."""

    unawaited_async_calls: bool = True
    while_loops: bool = False
    interactive_input: bool = False


def syntax_error_text(error: SyntaxError) -> str:
    """The refusal for a cell that does not parse."""
    line = (error.text or "").rstrip()
    return f"Execution failed. Traceback:\nSyntax error in line:\n{line}\nMessage: {error.msg}"


def _callee(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def _unawaited_calls(tree: ast.AST, async_names: Collection[str]) -> list[str]:
    """Names of async cell functions called outside `await` and outside gather/wait/wait_for/... arguments."""
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Await) and isinstance(node.value, ast.Call):
            allowed.add(id(node.value))
        elif isinstance(node, ast.Call) and _callee(node) in _SCHEDULERS:
            for arg in [*node.args, *(kw.value for kw in node.keywords)]:
                # gather(*[f(x) for x in xs]) and wait([f(), g()]) hand the coroutines over as well.
                for inner in ast.walk(arg):
                    if isinstance(inner, ast.Call):
                        allowed.add(id(inner))
    found: list[str] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in async_names
            and id(node) not in allowed
            and node.func.id not in found
        ):
            found.append(node.func.id)
    return found


def check_cell(code: str, *, checks: CellChecks, async_names: Collection[str] = ()) -> str | None:
    """The refusal text for `code`, or None when it may run."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return syntax_error_text(exc)
    except ValueError as exc:  # source with NUL bytes
        return f"Execution failed. Traceback:\nSyntax error in line:\n\nMessage: {exc}"
    if not code.strip():
        return EMPTY_CELL
    if checks.unawaited_async_calls and async_names:
        unawaited = _unawaited_calls(tree, async_names)
        if unawaited:
            name = unawaited[0]
            return (
                f"Execution failed: {name}() is an async function and was called without await, so it "
                f"would never run. Write `await {name}(...)`, or pass the calls to asyncio.gather, wait, "
                f"wait_for, create_task or as_completed."
            )
    if checks.while_loops and any(isinstance(node, ast.While) for node in ast.walk(tree)):
        return "Execution failed: while loops are not allowed here. Use a bounded for loop instead."
    if checks.interactive_input and any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "input"
        for node in ast.walk(tree)
    ):
        return "Execution failed: input() is not available: there is no one to answer it."
    return None


def stuck_in_loop(codes: Sequence[str], *, threshold: int, window: int) -> bool:
    """Whether the last `threshold * period` cells repeat with some period in 1..min(window, len // threshold)."""
    if window <= 0 or threshold < 1:
        return False
    stripped = [code.strip() for code in codes]
    max_period = min(window, len(stripped) // threshold)
    for period in range(1, max_period + 1):
        tail = stripped[-period * threshold :]
        if all(tail[i] == tail[i % period] for i in range(len(tail))):
            return True
    return False
