"""Environment code that raises, in process (`python://`): a crashed grader is an infrastructure error, never a 0.

The environments are written as docs/environments.md shows them, with the real openreward SDK: a `@tool` that
returns `finished=True`, and no `platoon_terminal_tools` declaration (most authors never write one).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

from platoon.envs.ors.inprocess import InProcessOrsService, InvalidCall
from platoon.envs.service import Outcome

TASKS = [
    {"id": "right", "target": 1},
    {"id": "wrong", "target": 2},
    {"id": "grader-down", "target": 1, "crash": True},
]


class Guess(BaseModel):
    number: int


class SubmitEnv(Environment):
    """`submit` grades the guess and ends the episode; its grader is down for the tasks marked `crash`."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return TASKS

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Guess the number between 0 and 2.")]

    @tool
    def submit(self, params: Guess) -> ToolOutput:
        """Submit your guess."""
        if self.task_spec.get("crash"):
            raise RuntimeError("grader database unreachable")
        right = params.number == self.task_spec["target"]
        return ToolOutput(blocks=[TextBlock(text="graded")], reward=1.0 if right else 0.0, finished=True)

    @tool
    def check(self, params: Guess) -> ToolOutput:
        """Check a guess without submitting it: bad guesses are the policy's errors, said two ways."""
        if params.number < 0:
            raise InvalidCall("the number must not be negative")
        if params.number > 2:
            text = "out of range"
            return ToolOutput(blocks=[TextBlock(text=text)], metadata={"openhands.dev/tool-error": True})
        return ToolOutput(blocks=[TextBlock(text="fine")])


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def episode(
    service: Any, task_id: str, *calls: tuple[str, dict[str, Any]]
) -> tuple[list[Any], Outcome]:
    session = await service.open(await service.get_task(task_id), rollout_id=f"r-{task_id}")
    try:
        results = [await session.call_tool(name, args) for name, args in calls]
        return results, await session.grade()
    finally:
        await session.close()


def test_a_finishing_tool_that_raises_is_an_infra_error_without_any_declaration():
    async def main() -> dict[str, tuple[list[Any], Outcome]]:
        service = InProcessOrsService(SubmitEnv)
        submit = ("submit", {"number": 1})
        return {task: await episode(service, task, submit, submit) for task in ("test:0", "test:1", "test:2")}

    episodes = run(main())
    assert [outcome.rewards for _, outcome in (episodes["test:0"], episodes["test:1"])] == [
        {"reward": 1.0},
        {"reward": 0.0},
    ]
    results, crashed = episodes["test:2"]
    # The agent is told the environment failed (and may retry); the grade is not a zero for the policy.
    assert [r.metadata["error"] for r in results] == ["env_error", "env_error"]
    assert "RuntimeError: grader database unreachable" in results[0].as_text()
    assert (crashed.status, crashed.failure_kind, crashed.trainable) == ("error", "env_error", False)
    assert crashed.reason == "tool 'submit' raised RuntimeError: grader database unreachable (2 times)"
    assert "platoon_zero" not in crashed.metadata


def test_a_retry_that_grades_after_a_crash_is_scored():
    class Flaky(SubmitEnv):
        calls = 0

        @tool
        def submit(self, params: Guess) -> ToolOutput:
            """Submit your guess; the grader fails the first time."""
            type(self).calls += 1
            if type(self).calls == 1:
                raise ConnectionError("grader timed out")
            return ToolOutput(blocks=[TextBlock(text="graded")], reward=1.0, finished=True)

    _, outcome = run(
        episode(InProcessOrsService(Flaky), "test:0", ("submit", {"number": 1}), ("submit", {"number": 1}))
    )
    assert (outcome.status, outcome.rewards) == ("scored", {"reward": 1.0})


def test_policy_errors_the_environment_reports_stay_the_policys_zero():
    # InvalidCall and a result flagged as a tool error are the environment saying "the call was wrong": the
    # agent sees them, and an episode that never submits is the policy's 0 (no_submit).
    results, outcome = run(
        episode(InProcessOrsService(SubmitEnv), "test:0", ("check", {"number": -1}), ("check", {"number": 5}))
    )
    assert [r.is_error for r in results] == [True, True]
    assert results[0].metadata["error"] == "invalid_call"
    assert (outcome.status, outcome.rewards, outcome.reason) == ("scored", {"reward": 0.0}, "no_submit")


def test_a_non_terminal_tool_of_an_environment_that_declares_its_terminal_tool_is_the_policys_error():
    # Declaring the terminal tool says which tool grades: a crash elsewhere cannot have been the submit.
    class Declared(SubmitEnv):
        platoon_terminal_tools = ("submit",)

        @tool
        def check(self, params: Guess) -> ToolOutput:
            """Check a guess."""
            raise KeyError(params.number)

    results, outcome = run(episode(InProcessOrsService(Declared), "test:0", ("check", {"number": 7})))
    assert results[0].metadata["error"] == "tool_raised"
    assert (outcome.status, outcome.reason) == ("scored", "no_submit")
    assert outcome.metadata["tool_errors"] == ["check: KeyError: 7"]


# -- the built-in environments ---------------------------------------------------------------------------------


def test_the_bandit_declares_answer_terminal_and_a_crashing_answer_is_infra(monkeypatch: pytest.MonkeyPatch):
    from platoon.envs import bandit
    from platoon.envs.bandit import env as bandit_env

    def broken(letter: str) -> float:
        raise RuntimeError("scorer crashed")

    async def main() -> tuple[list[Any], Outcome]:
        service = InProcessOrsService(bandit.SERVICE)
        session = await service.open(await service.get_task("train:0"), rollout_id="r1")
        tools = await session.tools()
        monkeypatch.setattr(bandit_env, "score", broken)
        result = await session.call_tool("answer", {"letter": "C"})
        outcome = await session.grade()
        await session.close()
        return [(t.name, t.terminal) for t in tools], (result, outcome)

    tools, (result, outcome) = run(main())
    assert tools == [("answer", True)]
    assert result.metadata["error"] == "env_error"
    assert (outcome.status, outcome.failure_kind) == ("error", "env_error")
    assert outcome.reason == "terminal tool 'answer' raised RuntimeError: scorer crashed"


def test_number_search_declares_no_terminal_tool_so_guess_stays_visible_and_a_crashing_guess_is_infra():
    from platoon.envs import number_search
    from platoon.envs.number_search.env import task_spec

    async def main() -> tuple[list[Any], Any, Outcome]:
        service = InProcessOrsService(number_search.SERVICE, split="val")
        task = await service.get_task("val:0")
        first = await service.open(task, rollout_id="r1")
        won = await first.call_tool("guess", {"number": task_spec("val", 0)["misc"]["target"]})
        assert won.finished
        await first.close()
        # A tool seen ending an episode is not learned as terminal: harnesses would hide it from the model.
        second = await service.open(task, rollout_id="r2")
        tools = [(t.name, t.terminal) for t in await second.tools()]
        second.env.target = "unset"  # a broken task: comparing a guess with it raises TypeError
        result = await second.call_tool("guess", {"number": 3})
        outcome = await second.grade()
        await second.close()
        return tools, result, outcome

    tools, result, outcome = run(main())
    assert tools == [("guess", False)]
    assert result.metadata["error"] == "env_error"
    assert (outcome.status, outcome.failure_kind) == ("error", "env_error")
    assert outcome.reason is not None and outcome.reason.startswith("tool 'guess' raised TypeError")


# -- the SDK's logs ----------------------------------------------------------------------------------------------


def test_the_sdks_tool_failure_log_goes_through_logging_not_stdout(capfd, caplog):
    caplog.set_level(logging.WARNING, logger="openreward.environments")
    run(
        episode(
            InProcessOrsService(SubmitEnv),
            "test:2",
            ("check", {"number": -1}),  # InvalidCall: answered to the policy, not logged as a failure
            ("submit", {"number": 1}),
        )
    )
    assert capfd.readouterr().out == ""
    records = [r for r in caplog.records if r.name == "openreward.environments"]
    assert [r.getMessage().split()[0] for r in records] == ["tool_call_failed"]
    (record,) = records
    assert record.levelno == logging.ERROR and "tool=submit" in record.getMessage()
    # one line naming the exception, not a traceback per crashed call
    assert record.exc_info is None and "error='RuntimeError: " in record.getMessage()
