"""`TextCraftPromptBuilder`: variants, examples, the action space and the subagent helpers."""

from __future__ import annotations

import pytest

from platoon.harness.codeact import CellFunction
from platoon_textcraft.prompts import TextCraftPromptBuilder


def test_an_unknown_variant_is_refused():
    with pytest.raises(
        ValueError, match=r"variant must be one of \('linear', 'recursive', 'depth_aware'\), got 'x'"
    ):
        TextCraftPromptBuilder(variant="x")


def test_the_system_prompt_is_instructions_a_blank_line_and_the_codeact_paragraph():
    linear = TextCraftPromptBuilder().system_prompt()
    assert "2 with a goal of 3 means you must end with 5" in linear
    assert "<TIPS>\nCRAFTING STRATEGY:" in linear and "DELEGATION" not in linear
    assert linear.endswith("The code runs in a Jupyter notebook and its output is shown to you.")
    plain = TextCraftPromptBuilder(include_reasoning=False).system_prompt()
    assert plain.endswith("</TIPS>\n\nOutput your code action in <python> </python> tags.")
    recursive = TextCraftPromptBuilder(variant="recursive").system_prompt()
    assert "DELEGATION STRATEGY" in recursive and "depth x 8-10 steps" in recursive
    assert 'await launch_subagent({"item": 1}, 20)' in recursive and "asyncio.gather" in recursive
    depth_aware = TextCraftPromptBuilder(variant="depth_aware").system_prompt()
    assert "DELEGATION STRATEGY" in depth_aware and "8-10" not in depth_aware
    assert 'await launch_subagent({"item": 1})' in depth_aware


def test_the_action_space_is_fixed_text_with_synth_or_minecraft_examples():
    synth = TextCraftPromptBuilder().action_space([])
    assert synth.startswith(
        "Available Actions (python functions):\n1. craft(ingredients: dict, target: tuple[str, int]) -> str"
    )
    assert 'craft({"m0_i1": 2, "m1_i1": 1}, ("m2_i2", 2))' in synth
    assert 'get_info(["m2_i2", "raw_m0"])' in synth  # raw_m0 names no real item, and stays
    assert "4. finish(message: str) -> str" in synth and "5." not in synth and "CONCRETE" not in synth
    minecraft = TextCraftPromptBuilder(synth=False).action_space([])
    assert "CONCRETE item from that category" in minecraft and '"use_one_of"' in minecraft
    recursive = TextCraftPromptBuilder(variant="recursive").action_space([])
    assert '5. async launch_subagent(targets: dict, num_steps: int, context: str = "") -> str' in recursive
    depth_aware = TextCraftPromptBuilder(variant="depth_aware").action_space([])
    assert '5. async launch_subagent(targets: dict, context: str = "") -> str' in depth_aware
    assert "asyncio is already imported" in depth_aware


def test_subagent_goal_and_misc():
    builder = TextCraftPromptBuilder(variant="recursive")
    assert (
        builder.subagent_goal({"stick": 2, "oak_planks": 1})
        == "Craft the following items: 2x stick, 1x oak_planks"
    )
    assert builder.subagent_goal({"stick": 2}, "use the birch") == (
        "Craft the following items: 2x stick\n\nContext provided from parent agent: use the birch"
    )
    misc = builder.subagent_task_misc(
        {"stick": 2}, parent_misc={"target_items": {"x": 1}, "difficulty": "easy"}
    )
    assert misc == {"target_items": {"stick": 2}, "difficulty": "easy"}


def test_a_prompts_dir_replaces_the_system_prompt_and_the_action_space(tmp_path):
    """The built-in wording is the package's own: a user who has the exact text an agent was trained on supplies it
    as templates, and only the templates the directory holds replace anything."""
    (tmp_path / "system_prompt.j2").write_text(
        "Crafting agent ({{ variant }}, {{ 'synthetic' if synth else 'Minecraft' }})."
        "{% if include_reasoning %} Think in <thought> tags.{% endif %}\n"
    )
    builder = TextCraftPromptBuilder(str(tmp_path), variant="recursive")
    assert builder.system_prompt() == "Crafting agent (recursive, synthetic). Think in <thought> tags."
    # No action_space.j2 there: the built-in action space stays.
    assert builder.action_space([]) == TextCraftPromptBuilder(variant="recursive").action_space([])
    (tmp_path / "action_space.j2").write_text(
        "{% for f in functions %}{{ f.name }}{{ f.signature }}\n{% endfor %}{% if any_async %}await them{% endif %}"
    )
    functions = [
        CellFunction("craft", "(ingredients, target)", "", False),
        CellFunction("launch_subagent", "(targets, num_steps)", "", True),
    ]
    assert (
        builder.action_space(functions)
        == "craft(ingredients, target)\nlaunch_subagent(targets, num_steps)\nawait them"
    )


def test_a_prompts_dir_that_is_not_a_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"prompts_dir .*missing.* is not a directory"):
        TextCraftPromptBuilder(str(tmp_path / "missing"))
