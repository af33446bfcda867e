"""`rollout_config.step_timeout`: an environment tool (the grader of an ORS environment is its finishing tool) that
never returns ends the rollout as the untrainable outcome `timeout` (kind `step_timeout`), never a reward of 0,
whether the tool is async or a sync one on its thread, and whatever the harness makes of the failed call."""

from __future__ import annotations

import sys
import textwrap

import pytest

from platoon.testing.episode import run_episode

HANGING_MODULE = '''
import asyncio
import time

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

import platoon as pt


class Nothing(BaseModel):
    pass


class HangingGrader(Environment):
    @classmethod
    def list_splits(cls):
        return ["train"]

    @classmethod
    def list_tasks(cls, split):
        return [{"id": "async"}, {"id": "sync"}, {"id": "quick"}]

    def get_prompt(self):
        return [TextBlock(text="Submit.")]

    @tool
    async def submit_async(self, params: Nothing) -> ToolOutput:
        """A grader awaiting a service that never answers."""
        await asyncio.Event().wait()

    @tool
    def submit_sync(self, params: Nothing) -> ToolOutput:
        """A grader blocked in a call that never returns."""
        time.sleep(3600)

    @tool
    async def submit_quick(self, params: Nothing) -> ToolOutput:
        """A grader that answers."""
        return ToolOutput(blocks=[TextBlock(text="graded")], reward=1.0, finished=True)


@pt.harness("steptest-submitter")
async def submitter(ctx):
    """Submit with the task's tool; a failed call is shown to the model, which then says it is done."""
    await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=1)
    try:
        await ctx.call_tool("submit_" + ctx.task.misc["ors"]["name"], {})
    except Exception as exc:
        await ctx.chat([{"role": "user", "content": f"the tool failed: {exc}"}], max_tokens=1)
    return pt.AgentResult(final_message="done")
'''


@pytest.fixture
def hanging_module(tmp_path, monkeypatch):
    (tmp_path / "steptest_hanging.py").write_text(textwrap.dedent(HANGING_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "steptest_hanging"
    sys.modules.pop("steptest_hanging", None)
    from platoon.harness.function import REGISTRY

    REGISTRY._records.pop("steptest-submitter@1", None)


def _run(module: str, task: str, **rollout: object):
    return run_episode(
        task,
        service=f"python://{module}:HangingGrader",
        harness=f"{module}:submitter",
        policy=lambda prompt: "ok",
        service_kwargs={"close_timeout_s": 1},  # the close gives up on the hung sync call after this long
        rollout={"verbose": False, **rollout},
    )


@pytest.mark.parametrize("task", ["async", "sync"])
def test_a_grader_that_never_returns_ends_the_rollout_as_a_step_timeout(hanging_module, task):
    run = _run(hanging_module, task, step_timeout=0.5)
    assert run.outcome["status"] == "timeout"
    assert run.outcome["failure_kind"] == "step_timeout"
    assert run.outcome["reason"] == (
        f"tool 'submit_{task}' did not return within rollout_config.step_timeout (0.5 s)"
    )
    assert run.reward is None  # untrainable, not a 0
    assert len(run.root.steps) == 2  # the harness saw the failure and went on; the outcome stays the timeout


def test_a_grader_that_answers_within_the_step_timeout_scores(hanging_module):
    run = _run(hanging_module, "quick", step_timeout=0.5)
    assert run.outcome["status"] == "scored" and run.reward == 1.0


class _Stated:
    """What an environment that bounds its own calls states (as Harbor's session and service do)."""

    agent_timeout_s = 900.0

    def rollout_overhead_s(self, task_id: str) -> float:
        return 1500.0 if task_id == "slow-verifier" else 60.0


def test_an_environment_that_states_longer_limits_keeps_them():
    import asyncio

    from platoon.episode.deadlines import step_deadline_for

    stated = _Stated()

    def deadline(step_timeout, owner, task_id):
        return asyncio.run(step_deadline_for(step_timeout, owner, owner, task_id))

    kept = deadline(300.0, stated, "slow-verifier")
    assert kept is not None and kept.seconds == 1500.0
    assert kept.setting == "the environment's own time limit (above rollout_config.step_timeout)"
    assert deadline(1000.0, stated, "quick").seconds == 1000.0
    assert deadline(300.0, object(), "any").seconds == 300.0
    assert deadline(None, stated, "any") is None


def test_a_function_harness_that_never_finishes_meets_the_default_deadline(hanging_module, monkeypatch):
    """Without `rollout_config.timeout` or a limit the environment states, a function harness still has a deadline
    (24 h, made short here): one that keeps calling the model, each call answered, ends as `timeout`, never a 0."""
    import platoon as pt
    from platoon.episode import program
    from platoon.testing import Completion

    @pt.harness("steptest-endless")
    async def endless(ctx):
        while True:
            await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=1)

    monkeypatch.setattr(program, "UNBOUNDED_ROLLOUT_DEADLINE_S", 1.0)
    try:
        run = run_episode(
            "quick",
            service=f"python://{hanging_module}:HangingGrader",
            harness=endless,
            policy=lambda prompt: Completion("ok", delay=0.25),  # a sampler's answer takes a moment
            service_kwargs={"close_timeout_s": 1},
            rollout={"verbose": False},
        )
    finally:
        from platoon.harness.function import REGISTRY

        REGISTRY._records.pop("steptest-endless@1", None)
    assert (run.outcome["status"], run.outcome["reason"]) == ("timeout", "agent_timeout")
    assert run.reward is None
    assert len(run.root.steps) > 1  # it made progress all along: only the deadline ended it
