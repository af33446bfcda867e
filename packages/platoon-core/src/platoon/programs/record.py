"""The record of an episode program, `EpisodeProgram`: a name, a version and the async function.

`platoon.programs.registry` registers and looks programs up; the record sits apart so that the hookspecs, which
`platoon.plugins` imports, can name its type without a circle through the lookup.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EpisodeProgram:
    """A registered episode program; `version` is "" for an undecorated callable named by `module:attr`."""

    name: str
    version: str
    fn: Callable[..., Any]

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}" if self.version else self.name

    @property
    def source(self) -> str:
        return f"{self.fn.__module__}:{self.fn.__qualname__}"

    @property
    def doc(self) -> str:
        return inspect.getdoc(self.fn) or ""
