"""Environments: the service contract (`platoon.envs.service`), task tables, ORS and step environments.

Kept import-light: submodules are imported by name, never from here, so `import platoon.envs` costs nothing;
`task_table` is resolved on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from platoon.envs.table import task_table as task_table

__all__ = ["task_table"]


def __getattr__(name: str) -> Any:
    if name == "task_table":
        from platoon.envs.table import task_table

        return task_table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
