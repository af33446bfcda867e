"""The CodeAct executor: one embedded IPython shell per agent, running cells on its own event loop and thread.

Cells call environment tools through generated functions whose work is shipped to the agent's event loop, so a
cell can never block that loop. IPython is imported here only, and only when the first shell starts.
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import concurrent.futures
import contextvars
import inspect
import io
import linecache
import os
import re
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from platoon.envs.service import ToolResult, ToolSpec
from platoon.harness.agent import terminal_arguments
from platoon_harnesses.codeact.checks import CellChecks, check_cell
from platoon_harnesses.codeact.functions import (
    FINISH_DESCRIPTION,
    LAUNCH_SUBAGENT_DESCRIPTION,
    LAUNCH_SUBAGENT_FIXED_DESCRIPTION,
    FunctionSpec,
    build_function,
    parameter_name,
    tool_function_spec,
)

__all__ = ["AGENT_ENDED", "CellOutcome", "CodeActExecutor", "SafeAsyncio", "clean_text"]

#: what a cell function says once the executor closed (the agent ended)
AGENT_ENDED = "The agent has ended: {name}() can no longer be called."
#: what a cell function says when called from a cell that timed out
CELL_RETIRED = "This cell timed out and was retired: {name}() can no longer be called from it."

Launch = Callable[[Any, int | None, str], Coroutine[Any, Any, str]]


# --------------------------------------------------------------------------------------------- asyncio facade


class SafeAsyncio:
    """The `asyncio` cells see: scheduling and synchronisation only, never loops or policies.

    Creating, running or replacing event loops from a cell would hang or break the executor's loop, so anything
    not listed here raises.
    """

    __name__ = "asyncio"

    gather = staticmethod(asyncio.gather)
    sleep = staticmethod(asyncio.sleep)
    create_task = staticmethod(asyncio.create_task)
    wait = staticmethod(asyncio.wait)
    wait_for = staticmethod(asyncio.wait_for)
    as_completed = staticmethod(asyncio.as_completed)
    shield = staticmethod(asyncio.shield)
    current_task = staticmethod(asyncio.current_task)
    all_tasks = staticmethod(asyncio.all_tasks)
    timeout = staticmethod(asyncio.timeout)
    timeout_at = staticmethod(asyncio.timeout_at)
    # asyncio.wait's return_when values belong to wait itself.
    FIRST_COMPLETED = asyncio.FIRST_COMPLETED
    FIRST_EXCEPTION = asyncio.FIRST_EXCEPTION
    ALL_COMPLETED = asyncio.ALL_COMPLETED

    Event = asyncio.Event
    Lock = asyncio.Lock
    Semaphore = asyncio.Semaphore
    BoundedSemaphore = asyncio.BoundedSemaphore
    Condition = asyncio.Condition
    Barrier = asyncio.Barrier
    Queue = asyncio.Queue
    LifoQueue = asyncio.LifoQueue
    PriorityQueue = asyncio.PriorityQueue
    QueueEmpty = asyncio.QueueEmpty
    QueueFull = asyncio.QueueFull

    Timeout = asyncio.Timeout
    TimeoutError = asyncio.TimeoutError
    CancelledError = asyncio.CancelledError

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(
            f"asyncio.{name} is disabled in sandbox: only gather, sleep, create_task, wait, wait_for, "
            f"as_completed, shield, current_task, all_tasks, timeout, timeout_at, the synchronization primitives "
            f"(Lock, Event, Semaphore, BoundedSemaphore, Condition, Barrier), queues and TimeoutError are available."
        )

    def __repr__(self) -> str:
        return "<module 'asyncio' (restricted)>"


SAFE_ASYNCIO = SafeAsyncio()


def _sandboxed_import(original: Callable[..., Any]) -> Callable[..., Any]:
    def __import__(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        # `import asyncio.tasks` and `from asyncio import gather` both land on the facade.
        if level == 0 and (name == "asyncio" or name.startswith("asyncio.")):
            return SAFE_ASYNCIO
        return original(name, globals, locals, fromlist, level)

    return __import__


def _no_display(*objs: Any, **kwargs: Any) -> None:
    """`display()` in a cell: rich output has nowhere to go, so it is dropped."""
    return None


def _no_input(prompt: Any = "") -> str:
    raise EOFError("input() is not available: there is no one to answer it")


# ------------------------------------------------------------------------------------- output capture and text

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")
# " at /abs/path.py:12" inside reprs of tasks, futures and coroutines
_SOURCE_AT = re.compile(r" at (?:/|[A-Za-z]:[\\/]|~/)[^\s>\]\)]*:\d+")
_OUT_PROMPT = re.compile(r"^Out\[\d+\]: ?", re.MULTILINE)


def _install_prefixes() -> list[str]:
    """Directories whose paths tracebacks shorten to module-relative ones (longest first)."""
    prefixes = {p for p in sys.path if p and os.path.isdir(p)}
    prefixes.update({sys.prefix, sys.base_prefix, sys.exec_prefix})
    return sorted((os.path.join(os.path.abspath(p), "") for p in prefixes), key=len, reverse=True)


def clean_text(text: str, prefixes: Sequence[str] | None = None) -> str:
    """Output as the model sees it: no ANSI escapes, no `Out[n]:` prompt, no install paths, no source locations."""
    text = _ANSI.sub("", text)
    text = _OUT_PROMPT.sub("", text)
    text = _SOURCE_AT.sub("", text)
    for prefix in _install_prefixes() if prefixes is None else prefixes:
        text = text.replace(prefix, "")
    return text


@dataclass
class _CellRun:
    """The cell a thread of execution belongs to; set in a context variable for the cell's task."""

    executor: CodeActExecutor
    index: int
    buffer: io.StringIO = field(default_factory=io.StringIO)
    traceback: list[str] = field(default_factory=list)
    retired: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, text: str) -> int:
        with self.lock:
            return self.buffer.write(text)


_CELL: contextvars.ContextVar[_CellRun | None] = contextvars.ContextVar("platoon_codeact_cell", default=None)


class _CellStream(io.TextIOBase):
    """A process-wide `sys.stdout`/`sys.stderr` that writes to the current cell's buffer, else to the real stream.

    Context variables make the capture per cell even while several agents run cells in parallel threads.
    """

    def __init__(self, fallback: Any) -> None:
        super().__init__()
        self.fallback = fallback

    def write(self, text: str) -> int:
        cell = _CELL.get()
        if cell is not None:
            return cell.write(text)
        return int(self.fallback.write(text) or 0)

    def flush(self) -> None:
        if _CELL.get() is None:
            self.fallback.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.fallback, "encoding", None) or "utf-8"

    def fileno(self) -> int:
        return int(self.fallback.fileno())


def _displayhook(value: Any) -> None:
    """A process-wide `sys.displayhook`: a cell's expression values go to its shell, anything else as before."""
    cell = _CELL.get()
    if cell is None or cell.executor._shell is None:
        _previous_displayhook(value)
        return
    cell.executor._shell.displayhook(value)


_previous_displayhook: Callable[[Any], Any] = sys.displayhook
_install_lock = threading.Lock()


def _install_capture() -> None:
    """Put the capturing streams and displayhook in place (again, if something replaced them since)."""
    global _previous_displayhook
    with _install_lock:
        if not isinstance(sys.stdout, _CellStream):
            sys.stdout = _CellStream(sys.stdout)
        if not isinstance(sys.stderr, _CellStream):
            sys.stderr = _CellStream(sys.stderr)
        if sys.displayhook is not _displayhook:
            _previous_displayhook = sys.displayhook
            sys.displayhook = _displayhook


# ------------------------------------------------------------------------------------------------------ shell


def _shell_class() -> type:
    """An `InteractiveShell` subclass that leaves the process alone: no `__main__`, sys.path, builtins or hooks."""
    from IPython.core.builtin_trap import BuiltinTrap
    from IPython.core.display_trap import DisplayTrap
    from IPython.core.displayhook import DisplayHook
    from IPython.core.interactiveshell import InteractiveShell

    class _NoBuiltinTrap(BuiltinTrap):
        # The stock trap swaps process-wide builtins per cell, which races between agents' threads.
        def __enter__(self) -> _NoBuiltinTrap:
            return self

        def __exit__(self, *exc: object) -> Literal[False]:
            return False

    class _NoDisplayTrap(DisplayTrap):
        # sys.displayhook is process-wide too: `_displayhook` dispatches by cell instead.
        def __enter__(self) -> _NoDisplayTrap:
            return self

        def __exit__(self, *exc: object) -> Literal[False]:
            return False

    class _QuietDisplayHook(DisplayHook):
        prompt_end_newline = True

        def write_output_prompt(self) -> None:
            # No `Out[n]:` prompt: the model sees the value only.
            return None

        def compute_format_data(self, result: Any) -> tuple[dict[str, Any], dict[str, Any]]:
            # The model reads a value's text only: the HTML, Markdown, LaTeX, image and JSON forms the stock hook
            # computes for every cell would be paid for nothing. (Limiting the formatter's active types through
            # the config instead costs a fifth of each shell's start in trait notifications.)
            shell: Any = self.shell
            text = shell.display_formatter.formatters["text/plain"](result)
            return ({"text/plain": text} if text is not None else {}), {}

    class CellShell(InteractiveShell):
        displayhook_class = _QuietDisplayHook

        def init_sys_modules(self) -> None:
            # The stock shell installs its namespace as sys.modules["__main__"]; the worker's __main__ stays.
            return None

        def init_virtualenv(self) -> None:
            # The stock shell may add a virtualenv to sys.path; the worker's path is not the cell's to change.
            return None

        def init_builtins(self) -> None:
            self.builtin_trap = _NoBuiltinTrap(shell=self)

        def init_displayhook(self) -> None:
            super().init_displayhook()
            self.display_trap = _NoDisplayTrap(hook=self.displayhook)

        def showtraceback(self, exc_tuple: Any = None, *args: Any, **kwargs: Any) -> None:
            # The executor's own frames (cell-function plumbing, the asyncio facade) are noise to the model.
            try:
                etype, value, tb = exc_tuple if exc_tuple is not None else self._get_exc_info()
            except ValueError:
                return super().showtraceback(exc_tuple, *args, **kwargs)
            return super().showtraceback((etype, value, _prune(tb)), *args, **kwargs)

        def _showtraceback(self, etype: Any, evalue: Any, stb: list[str]) -> None:
            # Tracebacks are the cell's error, kept apart from its output.
            text = self.InteractiveTB.stb2text(stb)
            cell = _CELL.get()
            if cell is not None:
                cell.traceback.append(text)
            else:
                print(text)

    return CellShell


_SHELL_CLASS: type | None = None
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _internal(filename: str) -> bool:
    return (
        filename.startswith("<cell function ") or os.path.dirname(os.path.abspath(filename)) == _PACKAGE_DIR
    )


def _prune(tb: TracebackType | None) -> TracebackType | None:
    """`tb` without the executor's own frames (the cell's frames and any library's stay)."""
    kept: list[TracebackType] = []
    while tb is not None:
        if not _internal(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    pruned: TracebackType | None = None
    for entry in reversed(kept):
        pruned = TracebackType(pruned, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return pruned


def _new_shell(namespace: Mapping[str, Any]) -> Any:
    global _SHELL_CLASS
    from traitlets.config import Config

    if _SHELL_CLASS is None:
        _SHELL_CLASS = _shell_class()
    config = Config()
    # History would open an sqlite file per shell (and keep it open); cells are recorded by the trajectory.
    config.HistoryManager.enabled = False
    saved = (sys.excepthook, sys.displayhook, sys.stdin)
    try:
        shell = _SHELL_CLASS(config=config, colors="nocolor")
    finally:
        sys.excepthook, sys.displayhook, sys.stdin = saved
    # Each shell registers an atexit handler that would keep every shell of the process alive until exit.
    atexit.unregister(shell.atexit_operations)
    shell.InteractiveTB.set_mode("Plain")
    user_builtins = dict(vars(builtins))
    user_builtins["__import__"] = _sandboxed_import(builtins.__import__)
    user_builtins["display"] = _no_display
    user_builtins["input"] = _no_input
    shell.user_ns["__builtins__"] = user_builtins
    shell.user_ns["asyncio"] = SAFE_ASYNCIO
    shell.user_ns["display"] = _no_display
    shell.user_ns.update(namespace)
    return shell


# --------------------------------------------------------------------------------------------------- executor


@dataclass(frozen=True)
class CellOutcome:
    """What running one cell gave: its output, its error (a refusal or a traceback), whether it timed out."""

    output: str = ""
    error: str | None = None
    timed_out: bool = False


def result_value(result: ToolResult) -> Any:
    """A tool result as a cell function returns it: structured content if any, else the text blocks joined."""
    structured = (result.metadata or {}).get("structured_content")
    if structured is not None:
        return structured
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, str):
            parts.append(block)
            continue
        kind = block.get("type") if isinstance(block, Mapping) else getattr(block, "type", None)
        text = block.get("text") if isinstance(block, Mapping) else getattr(block, "text", None)
        if kind in (None, "text") and isinstance(text, str):
            parts.append(text)
    return "\n".join(parts)


class CodeActExecutor:
    """Runs an agent's cells in an embedded IPython shell on a dedicated event loop in a daemon thread.

    Build it on the agent's event loop, `await start()`, `await run(code, timeout)` per cell, `await aclose()`.
    `ended` turns true when `finish` ends the agent or a tool result is flagged finished; `final_message`
    then holds the message.
    """

    def __init__(
        self,
        tools: Sequence[ToolSpec],
        call_tool: Callable[[str, Mapping[str, Any]], Awaitable[ToolResult]],
        *,
        terminal: ToolSpec | None = None,
        launch: Launch | None = None,
        subagent_budget: str = "argument",
        checks: CellChecks | None = None,
        max_output_chars: int | None = None,
    ) -> None:
        self._call_tool = call_tool
        self._terminal = terminal
        self._launch = launch
        self._subagent_budget = subagent_budget
        self._checks = checks or CellChecks()
        self._max_output_chars = max_output_chars
        self._agent_loop = asyncio.get_running_loop()
        self._agent_thread = threading.get_ident()
        # Shipped calls run in a copy of the agent's own context, never the cell's: a tool's prints stay out
        # of the cell's output, and the agent's context variables still hold.
        self._agent_context = contextvars.copy_context()
        self._missing = object()
        self._lock = threading.Lock()
        self._inflight: set[concurrent.futures.Future[Any]] = set()
        self._closed = False
        self._cells = 0
        self._shell: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._prefixes = _install_prefixes()
        self.finish_message: str | None = None
        self.finished_text: str | None = None
        self.ended = False
        self.specs, self.namespace = self._build_namespace(tools)

    # -- the namespace

    def _build_namespace(self, tools: Sequence[ToolSpec]) -> tuple[list[FunctionSpec], dict[str, Any]]:
        builtin_names = {"finish"} | ({"launch_subagent"} if self._launch is not None else set())
        taken = set(builtin_names) | {"asyncio", "display"}
        specs: list[FunctionSpec] = []
        namespace: dict[str, Any] = {}
        for tool in tools:
            # Built-in names win over same-named environment tools; the terminal tool is reached via finish.
            if tool.name in builtin_names:
                continue
            spec = tool_function_spec(
                tool.name, tool.description, tool.input_schema, name=parameter_name(tool.name, taken)
            )
            specs.append(spec)
            namespace[spec.name] = build_function(spec, self._tool_invoker(spec), self._missing)

        finish_spec = FunctionSpec(
            "finish",
            FINISH_SIGNATURE,
            (self._terminal.description if self._terminal is not None else "") or FINISH_DESCRIPTION,
        )
        specs.append(finish_spec)
        namespace["finish"] = self._make_finish()
        if self._launch is not None:
            fixed = self._subagent_budget == "fixed"
            specs.append(
                FunctionSpec(
                    "launch_subagent",
                    LAUNCH_FIXED_SIGNATURE if fixed else LAUNCH_SIGNATURE,
                    LAUNCH_SUBAGENT_FIXED_DESCRIPTION if fixed else LAUNCH_SUBAGENT_DESCRIPTION,
                    is_async=True,
                )
            )
            namespace["launch_subagent"] = self._make_launch(fixed)
        return specs, namespace

    @property
    def async_names(self) -> list[str]:
        return [spec.name for spec in self.specs if spec.is_async]

    def _tool_invoker(self, spec: FunctionSpec) -> Callable[[dict[str, Any]], Any]:
        tool = spec.tool or spec.name

        def invoke(arguments: dict[str, Any]) -> Any:
            return self._call_sync(spec.name, self._tool_call(tool, arguments))

        return invoke

    async def _tool_call(self, tool: str, arguments: Mapping[str, Any]) -> Any:
        result = await self._call_tool(tool, arguments)
        if result.finished:
            self._note_finished(result)
        return result_value(result)

    def _note_finished(self, result: ToolResult) -> None:
        if self.finished_text is None:
            self.finished_text = result.as_text()
        self.ended = True

    def _make_finish(self) -> Callable[..., Any]:
        executor = self

        def finish(message: str | None = "") -> Any:
            if message is not None:
                # finish's own message wins over the terminal result's text, even if that one comes first.
                if executor.finish_message is None:
                    executor.finish_message = str(message)
                executor.ended = True
            terminal = executor._terminal
            if terminal is None:
                return message
            arguments = terminal_arguments(terminal, str(message)) if message is not None else {}
            return executor._call_sync("finish", executor._tool_call(terminal.name, arguments))

        finish.__signature__ = FINISH_SIGNATURE  # type: ignore[attr-defined]
        finish.__doc__ = (self._terminal.description if self._terminal else "") or FINISH_DESCRIPTION
        finish.__module__ = "__main__"
        return finish

    def _make_launch(self, fixed: bool) -> Callable[..., Any]:
        executor = self
        launch = self._launch
        assert launch is not None

        async def _launch(targets: Any, num_steps: int | None, context: str) -> str:
            if num_steps is not None and (isinstance(num_steps, bool) or not isinstance(num_steps, int)):
                raise TypeError(f"num_steps must be an int, got {type(num_steps).__name__}: {num_steps!r}")
            return str(await executor._call_async("launch_subagent", launch(targets, num_steps, context)))

        if fixed:

            async def launch_subagent(targets: Any, context: str = "") -> str:
                return await _launch(targets, None, context)

        else:

            async def launch_subagent(targets: Any, num_steps: int, context: str = "") -> str:  # type: ignore[misc]
                return await _launch(targets, num_steps, context)

        launch_subagent.__signature__ = LAUNCH_FIXED_SIGNATURE if fixed else LAUNCH_SIGNATURE  # type: ignore[attr-defined]
        launch_subagent.__doc__ = LAUNCH_SUBAGENT_FIXED_DESCRIPTION if fixed else LAUNCH_SUBAGENT_DESCRIPTION
        launch_subagent.__module__ = "__main__"
        return launch_subagent

    # -- shipping calls to the agent's loop

    def _ship(self, name: str, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        cell = _CELL.get()
        with self._lock:
            refusal = None
            if self._closed:
                refusal = AGENT_ENDED.format(name=name)
            elif cell is not None and cell.executor is self and cell.retired:
                refusal = CELL_RETIRED.format(name=name)
            if refusal is not None:
                coro.close()
                raise RuntimeError(refusal)
            if threading.get_ident() == self._agent_thread:
                coro.close()
                raise RuntimeError(f"{name}() must run in a cell, not on the agent's event loop")
            future = self._agent_context.copy().run(asyncio.run_coroutine_threadsafe, coro, self._agent_loop)
            self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)
        return future

    def _call_sync(self, name: str, coro: Coroutine[Any, Any, Any]) -> Any:
        future = self._ship(name, coro)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise RuntimeError(AGENT_ENDED.format(name=name)) from None

    async def _call_async(self, name: str, coro: Coroutine[Any, Any, Any]) -> Any:
        future = self._ship(name, coro)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if self._closed:
                raise RuntimeError(AGENT_ENDED.format(name=name)) from None
            raise

    # -- life cycle

    async def start(self) -> None:
        """Start the executor's thread and loop and create the shell there (IPython's import included)."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                try:
                    _cancel_all(loop)
                    loop.run_until_complete(loop.shutdown_asyncgens())
                finally:
                    loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=serve, name="platoon-codeact-cells", daemon=True)
        self._thread.start()
        await asyncio.to_thread(ready.wait)
        namespace = self.namespace

        async def create() -> Any:
            return _new_shell(namespace)

        self._shell = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(create(), loop))

    async def run(self, code: str, timeout: float | None = None, *, check: bool = True) -> CellOutcome:
        """Run one cell: the pre-run checks, then the shell, with `timeout` seconds (None: no limit)."""
        if check:
            refusal = check_cell(code, checks=self._checks, async_names=self.async_names)
            if refusal is not None:
                return CellOutcome(error=refusal)
        if self._closed or self._loop is None:
            return CellOutcome(error="The agent has ended: no more cells run.")
        self._cells += 1
        cell = _CellRun(self, self._cells)
        future = asyncio.run_coroutine_threadsafe(self._run_cell(code, cell), self._loop)
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            # The cell keeps its thread if it is stuck in synchronous code; retiring it refuses its later calls.
            cell.retired = True
            future.cancel()
            output, _ = self._texts(cell)
            return CellOutcome(output=output, error=f"Cell timed out after {timeout:g} s.", timed_out=True)
        output, error = self._texts(cell)
        return CellOutcome(output=output, error=error)

    async def _run_cell(self, code: str, cell: _CellRun) -> None:
        _install_capture()
        token = _CELL.set(cell)
        try:
            shell = self._shell
            try:
                transformed = shell.transform_cell(code)
                preprocessing = None
            except Exception:
                transformed, preprocessing = code, sys.exc_info()
            await shell.run_cell_async(
                code, store_history=False, transformed_cell=transformed, preprocessing_exc_tuple=preprocessing
            )
        finally:
            _CELL.reset(token)

    def _texts(self, cell: _CellRun) -> tuple[str, str | None]:
        with cell.lock:
            output = cell.buffer.getvalue()
            error = "".join(cell.traceback)
        output = self._cut(clean_text(output, self._prefixes))
        error = self._cut(clean_text(error, self._prefixes).strip("\n"))
        return output, error or None

    def _cut(self, text: str) -> str:
        limit = self._max_output_chars
        if limit is None or len(text) <= limit:
            return text
        return text[:limit] + f"\n... (truncated: {len(text) - limit} more characters)"

    def close(self) -> None:
        """Refuse further cell-function calls, cancel the in-flight ones and stop the loop; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            inflight = list(self._inflight)
        for future in inflight:
            future.cancel()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:  # closed in between
                pass

    async def aclose(self, join_timeout: float = 2.0) -> None:
        """`close()`, then wait briefly for the thread (a cell stuck in synchronous code is left behind)."""
        self.close()
        thread = self._thread
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join, join_timeout)
        if thread is None or not thread.is_alive():
            self._release()

    def _release(self) -> None:
        """Forget the cells' and cell functions' sources and the namespace once no cell can run any more.

        linecache keeps every cell's source for tracebacks; a worker running thousands of agents would
        otherwise grow without bound.
        """
        shell, self._shell = self._shell, None
        names = [getattr(fn, "__code__", None) for fn in self.namespace.values()]
        keys = [code.co_filename for code in names if code is not None and code.co_filename.startswith("<")]
        if shell is not None:
            keys.extend(getattr(shell.compile, "_filename_map", {}))
            shell.user_ns.clear()
        for key in keys:
            linecache.cache.pop(key, None)

    @property
    def final_message(self) -> str | None:
        """`finish`'s message, else the text of the first finished tool result."""
        return self.finish_message if self.finish_message is not None else self.finished_text


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def _parameter(
    name: str, annotation: Any = inspect.Parameter.empty, default: Any = inspect.Parameter.empty
) -> Any:
    return inspect.Parameter(
        name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation
    )


# The built-ins' signatures, as the namespace and the action space show them.
FINISH_SIGNATURE = inspect.Signature([_parameter("message", str, "")])
LAUNCH_SIGNATURE = inspect.Signature(
    [_parameter("targets"), _parameter("num_steps", int), _parameter("context", str, "")],
    return_annotation=str,
)
LAUNCH_FIXED_SIGNATURE = inspect.Signature(
    [_parameter("targets"), _parameter("context", str, "")], return_annotation=str
)
