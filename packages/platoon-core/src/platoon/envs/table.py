"""Task tables: `service: table` and `platoon.envs.task_table(rows)`, tasks without an environment.

A table lists goals. Without a `grader` its sessions have no tools and cannot grade themselves (an episode is
`invalid`, `no_grader`). With one (`exact_match`, or `module:function`), a session takes the agent's final answer
through a `submit` tool kept from the model (as an ORS `@terminal` tool is) and scores it. Rows come inline or from
a JSONL `path`, parsed once per process and shared by every service naming it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from platoon.envs.service import ForkMode, Outcome, ToolResult, ToolSpec
from platoon.harness.agent import FINAL_ANSWER_META_KEY
from platoon.hookspecs import ServiceFactory, hookimpl
from platoon.task import Task

__all__ = ["GRADERS", "SUBMIT_TOOL", "TableSession", "TaskTableService", "exact_match", "task_table"]

log = logging.getLogger(__name__)

#: Inline tables longer than this get a one-time hint to use a JSONL file.
INLINE_ROWS_HINT = 20

_GOAL_KEYS = ("goal", "instruction", "prompt")
_RESERVED = ("id", "task_id", "split", "max_steps", *_GOAL_KEYS)

#: the row key `exact_match` compares the final answer with (kept in `Task.misc`)
ANSWER_KEY = "answer"
#: the tool a graded table's sessions take the final answer through, kept from the model (its meta says so)
SUBMIT_TOOL = "submit"
_SUBMIT_SPEC = ToolSpec(
    SUBMIT_TOOL,
    "Submit the final answer.",
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    terminal=True,
    meta={FINAL_ANSWER_META_KEY: {"arg": "answer"}},
)

#: a grader: (the final answer, the task) -> a reward (a finite number or a bool); may be async
Grader = Callable[[str, Task], Any]


def exact_match(answer: str, task: Task) -> float:
    """1.0 when the answer equals the row's `answer` (both with surrounding whitespace stripped), else 0.0."""
    return 1.0 if answer.strip() == str(task.misc[ANSWER_KEY]).strip() else 0.0


#: the graders a table names without an import string
GRADERS: dict[str, Grader] = {"exact_match": exact_match}

_warned_inline = False
_warn_lock = threading.Lock()

# Parsed JSONL files, keyed by (real path, mtime_ns, size): each file is read once per process.
_FILES: dict[tuple[str, int, int], list[Any]] = {}
_FILES_LOCK = threading.Lock()


@dataclass(frozen=True)
class _Row:
    task_id: str
    goal: str | None
    split: str | None
    max_steps: int | None
    misc: dict[str, Any]


class TaskTableService:
    """A table of tasks: `TaskTableService(rows)` or `TaskTableService(path="tasks.jsonl")` (exactly one).

    `splits` maps split -> task ids; without it the rows' `split` keys decide, else every task is `train`.
    """

    #: the options naming input files, resolved against the config file that writes them
    path_options = ("path",)

    def __init__(
        self,
        rows: Sequence[str | Mapping[str, Any]] | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        splits: Mapping[str, Sequence[str]] | None = None,
        name: str = "table",
        grader: str | Grader | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"table name must be a non-empty string; got {name!r}")
        self.name = name
        self.grader_name, self.grader = _grader(grader, name)
        if (rows is None) == (path is None):
            raise ValueError(f"table {name!r} needs exactly one of rows or path (a JSONL file)")
        if rows is not None and (isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence)):
            raise ValueError(f"table {name!r}: rows must be a list of goal strings or mappings")
        if splits is not None and not isinstance(splits, Mapping):
            raise ValueError(f"table {name!r}: splits must map split names to lists of task ids")
        self._inline = None if rows is None else list(rows)
        self._path = None if path is None else Path(os.path.expanduser(os.fspath(path)))
        self._explicit_splits = None if splits is None else {str(k): list(v) for k, v in splits.items()}
        self._rows: dict[str, _Row] | None = None
        self._splits: dict[str, list[str]] | None = None
        self._load_lock = asyncio.Lock()
        if self._inline is not None:
            if len(self._inline) > INLINE_ROWS_HINT:
                _warn_inline_once(name, len(self._inline))
            # Inline rows are checked now, so a bad table fails where it is written.
            self._build(self._inline)

    # -- loading ---------------------------------------------------------------------------------------------

    async def _table(self) -> tuple[dict[str, _Row], dict[str, list[str]]]:
        if self._rows is None or self._splits is None:
            async with self._load_lock:
                if self._rows is None:
                    assert self._path is not None
                    # File reading and JSON parsing stay off the event loop.
                    raw = await asyncio.to_thread(_read_jsonl, self._path, self.name)
                    self._build(raw)
        assert self._rows is not None and self._splits is not None
        return self._rows, self._splits

    def _build(self, raw: Sequence[Any]) -> None:
        rows: dict[str, _Row] = {}
        for index, item in enumerate(raw):
            row = _parse_row(item, index, self.name)
            if self.grader is exact_match and ANSWER_KEY not in row.misc:
                raise ValueError(
                    f"table {self.name!r}: row {index} has no {ANSWER_KEY!r}, which the exact_match grader "
                    "compares the final answer with"
                )
            if row.task_id in rows:
                raise ValueError(f"table {self.name!r}: duplicate task id {row.task_id!r} (row {index})")
            rows[row.task_id] = row
        splits: dict[str, list[str]] = {}
        if self._explicit_splits is not None:
            for split, ids in self._explicit_splits.items():
                unknown = [i for i in ids if i not in rows]
                if unknown:
                    raise ValueError(
                        f"table {self.name!r}: splits.{split} names unknown task ids: {', '.join(map(repr, unknown[:5]))}"
                    )
                splits[split] = list(ids)
        elif any(row.split is not None for row in rows.values()):
            for row in rows.values():
                splits.setdefault(row.split or "train", []).append(row.task_id)
        else:
            splits["train"] = list(rows)
        self._rows, self._splits = rows, splits

    # -- the service contract --------------------------------------------------------------------------------

    async def list_splits(self) -> list[str]:
        _, splits = await self._table()
        return list(splits)

    async def list_tasks(self, split: str) -> list[str]:
        _, splits = await self._table()
        if split not in splits:
            raise ValueError(f"table {self.name!r} has no split {split!r} (splits: {', '.join(splits)})")
        return list(splits[split])

    async def list_task_names(self, split: str) -> dict[str, str]:
        """Task ids are the names of a table's tasks."""
        return {task_id: task_id for task_id in await self.list_tasks(split)}

    async def get_task(self, task_id: str) -> Task:
        rows, _ = await self._table()
        row = rows.get(task_id)
        if row is None:
            raise ValueError(f"table {self.name!r} has no task {task_id!r}")
        return Task(goal=row.goal, id=row.task_id, max_steps=row.max_steps, misc=dict(row.misc))

    async def open(self, task: Task, *, rollout_id: str) -> TableSession:
        return TableSession(task, self.name, self.grader_name, self.grader)

    def __repr__(self) -> str:
        source = f"path={str(self._path)!r}" if self._path is not None else f"{len(self._inline or ())} rows"
        graded = f", grader={self.grader_name!r}" if self.grader is not None else ""
        return f"TaskTableService({self.name!r}, {source}{graded})"


class TableSession:
    """A session on a table row: the goal is the instruction. Without a grader it has no tools and cannot grade;
    with one, its `submit` tool (kept from the model) takes the final answer and the first answer is scored."""

    sandbox = None

    def __init__(
        self, task: Task, table: str, grader_name: str | None = None, grader: Grader | None = None
    ) -> None:
        self._task = task
        self._table = table
        self._grader_name = grader_name
        self._grader = grader
        #: the outcome of the first submitted answer
        self._submitted: Outcome | None = None

    @property
    def task(self) -> Task:
        return self._task

    @property
    def instruction(self) -> str | None:
        return self._task.goal

    async def tools(self) -> list[ToolSpec]:
        return [_SUBMIT_SPEC] if self._grader is not None else []

    async def call_tool(self, name: str, arguments: Mapping[str, Any], **_: Any) -> ToolResult:
        if self._grader is None:
            return ToolResult.text(
                f"Task table {self._table!r} has no tools (called {name!r})", is_error=True
            )
        if name != SUBMIT_TOOL:
            return ToolResult.text(f"unknown tool {name!r}: the only tool is {SUBMIT_TOOL!r}", is_error=True)
        if self._submitted is not None:
            return ToolResult.text("the answer was already submitted: the episode is over", is_error=True)
        answer = arguments.get("answer")
        if not isinstance(answer, str):
            return ToolResult.text("submit takes one string argument, answer", is_error=True)
        self._submitted = outcome = await self._score(answer)
        if outcome.status != "scored":
            return ToolResult.text(f"the answer could not be graded: {outcome.reason}", is_error=True)
        return ToolResult([{"type": "text", "text": "Submitted."}], finished=True, reward=outcome.reward)

    async def _score(self, answer: str) -> Outcome:
        assert self._grader is not None
        try:
            value = self._grader(answer, self._task)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:  # the grader's failure is never the policy's 0
            reason = f"grader {self._grader_name} raised {type(exc).__name__}: {exc}"
            return Outcome.infra("env_error", reason=reason)
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            reason = f"grader {self._grader_name} returned {value!r}, not a finite number"
            return Outcome.infra("no_reward", status="invalid", reason=reason)
        return Outcome("scored", {"reward": float(value)})

    async def grade(self) -> Outcome:
        if self._grader is None:
            # A table without a grader cannot measure anything: the outcome must come from a verifier.
            return Outcome.infra("no_grader", status="invalid", reason="self_grade")
        if self._submitted is not None:
            return self._submitted
        # No answer reached the grader: a zero platoon gives itself, as for an ORS episode that never finishes.
        return Outcome("scored", {"reward": 0.0}, reason="no_submit", metadata={"platoon_zero": True})

    async def fork(self, mode: ForkMode | str = ForkMode.SHARED, *, task: Task | None = None) -> TableSession:
        ForkMode(mode)  # an unknown mode is refused like everywhere else
        # There is no live state but the answer: every fork mode shares the row, and a fork answers for itself.
        return TableSession(task or self._task, self._table, self._grader_name, self._grader)

    async def close(self) -> None:
        return None


def task_table(
    rows: Sequence[str | Mapping[str, Any]],
    *,
    splits: Mapping[str, Sequence[str]] | None = None,
    name: str = "table",
    grader: str | Grader | None = None,
) -> TaskTableService:
    """A task-table service from rows in code: goal strings or mappings (`id`/`task_id`, `goal`, `split`, ...);
    `grader` scores the final answer (`exact_match`, `module:function` or a callable `(answer, task) -> reward`)."""
    return TaskTableService(rows, splits=splits, name=name, grader=grader)


def _grader(grader: str | Grader | None, table: str) -> tuple[str | None, Grader | None]:
    """(the grader's name for messages, the callable): a built-in name, an import string or a callable."""
    if grader is None:
        return None, None
    if isinstance(grader, str):
        if grader in GRADERS:
            return grader, GRADERS[grader]
        if ":" not in grader:
            raise ValueError(
                f"table {table!r}: unknown grader {grader!r}; name {', '.join(GRADERS)} or a module:function "
                "taking (answer, task) and returning the reward"
            )
        from platoon.registry import resolve_import_string

        try:
            found = resolve_import_string(grader)
        except ValueError as exc:
            raise ValueError(f"table {table!r}: grader {exc}") from None
        if not callable(found):
            raise ValueError(f"table {table!r}: grader {grader!r} is {type(found).__name__}, not a function")
        return grader, found
    if callable(grader):
        return getattr(grader, "__name__", repr(grader)), grader
    raise ValueError(
        f"table {table!r}: grader must be a name, a module:function or a function; got {grader!r}"
    )


def _parse_row(item: Any, index: int, table: str) -> _Row:
    if isinstance(item, str):
        return _Row(f"task-{index}", item, None, None, {})
    if not isinstance(item, Mapping):
        raise ValueError(
            f"table {table!r}: row {index} must be a goal string or a mapping; got {type(item).__name__}"
        )
    raw_id = item.get("id")
    if raw_id is None:
        raw_id = item.get("task_id")
    task_id = f"task-{index}" if raw_id is None else str(raw_id)
    goal = next((item[k] for k in _GOAL_KEYS if item.get(k) is not None), None)
    if goal is not None and not isinstance(goal, str):
        raise ValueError(f"table {table!r}: row {index} has a goal that is not a string: {goal!r}")
    split = item.get("split")
    if split is not None and (not isinstance(split, str) or not split):
        raise ValueError(f"table {table!r}: row {index} has a split that is not a name: {split!r}")
    max_steps = item.get("max_steps")
    if max_steps is not None and (
        isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 0
    ):
        raise ValueError(
            f"table {table!r}: row {index} has max_steps {max_steps!r}; give a non-negative integer"
        )
    misc = {k: v for k, v in item.items() if k not in _RESERVED}
    return _Row(task_id, goal, split, max_steps, misc)


def _read_jsonl(path: Path, table: str) -> list[Any]:
    try:
        real = os.path.realpath(path)
        stat = os.stat(real)
    except OSError as exc:
        raise ValueError(f"table {table!r}: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    key = (real, stat.st_mtime_ns, stat.st_size)
    with _FILES_LOCK:
        cached = _FILES.get(key)
        if cached is not None:
            return cached
        try:
            text = Path(real).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"table {table!r}: cannot read {str(path)!r}: {exc}") from None
        rows: list[Any] = []
        # Split on "\n" only: a JSON string may hold U+2028 and friends, which str.splitlines would break on.
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"table {table!r}: {path}:{number} is not JSON: {exc.msg}") from None
        _FILES[key] = rows
        return rows


def _warn_inline_once(name: str, count: int) -> None:
    global _warned_inline
    with _warn_lock:
        if _warned_inline:
            return
        _warned_inline = True
    log.warning(
        "task table %r has %d inline rows: put them in a JSONL file and name it with `path` instead",
        name,
        count,
    )


@hookimpl
def platoon_register_services(name: str) -> ServiceFactory | None:
    """The built-in `table` service."""
    if name != "table":
        return None
    return ServiceFactory(
        "table", "tasks from inline rows or a JSONL file, graded by an optional grader", TaskTableService
    )
