"""Tasks: the goal an agent works on, and the subtasks children get by forking it.

`str(task)` is the text harnesses put in prompts; it is byte-identical to platoon 0.1's so trained models see the
prompts they were trained on.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ForkStrategy", "SubTask", "Task"]

ForkStrategy = Literal["task", "subtask"]

_FORK_STRATEGIES = ("task", "subtask")


@dataclass
class Task:
    """A task: a goal, an id, an optional step budget and free-form `misc`.

    `fork_strategy` decides what `fork` makes: `subtask` (default) a `SubTask` that carries the parent goal stack,
    `task` a plain `Task`.
    """

    goal: str | None = None
    id: str | None = None
    max_steps: int | None = None
    misc: dict[str, Any] = field(default_factory=dict)
    fork_strategy: ForkStrategy = "subtask"

    def __post_init__(self) -> None:
        if self.fork_strategy not in _FORK_STRATEGIES:
            raise ValueError(f"fork_strategy must be 'task' or 'subtask'; got {self.fork_strategy!r}")

    def __str__(self) -> str:
        text = f"Your Goal: {self.goal}"
        if self.max_steps:
            text += f"\nBudget: You have a total budget of {self.max_steps} steps to complete this task."
        return text

    def fork(self, goal: str, max_steps: int | None = None, task_misc: dict[str, Any] | None = None) -> Task:
        """A child task for `goal` with a fresh uuid id; it shares this task's misc unless `task_misc` is given."""
        misc = self.misc if task_misc is None else task_misc
        task_id = str(uuid.uuid4())
        if self.fork_strategy == "task":
            return Task(goal=goal, id=task_id, max_steps=max_steps, misc=misc, fork_strategy="task")
        return SubTask(
            goal=goal, id=task_id, max_steps=max_steps, misc=misc, parent_tasks=[*self._ancestors(), self]
        )

    def _ancestors(self) -> list[Task]:
        return []

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        """Rebuild a task from its dict form (as `Trajectory.to_dict` writes it); a `parent_tasks` key makes a SubTask."""
        if "parent_tasks" in data or cls is SubTask:
            return SubTask._from_mapping(data)
        return cls(**dict(data))


@dataclass
class SubTask(Task):
    """A forked task that remembers its ancestors, root first, and lists their goals in its text."""

    parent_tasks: list[Task] = field(default_factory=list)

    def __str__(self) -> str:
        header = (
            "For additional context, here are the parent tasks in the stack so far (most recent first):\n"
        )
        if self.parent_tasks:
            depth = len(self.parent_tasks)
            levels = [
                f"Level {depth - i}: {parent.goal}" for i, parent in enumerate(reversed(self.parent_tasks))
            ]
            stack = header + "\n\n".join(levels)
        else:
            stack = header + "No parent tasks. This is the root task."
        return f"{super().__str__()}\n\n{stack}"

    def _ancestors(self) -> list[Task]:
        return list(self.parent_tasks)

    @classmethod
    def _from_mapping(cls, data: Mapping[str, Any]) -> SubTask:
        values = dict(data)
        parents = values.pop("parent_tasks", None) or []
        values["parent_tasks"] = [p if isinstance(p, Task) else Task.from_dict(p) for p in parents]
        return cls(**values)
