"""Task tables: rows and JSONL files, splits, ids, refusals, sessions without a grader, and graded tables."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

import platoon.envs
from platoon import plugins
from platoon.envs import table as table_module
from platoon.envs.service import EnvironmentService, EnvSession
from platoon.envs.table import TaskTableService, task_table
from platoon.task import Task


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_rows_are_goal_strings_or_mappings():
    table = task_table(
        [
            "Say hi.",
            {"id": "q1", "instruction": "Add 2 and 2.", "answer": 4, "max_steps": 3},
            {"task_id": 7, "goal": None, "prompt": "Name a colour."},
        ]
    )
    assert isinstance(table, EnvironmentService)
    assert table.name == "table"
    assert run(table.list_tasks("train")) == ["task-0", "q1", "7"]
    first = run(table.get_task("task-0"))
    assert (first.goal, first.id, first.max_steps, first.misc) == ("Say hi.", "task-0", None, {})
    second = run(table.get_task("q1"))
    assert (second.goal, second.max_steps, second.misc) == ("Add 2 and 2.", 3, {"answer": 4})
    assert run(table.get_task("7")).goal == "Name a colour."


def test_splits_come_from_the_argument_then_the_rows_then_train():
    rows = [{"id": "a", "goal": "A", "split": "val"}, {"id": "b", "goal": "B"}]
    by_rows = task_table(rows)
    assert run(by_rows.list_splits()) == ["val", "train"]
    assert run(by_rows.list_tasks("val")) == ["a"]
    explicit = task_table(rows, splits={"train": ["a", "b"], "test": ["b"]})
    assert run(explicit.list_tasks("test")) == ["b"]
    assert run(task_table(["x"]).list_splits()) == ["train"]


def test_refusals_name_the_table():
    with pytest.raises(ValueError, match=r"table 'quiz': duplicate task id 'a' \(row 1\)"):
        task_table([{"id": "a", "goal": "x"}, {"id": "a", "goal": "y"}], name="quiz")
    with pytest.raises(ValueError, match=r"table 'table': splits.val names unknown task ids: 'zz'"):
        task_table([{"id": "a", "goal": "x"}], splits={"val": ["zz"]})
    quiz = task_table(["x"], name="quiz")
    with pytest.raises(ValueError, match=r"table 'quiz' has no split 'val' \(splits: train\)"):
        run(quiz.list_tasks("val"))
    with pytest.raises(ValueError, match=r"table 'quiz' has no task 'nope'"):
        run(quiz.get_task("nope"))
    with pytest.raises(ValueError, match="exactly one of rows or path"):
        TaskTableService()
    with pytest.raises(ValueError, match="exactly one of rows or path"):
        TaskTableService(["x"], path="t.jsonl")
    with pytest.raises(ValueError, match="row 0 must be a goal string or a mapping; got int"):
        task_table([3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="rows must be a list"):
        task_table("abc")


def test_a_jsonl_path_is_parsed_once_and_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "tasks.jsonl"
    lines = [json.dumps({"id": "a", "goal": "line\u2028separator"}), "", json.dumps("Just a goal.")]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(table_module, "_FILES", {})
    first = TaskTableService(path=str(path))
    second = TaskTableService(path=path, name="again")
    assert run(first.list_tasks("train")) == ["a", "task-1"]
    assert run(first.get_task("a")).goal == "line\u2028separator"  # split on "\n" only
    assert run(second.list_tasks("train")) == ["a", "task-1"]
    assert len(table_module._FILES) == 1


def test_bad_jsonl_files_are_one_line_errors(tmp_path: Path):
    missing = TaskTableService(path=tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="table 'table': cannot read"):
        run(missing.list_tasks("train"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"goal": "ok"}\n{not json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2 is not JSON"):
        run(TaskTableService(path=bad).list_tasks("train"))


def test_many_inline_rows_warn_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(table_module, "_warned_inline", False)
    with caplog.at_level(logging.WARNING, logger="platoon.envs.table"):
        task_table([f"goal {i}" for i in range(21)])
        task_table([f"goal {i}" for i in range(30)])
        task_table(["few"])
    warnings = [r for r in caplog.records if "inline rows" in r.getMessage()]
    assert len(warnings) == 1
    assert "JSONL file" in warnings[0].getMessage()


def test_sessions_have_no_tools_and_no_grader():
    async def main() -> None:
        table = task_table([{"id": "a", "goal": "Count to three."}], name="quiz")
        task = await table.get_task("a")
        session = await table.open(task, rollout_id="r1")
        assert isinstance(session, EnvSession)
        assert session.instruction == "Count to three."
        assert session.sandbox is None
        assert await session.tools() == []
        result = await session.call_tool("x", {})
        assert result.is_error
        assert result.as_text() == "Task table 'quiz' has no tools (called 'x')"
        outcome = await session.grade()
        assert (outcome.status, outcome.failure_kind, outcome.reason) == (
            "invalid",
            "no_grader",
            "self_grade",
        )
        for mode in ("shared", "copy", "fresh"):
            child = await session.fork(mode)
            assert child.task is task
        await session.close()
        await session.close()

    run(main())


def _answer(session: Any, text: str) -> Any:
    """What a harness does with the model's final reply: submit it through the tool kept from the model."""
    from platoon.harness.agent import final_answer_tool, terminal_arguments

    async def main() -> Any:
        tool = final_answer_tool(await session.tools())
        assert tool is not None and tool.terminal
        return await session.call_tool(tool.name, terminal_arguments(tool, text))

    return main()


def test_exact_match_scores_the_submitted_final_answer():
    async def main() -> None:
        table = task_table(
            [
                {"id": "a", "goal": "What is 2 + 2?", "answer": 4},
                {"id": "b", "goal": "2 + 3?", "answer": "5"},
            ],
            grader="exact_match",
        )
        right = await table.open(await table.get_task("a"), rollout_id="r1")
        result = await _answer(right, " 4\n")
        assert (result.finished, result.reward, result.as_text()) == (True, 1.0, "Submitted.")
        again = await right.call_tool("submit", {"answer": "5"})
        assert again.is_error and "already submitted" in again.as_text()
        assert (await right.grade()).rewards == {"reward": 1.0}  # the first answer counts
        wrong = await table.open(await table.get_task("b"), rollout_id="r2")
        await _answer(wrong, "five")
        assert (await wrong.grade()).rewards == {"reward": 0.0}
        silent = await table.open(await table.get_task("b"), rollout_id="r3")
        outcome = await silent.grade()
        assert (outcome.status, outcome.reason, outcome.metadata) == (
            "scored",
            "no_submit",
            {"platoon_zero": True},
        )
        # a fork answers for itself
        child = await right.fork("shared")
        assert (await child.grade()).reason == "no_submit"

    run(main())


def test_exact_match_needs_an_answer_in_every_row():
    with pytest.raises(
        ValueError, match="table 'table': row 1 has no 'answer', which the exact_match grader"
    ):
        task_table([{"goal": "a", "answer": "1"}, {"goal": "b"}], grader="exact_match")
    with pytest.raises(ValueError, match="unknown grader 'exact'; name exact_match or a module:function"):
        task_table(["a"], grader="exact")
    with pytest.raises(ValueError, match="table 'table': grader "):
        task_table(["a"], grader="platoon_no_such_module:grade")


def test_a_custom_grader_is_called_with_the_answer_and_task_and_its_failures_are_never_a_zero():
    seen: list[tuple[str, str]] = []

    async def by_length(answer: str, task: Any) -> float:
        seen.append((answer, task.id))
        return len(answer) / 10

    def crashing(answer: str, task: Any) -> float:
        raise RuntimeError("the grading service is down")

    async def main() -> None:
        graded = await task_table(["Say something."], grader=by_length).open(
            Task(goal="g", id="task-0"), rollout_id="r"
        )
        await _answer(graded, "hello")
        assert (await graded.grade()).rewards == {"reward": 0.5}
        assert seen == [("hello", "task-0")]
        broken = await task_table(["x"], grader=crashing).open(Task(goal="g", id="task-0"), rollout_id="r")
        result = await _answer(broken, "hi")
        assert result.is_error and not result.finished
        outcome = await broken.grade()
        assert (outcome.status, outcome.failure_kind) == ("error", "env_error")
        assert outcome.reason == "grader crashing raised RuntimeError: the grading service is down"
        odd = await task_table(["x"], grader=lambda answer, task: "yes").open(Task(goal="g"), rollout_id="r")
        await _answer(odd, "hi")
        assert (await odd.grade()).failure_kind == "no_reward"

    run(main())


def test_the_table_service_resolves_through_its_entry_point():
    factory = plugins.get_service("table")
    assert factory.factory is TaskTableService
    assert factory.summary
    assert plugins.get_service_path_options("table") == ("path",)
    assert platoon.envs.task_table is task_table
    service = factory.factory(rows=["x"], name="t")
    assert run(service.list_tasks("train")) == ["task-0"]
