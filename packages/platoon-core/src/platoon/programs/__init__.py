"""Episode programs: compose one episode (run the root agent, add finalizers, grade) and shape its rewards.

`@platoon.program(name)` registers one; `single` and `gym` are built in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from platoon.programs.registry import EpisodeProgram, get_program, program

__all__ = ["EpisodeContext", "EpisodeProgram", "get_program", "program"]

if TYPE_CHECKING:
    from platoon.programs.context import EpisodeContext


def __getattr__(name: str) -> Any:
    if name == "EpisodeContext":
        from platoon.programs.context import EpisodeContext

        return EpisodeContext
    raise AttributeError(f"module 'platoon.programs' has no attribute {name!r}")
