"""Episode programs: compose one episode (run the root agent, add finalizers, grade) and shape its rewards.

`@platoon.program(name)` registers one; `single` and `gym` are built in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platoon._lazy import lazy_exports
from platoon.programs.registry import EpisodeProgram, get_program, program

__all__ = ["EpisodeContext", "EpisodeProgram", "get_program", "program"]

if TYPE_CHECKING:
    from platoon.programs.context import EpisodeContext

__getattr__, __dir__ = lazy_exports(globals(), {"EpisodeContext": "platoon.programs.context"})
