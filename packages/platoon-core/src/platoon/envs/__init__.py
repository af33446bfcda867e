"""Environments: the service contract (`platoon.envs.service`), task tables, ORS and step environments.

Kept import-light: submodules are imported by name, never from here, so `import platoon.envs` costs nothing;
`task_table` is resolved on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platoon._lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from platoon.envs.table import task_table as task_table

__all__ = ["task_table"]

__getattr__, __dir__ = lazy_exports(globals(), {"task_table": "platoon.envs.table"})
