"""The TextCraft-Synth world as a `RecipeBook`, built once per process, and its `recipes.json` document.

The environment's world is `SynthRecipeDatabase.generate_all_recipes(seed=42, items_per_domain_tier=25)`; depths
are the stored tiers. `recipes_document` writes the book in the `textcraft-recipes/1` format whose sha256 the
spec pins (`RECIPES_SHA256`): compact JSON, one line per top-level key and one per recipe item, ASCII.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from platoon_textcraft.recipe_loader import Recipe, RecipeBook
from platoon_textcraft.synth_recipe_generator import SynthRecipeDatabase

__all__ = ["ITEMS_PER_DOMAIN_TIER", "RECIPES_SHA256", "SEED", "load_synth_book", "recipes_document"]

SEED = 42
#: The environment's world has 25 items per domain and tier (the generator CLI's default is 8).
ITEMS_PER_DOMAIN_TIER = 25
RECIPES_SHA256 = "a020eec273337c66b35c0fc487664e35c44da65ad18e9afffe6a4c25af949f10"
RECIPES_FORMAT = "textcraft-recipes/1"


def book_from_database(db: SynthRecipeDatabase) -> RecipeBook:
    recipes = {
        name: [Recipe(name, recipe.result_count, dict(recipe.ingredients))]
        for name, recipe in db.recipes.items()
    }
    return RecipeBook(recipes=recipes, items=set(db.depths), tags={}, depths=dict(db.depths))


@functools.cache
def load_synth_book(seed: int = SEED, items_per_domain_tier: int = ITEMS_PER_DOMAIN_TIER) -> RecipeBook:
    """The synthetic world (generated once per process and argument pair)."""
    return book_from_database(SynthRecipeDatabase.generate_all_recipes(seed, items_per_domain_tier))


def recipes_document(book: RecipeBook, name: str) -> str:
    """`recipes.json` of `book`: format, name, sorted base items, non-zero depths, tags, recipes by sorted item."""

    def dump(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=True)

    tag_names = sorted(
        {
            i.removeprefix("tag:")
            for rs in book.recipes.values()
            for r in rs
            for i in r.ingredients
            if i.startswith("tag:")
        }
    )
    depths = {item: book.get_crafting_depth(item) for item in sorted(book.items)}
    recipe_lines = ",\n".join(
        dump(item)
        + ":"
        + dump(
            [
                {"result_count": r.result_count, "ingredients": [[i, n] for i, n in r.ingredients.items()]}
                for r in book.recipes[item]
            ]
        )
        for item in sorted(book.recipes)
    )
    keys = [
        ("format", dump(RECIPES_FORMAT)),
        ("name", dump(name)),
        ("base_items", dump(sorted(book.base_items))),
        ("depths", dump({item: depth for item, depth in depths.items() if depth})),
        ("tags", dump({tag: book.get_tag_members(tag) for tag in tag_names})),
        ("recipes", "{\n" + recipe_lines + "\n}"),
    ]
    return "{\n" + ",\n".join(f"{dump(key)}:{value}" for key, value in keys) + "}\n"
