"""The Harbor task image's copy of the game (`harbor/game.py`) plays as the ORS environment does.

`game.py` runs in a task sandbox on the standard library alone, so it carries its own copy of the rules of
`env.py` and `recipe_loader.py`. Over a sample of real tasks from both worlds, each episode here is played through
both: the gold crafts, and before each of them crafts that fail (a wrong amount, a missing or an extra ingredient,
a total the recipe's yield does not divide, a tag filled by a member not held), `get_info` and `view_inventory`
along the way, then `finish` (with every target crafted, and once short of the last craft). Every answer's text,
the inventory after every action and the grade must be the same in both.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from platoon_textcraft.env import TextCraftEnvironment, TextCraftSynthEnvironment
from platoon_textcraft.harbor import game
from platoon_textcraft.recipe_loader import TAG_PREFIX, RecipeBook, RecipeDatabase
from platoon_textcraft.synth_recipe_loader import load_synth_book, recipes_document
from platoon_textcraft.synth_tasks import load_synth_tasks
from platoon_textcraft.tasks import load_tasks

#: (world, split, task indices): Minecraft tasks of both splits, TextCraft-Synth at every difficulty
SAMPLES = [
    ("textcraft", "train", (0, 14, 231, 511, 994)),
    ("textcraft", "val", (7, 50)),
    ("textcraft-synth", "val-easy", (0, 1)),
    ("textcraft-synth", "val-medium", (0,)),
    ("textcraft-synth", "val-hard", (0,)),
    ("textcraft-synth", "train-extreme", (3,)),
]
#: the sampled tasks with a gold craft whose recipe names a tag (the craft gives one member; another is tried)
TAGGED = {
    ("textcraft", "train", 14),
    ("textcraft", "train", 231),
    ("textcraft", "train", 994),
    ("textcraft", "val", 7),
    ("textcraft", "val", 50),
}


def _world(name: str) -> tuple[type[TextCraftEnvironment], RecipeBook]:
    if name == "textcraft":
        return TextCraftEnvironment, RecipeDatabase()
    return TextCraftSynthEnvironment, load_synth_book()


def _cases() -> Iterator[Any]:
    for world, split, indices in SAMPLES:
        for index in indices:
            yield pytest.param(world, split, index, id=f"{world}-{split}-{index}")


class Copies:
    """One task played through the ORS environment and through the task image's game, side by side."""

    def __init__(self, world: str, spec: dict[str, Any]) -> None:
        env_class, book = _world(world)
        self.book = book
        self.env = env_class(spec)
        recipes = recipes_document(book, world).encode("ascii")
        misc = spec["misc"]
        task = {
            "format": game.TASK_FORMAT,
            "name": f"{world}/parity",
            "goal": spec["goal"],
            "target_items": misc["target_items"],
            "initial_inventory": misc["initial_inventory"],
            "recipes_sha256": hashlib.sha256(recipes).hexdigest(),
        }
        self.game = game.Game(
            game.Task(task, task["recipes_sha256"]), game.Book(json.loads(recipes.decode("ascii")))
        )

    async def play(self, tool: str, args: dict[str, Any]) -> tuple[str, Any]:
        """Both copies' text for one action (they must agree, and so must the inventories after it)."""
        result = (await self.env._call_tool(tool, args)).root
        assert result.ok, result
        env_text = result.output.blocks[0].text
        game_text, _ok, _record = self.game.run(tool, args)
        assert game_text == env_text, (tool, args)
        assert self.game.inventory == self.env.inventory, (tool, args)
        return env_text, result.output


def _failing_variants(craft: dict[str, Any], recipe_yield: int) -> list[dict[str, Any]]:
    """Crafts near a gold one that the rules refuse: each changes one thing about it."""
    ingredients, (item, total) = craft["ingredients"], craft["target"]
    first = next(iter(ingredients))
    variants = [
        {"ingredients": {**ingredients, first: ingredients[first] + 1}, "target": [item, total]},
        {"ingredients": {k: v for k, v in ingredients.items() if k != first}, "target": [item, total]},
        {"ingredients": {**ingredients, "no_such_item": 1}, "target": [item, total]},
    ]
    if recipe_yield > 1:
        variants.append({"ingredients": ingredients, "target": [item, total + 1]})
    return variants


def _tag_variants(copies: Copies, craft: dict[str, Any]) -> list[dict[str, Any]]:
    """The craft with the member it gives for a recipe's tag swapped for a member of that tag not held."""
    variants = []
    for recipe in copies.book.get_recipes(craft["target"][0]):
        for name in recipe.ingredients:
            if not name.startswith(TAG_PREFIX):
                continue
            members = copies.book.get_tag_members(name)
            given = [m for m in craft["ingredients"] if m in members]
            unheld = [m for m in members if not copies.env.inventory.get(m) and m not in craft["ingredients"]]
            if given and unheld:
                swapped = {(unheld[0] if k == given[0] else k): v for k, v in craft["ingredients"].items()}
                variants.append({"ingredients": swapped, "target": craft["target"]})
    return variants


def _gold_craft(copies: Copies, step: dict[str, Any]) -> dict[str, Any]:
    """A gold step as a craft: a tag filled by the first member held in enough quantity (as the export does)."""
    ingredients: dict[str, int] = {}
    for name, amount in step["ingredients"].items():
        if name.startswith(TAG_PREFIX):
            name = next(
                m
                for m in copies.book.get_tag_members(name)
                if copies.env.inventory.get(m, 0) >= amount
                and m not in ingredients
                and m not in step["ingredients"]
            )
        ingredients[name] = amount
    return {"ingredients": ingredients, "target": [step["target"][0], step["result_count"]]}


async def _episode(copies: Copies, steps: list[dict[str, Any]]) -> dict[str, int]:
    """Play `steps`, each after the crafts near it that the rules refuse: how many crafts of each kind ran."""
    seen = {"crafted": 0, "refused": 0, "tag": 0}
    await copies.play("view_inventory", {})
    for step in steps:
        craft = _gold_craft(copies, step)
        item = craft["target"][0]
        await copies.play("get_info", {"items": [item, *craft["ingredients"]]})
        recipe_yield = min(r.result_count for r in copies.book.get_recipes(item))
        tagged = _tag_variants(copies, craft)
        for variant in [*_failing_variants(craft, recipe_yield), *tagged]:
            text, _ = await copies.play("craft", variant)
            assert text.startswith("Error"), (variant, text)
            seen["refused"] += 1
        seen["tag"] += len(tagged)
        text, _ = await copies.play("craft", craft)
        assert text.startswith("Successfully crafted"), (craft, text)
        seen["crafted"] += 1
        await copies.play("view_inventory", {})
    return seen


@pytest.mark.parametrize(("world", "split", "index"), list(_cases()))
def test_both_copies_play_a_real_task_alike(world: str, split: str, index: int) -> None:
    spec = (load_tasks if world == "textcraft" else load_synth_tasks)(split)[index]
    gold = spec["misc"]["gold_trajectory"]

    finished = Copies(world, spec)
    seen = asyncio.run(_episode(finished, gold))
    _, output = asyncio.run(finished.play("finish", {"message": "crafted every target"}))
    verdict = game.finish_verdict({"reward": 0.0}, finished.game)
    assert (output.reward, verdict["reward"]) == (1.0, 1.0)
    assert seen["crafted"] == len(gold) and seen["refused"] >= 3 * len(gold)
    assert (seen["tag"] > 0) == ((world, split, index) in TAGGED), seen

    short = Copies(world, spec)
    asyncio.run(_episode(short, gold[:-1]))
    _, output = asyncio.run(short.play("finish", {"message": "stopped one craft short"}))
    verdict = game.finish_verdict({"reward": 0.0}, short.game)
    assert (output.reward, verdict["reward"]) == (0.0, 0.0)
    assert verdict["missing_items"] == output.metadata["reward_misc"]["missing_items"] != {}


def test_both_copies_refuse_a_tag_filled_by_two_members_alike():
    # Train task 329's gold fills `tag:planks` (9) from 8 acacia and 4 spruce planks; the rules take one member
    # at exactly the needed count, so neither copy can play that gold step.
    spec = load_tasks("train")[329]
    copies = Copies("textcraft", spec)

    async def play() -> str:
        for step in spec["misc"]["gold_trajectory"][:2]:
            await copies.play("craft", _gold_craft(copies, step))
        mixed = {"white_wool": 9, "acacia_planks": 8, "spruce_planks": 1}
        text, _ = await copies.play("craft", {"ingredients": mixed, "target": ["white_bed", 3]})
        return text

    text = asyncio.run(play())
    assert text.startswith("Error: All 1 recipe(s) failed for white_bed"), text
    assert "No ingredient provided for tag:planks" in text
