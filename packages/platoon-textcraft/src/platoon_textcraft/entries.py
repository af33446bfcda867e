"""The named environments `textcraft@1` and `textcraft-synth@1` (entry points of `platoon.environments`).

Core imports this module only when a config names one of them. Needs the `platoon` extra.
"""

from __future__ import annotations

from platoon import EnvironmentEntry

__all__ = ["TEXTCRAFT", "TEXTCRAFT_SYNTH"]

_BUILDER = "platoon_textcraft.prompts:TextCraftPromptBuilder"

TEXTCRAFT = EnvironmentEntry(
    "textcraft",
    "1",
    description=(
        "crafting Minecraft items by recipe with craft, get_info, view_inventory and finish (ORS, in process)"
    ),
    service="python://platoon_textcraft.env:TextCraftEnvironment",
    eval_dataset_kwargs={"split_name": "val"},
    harness_defaults={
        "platoon-codeact": {"prompt_builder": _BUILDER, "prompt_builder_options": {"synth": False}},
    },
)

TEXTCRAFT_SYNTH = EnvironmentEntry(
    "textcraft-synth",
    "1",
    description="TextCraft on synthetic recipes with deeper trees and easy-to-extreme splits (ORS, in process)",
    service="python://platoon_textcraft.env:TextCraftSynthEnvironment",
    eval_dataset_kwargs={"split_name": "val"},
    reward_processor="platoon-delegation",
    harness_defaults={
        "platoon-codeact": {"prompt_builder": _BUILDER, "prompt_builder_options": {"synth": True}},
    },
)
