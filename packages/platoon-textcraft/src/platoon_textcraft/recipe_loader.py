"""Recipe books: `RecipeBook` (what the environment asks of a world) and `RecipeDatabase` (Minecraft's recipes).

`RecipeDatabase(recipes_dir)` reads Minecraft: Java Edition 1.16.5's recipe JSON files in sorted file-name order
(so recipe numbering is the same on every machine). Only `minecraft:crafting_shaped` and
`minecraft:crafting_shapeless` recipes load; a file that fails to parse is skipped. An ingredient given as a list
of alternatives is dropped, as the shipped tasks were generated that way (so `torch` needs only `stick` and
`sandstone_slab` has no ingredients). Tag members come from item-name patterns, never from recipe results.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DATA_DIR", "RECIPES_DIR", "Recipe", "RecipeBook", "RecipeDatabase"]

DATA_DIR = Path(__file__).resolve().parent / "data"
RECIPES_DIR = DATA_DIR / "recipes"
TAG_PREFIX = "tag:"
_CRAFTING_TYPES = ("minecraft:crafting_shaped", "minecraft:crafting_shapeless")


@dataclass(frozen=True)
class Recipe:
    """`result_count` of `result` from `ingredients` (name or `tag:<name>` -> amount, in recipe order)."""

    result: str
    result_count: int
    ingredients: dict[str, int]


@dataclass
class RecipeBook:
    """A world's recipes: each item's recipes in load order, base items, tag members and crafting depths.

    `depths` holds stored depths (TextCraft-Synth stores each item's tier); when it is None depths are computed
    from the recipes, ignoring tags.
    """

    recipes: dict[str, list[Recipe]] = field(default_factory=dict)
    items: set[str] = field(default_factory=set)
    tags: dict[str, list[str]] = field(default_factory=dict)
    depths: dict[str, int] | None = None

    @property
    def base_items(self) -> set[str]:
        return {item for item in self.items if item not in self.recipes}

    def can_craft(self, item: str) -> bool:
        return bool(self.recipes.get(item))

    def is_base_item(self, item: str) -> bool:
        return item in self.items and item not in self.recipes

    def get_recipes(self, item: str) -> list[Recipe]:
        return list(self.recipes.get(item, ()))

    def get_tag_members(self, tag: str) -> list[str]:
        """The members of `tag` (with or without the `tag:` prefix), sorted; an unknown tag has none."""
        return list(self.tags.get(tag.removeprefix(TAG_PREFIX), ()))

    def get_crafting_depth(self, item: str) -> int:
        """0 for base or unknown items; else the longest chain of non-tag ingredients below it (a cycle counts 0)."""
        if self.depths is not None:
            return self.depths.get(item, 0)
        memo: dict[str, int] = self.__dict__.setdefault("_depth_memo", {})
        if item not in memo:
            memo[item] = _depth(self, item, set())
        return memo[item]


def _depth(book: RecipeBook, item: str, visited: set[str]) -> int:
    # `visited` is shared by the whole walk from the top item, not just the current path: an item met once
    # counts 0 when met again. That is the rule the shipped tasks were generated with (greatest depth 7; a
    # longest-simple-path depth would reach 8 through the ingot/nugget/block cycles).
    if item in visited or not book.recipes.get(item):
        return 0
    visited.add(item)
    depth = 0
    for recipe in book.recipes[item]:
        for ingredient in recipe.ingredients:
            if not ingredient.startswith(TAG_PREFIX):
                depth = max(depth, _depth(book, ingredient, visited) + 1)
    return depth


class RecipeDatabase(RecipeBook):
    """Minecraft's crafting recipes, loaded from a directory of recipe JSON files (default: the shipped 860)."""

    def __init__(self, recipes_dir: str | Path = RECIPES_DIR) -> None:
        super().__init__()
        self.recipes_dir = Path(recipes_dir)
        tag_names: set[str] = set()
        for path in sorted(self.recipes_dir.glob("*.json")):
            try:
                document = json.loads(path.read_text(encoding="utf-8"))
                recipe = _parse(document)
            except (ValueError, TypeError, KeyError, AttributeError, IndexError, OSError):
                continue
            if recipe is None:
                continue
            self.recipes.setdefault(recipe.result, []).append(recipe)
            self.items.add(recipe.result)
            for ingredient in recipe.ingredients:
                if ingredient.startswith(TAG_PREFIX):
                    tag_names.add(ingredient.removeprefix(TAG_PREFIX))
                else:
                    self.items.add(ingredient)
        self.tags = {tag: sorted(_tag_members(tag, self.items)) for tag in sorted(tag_names)}


def _name(value: str) -> str:
    return value.split(":", 1)[1] if ":" in value else value


def _ingredient(entry: Any) -> str | None:
    """`item`, `tag:<name>`, or None for a list of alternatives (dropped) or anything unrecognised."""
    if isinstance(entry, dict):
        if "item" in entry:
            return _name(entry["item"])
        if "tag" in entry:
            return TAG_PREFIX + _name(entry["tag"])
    return None


def _parse(document: dict[str, Any]) -> Recipe | None:
    kind = document.get("type")
    if kind not in _CRAFTING_TYPES:
        return None
    result = document["result"]
    if isinstance(result, dict):
        item, count = _name(result["item"]), int(result.get("count", 1))
    elif isinstance(result, list):
        first = result[0]
        item, count = (
            (_name(first["item"]), int(first.get("count", 1)))
            if isinstance(first, dict)
            else (_name(first), 1)
        )
    else:
        item, count = _name(str(result)), 1
    ingredients: dict[str, int] = {}
    if kind == "minecraft:crafting_shapeless":
        for entry in document["ingredients"]:
            name = _ingredient(entry)
            if name is not None:
                ingredients[name] = ingredients.get(name, 0) + 1
    else:
        key = document["key"]
        for row in document["pattern"]:
            for char in row:
                if char == " " or char not in key:
                    continue
                name = _ingredient(key[char])
                if name is not None:
                    ingredients[name] = ingredients.get(name, 0) + 1
    return Recipe(item, count, ingredients)


def _tag_members(tag: str, items: set[str]) -> list[str]:
    """A tag's members from name patterns over the known items (recipe results never decide membership)."""
    if tag == "planks":
        return [i for i in items if i.endswith("_planks")]
    if tag == "logs":
        return [i for i in items if i.endswith(("_log", "_stem")) or i in ("log", "stem")]
    if tag.endswith(("_logs", "_stems")):
        wood = tag.rsplit("_", 1)[0]
        return [i for i in items if i.startswith((f"{wood}_log", f"{wood}_stem"))]
    if tag in ("wooden_slab", "wooden_slabs"):
        return [i for i in items if "_slab" in i and ("planks" in i or "wood" in i)]
    if "stone_tool" in tag:
        return [i for i in ("cobblestone", "blackstone", "cobbled_deepslate", "stone") if i in items]
    if "stone_crafting" in tag:
        return ["cobblestone", "stone", "smooth_stone"]
    if tag == "coals":
        return [i for i in ("coal", "charcoal") if i in items]
    if "soul_fire" in tag:
        return [i for i in ("soul_sand", "soul_soil") if i in items]
    if tag == "wool":
        return [i for i in items if i.endswith("_wool")]
    return []
