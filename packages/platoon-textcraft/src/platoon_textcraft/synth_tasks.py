"""TextCraft-Synth's task files: train (2,522) and val (632), and their difficulty splits.

Each shipped split holds every (item, count) pair of its target pool exactly once; `misc` adds `difficulty`,
`max_depth` (the target's tier) and `num_craft_steps`. A `<split>-<difficulty>` split is the base file filtered by
`misc.difficulty` in file order, so its indices count within the filtered list (`train-medium:0` is
`textcraft_synth.train.0`). The shipped files are the source of truth and are never regenerated.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from platoon_textcraft.recipe_loader import DATA_DIR
from platoon_textcraft.synth_recipe_generator import SynthRecipeDatabase
from platoon_textcraft.synth_recipe_loader import ITEMS_PER_DOMAIN_TIER, book_from_database
from platoon_textcraft.tasks import base_needs, format_goal, read_jsonl, solve, write_jsonl

__all__ = [
    "BASE_SPLITS",
    "DIFFICULTIES",
    "SHARES",
    "SPLIT_FILES",
    "create_synth_datasets",
    "load_synth_tasks",
    "split_names",
]

SPLIT_FILES = {"train": "textcraft_synth_train.jsonl", "val": "textcraft_synth_val.jsonl"}
BASE_SPLITS = tuple(SPLIT_FILES)
#: difficulty -> target depths
DIFFICULTIES = {"easy": (2, 3), "medium": (4, 6), "hard": (7, 9), "extreme": (10, 12)}
#: default share of each difficulty among the wanted tasks (the remainder goes to medium)
SHARES = {"easy": 0.25, "medium": 0.35, "hard": 0.25, "extreme": 0.15}
_MAX_COUNT = {"easy": 3, "medium": 3, "hard": 2, "extreme": 2}


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


def create_synth_datasets(
    seed: int = 42,
    num_train: int = 2000,
    num_val: int = 500,
    shares: dict[str, float] | None = None,
    val_item_fraction: float = 0.2,
    items_per_domain_tier: int = ITEMS_PER_DOMAIN_TIER,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Generate TextCraft-Synth train and val specs with disjoint target items.

    Each tier's items are shuffled and the last `val_item_fraction` become val-only targets; tasks are drawn per
    difficulty (30 attempts per wanted task) and deduplicated by (item, count). The distractor base items come
    from a Python set, so reruns differ unless the string hash seed is fixed: the shipped files stay the truth.
    """
    shares = shares or SHARES
    db = SynthRecipeDatabase.generate_all_recipes(
        42, items_per_domain_tier
    )  # the world uses the global random
    book = book_from_database(db)
    rng = random.Random(seed)
    pools: dict[str, dict[int, list[str]]] = {"train": {}, "val": {}}
    for tier in range(2, 13):
        items = sorted(set(db.tier_items.get(tier, [])))
        rng.shuffle(items)
        cut = len(items) - int(len(items) * val_item_fraction)
        pools["train"][tier], pools["val"][tier] = items[:cut], items[cut:]
    out: dict[str, list[dict[str, Any]]] = {}
    for split, wanted_total in (("train", num_train), ("val", num_val)):
        wanted = {d: int(wanted_total * shares.get(d, 0)) for d in DIFFICULTIES}
        wanted["medium"] += wanted_total - sum(wanted.values())
        specs: list[dict[str, Any]] = []
        for difficulty, (low, high) in DIFFICULTIES.items():
            candidates = [i for t in range(low, high + 1) for i in pools[split].get(t, [])]
            seen: set[tuple[str, int]] = set()
            for _ in range(wanted[difficulty] * 30):
                if len(seen) >= wanted[difficulty] or not candidates:
                    break
                item, count = rng.choice(candidates), rng.randint(1, _MAX_COUNT[difficulty])
                if (item, count) in seen:
                    continue
                seen.add((item, count))
                needs: dict[str, int] = {}
                base_needs(book, item, count, needs, yields=False)
                inventory = {b: n + rng.randint(0, n // 2) for b, n in needs.items()}
                for extra in rng.sample(sorted(set(db.base_items) - set(needs)), rng.randint(1, 3)):
                    inventory[extra] = rng.randint(1, 5)
                gold = solve(book, {item: count}, inventory)
                specs.append(
                    {
                        "goal": format_goal({item: count}),
                        "id": "",
                        "max_steps": 75,
                        "misc": {
                            "target_items": {item: count},
                            "initial_inventory": inventory,
                            "gold_trajectory": gold,
                            "difficulty": difficulty,
                            "max_depth": db.depths[item],
                            "num_craft_steps": len(gold),
                        },
                    }
                )
        random.Random(seed + 1).shuffle(specs)
        for index, spec in enumerate(specs):
            spec["id"] = f"textcraft_synth.{split}.{index}"
        out[split] = specs
    return out["train"], out["val"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m platoon_textcraft.synth_tasks",
        description="Generate TextCraft-Synth task files (never into the package).",
    )
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--num-val", type=int, default=500)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.out.resolve() == DATA_DIR.resolve():
        parser.error(
            "--out must not be the package's data directory (the shipped files are the source of truth)"
        )
    train, val = create_synth_datasets(args.seed, args.num_train, args.num_val)
    write_jsonl(args.out / SPLIT_FILES["train"], train)
    write_jsonl(args.out / SPLIT_FILES["val"], val)
    print(f"wrote {len(train)} train and {len(val)} val tasks to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
