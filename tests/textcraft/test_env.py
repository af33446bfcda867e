"""The ORS environments in process: tools and their exact texts, the reward rule, splits, forks."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from platoon_textcraft.env import TextCraftEnvironment, TextCraftSynthEnvironment

# a Minecraft task of our own: planks by tag, sticks (yield 4), a crafting table
PLANKS_SPEC = {
    "goal": "Craft the following items: 4x stick",
    "id": "test.0",
    "max_steps": 50,
    "misc": {
        "target_items": {"stick": 4},
        "initial_inventory": {"oak_log": 2, "birch_planks": 3, "stick": 2},
    },
}


def call(env: Any, tool: str, args: dict | None = None) -> Any:
    result = asyncio.run(env._call_tool(tool, args or {})).root
    assert result.ok, result
    return result.output


def text(env: Any, tool: str, args: dict | None = None) -> str:
    return call(env, tool, args).blocks[0].text


def craft(env: Any, ingredients: Any, target: Any) -> str:
    return text(env, "craft", {"ingredients": ingredients, "target": target})


@pytest.fixture
def env() -> TextCraftEnvironment:
    return TextCraftEnvironment(json.loads(json.dumps(PLANKS_SPEC)))


def test_the_tools_and_the_terminal_tool():
    listing = TextCraftEnvironment.list_tools()
    assert sorted(t.name for t in listing.tools) == ["craft", "get_info", "view_inventory"]
    assert listing.terminal_tool is not None and listing.terminal_tool.name == "finish"
    assert TextCraftSynthEnvironment.list_tools().terminal_tool.name == "finish"


@pytest.mark.parametrize(
    ("ingredients", "target", "expected"),
    [
        ([1], ["stick", 4], "Error: ingredients must be a dict, got list"),
        ({}, "stick", "Error: target must be a tuple of (item_name, count)"),
        ({}, ["stick", 4, 1], "Error: target must be a tuple of (item_name, count)"),
        ({}, [3, 4], "Error: target item must be a string, got int"),
        ({}, ["stick", "4"], "Error: target count must be an int, got str"),
        ({}, ["stick", 0], "Error: target count must be positive, got 0"),
        ({"oak_planks": "2"}, ["stick", 4], "Error: ingredient count for oak_planks must be an int, got str"),
        ({"oak_planks": -1}, ["stick", 4], "Error: ingredient count for oak_planks must be positive, got -1"),
        ({}, ["no_such_item", 1], "Error: No recipe found for no_such_item"),
    ],
)
def test_craft_checks_its_arguments_in_order(env, ingredients, target, expected):
    before = dict(env.inventory)
    assert craft(env, ingredients, target) == expected
    assert env.inventory == before


def test_craft_makes_the_total_and_deducts_exact_ingredients(env):
    # the target count is the total; a tag is satisfied by a member in exactly the needed amount
    assert craft(env, {"oak_log": 1}, ["oak_planks", 4]) == "Successfully crafted 4 oak_planks(s)"
    assert env.inventory == {"oak_log": 1, "birch_planks": 3, "stick": 2, "oak_planks": 4}
    assert craft(env, {"birch_planks": 3, "oak_planks": 2}, ("stick", 4)).startswith("Error: All 2 recipe(s)")
    assert craft(env, {"oak_planks": 2, "birch_planks": 3}, ["stick", 4]).splitlines()[1] == (
        "Recipe 1: Extra ingredients not required: birch_planks"
    )
    # the first member in the caller's order whose amount equals the need takes the tag; the other is extra
    assert craft(env, {"birch_planks": 2, "oak_planks": 2}, ["stick", 4]).splitlines()[1] == (
        "Recipe 1: Extra ingredients not required: oak_planks"
    )
    assert craft(env, {"oak_planks": 2}, ["stick", 4]) == "Successfully crafted 4 stick(s)"
    assert env.inventory == {"oak_log": 1, "birch_planks": 3, "stick": 6, "oak_planks": 2}


def test_craft_errors_are_reported_per_recipe_and_exactly(env):
    # the total must be divisible by the yield
    # stick has two recipes (planks by tag, yield 4; bamboo, yield 1): both are tried, in order
    assert craft(env, {"oak_planks": 1}, ["stick", 2]) == (
        "Error: All 2 recipe(s) failed for stick. Errors:\n"
        "Recipe 1: Target count 2 is not divisible by recipe result count 4\n"
        "Recipe 2: Missing required ingredient bamboo"
    )
    assert craft(env, {"oak_planks": 3}, ["stick", 8]).splitlines()[1] == (
        "Recipe 1: No ingredient provided for tag:planks. Expected one of: ['acacia_planks', 'birch_planks', "
        "'crimson_planks', 'dark_oak_planks', 'jungle_planks', 'oak_planks', 'spruce_planks', 'warped_planks']"
    )
    assert craft(env, {"birch_planks": 4}, ["stick", 8]).splitlines()[1] == (
        "Recipe 1: Insufficient ingredients in inventory: birch_planks: need 4, have 3"
    )
    assert craft(env, {"iron_nugget": 9}, ["iron_ingot", 1]) == (
        "Error: All 2 recipe(s) failed for iron_ingot. Errors:\n"
        "Recipe 1: Target count 1 is not divisible by recipe result count 9\n"
        "Recipe 2: Insufficient ingredients in inventory: iron_nugget: need 9, have 0"
    )
    assert craft(env, {"paper": 3}, ["book", 1]).endswith("Recipe 1: Missing required ingredient leather")
    synth = TextCraftSynthEnvironment(TextCraftSynthEnvironment.list_tasks("train")[0])
    assert craft(synth, {"raw_a1": 3}, ["a9_i1", 3]).endswith(
        "Recipe 1: Wrong amount of raw_a1. Need 2, provided 3"
    )


def test_replaying_the_number_of_crafts_as_the_total_fails_when_the_yield_is_above_one():
    # gold steps keep the number of crafts in target[1] and the total in result_count
    spec = TextCraftSynthEnvironment.list_tasks("train")[0]
    step = spec["misc"]["gold_trajectory"][0]
    assert step["target"] == ["a9_i1", 4] and step["result_count"] == 12
    env = TextCraftSynthEnvironment(spec)
    assert "not divisible" in craft(env, step["ingredients"], step["target"])
    assert craft(env, step["ingredients"], [step["target"][0], step["result_count"]]).startswith(
        "Successfully"
    )


def test_get_info_and_view_inventory(env):
    output = call(env, "get_info", {"items": ["stick", "oak_log", "nothing"]})
    info = json.loads(output.blocks[0].text)
    assert output.metadata["structured_content"] == info
    assert info[0] == {
        "item": "stick",
        "can_craft": True,
        "is_base": False,
        "in_inventory": 2,
        "crafting_depth": 1,
        "recipes": [
            {"ingredients": {"tag:planks": {"count": 2, "use_one_of": env.recipe_book().get_tag_members("planks")}},
             "result_count": 4},
            {"ingredients": {"bamboo": 2}, "result_count": 1},
        ],
    }  # fmt: skip
    assert info[1]["is_base"] is True and info[1]["recipes"] == []
    assert info[2] == {
        "item": "nothing", "can_craft": False, "is_base": False, "in_inventory": 0, "crafting_depth": 0, "recipes": []
    }  # fmt: skip
    inventory = call(env, "view_inventory")
    assert json.loads(inventory.blocks[0].text) == inventory.metadata["structured_content"] == env.inventory


def test_success_is_gain_over_the_starting_snapshot(env):
    # the 2 sticks held at the start earn nothing
    assert env.evaluate("done")[0] == 0.0
    assert env.evaluate("done")[1]["missing_items"] == {"stick": 4}
    craft(env, {"oak_log": 1}, ["oak_planks", 4])
    craft(env, {"oak_planks": 2}, ["stick", 4])
    reward, misc = env.evaluate("done")
    assert reward == 1.0 and misc["success"] is True and "missing_items" not in misc
    # consuming a target after crafting it lowers the gain
    assert craft(env, {"stick": 1, "coal": 1}, ["torch", 4]).startswith("Error")  # torch takes only a stick
    assert craft(env, {"stick": 1}, ["torch", 4]) == "Successfully crafted 4 torch(s)"
    reward, misc = env.evaluate("done")
    assert reward == 0.0 and misc["missing_items"] == {"stick": 1}
    assert set(misc) >= {"success", "reward/success", "target_items", "initial_inventory", "final_inventory"}


def test_finish_grades_and_an_empty_message_scores_zero(env):
    # finish() defaults to "" and an empty message scores 0 even with every target crafted
    craft(env, {"oak_log": 1}, ["oak_planks", 4])
    craft(env, {"oak_planks": 2}, ["stick", 4])
    assert env.evaluate("")[1]["error"] == (
        "Episode ended without calling finish() - likely timeout or max steps reached"
    )
    output = call(env, "finish")
    assert output.finished is True and output.reward == 0.0
    assert output.metadata["reward_misc"]["reward/success"] == 0.0
    again = asyncio.run(env._call_tool("finish", {"message": "done"})).root
    assert not again.ok and again.reason == "episode_finished"
    fresh = TextCraftEnvironment(PLANKS_SPEC)
    craft(fresh, {"oak_log": 1}, ["oak_planks", 4])
    craft(fresh, {"oak_planks": 2}, ["stick", 4])
    output = call(fresh, "finish", {"message": "Crafted 4x stick"})
    assert (output.reward, output.finished, output.blocks[0].text) == (1.0, True, "Crafted 4x stick")


def test_no_targets_scores_zero():
    env = TextCraftEnvironment({"goal": "Do something", "misc": {}})
    assert env.evaluate("done") == (0.0, env.evaluate("done")[1])
    assert env.evaluate("done")[1]["error"] == "No target items defined in task"


def test_targets_come_from_misc_else_from_the_goal():
    assert TextCraftEnvironment(
        {"goal": "Craft the following items: 2x stick, 1x oak_planks"}
    ).target_items == {
        "stick": 2,
        "oak_planks": 1,
    }
    env = TextCraftEnvironment(PLANKS_SPEC)
    assert env.initial_inventory == env.inventory and env.initial_inventory is not env.inventory
    assert env.get_prompt()[0].text == PLANKS_SPEC["goal"]


def test_the_environment_ignores_the_specs_max_steps(env):
    # 60 tool calls in a task whose spec says 50
    for _ in range(60):
        text(env, "view_inventory")
    assert craft(env, {"oak_log": 1}, ["oak_planks", 4]).startswith("Successfully")


def test_children_share_the_inventory_object_and_snapshot_at_fork(env):
    child = env.platoon_fork(
        {
            **PLANKS_SPEC,
            "goal": "Craft the following items: 4x oak_planks\n\nContext provided from parent agent: 9x x",
        }
    )
    assert child.target_items == {"oak_planks": 4}  # first line only; never from misc
    assert child.inventory is env.inventory and child.initial_inventory == env.inventory
    sibling = env.platoon_fork({**PLANKS_SPEC, "goal": "Craft the following items: 4x oak_planks"})
    assert craft(child, {"oak_log": 1}, ["oak_planks", 4]).startswith("Successfully")
    assert env.inventory["oak_planks"] == 4
    assert (
        child.evaluate("done")[0] == 1.0 and sibling.evaluate("done")[0] == 1.0
    )  # siblings credit each other
    top = env.platoon_fork(
        {"goal": "anything", "target_items": {"stick": 4}, "misc": {"target_items": {"x": 1}}}
    )
    assert top.target_items == {"stick": 4}
    grandchild = child.platoon_fork({"goal": "Craft the following items: 4x stick"})
    assert grandchild.inventory is env.inventory


def test_splits_and_unknown_splits():
    assert [(s.name, s.type) for s in TextCraftEnvironment.list_splits()] == [
        ("train", "train"),
        ("val", "validation"),
    ]
    synth = [(s.name, s.type) for s in TextCraftSynthEnvironment.list_splits()]
    assert synth[:3] == [("train", "train"), ("val", "validation"), ("train-easy", "train")]
    assert ("val-extreme", "validation") in synth and len(synth) == 10
    with pytest.raises(
        ValueError, match=r"Unknown TextCraftEnvironment split 'x'; known: \['train', 'val'\]"
    ):
        TextCraftEnvironment.list_tasks("x")
    with pytest.raises(ValueError, match="Unknown TextCraftSynthEnvironment split"):
        TextCraftSynthEnvironment.list_tasks("train-impossible")


def test_tasks_are_addressed_by_split_and_index_through_the_service():
    # the val file repeats ids, so ids are `<split>:<index>`
    from platoon.envs.resolve import resolve_service

    service = resolve_service("python://platoon_textcraft.env:TextCraftEnvironment")

    async def ids() -> tuple[list[str], Any]:
        listed = await service.list_tasks("val")
        return listed, await service.get_task("val:19")

    listed, task = asyncio.run(ids())
    assert listed[:2] == ["val:0", "val:1"] and len(listed) == 100
    assert task.goal == TextCraftEnvironment.list_tasks("val")[19]["goal"]


def test_env_imports_neither_platoon_nor_ipython():
    # checked in a fresh process
    code = (
        "import sys, platoon_textcraft.env\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('platoon', 'IPython')]\n"
        "assert not bad, bad\n"
        "import platoon_textcraft\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, platoon_textcraft; assert len([m for m in sys.modules if m.startswith('platoon_textcraft')]) == 1",
        ],
        check=True,
    )


def test_the_synth_class_never_inherits_the_minecraft_listing_cache():
    # the SDK caches listings on the class; a subclass must not see its parent's
    async def listings() -> tuple[Any, Any]:
        await TextCraftEnvironment._list_tasks_cached("train")
        TextCraftEnvironment._list_splits_cached()
        splits = TextCraftSynthEnvironment._list_splits_cached()
        return splits, await TextCraftSynthEnvironment._list_tasks_cached("train")

    splits, specs = asyncio.run(listings())
    assert len(splits) == 10 and specs[0]["id"] == "textcraft_synth.train.0"
    assert len(TextCraftEnvironment._list_splits_cached()) == 2


def test_any_ors_server_serves_both_environments():
    from openreward.environments import Server
    from starlette.testclient import TestClient

    client = TestClient(Server([TextCraftEnvironment, TextCraftSynthEnvironment]).app)
    assert client.get("/textcraftenvironment/splits").status_code == 200
    splits = client.get("/textcraftsynthenvironment/splits").json()
    assert [s["name"] if isinstance(s, dict) else s for s in splits][:3] == ["train", "val", "train-easy"]
    task = client.post("/textcraftsynthenvironment/task", json={"split": "train-medium", "index": 0}).json()
    assert "textcraft_synth.train.0" in json.dumps(task)
