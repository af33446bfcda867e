"""TextCraft-Synth's task files: train (2,522) and val (632), and their difficulty splits.

Each shipped split holds every (item, count) pair of its target pool exactly once; `misc` adds `difficulty`,
`max_depth` (the target's tier) and `num_craft_steps`. A `<split>-<difficulty>` split is the base file filtered by
`misc.difficulty` in file order, so its indices count within the filtered list (`train-medium:0` is
`textcraft_synth.train.0`). The shipped files are the source of truth and are never regenerated.
"""

from __future__ import annotations

import json
from typing import Any

from platoon_textcraft.recipe_loader import DATA_DIR
from platoon_textcraft.tasks import read_jsonl

__all__ = ["BASE_SPLITS", "DIFFICULTIES", "SPLIT_FILES", "load_synth_tasks", "split_names"]

SPLIT_FILES = {"train": "textcraft_synth_train.jsonl", "val": "textcraft_synth_val.jsonl"}
BASE_SPLITS = tuple(SPLIT_FILES)
#: difficulty -> target depths
DIFFICULTIES = {"easy": (2, 3), "medium": (4, 6), "hard": (7, 9), "extreme": (10, 12)}


def split_names() -> list[str]:
    """`train`, `val`, then each base split's difficulty splits."""
    return [*BASE_SPLITS, *(f"{base}-{difficulty}" for base in BASE_SPLITS for difficulty in DIFFICULTIES)]


def load_synth_tasks(split: str) -> list[dict[str, Any]]:
    """The specs of `split` (a base split or `<base>-<difficulty>`), in file order, as fresh copies."""
    base, _, difficulty = split.partition("-")
    if split not in split_names():
        raise ValueError(f"Unknown TextCraftSynthEnvironment split {split!r}; known: {split_names()}")
    specs = read_jsonl(DATA_DIR / SPLIT_FILES[base])
    if difficulty:
        specs = tuple(s for s in specs if s["misc"].get("difficulty") == difficulty)
    return json.loads(json.dumps(specs))
