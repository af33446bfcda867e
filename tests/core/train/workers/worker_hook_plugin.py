"""An environment package whose import registers the rollout-worker hooks, as a plugin's would."""

from __future__ import annotations

from platoon import hooks

CALLS = {"telemetry": 0}


def _counters() -> dict[str, float]:
    CALLS["telemetry"] += 1
    return {"test_hook_cells_started": 3.0}


def _diagnostics() -> dict[str, str]:
    return {"test_hook_state": "busy"}


hooks.register("rollout_worker.telemetry", _counters)
hooks.register("rollout_worker.diagnostics", _diagnostics)
