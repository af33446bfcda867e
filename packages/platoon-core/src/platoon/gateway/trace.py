"""The trace builder: a rollout's agent records become trainable trajectories.

Judge-role agents and their descendants get no trajectory; their calls are kept for audit on the nearest kept
ancestor. Rewards and untrainable markers come from the episode outcome or the agent's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from platoon.harness.agent import LIMIT_MESSAGE
from platoon.task import Task
from platoon.trajectory import ParentInfo, Trajectory, TrajectoryCollection, TrajectoryStep

if TYPE_CHECKING:
    from platoon.envs.service import Outcome
    from platoon.gateway.core import RolloutRecorder
    from platoon.gateway.records import AgentRecord, CallRecord

__all__ = ["JUDGE_ROLE", "build_collection"]

#: Agents of this role (and their descendants) are never trained: their calls go to an ancestor's `judge_calls`.
JUDGE_ROLE = "judge"

#: outcome status -> the trajectory misc marker that makes it untrainable
_MARKERS = {
    "invalid": "trajectory_invalid",
    "error": "trajectory_invalid",
    "timeout": "trajectory_timed_out",
    "cancelled": "trajectory_cancelled",
}
#: an agent's own run status -> the marker a child sharing the episode outcome gets
_RUN_MARKERS = {"timeout": "trajectory_timed_out", "cancelled": "trajectory_cancelled"}


def build_collection(rollout: RolloutRecorder, *, episode_outcome: Outcome) -> TrajectoryCollection:
    """One trajectory per kept agent, root first, then in opening order (exactly one root; orphans are an error)."""
    agents = rollout.agents
    known = {id(agent) for agent in agents}
    roots = [agent for agent in agents if agent.parent is None]
    if len(roots) != 1:
        raise ValueError(f"rollout {rollout.rollout_id} has {len(roots)} root agents; exactly one is needed")
    root = roots[0]
    for agent in agents:
        if agent.parent is not None and id(agent.parent) not in known:
            raise ValueError(
                f"agent {agent.agent_id} of rollout {rollout.rollout_id} has a parent outside it"
            )

    # The root is always kept; another agent is kept unless it or an ancestor is a judge.
    keeper: dict[int, AgentRecord] = {}  # id(agent) -> the kept agent its calls are recorded on
    for agent in (root, *(a for a in agents if a is not root)):
        parent = agent.parent
        if parent is None:
            keeper[id(agent)] = agent
        elif agent.role == JUDGE_ROLE or keeper.get(id(parent), parent) is not parent:
            keeper[id(agent)] = keeper.get(id(parent), parent)
        else:
            keeper[id(agent)] = agent
    judge_calls: dict[int, list[tuple[float, dict[str, Any]]]] = {}
    for agent in agents:
        target = keeper[id(agent)]
        calls = agent.calls if target is not agent else [c for c in agent.calls if c.kind == "judge"]
        for call in calls:
            judge_calls.setdefault(id(target), []).append((call.started, _judge_entry(agent, call)))

    root_task = _recorded_task(root.task, root.goal, root.goal, root.max_steps)
    collection = TrajectoryCollection(id=rollout.rollout_id)
    for agent in (root, *(a for a in agents if a is not root)):
        if keeper[id(agent)] is not agent:
            continue
        trajectory = _trajectory(agent, root, root_task, episode_outcome, judges=rollout.judges)
        entries = judge_calls.get(id(agent))
        if entries:
            entries.sort(key=lambda entry: entry[0])
            trajectory.misc["judge_calls"] = [entry for _, entry in entries]
        collection.trajectories[trajectory.id] = trajectory
    return collection


def _recorded_task(
    task: Task | None, goal: str | None, instruction: str | None, max_steps: int | None
) -> Task | None:
    """The task as recorded: a task without a goal (ORS tasks get theirs when the session opens) gets the
    instruction; an agent without a task gets one made of its goal."""
    if task is None:
        return None if goal is None else Task(goal=goal, max_steps=max_steps)
    if task.goal is None and instruction is not None:
        return dataclasses.replace(task, goal=instruction)
    return task


def _trajectory(
    agent: AgentRecord, root: AgentRecord, root_task: Task | None, episode_outcome: Outcome, *, judges: bool
) -> Trajectory:
    is_root = agent is root
    if is_root:
        task = root_task
    elif agent.task is not None:
        task = _recorded_task(agent.task, agent.goal, agent.goal or root.goal, agent.max_steps)
    elif root_task is not None:
        task = root_task.fork(agent.goal or "", agent.max_steps)
    else:
        task = _recorded_task(None, agent.goal, None, agent.max_steps)

    steps = [_step(call) for call in agent.calls if call.kind != "judge"]
    misc: dict[str, Any] = dict(agent.misc)  # harness annotations first: the builder's own keys win
    misc["agent"] = {"agent_id": agent.agent_id, "role": agent.role}
    misc["model_generations"] = {
        call.call_id: dict(call.generation) for call in agent.calls if call.kind != "judge"
    }
    misc["model_call_spans"] = {call.call_id: [call.started, call.ended] for call in agent.calls}
    misc["execution_span"] = [agent.started, agent.ended]
    result = agent.result
    status = None if result is None else str(result.status)
    misc["agent_result"] = {"status": status, "error": None if result is None else result.error}
    if is_root and not judges:
        misc["judges"] = {"enabled": False}

    own = is_root or agent.outcome is not None
    outcome = episode_outcome if is_root or agent.outcome is None else agent.outcome
    if own:
        misc["outcome"] = _outcome_misc(outcome)

    reward = 0.0
    error_message: str | None = None
    if outcome.status == "scored":
        marker = None if own else _RUN_MARKERS.get(status or "")
        if marker is None:
            reward = float(outcome.rewards[outcome.primary])
            if steps:
                steps[-1].misc.setdefault("reward_misc", {})["reward/success"] = reward
        else:  # a child sharing the episode's score whose own run timed out or was cancelled
            misc[marker] = True
    else:
        misc[_MARKERS[outcome.status]] = True
        error_message = f"Outcome {outcome.status}" + (f": {outcome.reason}" if outcome.reason else "")
    if not own and outcome.status != "scored" and status in _RUN_MARKERS:
        misc[_RUN_MARKERS[status]] = True
    if error_message is None and result is not None:
        error_message = result.error or (LIMIT_MESSAGE if status == "limit" else None)

    parent_info = None
    if agent.parent is not None:
        parent_info = ParentInfo(id=agent.parent.trajectory_id, fork_step=agent.fork_step)
    return Trajectory(
        id=agent.trajectory_id,
        task=task,
        parent_info=parent_info,
        steps=steps,
        reward=reward,
        finish_message=None if result is None else result.final_message,
        error_message=error_message,
        misc=misc,
    )


def _step(call: CallRecord) -> TrajectoryStep:
    action_misc: dict[str, Any] = {
        "completion_id": call.call_id,
        "model": call.model,
        "usage": dict(call.usage),
    }
    if call.kind != "policy":
        action_misc["kind"] = call.kind
    misc: dict[str, Any] = {"action_misc": action_misc, "message": call.message}
    for key, value in call.step_misc.items():
        if key == "action_misc":  # annotations never rewrite what the gateway recorded about the call
            continue
        if key == "reward_misc" and isinstance(value, dict):
            misc["reward_misc"] = {**misc.get("reward_misc", {}), **value}
        else:
            misc[key] = value
    return TrajectoryStep(misc=misc)


def _outcome_misc(outcome: Outcome) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "status": outcome.status,
        "rewards": dict(outcome.rewards),
        "reason": outcome.reason,
    }
    if outcome.failure_kind is not None:
        entry["failure_kind"] = outcome.failure_kind
    grade_reason = outcome.metadata.get("grade_reason")
    if grade_reason is not None:
        entry["grade_reason"] = grade_reason
    evidence = outcome.metadata.get("evidence")
    if isinstance(evidence, Mapping):
        # what the grader ran and saw (a verifier's exit code, seconds, output tail): why a run was excused
        entry["evidence"] = dict(evidence)
    if outcome.status == "scored":
        # null when platoon gave the zero itself: there is no grader's key to credit
        entry["reward_key"] = None if outcome.metadata.get("platoon_zero") else outcome.primary
    return entry


def _judge_entry(agent: AgentRecord, call: CallRecord) -> dict[str, Any]:
    return {
        "call_id": call.call_id,
        "agent_id": agent.agent_id,
        "role": agent.role,
        "message": call.message,
        "finish_reason": call.finish_reason,
        "usage": dict(call.usage),
    }
