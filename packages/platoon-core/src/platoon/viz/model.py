"""What the trajectory viewer shows, without Textual: event records folded into collections of trajectories, and
those turned into a tree of `Node`s (labels, colours, the payload the details pane renders) and searched.

Applying a record is idempotent (a step is set at its `step_index`, a created trajectory replaces its earlier
self), so a file read twice — a tailed file replaced by an atomic rename, a replay restarted — shows the same tree.
Nodes carry stable keys (`c:<collection>/t:<trajectory>/steps/3`), so the app updates its widget in place rather
than rebuilding it and losing what the user expanded.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "BRIDGE_TYPES",
    "MODES",
    "TRAJECTORY_TYPES",
    "CollectionState",
    "EventModel",
    "Node",
    "SearchGroup",
    "Section",
    "TaskInfo",
    "TrajectoryState",
    "record_time",
    "search",
    "task_info",
    "walk",
]

TRAJECTORY_TYPES = frozenset(
    {"trajectory_created", "trajectory_task_set", "trajectory_step_added", "trajectory_finished"}
)
#: the ORS bridge's event log (harness.md 7.6): no collection, a `session` and a `time`
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


def one_line(value: Any, limit: int = 80) -> str:
    """`value` on one line, whitespace collapsed, cut to `limit` characters with an ellipsis."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


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
    """One rollout (a trajectory collection), or one ORS bridge session (`bridge:<session>`)."""

    id: str
    trajectories: dict[str, TrajectoryState] = field(default_factory=dict)
    bridge_events: list[dict[str, Any]] = field(default_factory=list)
    sources: set[str] = field(default_factory=set)

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


class EventModel:
    """Collections built from event records, in the order they first appeared."""

    def __init__(self) -> None:
        self.collections: dict[str, CollectionState] = {}

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
            collection = self._collection(f"bridge:{session}", source)
            collection.bridge_events.append(dict(record))
            return collection.id
        return None

    def _collection(self, cid: str, source: str) -> CollectionState:
        collection = self.collections.get(cid)
        if collection is None:
            collection = self.collections[cid] = CollectionState(cid)
        collection.sources.add(source)
        return collection

    def _apply_trajectory(self, kind: str, record: Mapping[str, Any], source: str) -> str | None:
        tid = record.get("trajectory_id")
        created = _mapping(record.get("trajectory"))
        tid = _text(tid) or _text(created.get("id"))
        if tid is None:
            return None
        collection = self._collection(str(record.get("collection_id")), source)
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
        """What a search looks through: the label and every section's content."""
        parts = [self.label]
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
    parts = ["collection:", *info.parts(with_goal=False)]
    parts = [parts[0] + " " + " · ".join([*parts[1:], f"trajs:solver={solvers},verifier={verifiers}"])]
    label = parts[0] + f" · id:{short_id(collection.id)}"
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
    }
    return Node(
        key,
        label,
        "collection",
        details=[Section("collection", "json", overview)],
        children=children,
        expand=True,
    )


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
    return Node(key, f"steps ({len(trajectory.steps)})", "steps", children=children, expand=True)


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
        expand=True,
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
