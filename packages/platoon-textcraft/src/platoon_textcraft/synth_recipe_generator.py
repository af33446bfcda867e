"""The TextCraft-Synth world: generated recipes up to 12 tiers deep, built in memory from one seed.

`SynthRecipeDatabase.generate_all_recipes(seed=42, items_per_domain_tier=25)` is the environment's world. Every
draw goes through Python's global `random` (seeded once), in a fixed order, because the shipped task files were
made from exactly this sequence of draws: changing any draw (even `randint(1, 1)`, which still consumes one)
changes the world and breaks every shipped task. Depth is the tier, stored rather than computed.

CLI: `python -m platoon_textcraft.synth_recipe_generator --output-dir DIR [--seed 42] [--items-per-tier 8]
[--semantic-names]` writes one Minecraft-like shapeless JSON per recipe and `_metadata.json`; the environment
reads none of it.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CROSS_DOMAIN_ITEMS", "DOMAINS", "TIERS", "SynthRecipe", "SynthRecipeDatabase", "main"]

#: Domains in generation order, with the letter of their generic prefixes (`m0`…`m9`, …).
DOMAINS = {"metal": "m", "crystal": "c", "organic": "o", "arcane": "a", "tech": "t"}
_ORE_DOMAINS = ("metal", "crystal")  # their base items are `<p>_ore`; the others' are `raw_<p>`
MAX_TIER = 12


def _tier_rule(tier: int) -> tuple[int, int, int]:
    """(base number of ingredients, lowest yield, highest yield) of a recipe of `tier`."""
    if tier == 1:
        return 1, 2, 4
    if tier == 2:
        return 2, 2, 3
    if tier <= 5:
        return 2, 1, 2
    if tier <= 7:
        return 2, 1, 1
    if tier <= 11:
        return 3, 1, 1
    return 4, 1, 1


TIERS = {tier: _tier_rule(tier) for tier in range(1, MAX_TIER + 1)}

#: The twelve cross-domain items, made after every domain: (name, tier, domains whose tier-3 items they take).
CROSS_DOMAIN_ITEMS: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("x10_mc", 10, ("metal", "crystal")),
    ("x10_ot", 10, ("organic", "tech")),
    ("x10_am", 10, ("arcane", "metal")),
    ("x10_ct", 10, ("crystal", "tech")),
    ("x11_mct", 11, ("metal", "crystal", "tech")),
    ("x11_oam", 11, ("organic", "arcane", "metal")),
    ("x11_act", 11, ("arcane", "crystal", "tech")),
    ("x11_tca", 11, ("tech", "crystal", "arcane")),
    ("x12_mcat", 12, ("metal", "crystal", "arcane", "tech")),
    ("x12_oacm", 12, ("organic", "arcane", "crystal", "metal")),
    ("x12_tcoa", 12, ("tech", "crystal", "organic", "arcane")),
    ("x12_all", 12, tuple(DOMAINS)),
)

#: Word stems of the debugging-only semantic names (`iron_refined`, …), one list per domain.
_SEMANTIC_STEMS = {
    "metal": ["iron", "copper", "tin", "silver", "gold", "lead", "zinc", "nickel", "cobalt", "titanium"],
    "crystal": [
        "quartz",
        "amethyst",
        "ruby",
        "sapphire",
        "emerald",
        "topaz",
        "opal",
        "jade",
        "onyx",
        "garnet",
    ],
    "organic": ["wood", "fiber", "resin", "leaf", "root", "bark", "seed", "moss", "sap", "bone"],
    "arcane": ["mana", "rune", "ether", "spirit", "sigil", "aura", "glyph", "totem", "relic", "charm"],
    "tech": ["wire", "chip", "gear", "lens", "coil", "panel", "valve", "motor", "relay", "cell"],
}
_SEMANTIC_STAGES = [
    "refined", "alloy", "plate", "core", "frame", "module", "engine", "array", "matrix", "nexus", "apex", "prime",
]  # fmt: skip


@dataclass
class SynthRecipe:
    """One recipe: `result_count` of `result` from `ingredients` (name -> amount, in draw order)."""

    result: str
    result_count: int
    ingredients: dict[str, int]
    depth: int
    domain: str


@dataclass
class SynthRecipeDatabase:
    """The generated world: items by tier, one recipe per craftable item, 10 base items per domain."""

    seed: int = 42
    items_per_domain_tier: int = 8
    semantic_names: bool = False
    recipes: dict[str, SynthRecipe] = field(default_factory=dict)
    base_items: set[str] = field(default_factory=set)
    depths: dict[str, int] = field(default_factory=dict)
    #: every item of a tier, domain items and cross-domain items alike (list order, duplicates kept)
    tier_items: dict[int, list[str]] = field(default_factory=dict)
    #: each domain's items by tier (tier 0 keeps its duplicates when there are more than 10 entries)
    domain_items: dict[str, dict[int, list[str]]] = field(default_factory=dict)
    item_domain: dict[str, str] = field(default_factory=dict)

    @classmethod
    def generate_all_recipes(
        cls, seed: int = 42, items_per_domain_tier: int = 8, *, semantic_names: bool = False
    ) -> SynthRecipeDatabase:
        """Generate the world on Python's global `random`, seeded once with `seed`."""
        db = cls(seed=seed, items_per_domain_tier=items_per_domain_tier, semantic_names=semantic_names)
        random.seed(seed)
        for domain in DOMAINS:
            db._generate_domain(domain)
        for name, tier, domains in CROSS_DOMAIN_ITEMS:
            db._generate_cross_domain(name, tier, domains)
        return db

    # -- generation ------------------------------------------------------------------------------------------

    def _name(self, domain: str, tier: int, i: int) -> str:
        index = i % 10
        if self.semantic_names:
            stem = _SEMANTIC_STEMS[domain][index]
            return f"{stem}_ore" if tier == 0 else f"{stem}_{_SEMANTIC_STAGES[tier - 1]}"
        prefix = f"{DOMAINS[domain]}{index}"
        if tier == 0:
            return f"{prefix}_ore" if domain in _ORE_DOMAINS else f"raw_{prefix}"
        return f"{prefix}_i{tier}" if tier < 6 else f"{prefix}_i{tier}_{tier}"

    def _generate_domain(self, domain: str) -> None:
        n = self.items_per_domain_tier
        tiers: dict[int, list[str]] = {}
        self.domain_items[domain] = tiers
        # Tier 0: n entries over 10 distinct base items; the duplicates stay in the list (and so weigh more).
        tiers[0] = [self._name(domain, 0, i) for i in range(n)]
        for name in tiers[0]:
            self.base_items.add(name)
            self.depths[name] = 0
            self.item_domain[name] = domain
            self.tier_items.setdefault(0, []).append(name)
        for tier in range(1, MAX_TIER + 1):
            tiers[tier] = []
            for i in range(max(1, n - tier // 3)):
                name = self._name(domain, tier, i)
                if name in self.depths:
                    name = f"{name}_{i}"
                self._generate_recipe(domain, tier, name)
                tiers[tier].append(name)
                self.tier_items.setdefault(tier, []).append(name)

    def _generate_recipe(self, domain: str, tier: int, name: str) -> None:
        tiers = self.domain_items[domain]
        base, low, high = TIERS[tier]
        candidates: list[tuple[str, int]] = []  # (item, distance in tiers)
        for t in (tier - 2, tier - 1):
            if t >= 0:
                candidates.extend((item, tier - t) for item in tiers[t])
        if tier >= 4:
            cross = random.choice(range(max(0, tier - 4), tier - 2))
            candidates.append((random.choice(tiers[cross]), tier - cross))
        count = base + random.randint(0, min(2, tier // 3))
        count = min(count, len(candidates), 6)
        chosen = _weighted_sample(candidates, count)
        ingredients: dict[str, int] = {}
        for item in chosen:
            # A candidate listed twice may be drawn twice: it collapses into one ingredient, the later amount wins.
            ingredients[item] = random.randint(1, 2) if tier <= 4 else random.randint(1, 1)
        result_count = random.randint(low, high)
        self._add(SynthRecipe(name, result_count, ingredients, tier, domain))

    def _generate_cross_domain(self, name: str, tier: int, domains: tuple[str, ...]) -> None:
        ingredients: dict[str, int] = {}
        for domain in domains:
            item = random.choice(self.domain_items[domain][tier - 3])
            ingredients[item] = random.randint(1, 2)
        self._add(SynthRecipe(name, 1, ingredients, tier, "cross"))
        self.tier_items.setdefault(tier, []).append(name)

    def _add(self, recipe: SynthRecipe) -> None:
        self.recipes[recipe.result] = recipe
        self.depths[recipe.result] = recipe.depth
        self.item_domain[recipe.result] = recipe.domain

    # -- queries ---------------------------------------------------------------------------------------------

    @property
    def items(self) -> set[str]:
        return set(self.depths)

    def to_recipe_files(self, output_dir: str | Path) -> int:
        """Write one Minecraft-like shapeless recipe JSON per recipe plus `_metadata.json`; returns the count."""
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, recipe in self.recipes.items():
            document = {
                "type": "minecraft:crafting_shapeless",
                "ingredients": [
                    {"item": f"synth:{item}"}
                    for item, amount in recipe.ingredients.items()
                    for _ in range(amount)
                ],
                "result": {"item": f"synth:{name}", "count": recipe.result_count},
                "synth_metadata": {"depth": recipe.depth, "domain": recipe.domain},
            }
            (out / f"{name}.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        metadata = {
            "seed": self.seed,
            "items_per_domain_tier": self.items_per_domain_tier,
            "semantic_names": self.semantic_names,
            "num_items": len(self.depths),
            "num_base_items": len(self.base_items),
            "num_recipes": len(self.recipes),
            "max_depth": max(self.depths.values()),
            "base_items": sorted(self.base_items),
        }
        (out / "_metadata.json").write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
        return len(self.recipes)


def _weighted_sample(candidates: list[tuple[str, int]], count: int) -> list[str]:
    """`count` draws without replacement, weight 1/(distance+1); each draw is one `random()` and a cumulative scan."""
    pool = list(candidates)
    weights = [1.0 / (distance + 1) for _, distance in pool]
    chosen = []
    for _ in range(count):
        target = random.random() * sum(weights)
        running = 0.0
        index = len(pool) - 1  # float rounding can leave the sum just short of the target: take the last
        for i, weight in enumerate(weights):
            running += weight
            if running >= target:
                index = i
                break
        chosen.append(pool.pop(index)[0])
        weights.pop(index)
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m platoon_textcraft.synth_recipe_generator",
        description="Write the TextCraft-Synth recipes as JSON files (the environment builds them in memory).",
    )
    parser.add_argument("--output-dir", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--items-per-tier", type=int, default=8, help="items per domain and tier (the environment uses 25)"
    )
    parser.add_argument("--semantic-names", action="store_true", help="readable names, for debugging only")
    args = parser.parse_args(argv)
    db = SynthRecipeDatabase.generate_all_recipes(
        args.seed, args.items_per_tier, semantic_names=args.semantic_names
    )
    written = db.to_recipe_files(args.output_dir)
    print(f"wrote {written} recipes ({len(db.depths)} items, {len(db.base_items)} base) to {args.output_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
