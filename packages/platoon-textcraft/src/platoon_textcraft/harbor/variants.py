"""The worlds a TextCraft Harbor export can write (`Variant`, `VARIANTS`, `variant()`) and what it reports of each
task it wrote (`ExportedTask`); the export and its dataset card both read them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from platoon_textcraft.recipe_loader import RecipeBook, RecipeDatabase
from platoon_textcraft.synth_recipe_loader import load_synth_book
from platoon_textcraft.synth_tasks import SPLIT_FILES as SYNTH_SPLIT_FILES
from platoon_textcraft.synth_tasks import load_synth_tasks
from platoon_textcraft.tasks import SPLIT_FILES as ORIGINAL_SPLIT_FILES
from platoon_textcraft.tasks import load_tasks

__all__ = ["VARIANTS", "ExportedTask", "Variant", "variant"]


@dataclass(frozen=True)
class Variant:
    """One world to export: its names, environment, tasks and recipes."""

    key: str  # synth | original
    world: str  # the task-name prefix and recipes name
    title: str
    environment: str
    splits: tuple[str, ...]
    synth: bool

    def tasks(self, split: str) -> list[dict[str, Any]]:
        if self.synth:
            return load_synth_tasks(split)

        return load_tasks(split)

    def book(self) -> RecipeBook:
        if self.synth:
            return load_synth_book()

        return RecipeDatabase()

    def source_files(self) -> dict[str, str]:
        """The shipped task files the export read, by base split."""
        return dict(SYNTH_SPLIT_FILES if self.synth else ORIGINAL_SPLIT_FILES)


VARIANTS = {
    "synth": Variant(
        "synth", "textcraft-synth", "TextCraft-Synth", "textcraft-synth@1", ("train", "val"), True
    ),
    "original": Variant("original", "textcraft", "TextCraft", "textcraft@1", ("train", "val"), False),
}


def variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; one of {list(VARIANTS)}")
    return VARIANTS[name]


@dataclass(frozen=True)
class ExportedTask:
    """One exported task: its Harbor name, directory (relative to the dataset root), index fields and digest."""

    name: str
    path: str
    split: str
    index: int
    difficulty: str | None
    digest: str
    crafts: int
    metadata: Mapping[str, Any] = field(default_factory=dict)
