"""TextCraft's task files: the shipped train (1,000) and val (100) specs, loaded in file order.

A spec is `{"goal", "id", "max_steps", "misc": {"target_items", "initial_inventory", "gold_trajectory"}}`. The
val file's ids read `textcraft.train.N` (the generator assigned ids before splitting): address tasks by
`<split>:<index>`, never by id. The shipped files are the source of truth and are never regenerated.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from platoon_textcraft.recipe_loader import DATA_DIR

__all__ = ["GOAL_PREFIX", "SPLIT_FILES", "format_goal", "load_tasks", "parse_goal", "read_jsonl"]

GOAL_PREFIX = "Craft the following items:"
SPLIT_FILES = {"train": "textcraft_train.jsonl", "val": "textcraft_val.jsonl"}
_TARGET = re.compile(r"(\d+)x ([a-z0-9_]+)")


@functools.cache
def read_jsonl(path: Path) -> tuple[dict[str, Any], ...]:
    """Every JSON line of `path` (blank lines skipped), parsed once per process."""
    with path.open(encoding="utf-8") as handle:
        return tuple(json.loads(line) for line in handle if line.strip())


def load_tasks(split: str) -> list[dict[str, Any]]:
    """The specs of split `train` or `val`, in file order (fresh copies: callers may change them)."""
    if split not in SPLIT_FILES:
        raise ValueError(f"Unknown TextCraftEnvironment split {split!r}; known: {list(SPLIT_FILES)}")
    return json.loads(json.dumps(read_jsonl(DATA_DIR / SPLIT_FILES[split])))


def format_goal(targets: dict[str, int]) -> str:
    """`Craft the following items: 2x stick, 1x oak_planks` (insertion order)."""
    return f"{GOAL_PREFIX} " + ", ".join(f"{count}x {item}" for item, count in targets.items())


def parse_goal(goal: str) -> dict[str, int]:
    """The targets of a goal: every `<digits>x <name>` after the prefix, on its first line only.

    Only the first line is read, so the parent's context that core appends to a child's goal is never parsed.
    """
    first = goal.strip().split("\n", 1)[0]
    if GOAL_PREFIX in first:
        first = first.split(GOAL_PREFIX, 1)[1]
    targets: dict[str, int] = {}
    for count, item in _TARGET.findall(first):
        targets[item] = int(count)
    return targets
