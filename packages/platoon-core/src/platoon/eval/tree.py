"""What `platoon rollout` prints of a rollout: the JSON summary (`--json-output`) and the agent tree.

    rollout 1b9d...  task val:3
    agents 2  steps 5  max depth 1  reward 1  outcome scored [reward=1]
    policy 3f2a9c01  steps 4  reward 1  outcome scored [reward=1]
    └─ subagent 77c0e1d2  steps 1  reward 1  goal 'Suggest a first guess.'

A reward is `-` where an agent's outcome is untrainable (its trajectory's 0 is no score). With the entry's reward
processor, each reward is the processor's score, as training would use it. Where the grader kept evidence (a
verifier's exit code, seconds and output), the tree ends with it: one line, then the output's last lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from platoon.trajectory import Trajectory, TrajectoryCollection

__all__ = ["rollout_summary", "rollout_tree"]

TEXT_LIMIT = 60
#: the lines of the grader's output the tree shows (the JSON summary has the whole kept tail)
EVIDENCE_LINES = 8
ID_CHARS = 8
_UNTRAINABLE = ("trajectory_invalid", "trajectory_timed_out", "trajectory_cancelled")


def _short(text: str | None) -> str | None:
    """Whitespace collapsed, at most 60 characters (the last three `...` when cut)."""
    if text is None:
        return None
    line = " ".join(str(text).split())
    return line if len(line) <= TEXT_LIMIT else line[: TEXT_LIMIT - 3] + "..."


def _reward(trajectory: Trajectory, scored: tuple[float, Any] | None) -> float | None:
    if any(trajectory.misc.get(marker) for marker in _UNTRAINABLE):
        return None
    return float(scored[0]) if scored is not None else float(trajectory.reward)


def rollout_summary(
    collection: TrajectoryCollection,
    task_id: str,
    scores: Mapping[str, tuple[float, Any]] | None = None,
) -> dict[str, Any]:
    """`{id, task, agents, total_steps, max_depth, reward, outcome}`; each agent `{id, parent, depth, role, goal,
    steps, reward, outcome, error}`, root first, in the order the agents opened. `scores` are the reward
    processor's (trajectory id -> (score, components)), which replace the trajectories' own rewards."""
    trajectories = collection.trajectories
    depths: dict[str, int] = {}
    agents: list[dict[str, Any]] = []
    for trajectory_id, trajectory in trajectories.items():
        parent = trajectory.parent_info.id if trajectory.parent_info is not None else None
        depth = depths.get(parent, -1) + 1 if parent is not None else 0
        depths[trajectory_id] = depth
        agent = trajectory.misc.get("agent")
        role = agent.get("role") if isinstance(agent, Mapping) else None
        outcome = trajectory.misc.get("outcome")
        agents.append(
            {
                "id": trajectory_id,
                "parent": parent,
                "depth": depth,
                "role": str(role) if role else ("root" if parent is None else "child"),
                "goal": trajectory.task.goal if trajectory.task is not None else None,
                "steps": len(trajectory.steps),
                "reward": _reward(trajectory, (scores or {}).get(trajectory_id)),
                "outcome": dict(outcome) if isinstance(outcome, Mapping) else None,
                "error": trajectory.error_message,
            }
        )
    root = agents[0] if agents else None
    return {
        "id": collection.id,
        "task": task_id,
        "agents": agents,
        "total_steps": sum(int(a["steps"]) for a in agents),
        "max_depth": max((int(a["depth"]) for a in agents), default=0),
        "reward": root["reward"] if root is not None else None,
        "outcome": root["outcome"] if root is not None else None,
    }


def _number(value: Any) -> str:
    return "-" if value is None else f"{float(value):g}"


def _outcome(outcome: Mapping[str, Any] | None) -> str:
    """`<status> [name=value, ...] (reason)`, or `-`."""
    if not outcome:
        return "-"
    text = str(outcome.get("status") or "-")
    rewards = outcome.get("rewards") or {}
    if rewards:
        text += " [" + ", ".join(f"{name}={_number(value)}" for name, value in rewards.items()) + "]"
    reason = _short(outcome.get("reason"))
    if reason:
        text += f" ({reason})"
    return text


def _agent_line(agent: Mapping[str, Any]) -> str:
    parts = [
        f"{agent['role']} {str(agent['id'])[:ID_CHARS]}",
        f"steps {agent['steps']}",
        f"reward {_number(agent['reward'])}",
    ]
    if agent["outcome"]:
        parts.append(f"outcome {_outcome(agent['outcome'])}")
    error = _short(agent["error"])
    if error:
        parts.append(f"error {error}")
    if agent["parent"] is not None:
        parts.append(f"goal '{_short(agent['goal']) or ''}'")
    return "  ".join(parts)


def rollout_tree(summary: Mapping[str, Any]) -> str:
    """The tree text of a summary: a header, the totals, then one line per agent under box-drawing branches."""
    agents = list(summary["agents"])
    lines = [
        f"rollout {summary['id']}  task {summary['task']}",
        f"agents {len(agents)}  steps {summary['total_steps']}  max depth {summary['max_depth']}  "
        f"reward {_number(summary['reward'])}  outcome {_outcome(summary['outcome'])}",
    ]
    children: dict[str | None, list[Mapping[str, Any]]] = {}
    known = {a["id"] for a in agents}
    for agent in agents:
        parent = agent["parent"] if agent["parent"] in known else None
        if agent is agents[0]:
            continue
        children.setdefault(parent if parent is not None else agents[0]["id"], []).append(agent)

    def walk(agent: Mapping[str, Any], prefix: str) -> None:
        below = children.get(agent["id"], [])
        for i, child in enumerate(below):
            last = i == len(below) - 1
            lines.append(prefix + ("└─ " if last else "├─ ") + _agent_line(child))
            walk(child, prefix + ("   " if last else "│  "))

    if agents:
        lines.append(_agent_line(agents[0]))
        walk(agents[0], "")
    lines += _evidence_lines(summary["outcome"])
    return "\n".join(lines)


def _evidence_lines(outcome: Mapping[str, Any] | None) -> list[str]:
    """`evidence  exit 1  2.31 s  mode separate` and the last lines of the output under `| `; none without it."""
    evidence = outcome.get("evidence") if outcome else None
    if not isinstance(evidence, Mapping):
        return []
    parts = ["evidence"]
    if "exit_code" in evidence:
        parts.append(f"exit {'-' if evidence['exit_code'] is None else evidence['exit_code']}")
    if isinstance(evidence.get("seconds"), (int, float)):
        parts.append(f"{evidence['seconds']:.2f} s")
    if evidence.get("timed_out"):
        parts.append("timed out")
    if evidence.get("mode"):
        parts.append(f"mode {evidence['mode']}")
    if outcome and outcome.get("failure_kind"):
        parts.append(f"kind {outcome['failure_kind']}")
    output = str(evidence.get("output") or "").rstrip("\n")
    tail = output.splitlines()[-EVIDENCE_LINES:] if output else []
    return ["  ".join(parts), *(f"| {line}" for line in tail)]
