"""The trace builder: agent records of a rollout tree become trajectories with rewards, markers and judge calls."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from platoon.envs.service import Outcome
from platoon.gateway import build_collection
from platoon.gateway.records import AgentRecord
from platoon.harness.agent import LIMIT_MESSAGE, AgentResult
from platoon.task import SubTask, Task

SCORED = Outcome("scored", rewards={"reward": 0.75, "extra": 1.0}, reason="graded")


def call(gateway: Any, agent: AgentRecord, kind: str = "policy") -> str:
    return asyncio.run(gateway.chat(agent, [{"role": "user", "content": "go"}], kind=kind)).call_id


@pytest.fixture
def tree(make_gateway, sampler) -> dict[str, Any]:
    """root (2 policy, 1 judge, 1 aux) -> child (1 policy) -> grandchild (1 policy); root -> judge -> judge's child."""
    gateway = make_gateway()
    sampler.script = lambda prompt: "ok"
    rollout = gateway.open_rollout("rollout-1")
    root = gateway.open_agent(
        rollout, goal="root goal", task=Task(goal=None, id="t-1", max_steps=9), max_steps=9
    )
    ids: dict[str, list[str]] = {"root": [call(gateway, root), call(gateway, root, "judge")]}
    child = gateway.open_agent(rollout, parent=root, role="subagent", goal="child goal", max_steps=3)
    ids["child"] = [call(gateway, child)]
    judge = gateway.open_agent(rollout, parent=root, role="judge", goal="judge it")
    ids["judge"] = [call(gateway, judge, "judge"), call(gateway, judge)]
    judge_child = gateway.open_agent(rollout, parent=judge, role="subagent")
    ids["judge_child"] = [call(gateway, judge_child)]
    grandchild = gateway.open_agent(rollout, parent=child, role="subagent", goal="grandchild goal")
    ids["grandchild"] = [call(gateway, grandchild)]
    ids["root"] += [call(gateway, root, "aux"), call(gateway, root)]
    for agent in rollout.agents:
        agent.result = AgentResult("completed", final_message=f"done {agent.role}")
        gateway.close_agent(agent)
    agents = {
        "root": root,
        "child": child,
        "judge": judge,
        "judge_child": judge_child,
        "grandchild": grandchild,
    }
    return {"gateway": gateway, "rollout": rollout, "ids": ids, **agents}


def test_one_trajectory_per_kept_agent_root_first_in_opening_order(tree):
    collection = build_collection(tree["rollout"], episode_outcome=SCORED)
    assert collection.id == "rollout-1"
    expected = [tree[name].trajectory_id for name in ("root", "child", "grandchild")]
    assert list(collection.trajectories) == expected
    root, child, grandchild = collection.trajectories.values()
    assert root.parent_info is None
    assert (child.parent_info.id, child.parent_info.fork_step) == (tree["root"].trajectory_id, 1)
    assert (grandchild.parent_info.id, grandchild.parent_info.fork_step) == (tree["child"].trajectory_id, 1)
    assert root.finish_message == "done policy" and root.error_message is None
    assert root.misc["agent"] == {"agent_id": tree["root"].agent_id, "role": "policy"}
    assert child.misc["agent"]["role"] == "subagent"


def test_steps_are_policy_and_aux_calls_and_judge_calls_go_to_the_nearest_kept_ancestor(tree):
    ids = tree["ids"]
    root = build_collection(tree["rollout"], episode_outcome=SCORED).root
    assert root is not None
    policy, judge_call, aux, last = ids["root"]
    assert [step.misc["action_misc"]["completion_id"] for step in root.steps] == [policy, aux, last]
    first = root.steps[0].misc
    assert first["action_misc"] == {
        "completion_id": policy,
        "model": "fake/model",
        "usage": tree["root"].calls[0].usage,
    }
    assert first["message"]["content"] == "ok"
    assert root.steps[1].misc["action_misc"]["kind"] == "aux"
    judge_calls = root.misc["judge_calls"]
    assert [entry["call_id"] for entry in judge_calls] == [judge_call, *ids["judge"], *ids["judge_child"]]
    assert judge_calls[1]["agent_id"] == tree["judge"].agent_id and judge_calls[1]["role"] == "judge"
    assert judge_calls[-1]["role"] == "subagent"
    assert set(judge_calls[0]) == {"call_id", "agent_id", "role", "message", "finish_reason", "usage"}
    assert set(root.misc["model_generations"]) == {policy, aux, last}
    assert root.misc["model_generations"][policy]["finish_reason"] == "stop"
    assert set(root.misc["model_call_spans"]) == {policy, judge_call, aux, last}
    start, end = root.misc["execution_span"]
    assert start <= end


def test_a_scored_outcome_rewards_every_trajectory_that_shares_it(tree):
    collection = build_collection(tree["rollout"], episode_outcome=SCORED)
    root, child, grandchild = collection.trajectories.values()
    for trajectory in (root, child, grandchild):
        assert trajectory.reward == 0.75
        assert trajectory.steps[-1].misc["reward_misc"] == {"reward/success": 0.75}
        assert "reward_misc" not in trajectory.steps[0].misc or trajectory.steps[0] is trajectory.steps[-1]
        assert not {"trajectory_invalid", "trajectory_timed_out", "trajectory_cancelled"} & set(
            trajectory.misc
        )
    assert root.misc["outcome"] == {
        "status": "scored",
        "rewards": {"reward": 0.75, "extra": 1.0},
        "reason": "graded",
        "reward_key": "reward",
    }
    assert "outcome" not in child.misc  # children sharing the episode outcome have none of their own
    assert root.misc["agent_result"] == {"status": "completed", "error": None}


def test_a_child_with_its_own_outcome_uses_it(tree):
    tree["child"].outcome = Outcome(
        "scored", rewards={"pass": 0.0}, primary="pass", metadata={"platoon_zero": True}
    )
    tree["grandchild"].outcome = Outcome.infra("harness_crash", reason="harness_crash")
    root, child, grandchild = build_collection(tree["rollout"], episode_outcome=SCORED).trajectories.values()
    assert root.reward == 0.75
    assert child.reward == 0.0 and child.steps[-1].misc["reward_misc"] == {"reward/success": 0.0}
    assert child.misc["outcome"]["reward_key"] is None  # platoon gave the zero itself
    assert grandchild.reward == 0.0 and grandchild.misc["trajectory_invalid"] is True
    assert grandchild.error_message == "Outcome error: harness_crash"
    assert grandchild.misc["outcome"] == {
        "status": "error",
        "rewards": {},
        "reason": "harness_crash",
        "failure_kind": "harness_crash",
    }
    assert "reward_misc" not in grandchild.steps[-1].misc


@pytest.mark.parametrize(
    ("status", "marker", "reason", "message"),
    [
        ("invalid", "trajectory_invalid", None, "Outcome invalid"),
        ("error", "trajectory_invalid", "boom", "Outcome error: boom"),
        ("timeout", "trajectory_timed_out", "agent_timeout", "Outcome timeout: agent_timeout"),
        ("cancelled", "trajectory_cancelled", "agent_cancelled", "Outcome cancelled: agent_cancelled"),
    ],
)
def test_untrainable_outcomes_give_zero_a_marker_and_a_message(tree, status, marker, reason, message):
    outcome = Outcome(status, reason=reason, metadata={"grade_reason": "grader said"})
    collection = build_collection(tree["rollout"], episode_outcome=outcome)
    for trajectory in collection.trajectories.values():
        assert trajectory.reward == 0.0 and trajectory.misc[marker] is True
        assert trajectory.error_message == message
        assert all("reward_misc" not in step.misc for step in trajectory.steps)
    root = collection.root
    assert root is not None
    assert root.misc["outcome"]["grade_reason"] == "grader said" and "reward_key" not in root.misc["outcome"]


@pytest.mark.parametrize(
    ("run", "marker"), [("timeout", "trajectory_timed_out"), ("cancelled", "trajectory_cancelled")]
)
def test_a_child_sharing_the_score_is_marked_when_its_own_run_was_cut_off(tree, run, marker):
    tree["child"].result = AgentResult(run, error="Agent timed out after 5s: slow")
    root, child, grandchild = build_collection(tree["rollout"], episode_outcome=SCORED).trajectories.values()
    assert child.misc[marker] is True and child.reward == 0.0
    assert child.error_message == "Agent timed out after 5s: slow"
    assert "reward_misc" not in child.steps[-1].misc
    assert root.reward == grandchild.reward == 0.75 and marker not in grandchild.misc


def test_the_root_always_uses_the_episode_outcome(tree):
    tree["root"].outcome = Outcome("invalid")
    tree["root"].result = AgentResult("timeout", error="late")
    root = build_collection(tree["rollout"], episode_outcome=SCORED).root
    assert root is not None
    assert root.reward == 0.75 and "trajectory_timed_out" not in root.misc
    assert root.error_message == "late"


def test_a_limit_run_without_an_error_gets_the_limit_text(tree):
    tree["root"].result = AgentResult("limit")
    tree["child"].result = AgentResult("limit", error="my own words")
    root, child, _ = build_collection(tree["rollout"], episode_outcome=SCORED).trajectories.values()
    assert root.error_message == LIMIT_MESSAGE
    assert child.error_message == "my own words"
    assert root.misc["agent_result"] == {"status": "limit", "error": None}


def test_step_annotations_merge_but_never_overwrite_action_misc(tree):
    root_record = tree["root"]
    root_record.calls[0].step_misc.update(
        {
            "action_misc": {"completion_id": "forged", "model": "x"},
            "reward_misc": {"bonus": 1.0},
            "note": "first",
        }
    )
    last = root_record.calls[-1]
    last.step_misc.update(
        {"reward_misc": {"reward/success": 99.0, "reward/subagent_launched": 1.0}, "flag": True}
    )
    last.step_misc["exclude_from_training"] = True
    root = build_collection(tree["rollout"], episode_outcome=SCORED).root
    assert root is not None
    first = root.steps[0].misc
    assert first["action_misc"]["completion_id"] == root_record.calls[0].call_id
    assert first["action_misc"]["model"] == "fake/model"
    assert first["reward_misc"] == {"bonus": 1.0} and first["note"] == "first"
    final = root.steps[-1].misc
    # reward_misc merges by key; the outcome's reward/success wins over an annotation of the same key
    assert final["reward_misc"] == {"reward/success": 0.75, "reward/subagent_launched": 1.0}
    assert final["flag"] is True and final["exclude_from_training"] is True
    assert last.step_misc["reward_misc"]["reward/success"] == 99.0  # the records are not modified


def test_agent_misc_annotations_and_tool_calls_are_kept_but_builder_keys_win(tree):
    tree["root"].misc.update(
        {"note": "kept", "tool_calls": [{"event_id": "e1", "name": "search"}], "agent": "forged"}
    )
    root = build_collection(tree["rollout"], episode_outcome=SCORED).root
    assert root is not None
    assert root.misc["note"] == "kept" and root.misc["tool_calls"] == [{"event_id": "e1", "name": "search"}]
    assert root.misc["agent"]["agent_id"] == tree["root"].agent_id
    assert "judges" not in root.misc


def test_tasks_fill_goals_and_children_get_forks_of_the_root_task(tree):
    explicit = Task(goal=None, id="own")
    tree["grandchild"].task = explicit
    root, child, grandchild = build_collection(tree["rollout"], episode_outcome=SCORED).trajectories.values()
    assert root.task is not None and root.task.goal == "root goal" and root.task.id == "t-1"
    assert (
        tree["root"].task is not None and tree["root"].task.goal is None
    )  # the record's task is not changed
    assert isinstance(child.task, SubTask) and child.task.goal == "child goal" and child.task.max_steps == 3
    assert [t.goal for t in child.task.parent_tasks] == ["root goal"]
    assert grandchild.task is not None and grandchild.task.id == "own"
    assert grandchild.task.goal == "grandchild goal"


def test_judges_off_is_marked_on_the_root(make_gateway, sampler):
    gateway = make_gateway()
    rollout = gateway.open_rollout(judges=False)
    gateway.open_agent(rollout, goal="g")
    collection = build_collection(rollout, episode_outcome=SCORED)
    root = collection.root
    assert root is not None and root.misc["judges"] == {"enabled": False}
    assert root.steps == [] and root.reward == 0.75 and root.task is not None and root.task.goal == "g"
    assert root.misc["agent_result"] == {"status": None, "error": None}


def test_a_collection_needs_exactly_one_root_and_no_orphans(make_gateway):
    gateway = make_gateway()
    rollout = gateway.open_rollout()
    with pytest.raises(ValueError, match="0 root"):
        build_collection(rollout, episode_outcome=SCORED)
    root = gateway.open_agent(rollout)
    stranger = AgentRecord(agent_id="x", secret="s", rollout_id="other", trajectory_id="tx")
    rollout.agents.append(AgentRecord("o", "s2", rollout.rollout_id, "to", parent=stranger, depth=1))
    with pytest.raises(ValueError, match="parent outside"):
        build_collection(rollout, episode_outcome=SCORED)
    rollout.agents[-1] = AgentRecord("r2", "s3", rollout.rollout_id, "t2")
    with pytest.raises(ValueError, match="2 root"):
        build_collection(rollout, episode_outcome=SCORED)
    assert root in rollout.agents


def test_the_collection_serializes(tree):
    from platoon.trajectory import TrajectoryCollection

    collection = build_collection(tree["rollout"], episode_outcome=SCORED)
    data = collection.to_dict()
    again = TrajectoryCollection.from_dict(data)
    assert list(again.trajectories) == list(collection.trajectories)
    assert again.root is not None and again.root.misc["outcome"]["reward_key"] == "reward"
