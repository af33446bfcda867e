"""TextCraft's task files: the shipped train (1,000) and val (100) specs, loaded in file order.

A spec is `{"goal", "id", "max_steps", "misc": {"target_items", "initial_inventory", "gold_trajectory"}}`. The
val file's ids read `textcraft.train.N` (the generator assigned ids before splitting): address tasks by
`<split>:<index>`, never by id. The shipped files are the source of truth and are never regenerated.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import re
from pathlib import Path
from typing import Any

from platoon_textcraft.recipe_loader import DATA_DIR, TAG_PREFIX, RecipeBook, RecipeDatabase

__all__ = [
    "GOAL_PREFIX",
    "SPLIT_FILES",
    "base_needs",
    "create_textcraft_datasets",
    "format_goal",
    "load_tasks",
    "parse_goal",
    "read_jsonl",
    "solve",
]

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


# -- generation (the shipped files were made by an earlier run and are never regenerated) ---------------------


def _first_member(book: RecipeBook, name: str) -> str:
    members = book.get_tag_members(name)
    return members[0] if members else name


def base_needs(
    book: RecipeBook,
    item: str,
    count: int,
    needs: dict[str, int],
    *,
    yields: bool = True,
    path: frozenset[str] = frozenset(),
) -> None:
    """Add to `needs` the base materials that make `count` of `item` through first recipes (a tag: its first member).

    With `yields=False` every output is counted as one craft (TextCraft-Synth's generous inventories). An item met
    again on its own path (`iron_ingot` <- `iron_block` <- `iron_ingot`) is needed as it is, not crafted.
    """
    recipes = book.get_recipes(item)
    if not recipes or item in path:
        needs[item] = needs.get(item, 0) + count
        return
    recipe = recipes[0]
    crafts = math.ceil(count / recipe.result_count) if yields else count
    for name, amount in recipe.ingredients.items():
        if name.startswith(TAG_PREFIX):
            name = _first_member(book, name)
        base_needs(book, name, amount * crafts, needs, yields=yields, path=path | {item})


def solve(book: RecipeBook, targets: dict[str, int], inventory: dict[str, int]) -> list[dict[str, Any]]:
    """A gold trajectory: replay first recipes depth first on a copy of `inventory` until every target is gained.

    Steps are `{"action": "craft", "target": [item, crafts], "ingredients": {...}, "result_count": total}`; a tag
    ingredient names the first member held in enough quantity (or stays `tag:X` when none is).
    """
    held = dict(inventory)
    steps: list[dict[str, Any]] = []

    def make(item: str, count: int, path: frozenset[str] = frozenset()) -> None:
        recipe = book.get_recipes(item)[0]
        crafts = math.ceil(count / recipe.result_count)
        used: dict[str, int] = {}
        # Making one ingredient can consume another's stock (shared intermediates): pass until none is short.
        for _ in range(len(recipe.ingredients) + 1):
            used, made = {}, False
            for name, amount in recipe.ingredients.items():
                need = amount * crafts
                if name.startswith(TAG_PREFIX):
                    members = book.get_tag_members(name)
                    chosen = next((m for m in members if held.get(m, 0) >= need and m not in used), None)
                    if chosen is None and members and book.can_craft(members[0]) and members[0] not in path:
                        chosen = members[0]  # the member base_needs planned for: craft what is short
                        make(chosen, need - held.get(chosen, 0), path | {item})
                        made = True
                    name = chosen or name
                elif held.get(name, 0) < need and book.can_craft(name) and name not in path | {item}:
                    make(name, need - held.get(name, 0), path | {item})
                    made = True
                used[name] = need
            if not made:
                break
        for name, need in used.items():
            held[name] = held.get(name, 0) - need
        held[item] = held.get(item, 0) + recipe.result_count * crafts
        steps.append(
            {
                "action": "craft",
                "target": [item, crafts],
                "ingredients": used,
                "result_count": recipe.result_count * crafts,
            }
        )

    for item, count in targets.items():
        make(item, count)
    return steps


def create_textcraft_datasets(
    seed: int = 42,
    num_samples_train: int = 10000,
    num_samples_val: int = 1000,
    min_depth: int = 2,
    max_depth: int = 5,
    min_target_items: int = 1,
    max_target_items: int = 3,
    book: RecipeBook | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Generate TextCraft train and val specs (ids are assigned before the split, as in the shipped files)."""
    book = book or RecipeDatabase()
    rng = random.Random(seed)
    pool = sorted(i for i in book.items if min_depth <= book.get_crafting_depth(i) <= max_depth)
    bases = sorted(book.base_items)
    total = num_samples_train + num_samples_val
    train: list[dict[str, Any]] = []
    val: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    attempts = 0
    while len(train) + len(val) < total and attempts < total * 20:
        attempts += 1
        chosen = rng.sample(pool, rng.randint(min_target_items, min(max_target_items, len(pool))))
        targets = {item: rng.randint(1, 3) for item in chosen}
        needs: dict[str, int] = {}
        for item, count in targets.items():
            base_needs(book, item, count, needs)
        inventory = {item: n + rng.randint(0, max(1, n // 2)) for item, n in needs.items()}
        for item in rng.sample(bases, rng.randint(2, 5)):
            inventory[item] = inventory.get(item, 0) + rng.randint(1, 5)
        key = (tuple(sorted(targets.items())), tuple(sorted(inventory.items())))
        if key in seen:
            continue
        seen.add(key)
        spec = {
            "goal": format_goal(targets),
            "id": f"textcraft.train.{len(seen) - 1}",
            "max_steps": 50,
            "misc": {
                "target_items": targets,
                "initial_inventory": inventory,
                "gold_trajectory": solve(book, targets, inventory),
            },
        }
        # Python's salted hash of the targets decides the split, as the shipped files were made
        to_val = hash(key[0]) % total < num_samples_val
        if (to_val and len(val) < num_samples_val) or len(train) >= num_samples_train:
            val.append(spec)
        else:
            train.append(spec)
    return train, val


def write_jsonl(path: Path, specs: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(spec) + "\n" for spec in specs), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m platoon_textcraft.tasks",
        description="Generate TextCraft task files (never into the package).",
    )
    parser.add_argument("--num_samples", type=int, default=10000)
    parser.add_argument("--eval_size", type=int, default=1000)
    parser.add_argument("--min_depth", type=int, default=2)
    parser.add_argument("--max_depth", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.out.resolve() == DATA_DIR.resolve():
        parser.error(
            "--out must not be the package's data directory (the shipped files are the source of truth)"
        )
    train, val = create_textcraft_datasets(
        args.seed, args.num_samples, args.eval_size, args.min_depth, args.max_depth
    )
    write_jsonl(args.out / SPLIT_FILES["train"], train)
    write_jsonl(args.out / SPLIT_FILES["val"], val)
    print(f"wrote {len(train)} train and {len(val)} val tasks to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
