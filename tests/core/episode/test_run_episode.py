"""End to end with `platoon.testing.run_episode`: the toy tokenizer, a scripted policy, the real gateway and trace."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from platoon.envs.service import Outcome
from platoon.harness.agent import AgentResult
from platoon.task import Task

from .conftest import FakeService, fh


async def _echo(ctx: Any) -> AgentResult:
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}])
    return AgentResult(final_message=reply.text)


ECHO = fh(_echo)


def test_a_table_task_with_a_tiny_function_harness(tmp_path):
    from platoon.testing.episode import run_episode

    run = run_episode(
        "t1",
        service="table",
        service_kwargs={"rows": [{"id": "t1", "goal": "say hi"}]},
        harness=ECHO,
        policy=["hi there"],
        output_dir=tmp_path / "out",
    )
    root = run.root
    assert root.finish_message == "hi there" and root.task.goal == "say hi"
    assert len(root.steps) == 1 and run.children == []
    # a table cannot grade: the outcome is untrainable, never a 0 to train on
    assert run.outcome["status"] == "invalid" and run.outcome["failure_kind"] == "no_grader"
    # the trajectory stores 0, but the run has no reward: an ungraded episode never passes for a 0
    assert root.misc["trajectory_invalid"] and root.reward == 0.0 and run.reward is None and not run.scored
    call_id = root.steps[0].misc["action_misc"]["completion_id"]
    interaction = run.interactions[call_id]
    assert run.policy.calls[0].text == "hi there"
    assert "say hi" in run.policy.prompts[0]
    assert interaction.sampled_tokens[-1] == run.policy.stop_token
    saved = json.loads((tmp_path / "out" / "trajectory_collection.json").read_text())
    assert saved["id"] == run.collection.id and list(saved["trajectories"]) == [root.id]


def test_the_default_output_dir_is_a_kept_temp_dir():
    from platoon.testing.episode import run_episode

    run = run_episode(
        Task(goal="g", id="x"), service="table", service_kwargs={"rows": ["g"]}, harness=ECHO, policy=["a"]
    )
    assert run.output_dir.name.startswith("platoon-episode-")
    assert (run.output_dir / "trajectory_collection.json").is_file()


def test_a_custom_program_scores_a_table_task_from_the_harness_report():
    from platoon.testing.episode import run_episode

    async def self_report(ep: Any) -> Outcome:
        result = await ep.run()
        return Outcome("scored", rewards={"reward": 1.0 if result.final_message == "42" else 0.0})

    run = run_episode(
        "q",
        service="table",
        service_kwargs={"rows": [{"id": "q", "goal": "answer"}]},
        harness=ECHO,
        policy=["42"],
        program=self_report,
    )
    assert run.reward == 1.0 and run.outcome["status"] == "scored"
    assert run.root.steps[-1].misc["reward_misc"]["reward/success"] == 1.0


def test_a_depth_two_subagent_tree():
    from platoon.testing.episode import run_episode

    seen: dict[str, Any] = {}

    async def tree(ctx: Any) -> AgentResult:
        await ctx.chat([{"role": "user", "content": f"level {ctx.depth}"}])
        seen[f"access{ctx.depth}"] = str(ctx.access)
        if ctx.depth < 2:
            before = ctx.budget.remaining()
            child = await ctx.agents.spawn(f"sub of {ctx.depth}", max_steps=6 - 3 * ctx.depth)
            seen[f"spawn{ctx.depth}"] = (before, child.ok, child.message)
            await ctx.chat([{"role": "user", "content": f"after {ctx.depth}"}])
            seen[f"used{ctx.depth}"] = ctx.budget.used()
        return AgentResult(final_message=f"done {ctx.depth}")

    service = FakeService()
    run = run_episode(
        Task(goal="root goal", id="r"),
        service=service,
        harness=fh(tree),
        policy=lambda prompt: "ok",
        agents={"child_access": "no_terminal", "child_grading": "env"},
        max_steps=20,
    )
    root, child, grandchild = run.trajectories
    assert run.children == [child, grandchild]
    assert seen["spawn0"] == (19.0, True, "done 1") and seen["spawn1"] == (5.0, True, "done 2")
    assert seen["used0"] == 5 and seen["used1"] == 3  # linear budgets count descendants
    assert seen["access0"] == "full" and seen["access1"] == seen["access2"] == "no_terminal"
    assert child.parent_info.id == root.id and child.parent_info.fork_step == 1
    assert grandchild.parent_info.id == child.id and grandchild.parent_info.fork_step == 1
    assert child.task.goal == "sub of 0" and grandchild.task.goal == "sub of 1"
    assert [len(t.steps) for t in run.trajectories] == [2, 2, 1]
    assert root.steps[0].misc["reward_misc"]["reward/subagent_launched"] == 1
    assert root.steps[0].misc["reward_misc"]["reward/subagent_succeeded"] == 1.0
    assert all(t.reward == 1.0 for t in run.trajectories)
    assert [t.misc["agent"]["role"] for t in run.trajectories] == ["policy", "subagent", "subagent"]
    assert len(run.interactions) == 5
    # forked sessions were closed, the root's too at the end
    assert all(session.closed for session in service.sessions)


def test_a_raising_grader_is_untrainable_not_zero():
    from platoon.testing.episode import run_episode

    service = FakeService()

    def grader(session: Any) -> Outcome:
        raise RuntimeError("grader blew up")

    service.grader = grader
    run = run_episode(Task(goal="g", id="1"), service=service, harness=ECHO, policy=["x"])
    assert run.outcome["status"] == "error"
    assert run.outcome["failure_kind"] == "unexpected:RuntimeError"
    assert run.root.misc["trajectory_invalid"] and run.root.error_message.startswith("Outcome error: ")


def test_a_session_that_dies_mid_episode_is_untrainable():
    from platoon.testing.episode import run_episode

    service = FakeService()

    async def tool_user(ctx: Any) -> AgentResult:
        await ctx.chat([{"role": "user", "content": "go"}])
        service.dead = True
        await ctx.call_tool("look", {})
        return AgentResult()

    run = run_episode(Task(goal="g", id="1"), service=service, harness=fh(tool_user), policy=["x"])
    assert run.root.misc["agent_result"] == {
        "status": "error",
        "error": "ConnectionError: the sandbox is gone",
    }
    assert run.outcome["status"] == "error" and run.outcome["failure_kind"] == "harness_crash"
    assert run.reward is None and run.root.misc["trajectory_invalid"]


def test_a_session_that_fails_to_open_yields_an_untrainable_root():
    from platoon.envs.service import EnvSetupError
    from platoon.testing.episode import run_episode

    service = FakeService()
    service.open_error = EnvSetupError("env_connect", "no route to host")
    run = run_episode(Task(goal="g", id="1"), service=service, harness=ECHO, policy=[])
    assert run.outcome["failure_kind"] == "env_connect" and run.root.misc["trajectory_invalid"]


def test_serve_policy_installs_a_default_gateway(monkeypatch):
    from platoon.testing.gateway import default_gateway, default_policy, serve_policy

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert default_gateway() is None
    with serve_policy(["a"]) as policy:
        assert os.environ["TINKER_API_KEY"] == "tml-platoon-testing"
        assert default_policy().policy is policy
        gateway = default_gateway(model_name="m")
        assert gateway.sampler is policy and gateway.model_name == "m"
    assert default_gateway() is None and "TINKER_API_KEY" not in os.environ


def test_make_gateway_checks_renderer_arguments():
    from platoon.testing import toy_renderer
    from platoon.testing.gateway import make_gateway

    with pytest.raises(ValueError, match="renderer_kwargs"):
        make_gateway([], renderer=toy_renderer(), renderer_kwargs={"x": 1})
    with pytest.raises(ValueError):
        make_gateway([], renderer_kwargs={"no_such_attribute": 1})
    gateway = make_gateway(["x"], model_name="platoon/toy", max_tokens=16)
    assert gateway.defaults["max_tokens"] == 16
