"""`TextCraftPromptBuilder`: the CodeAct prompts of platoon's TextCraft agents (linear, recursive, depth-aware).

The system prompt is the variant's instructions, a blank line and the CodeAct paragraph; the action-space text is
fixed (whatever functions the harness built), with synthetic or Minecraft examples. With `prompts: platoon` (the
default) the wording is this package's own; with `prompts: rao` it is the
RAO paper's, as platoon-textcraft 0.1.0 published it, token for token: those texts are not in this package but
fetched once per site (`platoon prepare`, or `python -m platoon_textcraft.published_prompts fetch`; see
`published_prompts`), and a builder asking for them refuses to be built before they are. `prompts_dir` replaces any
of it: a `system_prompt.j2` or
`action_space.j2` there is rendered instead of the built-in text (with `variant`, `synth` and `include_reasoning`;
the action space also gets `functions` and `any_async`), and the core CodeAct templates (`initial_user.j2`,
`cell_output.j2`, `history.j2`) are looked up there first. Needs the `platoon` extra.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from platoon.harness.codeact import CellFunction, CodeActPromptBuilder
from platoon.hookspecs import PrepareStep
from platoon_textcraft import published_prompts
from platoon_textcraft.tasks import format_goal

__all__ = ["PROMPTS", "VARIANTS", "TextCraftPromptBuilder"]

VARIANTS = ("linear", "recursive", "depth_aware")
#: whose wording: this package's own, or the RAO paper's as platoon-textcraft 0.1.0 published it
PROMPTS = ("platoon", "rao")

_GAME = """You are an agent playing a crafting game. Your goal is to craft the target items given in the task.
Your inventory holds enough base materials for the task, but you may need to craft intermediate items first.
If you already hold some of a target item, craft the target amount on top of what you hold: holding 2 with a goal \
of 3 means you must end with 5."""

_TIPS = """<TIPS>
CRAFTING STRATEGY:
- A recipe makes a fixed quantity each time it runs: the total you ask for must be a multiple of its yield.
- Ingredients scale with the number of executions: provide each one's amount times the number of executions.
- Before concluding that something cannot be crafted, check recipes and inventory with get_info and view_inventory.
- Calculate the quantities carefully before every craft.
</TIPS>"""

_DELEGATION = """<TIPS>
DELEGATION STRATEGY:
- Delegating intermediate items to subagents is highly recommended: give each subagent an independent subtask.
- Subagents can delegate further in turn (recursive delegation).
- Delegate one related group of items at a time.
{budget}- Launch subagents for independent items in parallel.
- Subagents share your inventory: what they craft is yours at once.
- launch_subagent must be awaited.
  Correct: {correct}
  Correct (parallel): await asyncio.gather({gather})
  Incorrect: {incorrect}
</TIPS>"""

_BUDGET = """- Give each subagent a step budget of about depth x 8-10 steps, using the item's crafting_depth from get_info.
- Keep enough of your own budget for the final assembly.
"""

_CODEACT_REASONING = """You act by writing Python code; a task usually takes several steps. Each turn, first explain \
your reasoning in 1-3 sentences inside <thought> </thought> tags, then write your code inside <python> </python> tags. \
The code runs in a Jupyter notebook and its output is shown to you."""

_CODEACT_PLAIN = "Output your code action in <python> </python> tags."

_SYNTH_EXAMPLES = {
    "craft": 'craft({"m0_i1": 2, "m1_i1": 1}, ("m2_i2", 2))',
    "get_info": 'get_info(["m2_i2", "raw_m0"])',
    "targets": '{"m2_i2": 1}',
}
_MINECRAFT_EXAMPLES = {
    "craft": 'craft({"oak_planks": 2}, ("stick", 4))',
    "get_info": 'get_info(["stick", "oak_planks"])',
    "targets": '{"stick": 1}',
}


class TextCraftPromptBuilder(CodeActPromptBuilder):
    """CodeAct prompts for TextCraft (`synth=False`) and TextCraft-Synth (`synth=True`) in three variants."""

    def __init__(
        self,
        prompts_dir: str | None = None,
        prompt_mode: str = "sequence_extension",
        include_reasoning: bool = True,
        *,
        variant: str = "linear",
        synth: bool = True,
        prompts: str = "platoon",
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if prompts not in PROMPTS:
            raise ValueError(f"prompts must be one of {PROMPTS}, got {prompts!r}")
        super().__init__(include_reasoning=include_reasoning, prompt_mode=prompt_mode)
        # Read (and checked against their pinned hashes) once per builder, here: a site without them stops the run
        # when its options are checked, before any rollout.
        self.published = published_prompts.load_texts() if prompts == "rao" else None
        if prompts_dir is not None:
            # A mistyped directory would otherwise leave the built-in prompts in place without a word.
            if not Path(prompts_dir).is_dir():
                raise ValueError(f"prompts_dir {prompts_dir!r} is not a directory")
            self.template_dir = prompts_dir
        self.variant = variant
        self.synth = synth

    @classmethod
    def prepare_steps(
        cls, options: Mapping[str, Any], cache_root: str | None, dry_run: bool
    ) -> list[PrepareStep]:
        """`textcraft prompts`: the published RAO prompts fetched into the site cache, for `prompts: rao`."""
        if options.get("prompts") != "rao":
            return []
        step = "textcraft prompts"
        where = published_prompts.location(cache_root)
        try:
            published_prompts.load_texts(cache_root)
            return [PrepareStep(step, "current", f"platoon-textcraft {published_prompts.VERSION} in {where}")]
        except published_prompts.PublishedPromptsError:
            if dry_run:
                return [
                    PrepareStep(step, "missing", f"would fetch platoon-textcraft {published_prompts.VERSION}")
                ]
        try:
            status, where = published_prompts.fetch(cache_root)
        except (published_prompts.PublishedPromptsError, published_prompts.IndexUnavailable, OSError) as exc:
            return [PrepareStep(step, "failed", str(exc))]
        return [PrepareStep(step, status, f"platoon-textcraft {published_prompts.VERSION} in {where}")]

    @property
    def _examples(self) -> dict[str, str]:
        return _SYNTH_EXAMPLES if self.synth else _MINECRAFT_EXAMPLES

    def _supplied(self, template: str) -> bool:
        """Whether `prompts_dir` holds its own `template` (which then replaces the built-in text)."""
        return self.template_dir is not None and (Path(self.template_dir) / template).is_file()

    def system_prompt(self) -> str:
        if self._supplied("system_prompt.j2"):
            return self.render(
                "system_prompt.j2",
                include_reasoning=self.include_reasoning,
                variant=self.variant,
                synth=self.synth,
            )
        if self.published is not None:
            paragraph = "CODEACT_REASONING" if self.include_reasoning else "CODEACT_PLAIN"
            return self.published[f"{self.variant.upper()}_INSTRUCTIONS"] + self.published[paragraph]
        parts = [_GAME, _TIPS]
        if self.variant != "linear":
            steps = ", 20" if self.variant == "recursive" else ""
            parts.append(
                _DELEGATION.format(
                    budget=_BUDGET if self.variant == "recursive" else "",
                    correct=f'await launch_subagent({{"item": 1}}{steps})',
                    gather=f'launch_subagent({{"a": 1}}{steps}), launch_subagent({{"b": 1}}{steps})',
                    incorrect=f'launch_subagent({{"item": 1}}{steps})  # not awaited: it never runs',
                )
            )
        instructions = "\n\n".join(parts)
        codeact = _CODEACT_REASONING if self.include_reasoning else _CODEACT_PLAIN
        return f"{instructions}\n\n{codeact}"

    def action_space(self, functions: Sequence[CellFunction]) -> str:
        if self._supplied("action_space.j2"):
            return self.render(
                "action_space.j2",
                functions=list(functions),
                any_async=any(f.is_async for f in functions),
                include_reasoning=self.include_reasoning,
                variant=self.variant,
                synth=self.synth,
            )
        if self.published is not None:
            world = "SYNTH" if self.synth else "MINECRAFT"
            text = self.published[f"{world}_ACTIONS"]
            if self.variant == "recursive":
                text += self.published[f"{world}_SUBAGENT_ACTIONS"]
            elif self.variant == "depth_aware":
                text += self.published[f"{world}_DEPTH_AWARE_SUBAGENT_ACTIONS"]
            return text
        ex = self._examples
        lines = [
            "Available Actions (python functions):",
            "1. craft(ingredients: dict, target: tuple[str, int]) -> str",
            "   Craft target = (item, total_count) from exactly the ingredients its recipe needs for that total.",
            f"   Example: {ex['craft']}",
            "2. get_info(items: list) -> list[dict]",
            "   For each item: item, can_craft, is_base, in_inventory, crafting_depth (0 for base items, else the "
            "longest chain of crafts below it) and recipes, each {ingredients: {item: count}, result_count}.",
            f"   Example: {ex['get_info']}",
        ]
        if not self.synth:
            lines += [
                '   A tag ingredient is shown as {"tag:X": {"count": N, "use_one_of": [...]}}: provide a CONCRETE '
                "item from that category, in that count.",
            ]
        lines += [
            "3. view_inventory() -> dict",
            "   The current inventory, {item: count}.",
            "4. finish(message: str) -> str",
            "   End the task with a short message once every target is crafted.",
        ]
        if self.variant == "recursive":
            lines += [
                '5. async launch_subagent(targets: dict, num_steps: int, context: str = "") -> str',
                f"   Delegate crafting targets to a subagent with its own step budget: "
                f"await launch_subagent({ex['targets']}, 20)",
            ]
        elif self.variant == "depth_aware":
            lines += [
                '5. async launch_subagent(targets: dict, context: str = "") -> str',
                f"   Delegate crafting targets to a subagent: await launch_subagent({ex['targets']})",
            ]
        if self.variant != "linear":
            lines.append("   asyncio is already imported; results of async functions must be awaited.")
        return "\n".join(lines)

    def subagent_goal(self, targets: Any, context: str = "") -> str:
        goal = format_goal(dict(targets)) if isinstance(targets, Mapping) else str(targets)
        if context:
            goal += f"\n\nContext provided from parent agent: {context}"
        return goal

    def subagent_task_misc(
        self, targets: Any, context: str = "", *, parent_misc: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        if not isinstance(targets, Mapping):
            return None
        return {**(parent_misc or {}), "target_items": dict(targets)}
