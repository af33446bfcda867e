"""`Task`, `SubTask` and the trajectory types: prompt text, forks, JSON-safe dicts."""

from __future__ import annotations

import enum
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from platoon.harness.agent import AgentResult, LaunchFailure
from platoon.task import SubTask, Task
from platoon.trajectory import ParentInfo, Trajectory, TrajectoryCollection, TrajectoryStep


def test_task_text() -> None:
    assert str(Task("Craft a stick.")) == "Your Goal: Craft a stick."
    assert str(Task("Craft a stick.", max_steps=0)) == "Your Goal: Craft a stick."
    assert str(Task("Craft a stick.", max_steps=7)) == (
        "Your Goal: Craft a stick.\nBudget: You have a total budget of 7 steps to complete this task."
    )


def test_task_defaults() -> None:
    task = Task()
    assert (task.goal, task.id, task.max_steps, task.misc, task.fork_strategy) == (
        None,
        None,
        None,
        {},
        "subtask",
    )
    assert Task().misc is not task.misc
    with pytest.raises(ValueError, match="fork_strategy"):
        Task(fork_strategy="tree")  # type: ignore[arg-type]


def test_subtask_fork_carries_the_goal_stack() -> None:
    root = Task("root goal", id="root", max_steps=30, misc={"env": "x"})
    child = root.fork("child goal", 10)
    assert isinstance(child, SubTask)
    assert child.parent_tasks == [root]
    assert str(uuid.UUID(child.id or "")) == child.id and child.id != root.id
    assert child.misc is root.misc
    assert child.max_steps == 10
    grandchild = child.fork("grandchild goal", task_misc={"own": True})
    assert isinstance(grandchild, SubTask)
    assert grandchild.parent_tasks == [root, child]
    assert grandchild.misc == {"own": True}
    assert str(grandchild) == (
        "Your Goal: grandchild goal\n"
        "\n"
        "For additional context, here are the parent tasks in the stack so far (most recent first):\n"
        "Level 2: child goal\n"
        "\n"
        "Level 1: root goal"
    )
    assert str(child) == (
        "Your Goal: child goal\nBudget: You have a total budget of 10 steps to complete this task.\n"
        "\n"
        "For additional context, here are the parent tasks in the stack so far (most recent first):\n"
        "Level 1: root goal"
    )


def test_subtask_without_parents() -> None:
    assert str(SubTask("alone")) == (
        "Your Goal: alone\n\n"
        "For additional context, here are the parent tasks in the stack so far (most recent first):\n"
        "No parent tasks. This is the root task."
    )


def test_task_strategy_forks_plain_tasks() -> None:
    root = Task("root", fork_strategy="task")
    child = root.fork("child", 5)
    assert type(child) is Task
    assert child.fork_strategy == "task" and child.goal == "child" and child.max_steps == 5
    assert child.id != root.id and child.id is not None
    assert str(child) == "Your Goal: child\nBudget: You have a total budget of 5 steps to complete this task."


def test_two_forks_get_distinct_ids() -> None:
    root = Task("root")
    assert root.fork("a").id != root.fork("a").id


def test_task_from_dict_round_trip() -> None:
    assert Task.from_dict({"goal": "g", "id": "1", "max_steps": 3, "misc": {"k": 1}}) == Task(
        "g", "1", 3, {"k": 1}
    )
    grandchild = Task("root", id="r").fork("child").fork("grandchild")
    data = Trajectory("t", task=grandchild).to_dict()["task"]
    rebuilt = Task.from_dict(data)
    assert isinstance(rebuilt, SubTask)
    assert rebuilt == grandchild
    assert str(rebuilt) == str(grandchild)
    with pytest.raises(TypeError):
        Task.from_dict({"goal": "g", "unknown": 1})


def test_trajectory_defaults() -> None:
    trajectory = Trajectory("t1")
    assert trajectory.task is None and trajectory.parent_info is None
    assert trajectory.steps == [] and trajectory.reward == 0.0 and trajectory.misc == {}
    assert trajectory.finish_message is None and trajectory.error_message is None
    assert TrajectoryStep().misc == {}
    assert ParentInfo("p", 3) == ParentInfo(id="p", fork_step=3)


def test_collection_gets_a_uuid_id_and_keeps_the_root_first() -> None:
    a, b = TrajectoryCollection(), TrajectoryCollection()
    assert a.id != b.id and str(uuid.UUID(a.id)) == a.id
    assert a.trajectories == {} and a.root is None
    root, child = Trajectory("root"), Trajectory("child", parent_info=ParentInfo("root", 0))
    collection = TrajectoryCollection("r1", {"root": root, "child": child})
    assert collection.root is root
    assert list(collection.to_dict()["trajectories"]) == ["root", "child"]


class _Color(enum.Enum):
    RED = "red"


class _FakeModel:
    """Shaped like a pydantic model: a class-level `model_fields` and `model_dump(mode=...)`."""

    model_fields = {"x": None}

    def __init__(self) -> None:
        self.modes: list[str] = []

    def model_dump(self, *, mode: str = "python") -> dict[str, object]:
        self.modes.append(mode)
        return {"x": 1, "when": "2025-01-01T00:00:00"}


@dataclass
class _Holder:
    value: object


def test_to_dict_is_json_safe() -> None:
    model = _FakeModel()
    misc_in: dict[Any, Any] = {
        "action_misc": {"completion_id": "c1", "usage": (1, 2)},
        "reward_misc": {"reward/success": 1.0},
        "model": model,
        "path": Path("/tmp/x"),
        "color": _Color.RED,
        "status": AgentResult("limit").status,
        "launch": LaunchFailure("Failed to launch"),
        "result": AgentResult("error", error="E: x"),
        "ids": {3},
        7: "int key",
    }
    step = TrajectoryStep(misc=misc_in)
    task = Task("root", id="r").fork("child")
    trajectory = Trajectory(
        "t",
        task=task,
        parent_info=ParentInfo("p", 2),
        steps=[step],
        reward=1.0,
        finish_message="done",
        misc={"outcome": {"status": "scored"}},
    )
    collection = TrajectoryCollection("rid", {"t": trajectory})
    data = collection.to_dict()
    json.dumps(data)  # no TypeError
    assert model.modes == ["json"]
    misc = data["trajectories"]["t"]["steps"][0]["misc"]
    assert misc["model"] == {"x": 1, "when": "2025-01-01T00:00:00"}
    assert misc["path"] == "/tmp/x"
    assert misc["color"] == str(_Color.RED)
    assert misc["status"] == "limit" and type(misc["status"]) is str
    assert type(misc["launch"]) is str and misc["launch"] == "Failed to launch"
    assert misc["result"] == {"status": "error", "final_message": None, "error": "E: x"}
    assert misc["action_misc"]["usage"] == [1, 2]
    assert misc["ids"] == [3]
    assert misc["7"] == "int key"
    parent = data["trajectories"]["t"]["parent_info"]
    assert parent == {"id": "p", "fork_step": 2}
    assert data["trajectories"]["t"]["task"]["parent_tasks"][0]["goal"] == "root"
    assert data["id"] == "rid"


def test_to_dict_walks_dataclasses_without_copying() -> None:
    class NoCopy:
        def __deepcopy__(self, memo: object) -> NoCopy:
            raise AssertionError("to_dict must not deep-copy")

        def __str__(self) -> str:
            return "no-copy"

    data = Trajectory("t", misc={"holder": _Holder(NoCopy())}).to_dict()
    assert data["misc"] == {"holder": {"value": "no-copy"}}


def test_to_dict_survives_a_reference_cycle() -> None:
    loop: dict[str, object] = {}
    loop["self"] = loop
    data = Trajectory("t", misc={"loop": loop}).to_dict()
    json.dumps(data)


def test_collection_from_dict_round_trip() -> None:
    root = Trajectory(
        "root", task=Task("g", id="0"), steps=[TrajectoryStep({"reward_misc": {"reward/success": 1}})]
    )
    child = Trajectory("child", task=root.task.fork("sub"), parent_info=ParentInfo("root", 0), reward=0.5)  # type: ignore[union-attr]
    collection = TrajectoryCollection("rid", {"root": root, "child": child})
    rebuilt = TrajectoryCollection.from_dict(json.loads(json.dumps(collection.to_dict())))
    assert rebuilt == collection
    assert list(rebuilt.trajectories) == ["root", "child"]
