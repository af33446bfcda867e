"""Deprecations: the warning class users filter on, the record a config class uses to list its old keys, and the
lines a command prints for a loaded config's deprecations."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any


class PlatoonDeprecationWarning(FutureWarning):
    """A deprecated config key, variable or command that still works in this release (shown by default)."""


@dataclass(frozen=True)
class DeprecatedKey:
    """A config key that still works until `removed_in`: renamed (`renamed_to`) or replaced (`instead`)."""

    removed_in: str
    renamed_to: str | None = None
    instead: str | None = None

    def __post_init__(self) -> None:
        if (self.renamed_to is None) == (self.instead is None):
            raise ValueError("DeprecatedKey needs exactly one of renamed_to and instead")

    @property
    def replacement(self) -> str:
        return self.renamed_to if self.renamed_to is not None else str(self.instead)


def deprecation_message(path: str, key: DeprecatedKey) -> str:
    """`<path>: deprecated; use <replacement> instead (platoon <removed_in> removes it)`."""
    return f"{path}: deprecated; use {key.replacement} instead (platoon {key.removed_in} removes it)"


def deprecation_lines(loaded: Any) -> list[str]:
    """The loaded config's deprecation messages, passed through Python's warning filters first.

    An `error` filter raises PlatoonDeprecationWarning (the command line exits 78); an `ignore` filter drops it.
    Each message is returned once; the command prints them.
    """
    with warnings.catch_warnings(record=True) as caught:
        for record in loaded.deprecations:
            warnings.warn(record.message, PlatoonDeprecationWarning, stacklevel=2)
    seen: dict[str, None] = {}
    for warning in caught:
        if issubclass(warning.category, PlatoonDeprecationWarning):
            seen.setdefault(str(warning.message))
    return list(seen)
