"""What the trajectory viewer shows, without Textual: event records folded into collections of trajectories, those
turned into a tree of `Node`s (labels, colours, the payload the details pane renders), grouped by training step
(`view`), filtered (`parse_filter`) and searched.

Applying a record is idempotent (a step is set at its `step_index`, a created trajectory replaces its earlier
self), so a file read twice — a tailed file replaced by an atomic rename, a replay restarted — shows the same tree.
Nodes carry stable keys (`c:<collection>/t:<trajectory>/steps/3`), so the app updates its widget in place rather
than rebuilding it and losing what the user expanded.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import re
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "BRIDGE_TYPES",
    "FILTER_TERMS",
    "MODES",
    "TRAJECTORY_TYPES",
    "CollectionState",
    "EventModel",
    "GroupKey",
    "Node",
    "RolloutFilter",
    "SearchGroup",
    "Section",
    "TaskInfo",
    "TrajectoryState",
    "collection_node",
    "fit",
    "group_node",
    "parse_filter",
    "record_time",
    "search",
    "task_info",
    "view",
    "walk",
]

TRAJECTORY_TYPES = frozenset(
    {"trajectory_created", "trajectory_task_set", "trajectory_step_added", "trajectory_finished"}
)
#: the ORS bridge's event log: no collection, a `session` and a `time`
BRIDGE_TYPES = frozenset(
    {
        "session_started",
        "task_requested",
        "tool_call",
        "tool_result",
        "tool_error",
        "tool_not_run",
        "max_tool_calls_exceeded",
        "session_closing",
    }
)
MODES = ("auto", "codeact", "openhands")
#: nodes whose details sum up their children: a training step's group, a trajectory's steps
SUMMARY_KINDS = frozenset({"group", "steps"})
Mode = Literal["auto", "codeact", "openhands"]
OPENREWARD_REFERENCE = "openreward:v1:"
FINAL_PAYLOAD_KEY = "openreward/final_payload"
VERIFIER_ROLES = ("verifier", "judge")


def record_time(record: Mapping[str, Any]) -> float:
    """The time a record is merged by: `ts` (trajectory events) or `time` (bridge events); 0 when neither."""
    for key in ("ts", "time"):
        value = record.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return 0.0


# ---------------------------------------------------------------------------------------------------------------
# Small text helpers


def fit(text: str, width: int) -> str:
    """`text` cut to `width` characters at a word boundary, an ellipsis marking the cut. A word longer than most of
    the width (a path, an id) is cut inside rather than leaving the line near-empty."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = text[: width - 1]
    boundary = max(head.rfind(" "), head.rfind(","), head.rfind("("))
    if boundary >= width // 2:
        head = head[: boundary + (head[boundary] != " ")]
    return head.rstrip(" ·,") + "…"


def one_line(value: Any, limit: int = 80) -> str:
    """`value` on one line, whitespace collapsed, cut to `limit` characters at a word boundary with an ellipsis."""
    return fit(" ".join(str(value).split()), limit)


def first_line(value: Any, limit: int = 80) -> str:
    """The first non-blank line of `value`, cut to `limit`."""
    for line in str(value or "").splitlines():
        if line.strip():
            return one_line(line, limit)
    return ""


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _count(value: Any, default: int | None) -> int | None:
    """`value` when it is a whole number of 0 or more (a step, a policy version), else `default`."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _mapping(value: Any) -> Mapping[str, Any]:
    """`value` when it is a mapping, else an empty one (records are read from files anyone may have written)."""
    return value if isinstance(value, Mapping) else {}


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _inline_args(arguments: Any, limit: int = 60) -> str:
    arguments = _maybe_json(arguments)
    if arguments in (None, "", {}):
        return ""
    if isinstance(arguments, Mapping):
        return one_line(", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in arguments.items()), limit)
    return one_line(json.dumps(arguments, default=str), limit)


def short_id(value: Any) -> str:
    return str(value)[:8]


# ---------------------------------------------------------------------------------------------------------------
# Task metadata


@dataclass(frozen=True)
class TaskInfo:
    """What a task is called: from task misc keys (`ors`, `openreward_*`, `environment`) or an OpenReward
    reference id (`openreward:v1:<base64 JSON>`)."""

    environment: str | None = None
    name: str | None = None
    index: str | None = None
    split: str | None = None
    task_id: str | None = None
    goal: str | None = None

    def merged(self, other: TaskInfo) -> TaskInfo:
        """Fields this one lacks taken from `other` (a child's task fills gaps, never replaces the root's)."""
        return TaskInfo(
            *(
                mine if mine is not None else theirs
                for mine, theirs in zip(_fields(self), _fields(other), strict=True)
            )
        )

    def parts(self, *, with_goal: bool) -> list[str]:
        parts = []
        if self.environment:
            parts.append(f"env:{self.environment}")
        if self.name or self.task_id:
            parts.append(f"task:{self.name or self.task_id}")
        if self.index is not None:
            parts.append(f"index:{self.index}")
        if self.split:
            parts.append(f"split:{self.split}")
        if with_goal and self.goal:
            parts.append(one_line(self.goal, 100))
        return parts


def _fields(info: TaskInfo) -> tuple[str | None, ...]:
    return (info.environment, info.name, info.index, info.split, info.task_id, info.goal)


def decode_openreward_reference(task_id: str | None) -> dict[str, Any]:
    """The JSON object an `openreward:v1:` task reference encodes (URL-safe base64, padding optional); {} when it
    is not one or does not decode."""
    if not task_id or not task_id.startswith(OPENREWARD_REFERENCE):
        return {}
    token = task_id[len(OPENREWARD_REFERENCE) :]
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        decoded = json.loads(raw)
    except (binascii.Error, ValueError):
        return {}
    return decoded if isinstance(decoded, dict) else {}


def task_info(task: Any) -> TaskInfo:
    """The `TaskInfo` of a task dict (as `Task.to_dict()` writes it); empty for anything else."""
    if not isinstance(task, Mapping):
        return TaskInfo()
    misc = _mapping(task.get("misc"))
    ors = _mapping(misc.get("ors"))
    task_id = _text(task.get("id"))
    reference = decode_openreward_reference(task_id)

    def pick(*candidates: Any) -> str | None:
        return next((text for text in map(_text, candidates) if text is not None), None)

    return TaskInfo(
        environment=pick(
            misc.get("openreward_environment_label"),
            reference.get("environment"),
            ors.get("environment"),
            misc.get("environment"),
            misc.get("env"),
            task.get("environment"),
        ),
        name=pick(
            misc.get("openreward_task_name"), reference.get("name"), ors.get("name"), misc.get("task_name")
        ),
        index=pick(
            misc.get("openreward_task_index"), reference.get("index"), ors.get("index"), misc.get("index")
        ),
        split=pick(
            misc.get("openreward_task_split"), reference.get("split"), ors.get("split"), misc.get("split")
        ),
        task_id=task_id if not reference else None,
        goal=_text(task.get("goal")),
    )


# ---------------------------------------------------------------------------------------------------------------
# State folded from the records


@dataclass
class TrajectoryState:
    """One trajectory as its records have built it so far."""

    id: str
    parent_id: str | None = None
    fork_step: int | None = None
    task: dict[str, Any] | None = None
    steps: list[dict[str, Any] | None] = field(default_factory=list)
    reward: float | None = None
    finished: bool = False
    finish_message: str | None = None
    error_message: str | None = None
    misc: dict[str, Any] = field(default_factory=dict)
    created: dict[str, Any] = field(default_factory=dict)

    def _agent(self) -> Mapping[str, Any]:
        agent = self.misc.get("agent")
        return agent if isinstance(agent, Mapping) else {}

    @property
    def role(self) -> str | None:
        return _text(self._agent().get("role")) or _text(self.misc.get("role"))

    @property
    def verifies(self) -> str | None:
        """The id of the trajectory this one verifies, when it names one."""
        task_misc = self.task.get("misc") if isinstance(self.task, Mapping) else None
        task_misc = task_misc if isinstance(task_misc, Mapping) else {}
        return (
            _text(self.misc.get("verifier_of"))
            or _text(self.misc.get("verifies"))
            or _text(self._agent().get("verifies"))
            or _text(task_misc.get("subagent_reward_verifies_trajectory_id"))
            or _text(task_misc.get("platoon_subagent_verifies_trajectory_id"))
        )

    @property
    def is_verifier(self) -> bool:
        task_misc = self.task.get("misc") if isinstance(self.task, Mapping) else None
        return (
            self.role in VERIFIER_ROLES
            or bool(self.misc.get("verifier_role"))
            or self.verifies is not None
            or (isinstance(task_misc, Mapping) and task_misc.get("subagent_reward_verifier") is True)
        )


@dataclass
class CollectionState:
    """One rollout (a trajectory collection), or one ORS bridge session (`bridge:<session>`). `scope`, `step`,
    `policy_version` and `label` say where a training rollout belongs (from its records, else from the path of its
    file); `first_time` and `arrival` order rollouts newest first."""

    id: str
    trajectories: dict[str, TrajectoryState] = field(default_factory=dict)
    bridge_events: list[dict[str, Any]] = field(default_factory=list)
    sources: set[str] = field(default_factory=set)
    scope: str | None = None
    step: int | None = None
    policy_version: int | None = None
    label: str | None = None
    first_time: float | None = None
    arrival: int = 0

    def note(self, record: Mapping[str, Any], source: str) -> None:
        """Take what a record says about where the rollout belongs, and when it was written."""
        time = record_time(record)
        if time and (self.first_time is None or time < self.first_time):
            self.first_time = time
        self.scope = _text(record.get("scope")) or self.scope
        self.step = _count(record.get("training_step"), self.step)
        self.policy_version = _count(record.get("policy_version"), self.policy_version)
        self.label = _text(record.get("label")) or self.label
        if self.scope is None and source:
            self._place_by_path(source)

    def _place_by_path(self, source: str) -> None:
        scope, number = _placement_by_path(source)
        if scope == "train":
            self.scope, self.policy_version = scope, _count(number, self.policy_version)
        elif scope == "eval":
            self.scope, self.step = scope, _count(number, self.step)

    @property
    def group(self) -> GroupKey | None:
        """The group the rollout is listed under: its training step (or evaluation), else its policy version;
        None for rollouts that belong to no training step (platoon eval, platoon rollout)."""
        if self.step is None and self.policy_version is None:
            return None
        if self.step is not None:
            return GroupKey(self.scope or "train", self.step, None)
        return GroupKey(self.scope or "train", None, self.policy_version)

    @property
    def reward(self) -> float | None:
        """The rollout's reward: its root trajectory's, once finished and scored. A rollout that ended otherwise
        (an error, a timeout) has none: failures are not zeros, as in training's averages."""
        root = self.root
        if root is None or not root.finished or self.outcome not in ("scored", "none"):
            return None
        return root.reward

    @property
    def outcome(self) -> str:
        """How the rollout ended: its root's outcome status (`scored`, `error`, `timeout`, ...), `running` before
        the root finished, `none` when it finished without one."""
        root = self.root
        if root is None or not root.finished:
            return "running"
        outcome = root.misc.get("outcome")
        return (_text(outcome.get("status")) if isinstance(outcome, Mapping) else None) or "none"

    @property
    def failure_kind(self) -> str | None:
        root = self.root
        outcome = root.misc.get("outcome") if root is not None else None
        return _text(outcome.get("failure_kind")) if isinstance(outcome, Mapping) else None

    @property
    def is_bridge(self) -> bool:
        return self.id.startswith("bridge:")

    @property
    def root(self) -> TrajectoryState | None:
        return next(iter(self.trajectories.values()), None)

    def info(self) -> TaskInfo:
        """The root's task names the collection; other trajectories' tasks only fill what it lacks."""
        info = TaskInfo()
        for trajectory in self.trajectories.values():
            info = info.merged(task_info(trajectory.task))
        return info

    def counts(self) -> tuple[int, int]:
        verifiers = sum(1 for t in self.trajectories.values() if t.is_verifier)
        return len(self.trajectories) - verifiers, verifiers


@functools.lru_cache(maxsize=256)
def _placement_by_path(source: str) -> tuple[str | None, int | None]:
    """(`train`, policy version) or (`eval`, step) for a file in training's layout (`rollouts/train/<policy
    version>/events/`, `rollouts/eval/step_<n>/events/`), which files written before the records said where they
    belong still have; (None, None) for any other file."""
    parts = Path(source).parts
    for index in range(len(parts) - 2):
        if parts[index] != "rollouts":
            continue
        scope, key = parts[index + 1], parts[index + 2]
        if scope == "train" and key.isdigit():
            return "train", int(key)
        if scope == "eval" and key.startswith("step_") and key[5:].isdigit():
            return "eval", int(key[5:])
    return None, None


class EventModel:
    """Collections built from event records, in the order they first appeared."""

    def __init__(self) -> None:
        self.collections: dict[str, CollectionState] = {}
        self._arrivals = 0

    def reset(self) -> None:
        self.collections.clear()

    def forget_source(self, source: str) -> set[str]:
        """Drop the collections that came from `source` alone (a tailed file was truncated or replaced, and will
        be read again); returns their ids."""
        gone = {cid for cid, c in self.collections.items() if c.sources == {source}}
        for cid in gone:
            del self.collections[cid]
        for collection in self.collections.values():
            collection.sources.discard(source)
        return gone

    def apply_all(self, records: Iterable[Mapping[str, Any]], source: str = "") -> set[str]:
        changed: set[str] = set()
        for record in records:
            cid = self.apply(record, source)
            if cid is not None:
                changed.add(cid)
        return changed

    def apply(self, record: Mapping[str, Any], source: str = "") -> str | None:
        """Fold one record in; returns the id of the collection it changed (None when it was not one of ours)."""
        kind = record.get("type")
        if kind in TRAJECTORY_TYPES:
            return self._apply_trajectory(str(kind), record, source)
        if kind in BRIDGE_TYPES:
            session = record.get("session") or record.get("session_id") or "?"
            collection = self._collection(f"bridge:{session}", source, record)
            collection.bridge_events.append(dict(record))
            return collection.id
        return None

    def _collection(self, cid: str, source: str, record: Mapping[str, Any]) -> CollectionState:
        collection = self.collections.get(cid)
        if collection is None:
            self._arrivals += 1
            collection = self.collections[cid] = CollectionState(cid, arrival=self._arrivals)
        collection.sources.add(source)
        collection.note(record, source)
        return collection

    def _apply_trajectory(self, kind: str, record: Mapping[str, Any], source: str) -> str | None:
        tid = record.get("trajectory_id")
        created = _mapping(record.get("trajectory"))
        tid = _text(tid) or _text(created.get("id"))
        if tid is None:
            return None
        collection = self._collection(str(record.get("collection_id")), source, record)
        trajectory = collection.trajectories.get(tid)
        if trajectory is None or kind == "trajectory_created":
            # A created record read again (a replaced file, a restarted replay) starts the trajectory over; a
            # dict assignment to an existing key keeps its place in the order.
            trajectory = collection.trajectories[tid] = TrajectoryState(tid)
        if kind == "trajectory_created":
            parent = created.get("parent_info")
            if isinstance(parent, Mapping):
                trajectory.parent_id = _text(parent.get("id"))
                step = parent.get("fork_step")
                trajectory.fork_step = step if isinstance(step, int) and not isinstance(step, bool) else None
            trajectory.misc = dict(created.get("misc") or {})
            trajectory.created = dict(created)
        elif kind == "trajectory_task_set":
            task = record.get("task")
            trajectory.task = dict(task) if isinstance(task, Mapping) else None
        elif kind == "trajectory_step_added":
            index = record.get("step_index")
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                index = len(trajectory.steps)
            while len(trajectory.steps) <= index:
                trajectory.steps.append(None)
            step = record.get("step")
            trajectory.steps[index] = dict(step) if isinstance(step, Mapping) else {"misc": {"value": step}}
        else:  # trajectory_finished
            trajectory.finished = True
            reward = record.get("reward")
            trajectory.reward = float(reward) if isinstance(reward, int | float) else None
            trajectory.finish_message = record.get("finish_message")
            trajectory.error_message = record.get("error_message")
            misc = record.get("misc")
            if isinstance(misc, Mapping):
                trajectory.misc = {**trajectory.misc, **misc}
        return collection.id

    def tree(self, mode: Mode = "auto") -> list[Node]:
        return [collection_node(c, mode) for c in self.collections.values()]


# ---------------------------------------------------------------------------------------------------------------
# The tree


@dataclass
class Section:
    """One block of the details pane: `code` is syntax-highlighted (in `language`), `json` pretty-printed."""

    title: str
    kind: Literal["text", "code", "json"]
    content: Any
    language: str = "python"


@dataclass
class Node:
    """One tree entry: a stable `key`, its `label`, a colour (`style`), what the details pane shows, children."""

    key: str
    label: str
    kind: str
    style: str | None = None
    details: list[Section] = field(default_factory=list)
    children: list[Node] = field(default_factory=list)
    expand: bool = False

    def text(self) -> str:
        """What a search looks through: the label and every section's content (only the label of a node whose
        details sum up its children, which the search finds themselves)."""
        parts = [self.label]
        if self.kind in SUMMARY_KINDS:
            return self.label
        for section in self.details:
            content = section.content
            parts.append(content if isinstance(content, str) else json.dumps(content, default=str))
        return "\n".join(parts)


def walk(nodes: Iterable[Node], parents: tuple[Node, ...] = ()) -> Iterator[tuple[Node, tuple[Node, ...]]]:
    """Every node depth-first with its ancestors."""
    for node in nodes:
        yield node, parents
        yield from walk(node.children, (*parents, node))


def reward_style(trajectory: TrajectoryState) -> str | None:
    """Red at or below 0, green at or above 1, yellow between; no colour until the trajectory finishes."""
    if not trajectory.finished or trajectory.reward is None:
        return None
    if trajectory.reward <= 0:
        return "red"
    if trajectory.reward >= 1:
        return "green"
    return "yellow"


def collection_node(collection: CollectionState, mode: Mode) -> Node:
    key = f"c:{collection.id}"
    if collection.is_bridge:
        return bridge_node(collection, key)
    info = collection.info()
    solvers, verifiers = collection.counts()
    names = info.parts(with_goal=False)
    named = [part for part in names if part.startswith(("env:", "task:"))]
    # What tells rollouts of one step apart comes first: a long label is cut at the pane's edge.
    outcome = collection.outcome
    parts = list(named)
    if outcome in ("scored", "running", "none"):
        parts.append(f"reward:{_reward_text(collection.reward)}")
    else:  # no reward: the rollout failed, and says how
        kind = collection.failure_kind
        parts.append(f"outcome:{outcome}" + (f"/{kind}" if kind else ""))
    parts += [part for part in names if part not in named]
    parts += [f"trajs:solver={solvers},verifier={verifiers}", f"id:{short_id(collection.id)}"]
    label = "collection: " + " · ".join(parts)
    placed = _placement(collection)
    children = [
        trajectory_node(collection, t, placed, f"{key}/t:{t.id}", mode)
        for t in collection.trajectories.values()
        if placed.get(t.id) is None
    ]
    overview = {
        "collection_id": collection.id,
        "environment": info.environment,
        "task": info.name or info.task_id,
        "index": info.index,
        "split": info.split,
        "solver_trajectories": solvers,
        "verifier_trajectories": verifiers,
        "reward": collection.reward,
        "outcome": outcome,
        "failure_kind": collection.failure_kind,
        "scope": collection.scope,
        "step": collection.step,
        "policy_version": collection.policy_version,
        "label": collection.label,
    }
    root = collection.root
    return Node(
        key,
        label,
        "collection",
        style=reward_style(root) if root is not None else None,
        details=[Section("collection", "json", {k: v for k, v in overview.items() if v is not None})],
        children=children,
    )


def _reward_text(reward: float | None) -> str:
    return "…" if reward is None else f"{reward:.3f}"


def _placement(collection: CollectionState) -> dict[str, str | None]:
    """trajectory id -> the trajectory it sits under (a verifier under what it verifies, a child under its
    parent), None at the top (the root, and anyone whose parent has not arrived yet)."""
    known = collection.trajectories
    placed: dict[str, str | None] = {}
    for t in known.values():
        anchor = t.verifies if t.is_verifier and t.verifies in known else None
        anchor = anchor or (t.parent_id if t.parent_id in known else None)
        placed[t.id] = anchor if anchor != t.id else None
    # A cycle (corrupt records) would hide trajectories: break it by lifting its members to the top.
    for tid in list(placed):
        seen = {tid}
        current = placed[tid]
        while current is not None:
            if current in seen:
                placed[tid] = None
                break
            seen.add(current)
            current = placed.get(current)
    return placed


def _subtree_counts(
    tid: str, collection: CollectionState, placed: Mapping[str, str | None]
) -> tuple[int, int]:
    solvers = verifiers = 0
    stack = [tid]
    while stack:
        current = stack.pop()
        if collection.trajectories[current].is_verifier:
            verifiers += 1
        else:
            solvers += 1
        stack += [child for child, anchor in placed.items() if anchor == current]
    return solvers, verifiers


def trajectory_node(
    collection: CollectionState,
    trajectory: TrajectoryState,
    placed: Mapping[str, str | None],
    key: str,
    mode: Mode,
) -> Node:
    reward = f"{trajectory.reward:.3f}" if trajectory.finished and trajectory.reward is not None else "…"
    if trajectory.is_verifier:
        label = f"verifier:{short_id(trajectory.id)} · reward:{reward}"
        style: str | None = "dim"
    else:
        solvers, verifiers = _subtree_counts(trajectory.id, collection, placed)
        label = f"traj:{short_id(trajectory.id)} · subtree:solver={solvers},verifier={verifiers} · reward:{reward}"
        style = reward_style(trajectory)
    if trajectory.error_message:
        label += f" · error: {one_line(trajectory.error_message, 40)}"
    children: list[Node] = []
    info = task_info(trajectory.task)
    if trajectory.task is not None:
        children.append(
            Node(
                f"{key}/task",
                " · ".join(info.parts(with_goal=True)) or "task",
                "task",
                details=[Section("task", "json", trajectory.task)],
            )
        )
    children.append(steps_node(trajectory, f"{key}/steps", mode))
    outcome = trajectory.misc.get("outcome")
    if isinstance(outcome, Mapping):
        children.append(outcome_node(outcome, f"{key}/outcome"))
    for child in collection.trajectories.values():
        if placed.get(child.id) != trajectory.id:
            continue
        child_node = trajectory_node(collection, child, placed, f"{key}/t:{child.id}", mode)
        if child.is_verifier:
            children.append(child_node)
            continue
        at = f" @ step {child.fork_step}" if child.fork_step is not None else ""
        children.append(
            Node(
                f"{key}/fork:{child.id}",
                f"fork from {short_id(trajectory.id)}{at}",
                "fork",
                details=[
                    Section(
                        "fork",
                        "json",
                        {"parent": trajectory.id, "child": child.id, "fork_step": child.fork_step},
                    )
                ],
                children=[child_node],
                expand=True,
            )
        )
    summary = {
        "id": trajectory.id,
        "parent": trajectory.parent_id,
        "fork_step": trajectory.fork_step,
        "role": trajectory.role,
        "finished": trajectory.finished,
        "reward": trajectory.reward,
        "finish_message": trajectory.finish_message,
        "error_message": trajectory.error_message,
        "steps": len(trajectory.steps),
    }
    details = [Section("trajectory", "json", summary), Section("misc", "json", trajectory.misc)]
    kind = "verifier" if trajectory.is_verifier else "trajectory"
    return Node(
        key, label, kind, style=style, details=details, children=children, expand=not trajectory.is_verifier
    )


def outcome_node(outcome: Mapping[str, Any], key: str) -> Node:
    """How the trajectory was graded: status, kind and reason in the label; the grader's evidence (a verifier's exit
    code, seconds and output) in the details, its output as text so its lines read as they were printed."""
    evidence = _mapping(outcome.get("evidence"))
    parts = [f"outcome:{_text(outcome.get('status')) or '?'}"]
    if outcome.get("failure_kind"):
        parts.append(str(outcome["failure_kind"]))
    if "exit_code" in evidence:
        parts.append(f"exit {evidence['exit_code']}")
    if isinstance(evidence.get("seconds"), (int, float)):
        parts.append(f"{evidence['seconds']:.2f} s")
    if outcome.get("reason"):
        parts.append(one_line(outcome["reason"], 60))
    summary = {k: v for k, v in outcome.items() if k != "evidence"}
    details = [Section("outcome", "json", summary)]
    if evidence:
        details.append(Section("evidence", "json", {k: v for k, v in evidence.items() if k != "output"}))
        details.append(Section("grader output (last 16 KiB)", "text", str(evidence.get("output") or "")))
    style = None if outcome.get("status") == "scored" else "red"
    return Node(key, " · ".join(parts), "outcome", style=style, details=details)


# ---------------------------------------------------------------------------------------------------------------
# Steps


def _step_fields(step: Mapping[str, Any]) -> dict[str, Any]:
    """A step's fields wherever the writer put them: platoon's steps keep everything in `misc`."""
    misc = step.get("misc")
    merged = dict(misc) if isinstance(misc, Mapping) else {}
    merged.update({k: v for k, v in step.items() if k != "misc"})
    return merged


def is_openhands_step(fields: Mapping[str, Any]) -> bool:
    return "action_events" in fields or "observation_events" in fields


def steps_node(trajectory: TrajectoryState, key: str, mode: Mode) -> Node:
    children = []
    for index, step in enumerate(trajectory.steps):
        if step is None:
            children.append(Node(f"{key}/{index}", f"step {index}: (not received)", "step", style="dim"))
            continue
        fields = _step_fields(step)
        if mode == "openhands" or (mode == "auto" and is_openhands_step(fields)):
            children.append(openhands_step_node(trajectory, index, fields, f"{key}/{index}"))
        else:
            children.append(codeact_step_node(trajectory, index, fields, f"{key}/{index}"))
    overview = Section("steps", "text", "\n".join(child.label for child in children) or "(no step yet)")
    return Node(
        key, f"steps ({len(trajectory.steps)})", "steps", details=[overview], children=children, expand=True
    )


def _tool_results(trajectory: TrajectoryState) -> dict[int, list[Mapping[str, Any]]]:
    """step number (1-based, as the finished record's misc `tool_calls` counts) -> the tool calls made there."""
    found: dict[int, list[Mapping[str, Any]]] = {}
    for call in trajectory.misc.get("tool_calls") or ():
        if isinstance(call, Mapping) and isinstance(call.get("step"), int):
            found.setdefault(call["step"], []).append(call)
    return found


def _message_tool_calls(fields: Mapping[str, Any]) -> list[tuple[str, Any]]:
    message = fields.get("message")
    calls = message.get("tool_calls") if isinstance(message, Mapping) else None
    result = []
    for call in calls or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            result.append((str(function.get("name")), function.get("arguments")))
    return result


def codeact_step_node(trajectory: TrajectoryState, index: int, fields: Mapping[str, Any], key: str) -> Node:
    """`step i: <first line of code> · <first line of thought> [output] [error]`; a step without code (a
    tool-calling harness) shows its calls and the first line of its message."""
    code, thought = fields.get("code"), fields.get("thought")
    output, error = fields.get("output"), fields.get("error")
    message = _mapping(fields.get("message"))
    calls = _message_tool_calls(fields)
    parts = []
    if code:
        parts.append(first_line(code, 60))
    parts += [f"{name}({_inline_args(arguments, 40)})" for name, arguments in calls]
    if thought:
        parts.append(f'"{first_line(thought, 40)}"')
    elif not parts and message.get("content"):
        parts.append(first_line(message.get("content"), 60))
    markers = []
    if output not in (None, ""):
        markers.append("[output]")
    results = _tool_results(trajectory).get(index + 1, [])
    if error or any(r.get("is_error") for r in results):
        markers.append("[error]")
    rewards = [r["reward"] for r in results if isinstance(r.get("reward"), int | float)]
    if rewards:
        markers.append(f"[reward {rewards[-1]:g}]")
    label = (
        f"step {index}: "
        + " · ".join(parts or ["(no action)"])
        + ("  " + " ".join(markers) if markers else "")
    )
    children = []
    details: list[Section] = []
    for name, value, kind in (
        ("thought", thought, "text"),
        ("code", code, "code"),
        ("output", output, "text"),
        ("error", error, "text"),
    ):
        if value in (None, ""):
            continue
        section = Section(name, kind, str(value))  # type: ignore[arg-type]
        details.append(section)
        children.append(
            Node(
                f"{key}/{name}",
                f"{name}: {first_line(value, 60)}",
                name,
                style="red" if name == "error" else None,
                details=[section],
            )
        )
    for position, (name, arguments) in enumerate(calls):
        section = Section(f"call {name}", "json", {"name": name, "arguments": _maybe_json(arguments)})
        details.append(section)
        children.append(
            Node(
                f"{key}/call{position}",
                f"call: {name}({_inline_args(arguments, 50)})",
                "call",
                details=[section],
            )
        )
    if message.get("content") and not code:
        details.append(Section("message", "text", str(message.get("content"))))
    if results:
        details.append(Section("tool results", "json", results))
    details.append(Section("step", "json", dict(fields)))
    return Node(key, label, "step", details=details, children=children)


# ---------------------------------------------------------------------------------------------------------------
# OpenHands steps


def _events(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, Mapping):
        value = value.get("events") or [value]
    return [dict(item) for item in value or () if isinstance(item, Mapping)]


def action_call(event: Mapping[str, Any]) -> tuple[str, Any]:
    """The tool an action event calls and its arguments, with `call_tool` wrappers resolved to the catalogue
    tool they call."""
    name: Any = None
    arguments: Any = None
    action = event.get("action")
    data = action.get("data") if isinstance(action, Mapping) else None
    tool_call = event.get("tool_call")
    if isinstance(data, Mapping) and data:
        name = data.get("name")
        arguments = data.get("arguments", data)
    elif isinstance(tool_call, Mapping):
        function = _mapping(tool_call.get("function")) or tool_call
        name, arguments = function.get("name"), function.get("arguments")
    elif isinstance(action, Mapping):
        arguments = {k: v for k, v in action.items() if k != "kind"}
    name = name or event.get("tool_name") or (action.get("kind") if isinstance(action, Mapping) else None)
    arguments = _maybe_json(arguments)
    if name == "call_tool" and isinstance(arguments, Mapping) and _text(arguments.get("name")):
        return str(arguments["name"]), _maybe_json(arguments.get("arguments") or {})
    return str(name or event.get("kind") or "action"), arguments


def observation_text(event: Mapping[str, Any]) -> str:
    """What an observation event says, as text (content blocks joined)."""
    observation = event.get("observation")
    content: Any = observation.get("content") if isinstance(observation, Mapping) else None
    if content is None:
        content = event.get("error") or event.get("content") or ""
    if isinstance(content, list):
        texts = []
        for block in content:
            text = block.get("text") if isinstance(block, Mapping) else block
            if isinstance(text, str):
                texts.append(text)
        content = "\n".join(texts)
    return content if isinstance(content, str) else json.dumps(content, default=str)


def observation_failed(event: Mapping[str, Any]) -> bool:
    observation = event.get("observation")
    return bool(
        event.get("error")
        or "Error" in str(event.get("kind") or "")
        or (isinstance(observation, Mapping) and (observation.get("is_error") or observation.get("error")))
    )


def _pair_key(event: Mapping[str, Any]) -> str | None:
    return _text(event.get("tool_call_id")) or _text(event.get("action_id"))


def openhands_step_node(trajectory: TrajectoryState, index: int, fields: Mapping[str, Any], key: str) -> Node:
    """Action events paired with their observations (by `tool_call_id` or `action_id`), repeated calls collapsed
    as `name xN`, errors surfaced in the label, the final payload from `reward_misc`."""
    actions = _events(fields.get("action_events"))
    observations = _events(fields.get("observation_events"))
    by_key: dict[str, list[dict[str, Any]]] = {}
    unpaired: list[dict[str, Any]] = []
    for observation in observations:
        pair = _pair_key(observation)
        if pair is None:
            unpaired.append(observation)
        else:
            by_key.setdefault(pair, []).append(observation)
    children: list[Node] = []
    names: list[str] = []
    errors = 0
    for position, action in enumerate(actions):
        name, arguments = action_call(action)
        names.append(name)
        paired = by_key.pop(action.get("id") or "", []) + by_key.pop(_pair_key(action) or "", [])
        failed = any(observation_failed(o) for o in paired)
        errors += failed
        result = (
            " → " + ("error: " if failed else "") + first_line(observation_text(paired[-1]), 50)
            if paired
            else ""
        )
        details = [Section(f"action {name}", "json", {"name": name, "arguments": arguments})]
        details += [Section("observation", "text", observation_text(o)) for o in paired]
        details.append(Section("events", "json", {"action": action, "observations": paired}))
        children.append(
            Node(
                f"{key}/a{position}",
                f"{name}({_inline_args(arguments, 40)}){result}",
                "action",
                style="red" if failed else None,
                details=details,
            )
        )
    for position, observation in enumerate(unpaired + [o for rest in by_key.values() for o in rest]):
        failed = observation_failed(observation)
        errors += failed
        children.append(
            Node(
                f"{key}/o{position}",
                ("error: " if failed else "observation: ") + first_line(observation_text(observation), 60),
                "observation",
                style="red" if failed else None,
                details=[
                    Section("observation", "text", observation_text(observation)),
                    Section("event", "json", observation),
                ],
            )
        )
    reward_misc = _mapping(fields.get("reward_misc"))
    final = reward_misc.get(FINAL_PAYLOAD_KEY)
    if final is not None:
        children.append(
            Node(
                f"{key}/final",
                f"final: {one_line(json.dumps(final, default=str), 60)}",
                "final",
                details=[Section("final payload", "json", final)],
            )
        )
    if names:
        collapsed: list[tuple[str, int]] = []
        for name in names:
            if collapsed and collapsed[-1][0] == name:
                collapsed[-1] = (name, collapsed[-1][1] + 1)
            else:
                collapsed.append((name, 1))
        summary = ", ".join(f"{n} x{c}" if c > 1 else str(n) for n, c in collapsed)
    elif index == 0:
        summary = "setup"
    else:
        message = fields.get("message")
        summary = (
            first_line(message.get("content") if isinstance(message, Mapping) else message, 60)
            or "(no action)"
        )
    if errors:
        summary += f"  [{errors} error{'s' if errors > 1 else ''}]"
    if final is not None:
        summary += "  [final]"
    step_details = [Section("step", "json", dict(fields))]
    return Node(
        key,
        f"step {index}: {summary}",
        "step",
        style="red" if errors else None,
        details=step_details,
        children=children,
    )


# ---------------------------------------------------------------------------------------------------------------
# ORS bridge sessions


def bridge_node(collection: CollectionState, key: str) -> Node:
    """A bridge session's events grouped per turn: a `turn` field when the record has one, else each
    `tool_call` opens the next turn; what comes before the first call is the session's setup."""
    turns: dict[int, list[dict[str, Any]]] = {}
    current = 0
    for event in sorted(collection.bridge_events, key=record_time):
        turn = event.get("turn")
        if isinstance(turn, int) and not isinstance(turn, bool):
            current = turn
        elif event.get("type") == "tool_call":
            current += 1
        turns.setdefault(current, []).append(event)
    children = []
    for turn, events in sorted(turns.items()):
        calls = [e for e in events if e.get("type") == "tool_call"]
        failed = any(
            e.get("type") in ("tool_error", "tool_not_run", "max_tool_calls_exceeded") for e in events
        )
        if calls:
            payload = _mapping(calls[0].get("payload")) or calls[0]
            name = payload.get("name") or payload.get("tool") or "tool"
            title = (
                f"turn {turn}: {name}({_inline_args(payload.get('arguments') or payload.get('input'), 40)})"
            )
        else:
            title = f"turn {turn}: " + ", ".join(str(e.get("type")) for e in events)
        results = [e for e in events if e.get("type") in ("tool_result", "tool_error")]
        if results:
            payload = results[-1].get("payload", results[-1])
            title += " → " + first_line(
                payload if isinstance(payload, str) else json.dumps(payload, default=str), 40
            )
        leaves = [
            Node(
                f"{key}/turn{turn}/{i}",
                f"{e.get('type')}",
                "bridge_event",
                style="red" if "error" in str(e.get("type")) or e.get("type") == "tool_not_run" else None,
                details=[Section(str(e.get("type")), "json", e)],
            )
            for i, e in enumerate(events)
        ]
        children.append(
            Node(
                f"{key}/turn{turn}",
                title,
                "turn",
                style="red" if failed else None,
                details=[Section(f"turn {turn}", "json", events)],
                children=leaves,
            )
        )
    label = f"{collection.id} · turns:{max(turns, default=0)} · events:{len(collection.bridge_events)}"
    return Node(
        key,
        label,
        "bridge",
        details=[Section("session", "json", {"session": collection.id[len("bridge:") :]})],
        children=children,
    )


# ---------------------------------------------------------------------------------------------------------------
# Groups and filters: the tree's top level


@dataclass(frozen=True)
class GroupKey:
    """A training step's rollouts (`scope` train), an evaluation's during training (`eval`, at `step`), or, for
    files that do not say their step, a policy version's."""

    scope: str
    step: int | None
    policy_version: int | None

    @property
    def key(self) -> str:
        return f"g:{self.scope}:" + (
            f"step{self.step}" if self.step is not None else f"v{self.policy_version}"
        )

    def newest_first(self) -> tuple[int, int, int]:
        # An evaluation at step n runs after training step n: it sorts above it.
        return (
            -1 if self.step is None else self.step,
            int(self.scope == "eval"),
            -1 if self.policy_version is None else self.policy_version,
        )


#: the terms a filter is written in, as the app's help and its error lines name them
FILTER_TERMS = (
    "reward>=X, reward<X, reward:A..B, outcome:KIND[,KIND], task:TEXT, label:TEXT, step:N or step:A..B"
)
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_COMPARISON = re.compile(rf"reward(<=|>=|<|>|=)({_NUMBER})")
_RANGE = re.compile(rf"(reward|step):({_NUMBER})?\.\.({_NUMBER})?")


@dataclass(frozen=True)
class RolloutFilter:
    """Which rollouts the tree shows: every term must hold (`reward>=0.5 outcome:error task:train:3`). A reward
    term never holds for a rollout still running."""

    text: str = ""
    tests: tuple[Callable[[CollectionState], bool], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.tests)

    def matches(self, collection: CollectionState) -> bool:
        return all(test(collection) for test in self.tests)


def parse_filter(text: str) -> RolloutFilter:
    """The filter `text` writes (terms separated by spaces; an empty text shows everything). A term it does not
    know raises ValueError naming it and the terms there are."""
    tests = [_filter_term(term) for term in text.split()]
    return RolloutFilter(" ".join(text.split()), tuple(tests))


def _filter_term(term: str) -> Callable[[CollectionState], bool]:
    lowered = term.lower()
    compared = _COMPARISON.fullmatch(lowered)
    if compared:
        operator, bound = compared.group(1), float(compared.group(2))
        holds = {
            "<": lambda r: r < bound,
            "<=": lambda r: r <= bound,
            ">": lambda r: r > bound,
            ">=": lambda r: r >= bound,
            "=": lambda r: r == bound,
        }[operator]
        return lambda c: c.reward is not None and holds(c.reward)
    ranged = _RANGE.fullmatch(lowered)
    if ranged:
        what, low, high = ranged.group(1), ranged.group(2), ranged.group(3)
        if low is None and high is None:
            raise ValueError(
                f"filter term {term!r} has no bound: write {what}:A..B, {what}:A.. or {what}:..B"
            )
        least = float(low) if low is not None else -math.inf
        most = float(high) if high is not None else math.inf

        def within(value: float | None) -> bool:
            return value is not None and least <= value <= most

        if what == "reward":
            return lambda c: within(c.reward)
        return lambda c: within(c.step)
    name, colon, value = term.partition(":")
    name = name.lower()
    if colon and value:
        wanted = value.lower()
        if name == "outcome":
            kinds = {kind for kind in wanted.split(",") if kind}
            return lambda c: c.outcome in kinds or (c.failure_kind or "").lower() in kinds
        if name == "task":
            return lambda c: any(wanted in text.lower() for text in _task_texts(c))
        if name == "label":
            return lambda c: c.label is not None and wanted in c.label.lower()
        if name == "step" and value.isdigit():
            return lambda c: c.step == int(value)
    raise ValueError(f"unknown filter term {term!r}: use {FILTER_TERMS}")


def _task_texts(collection: CollectionState) -> list[str]:
    """What `task:` looks in: the task ids and names of the rollout's trajectories."""
    info = collection.info()
    texts = [text for text in (info.name, info.task_id, info.environment) if text]
    for trajectory in collection.trajectories.values():
        task_id = _text(trajectory.task.get("id")) if isinstance(trajectory.task, Mapping) else None
        if task_id:
            texts.append(task_id)
    return texts


def _newest_first(collection: CollectionState) -> tuple[float, int]:
    return (-(collection.first_time or 0.0), -collection.arrival)


def view(
    collections: Iterable[CollectionState],
    nodes: Mapping[str, Node],
    rule: RolloutFilter | None = None,
) -> list[Node]:
    """The tree's top level: one node per training step (or evaluation, or policy version), newest first, each
    holding its rollouts that `rule` lets through, newest first and closed; then the rollouts that belong to no
    step, the same way. `nodes` holds each collection's node (`collection_node`). A view of one rollout outside
    training (`platoon rollout`) opens it."""
    grouped: dict[GroupKey, list[CollectionState]] = {}
    totals: dict[GroupKey, int] = {}
    loose: list[CollectionState] = []
    for collection in collections:
        if collection.id not in nodes:
            continue
        group = collection.group
        if group is not None:
            totals[group] = totals.get(group, 0) + 1
        if rule is not None and not rule.matches(collection):
            continue
        if group is None:
            loose.append(collection)
        else:
            grouped.setdefault(group, []).append(collection)
    top: list[Node] = []
    for group in sorted(grouped, key=GroupKey.newest_first, reverse=True):
        members = sorted(grouped[group], key=_newest_first)
        top.append(group_node(group, members, totals[group], [nodes[c.id] for c in members]))
    rollouts = [nodes[c.id] for c in sorted(loose, key=_newest_first)]
    if len(rollouts) == 1 and not grouped:  # one rollout (`platoon rollout`): shown open
        rollouts = [replace(rollouts[0], expand=True)]
    return top + rollouts


def group_node(group: GroupKey, members: list[CollectionState], total: int, children: list[Node]) -> Node:
    """`step 12 · policy v6 · 128 rollouts · reward avg 0.531 · error 2`: what the step's rollouts (those the filter
    lets through: `3 of 128 rollouts`) scored and how many ended otherwise than scored."""
    rewards = [c.reward for c in members if c.reward is not None]
    outcomes: dict[str, int] = {}
    for collection in members:
        outcomes[collection.outcome] = outcomes.get(collection.outcome, 0) + 1
    versions = sorted({c.policy_version for c in members if c.policy_version is not None})
    if group.scope == "eval":
        parts = [f"eval @ step {group.step}"]
    elif group.step is not None:
        parts = [f"step {group.step}"]
    else:
        parts = []
    if versions:
        low, high = versions[0], versions[-1]
        parts.append(f"policy v{low}" if low == high else f"policy v{low}-v{high}")
    count = len(members)
    parts.append(
        f"{count} rollout{'s' if count != 1 else ''}" if count == total else f"{count} of {total} rollouts"
    )
    mean = statistics.fmean(rewards) if rewards else None
    if mean is not None:
        parts.append(f"reward avg {mean:.3f}")
    parts += [f"{kind} {n}" for kind, n in sorted(outcomes.items()) if kind != "scored"]
    summary = {
        "scope": group.scope,
        "step": group.step,
        "policy_versions": versions,
        "rollouts": total,
        "shown": count,
        "reward": (
            {"avg": mean, "min": min(rewards), "max": max(rewards), "count": len(rewards)}
            if rewards
            else None
        ),
        "outcomes": outcomes,
        "tasks": len({c.info().name or c.info().task_id for c in members}),
        "labels": sorted({c.label for c in members if c.label}),
    }
    style = None if mean is None else "red" if mean <= 0 else "green" if mean >= 1 else "yellow"
    return Node(
        group.key,
        " · ".join(parts),
        "group",
        style=style,
        details=[Section("rollouts", "json", summary)],
        children=children,
    )


# ---------------------------------------------------------------------------------------------------------------
# Search


@dataclass
class SearchGroup:
    """Matches under one trajectory (or one collection's own nodes): its label and the matching keys."""

    key: str
    label: str
    hits: list[Node] = field(default_factory=list)


def search(roots: Iterable[Node], query: str) -> list[SearchGroup]:
    """Nodes whose label or details contain `query` (case-insensitive), grouped by the nearest trajectory (or
    collection) above them, in tree order."""
    needle = query.strip().lower()
    if not needle:
        return []
    groups: dict[str, SearchGroup] = {}
    for node, parents in walk(roots):
        if needle not in node.text().lower():
            continue
        owner = next(
            (
                p
                for p in reversed((*parents, node))
                if p.kind in ("trajectory", "verifier", "collection", "bridge")
            ),
            node,
        )
        group = groups.get(owner.key)
        if group is None:
            collection = parents[0] if parents else node
            title = (
                owner.label
                if owner is collection
                else f"{first_line(collection.label, 50)} / {first_line(owner.label, 40)}"
            )
            group = groups[owner.key] = SearchGroup(owner.key, title)
        group.hits.append(node)
    return list(groups.values())
