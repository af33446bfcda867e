"""The two ORS environments: `TextCraftEnvironment` (Minecraft recipes) and `TextCraftSynthEnvironment`.

Both offer the same four tools (`craft`, `get_info`, `view_inventory`, `finish`) with the same texts, and the same
reward rule: `finish` with a non-empty message scores 1 exactly when, for every target, the inventory gained at
least the required count over the agent's own starting snapshot (`initial_inventory`). This module imports neither
platoon nor IPython, so any ORS server can serve the environments with only `pip install platoon-textcraft`.

It deliberately avoids `from __future__ import annotations`: the SDK reads tool signatures with `get_type_hints`,
which needs the real parameter classes.
"""

import functools
import json
from typing import Any

# This module exists to define ORS environments: the SDK is its reason to be imported, so it loads at the top.
from openreward.environments import Environment, Split, TextBlock, ToolOutput, tool  # noqa: TID253
from pydantic import BaseModel, Field

from platoon_textcraft.recipe_loader import TAG_PREFIX, RecipeBook, RecipeDatabase
from platoon_textcraft.synth_recipe_loader import load_synth_book
from platoon_textcraft.synth_tasks import load_synth_tasks, split_names
from platoon_textcraft.tasks import SPLIT_FILES, load_tasks, parse_goal

try:  # the SDK's terminal marker, where the installed SDK has it
    from openreward.environments import terminal
except ImportError:  # pragma: no cover - older SDKs: the attribute the SDK reads
    terminal = None

__all__ = [
    "TextCraftEnvironment",
    "TextCraftSynthEnvironment",
    "craft_items",
    "evaluate_inventory",
    "item_info",
]

NO_FINISH_ERROR = "Episode ended without calling finish() - likely timeout or max steps reached"
NO_TARGETS_ERROR = "No target items defined in task"


@functools.cache
def _minecraft_book() -> RecipeDatabase:
    return RecipeDatabase()


def _type_name(value: Any) -> str:
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def craft_items(book: RecipeBook, inventory: dict[str, int], ingredients: Any, target: Any) -> str:
    """Apply one craft to `inventory` in place; returns the tool's text (`Error: …` leaves it unchanged)."""
    if not isinstance(ingredients, dict):
        return f"Error: ingredients must be a dict, got {_type_name(ingredients)}"
    if not isinstance(target, tuple | list) or len(target) != 2:
        return "Error: target must be a tuple of (item_name, count)"
    item, total = target
    if not isinstance(item, str):
        return f"Error: target item must be a string, got {_type_name(item)}"
    if not _is_int(total):
        return f"Error: target count must be an int, got {_type_name(total)}"
    if total <= 0:
        return f"Error: target count must be positive, got {total}"
    for name, amount in ingredients.items():
        if not isinstance(name, str):
            return f"Error: ingredient name must be a string, got {_type_name(name)}"
        if not _is_int(amount):
            return f"Error: ingredient count for {name} must be an int, got {_type_name(amount)}"
        if amount <= 0:
            return f"Error: ingredient count for {name} must be positive, got {amount}"
    recipes = book.get_recipes(item)
    if not recipes:
        return f"Error: No recipe found for {item}"
    errors = []
    for number, recipe in enumerate(recipes, start=1):
        problem, used = _match(book, recipe.result_count, recipe.ingredients, ingredients, inventory, total)
        if problem is None:
            for name, amount in used.items():
                inventory[name] -= amount
                if inventory[name] == 0:
                    del inventory[name]
            inventory[item] = inventory.get(item, 0) + total
            return f"Successfully crafted {total} {item}(s)"
        errors.append(f"Recipe {number}: {problem}")
    return f"Error: All {len(recipes)} recipe(s) failed for {item}. Errors:\n" + "\n".join(errors)


def _match(
    book: RecipeBook,
    result_count: int,
    needs: dict[str, int],
    provided: dict[str, int],
    inventory: dict[str, int],
    total: int,
) -> tuple[str | None, dict[str, int]]:
    """(None, what to deduct) when the provided ingredients make `total` by this recipe, else (why not, {})."""
    if total % result_count:
        return f"Target count {total} is not divisible by recipe result count {result_count}", {}
    crafts = total // result_count
    used: dict[str, int] = {}
    for name, count in needs.items():
        need = count * crafts
        if name.startswith(TAG_PREFIX):
            members = book.get_tag_members(name)
            chosen = next((p for p, n in provided.items() if p in members and n == need), None)
            if chosen is None:
                return f"No ingredient provided for {name}. Expected one of: {members}", {}
            used[chosen] = need
        elif name not in provided:
            return f"Missing required ingredient {name}", {}
        elif provided[name] != need:
            return f"Wrong amount of {name}. Need {need}, provided {provided[name]}", {}
        else:
            used[name] = need
    extra = [name for name in provided if name not in used]
    if extra:
        return f"Extra ingredients not required: {', '.join(extra)}", {}
    short = [f"{n}: need {a}, have {inventory.get(n, 0)}" for n, a in used.items() if inventory.get(n, 0) < a]
    if short:
        return f"Insufficient ingredients in inventory: {', '.join(short)}", {}
    return None, used


def item_info(book: RecipeBook, inventory: dict[str, int], items: Any) -> list[dict[str, Any]]:
    """`get_info`'s list: per item whether it can be crafted, is base, is held, its depth and its recipes."""
    names = [items] if isinstance(items, str) else list(items) if isinstance(items, list | tuple) else []
    info = []
    for item in names:
        item = str(item)
        recipes = []
        for recipe in book.get_recipes(item):
            shown: dict[str, Any] = {}
            for name, count in recipe.ingredients.items():
                if name.startswith(TAG_PREFIX):
                    shown[name] = {"count": count, "use_one_of": book.get_tag_members(name)}
                else:
                    shown[name] = count
            recipes.append({"ingredients": shown, "result_count": recipe.result_count})
        info.append(
            {
                "item": item,
                "can_craft": book.can_craft(item),
                "is_base": book.is_base_item(item),
                "in_inventory": inventory.get(item, 0),
                "crafting_depth": book.get_crafting_depth(item),
                "recipes": recipes,
            }
        )
    return info


def evaluate_inventory(
    message: str, targets: dict[str, int], initial: dict[str, int], inventory: dict[str, int]
) -> tuple[float, dict[str, Any]]:
    """The reward rule: 1.0 when the message is non-empty and every target's gain reaches its count, else 0.0."""
    misc: dict[str, Any] = {
        "target_items": dict(targets),
        "initial_inventory": dict(initial),
        "final_inventory": dict(inventory),
    }
    if not message:
        return 0.0, {"success": False, "reward/success": 0.0, "error": NO_FINISH_ERROR, **misc}
    if not targets:
        return 0.0, {"success": False, "reward/success": 0.0, "error": NO_TARGETS_ERROR, **misc}
    missing = {}
    for item, count in targets.items():
        gain = inventory.get(item, 0) - initial.get(item, 0)
        if gain < count:
            missing[item] = count - gain
    success = not missing
    reward = 1.0 if success else 0.0
    out = {"success": success, "reward/success": reward, **misc}
    if missing:
        out["missing_items"] = missing
    return reward, out


class CraftInput(BaseModel):
    ingredients: Any = Field(
        description="The ingredients to use, {item: count}, exactly as the recipe needs."
    )
    target: Any = Field(description="[item, total_count]: the item and the total number to produce.")


class GetInfoInput(BaseModel):
    items: Any = Field(description="The item names to look up.")


class FinishInput(BaseModel):
    message: Any = Field(default="", description="A short summary of what was crafted.")


class TextCraftEnvironment(Environment):
    """TextCraft: craft the target items from the inventory by Minecraft recipes (ADaPT, Prasad et al. 2024)."""

    def __init__(
        self, task_spec: dict[str, Any] | None = None, secrets: dict[str, str] | None = None
    ) -> None:
        task_spec = dict(task_spec or {})
        super().__init__(task_spec, dict(secrets or {}))
        misc = dict(task_spec.get("misc") or {})
        goal = task_spec.get("goal")
        self.goal: str = goal if isinstance(goal, str) else ""
        targets = misc.get("target_items")
        self.target_items: dict[str, int] = dict(targets) if targets else parse_goal(self.goal)
        self.inventory: dict[str, int] = dict(misc.get("initial_inventory") or {})
        self.initial_inventory: dict[str, int] = dict(self.inventory)

    # -- the world -------------------------------------------------------------------------------------------

    @classmethod
    def recipe_book(cls) -> RecipeBook:
        return _minecraft_book()

    # -- ORS task listing ------------------------------------------------------------------------------------

    @classmethod
    def list_splits(cls) -> list[Split]:
        return [
            Split(name=name, type="train" if name.startswith("train") else "validation")
            for name in cls.split_names()
        ]

    @classmethod
    def split_names(cls) -> list[str]:
        return list(SPLIT_FILES)

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return load_tasks(split)

    # The SDK caches listings on the class behind `hasattr(cls, ...)`, which finds a parent's cache: once
    # TextCraftEnvironment was listed, TextCraftSynthEnvironment would list the Minecraft splits and tasks. These
    # keep each class's cache in its own namespace. (The task files are parsed once per process anyway.)

    @classmethod
    def _list_splits_cached(cls) -> list[Split]:
        cached = cls.__dict__.get("_textcraft_splits")
        if cached is None:
            cached = cls.list_splits()
            setattr(cls, "_textcraft_splits", cached)  # noqa: B010 - a class attribute set per class
        return cached

    @classmethod
    async def _list_tasks_cached(cls, split: str) -> list[dict[str, Any]]:
        cache: dict[str, list[dict[str, Any]]] = cls.__dict__.get("_textcraft_tasks") or {}
        if split not in cache:
            cache[split] = cls.list_tasks(split)
            setattr(cls, "_textcraft_tasks", cache)  # noqa: B010
        return cache[split]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=self.goal)]

    # -- subagents -------------------------------------------------------------------------------------------

    def platoon_fork(self, task_spec: dict[str, Any]) -> "TextCraftEnvironment":
        """A child crafting its own targets on this agent's inventory (the same dict), snapshotted now.

        The child's targets come from a top-level `target_items`, else from its goal text; never from `misc`,
        which still describes the parent's task.
        """
        spec = dict(task_spec)
        targets = spec.get("target_items")
        child = type(self)({"goal": spec.get("goal", ""), "misc": {}})
        child.task_spec = spec
        child.target_items = dict(targets) if isinstance(targets, dict) else parse_goal(child.goal)
        child.inventory = self.inventory  # shared: what a child crafts is its parent's at once
        child.initial_inventory = dict(self.inventory)
        return child

    # -- tools -----------------------------------------------------------------------------------------------

    @tool
    async def craft(self, params: CraftInput) -> ToolOutput:
        """Craft `target` = [item, total_count] from exactly the ingredients its recipe needs for that total."""
        text = craft_items(self.recipe_book(), self.inventory, params.ingredients, params.target)
        return ToolOutput(blocks=[TextBlock(text=text)])

    @tool
    async def get_info(self, params: GetInfoInput) -> ToolOutput:
        """Look up items: whether they can be crafted, are base items, how many are held, depth and recipes."""
        info = item_info(self.recipe_book(), self.inventory, params.items)
        return ToolOutput(blocks=[TextBlock(text=json.dumps(info))], metadata={"structured_content": info})

    @tool
    async def view_inventory(self) -> ToolOutput:
        """The current inventory, {item: count}."""
        held = dict(self.inventory)
        return ToolOutput(blocks=[TextBlock(text=json.dumps(held))], metadata={"structured_content": held})

    async def finish(self, params: FinishInput) -> ToolOutput:
        """End the episode with a message; it is graded on what was crafted since the start."""
        message = params.message if isinstance(params.message, str) else str(params.message)
        reward, misc = self.evaluate(message)
        return ToolOutput(
            blocks=[TextBlock(text=message)], reward=reward, finished=True, metadata={"reward_misc": misc}
        )

    def evaluate(self, message: str) -> tuple[float, dict[str, Any]]:
        """The grade of finishing now with `message` (gain over this agent's own snapshot)."""
        return evaluate_inventory(message, self.target_items, self.initial_inventory, self.inventory)


# `finish` is the SDK's terminal tool: `@terminal` where the SDK has it, else the attribute the SDK reads.
if terminal is not None:
    TextCraftEnvironment.finish = terminal(tool(TextCraftEnvironment.finish))  # type: ignore[method-assign]
else:  # pragma: no cover
    TextCraftEnvironment.finish = tool(TextCraftEnvironment.finish)  # type: ignore[method-assign]
    TextCraftEnvironment.finish._env_tool_terminal = True  # type: ignore[attr-defined]


class TextCraftSynthEnvironment(TextCraftEnvironment):
    """TextCraft-Synth: the same game on a generated world up to 12 tiers deep, with difficulty splits."""

    @classmethod
    def recipe_book(cls) -> RecipeBook:
        return load_synth_book()

    @classmethod
    def split_names(cls) -> list[str]:
        return split_names()

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return load_synth_tasks(split)
