"""The two worlds and the shipped data: acceptance counts and hashes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import pytest

from platoon_textcraft.recipe_loader import DATA_DIR, RecipeDatabase
from platoon_textcraft.synth_recipe_generator import SynthRecipeDatabase
from platoon_textcraft.synth_recipe_loader import RECIPES_SHA256, load_synth_book, recipes_document
from platoon_textcraft.synth_tasks import load_synth_tasks, split_names
from platoon_textcraft.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def minecraft() -> RecipeDatabase:
    return RecipeDatabase()


def _fetch_script():
    spec = importlib.util.spec_from_file_location(
        "fetch_textcraft_data", ROOT / "scripts/fetch_textcraft_data.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_shipped_data_files_are_the_published_ones():
    fetch = _fetch_script()
    assert fetch.check(DATA_DIR) == []
    sums = (DATA_DIR / "SHA256SUMS").read_text().split()
    assert sums[1::2] == [
        "textcraft_train.jsonl",
        "textcraft_val.jsonl",
        "textcraft_synth_train.jsonl",
        "textcraft_synth_val.jsonl",
    ]
    assert [s[:8] for s in sums[0::2]] == ["007c8df7", "12252c6e", "685823fb", "84a123ee"]
    assert len(list((DATA_DIR / "recipes").glob("*.json"))) == 860


def test_minecraft_recipes_load_as_specified(minecraft):
    assert sum(len(r) for r in minecraft.recipes.values()) == 635
    assert len(minecraft.recipes) == 562
    assert len(minecraft.items) == 662
    assert len(minecraft.base_items) == 100
    assert len(minecraft.tags) == 16
    assert sum(1 for r in minecraft.recipes.values() if len(r) > 1) == 63
    assert max(minecraft.get_crafting_depth(i) for i in minecraft.items) == 7
    assert minecraft.get_crafting_depth("no_such_item") == 0


def test_minecraft_list_alternatives_are_dropped_and_two_tags_are_empty(minecraft):
    assert [r.ingredients for r in minecraft.get_recipes("torch")] == [{"stick": 1}]
    assert [r.ingredients for r in minecraft.get_recipes("sandstone_slab")] == [{}]
    assert minecraft.get_tag_members("tag:wooden_slabs") == []
    assert minecraft.get_tag_members("soul_fire_base_blocks") == []
    assert [t for t, members in minecraft.tags.items() if not members] == [
        "soul_fire_base_blocks",
        "wooden_slabs",
    ]


def test_minecraft_tag_members_come_from_name_patterns(minecraft):
    assert minecraft.get_tag_members("planks") == sorted(i for i in minecraft.items if i.endswith("_planks"))
    assert minecraft.get_tag_members("oak_logs") == ["oak_log"]  # stripped logs satisfy `logs` only
    assert "stripped_oak_log" in minecraft.get_tag_members("logs")
    assert minecraft.get_tag_members("coals") == ["coal"]
    assert minecraft.get_tag_members("stone_crafting_materials") == ["cobblestone", "smooth_stone", "stone"]
    assert minecraft.get_crafting_depth("oak_planks") == 0  # only a tag ingredient


def test_minecraft_recipes_of_one_item_keep_sorted_file_order(minecraft):
    recipes = minecraft.get_recipes("iron_ingot")
    assert [r.ingredients for r in recipes] == [{"iron_block": 1}, {"iron_nugget": 9}]


def test_the_synthetic_world_matches_its_acceptance_values():
    # the recipes document is byte-for-byte the pinned one
    book = load_synth_book()
    assert len(book.items) == 1452 and len(book.base_items) == 50 and len(book.recipes) == 1402
    document = recipes_document(book, "textcraft-synth").encode("ascii")
    assert len(document) == 154_513
    assert hashlib.sha256(document).hexdigest() == RECIPES_SHA256
    assert max(book.get_crafting_depth(i) for i in book.items) == 12


def test_the_synthetic_world_has_the_quirks_the_shipped_tasks_need():
    db = SynthRecipeDatabase.generate_all_recipes(seed=42, items_per_domain_tier=25)
    assert len(db.domain_items["metal"][0]) == 25 and len(set(db.domain_items["metal"][0])) == 10
    assert "a2_i1_22" in db.recipes  # a name that exists gets `_<i>` appended
    assert "m0_i6_6" in db.recipes  # tiers >= 6 repeat the tier
    cross = [name for name in db.recipes if name.startswith("x")]
    assert len(cross) == 12 and all(db.recipes[name].result_count == 1 for name in cross)
    used = {i for r in db.recipes.values() for i in r.ingredients}
    assert not used & set(cross)  # no recipe uses a cross-domain item
    # the CLI's default (8 per tier) is a different, smaller world
    assert len(SynthRecipeDatabase.generate_all_recipes(42, 8).recipes) < 1402


def test_every_gold_step_of_the_shipped_synth_tasks_is_a_recipe_of_the_world():
    book = load_synth_book()
    for split in ("train", "val"):
        for spec in load_synth_tasks(split):
            for step in spec["misc"]["gold_trajectory"]:
                item, crafts = step["target"]
                (recipe,) = book.get_recipes(item)
                assert step["result_count"] == recipe.result_count * crafts
                assert step["ingredients"] == {i: n * crafts for i, n in recipe.ingredients.items()}


def test_textcraft_task_files():
    train, val = load_tasks("train"), load_tasks("val")
    assert len(train) == 1000 and len(val) == 100
    assert [t["id"] for t in train] == [f"textcraft.train.{i}" for i in range(1000)]
    # val ids read textcraft.train.N, some repeated
    assert all(t["id"].startswith("textcraft.train.") for t in val)
    assert len({t["id"] for t in val}) == 92
    for spec in train + val:
        assert spec["max_steps"] == 50
        assert 1 <= len(spec["misc"]["target_items"]) <= 3
        assert all(1 <= n <= 3 for n in spec["misc"]["target_items"].values())


def test_synth_splits_are_exhaustive_enumerations():
    # each split holds every (item, count) pair of its pool exactly once
    expected = {"train": (2522, [588, 852, 544, 538]), "val": (632, [147, 213, 136, 136])}
    for split, (total, per_difficulty) in expected.items():
        specs = load_synth_tasks(split)
        assert len(specs) == total
        assert [t["id"] for t in specs] == [f"textcraft_synth.{split}.{i}" for i in range(total)]
        counts = Counter(t["misc"]["difficulty"] for t in specs)
        assert [counts[d] for d in ("easy", "medium", "hard", "extreme")] == per_difficulty
        pairs = Counter(tuple(next(iter(t["misc"]["target_items"].items()))) for t in specs)
        assert max(pairs.values()) == 1
        assert all(t["max_steps"] == 75 and len(t["misc"]["target_items"]) == 1 for t in specs)
    train_targets = {next(iter(t["misc"]["target_items"])) for t in load_synth_tasks("train")}
    val_targets = {next(iter(t["misc"]["target_items"])) for t in load_synth_tasks("val")}
    assert not train_targets & val_targets


def test_synth_gold_lengths():
    lengths = {d: [] for d in ("easy", "medium", "hard", "extreme")}
    for spec in load_synth_tasks("train"):
        lengths[spec["misc"]["difficulty"]].append(len(spec["misc"]["gold_trajectory"]))
    summary = {d: (min(v), statistics.median_low(v), max(v)) for d, v in lengths.items()}
    assert summary == {
        "easy": (1, 3, 10),
        "medium": (4, 18, 59),
        "hard": (26, 88, 141),
        "extreme": (103, 173, 549),
    }


def test_difficulty_splits_filter_the_base_file_in_order():
    assert split_names() == [
        "train", "val",
        "train-easy", "train-medium", "train-hard", "train-extreme",
        "val-easy", "val-medium", "val-hard", "val-extreme",
    ]  # fmt: skip
    medium = load_synth_tasks("train-medium")
    assert len(medium) == 852 and medium[0]["id"] == "textcraft_synth.train.0"
    assert [t["id"] for t in medium] == [
        t["id"] for t in load_synth_tasks("train") if t["misc"]["difficulty"] == "medium"
    ]
    with pytest.raises(ValueError, match="Unknown TextCraftSynthEnvironment split 'test'"):
        load_synth_tasks("test")
    json.dumps(medium)  # plain JSON values
