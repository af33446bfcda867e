"""What every command prints: the CLI's name for `platoon.console`, which plugins import too (it moved there so the
print helper is part of the declared plugin surface, `platoon.surface`)."""

from __future__ import annotations

from platoon.console import TOP_LEVEL, dump_json, err, new_app, out, table, write_stderr

__all__ = ["TOP_LEVEL", "dump_json", "err", "new_app", "out", "table", "write_stderr"]
