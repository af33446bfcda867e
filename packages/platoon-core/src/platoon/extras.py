"""Whether an optional dependency (an extra's package) is installed, asked without importing it."""

from __future__ import annotations

import importlib.util


def installed(module: str) -> bool:
    """True when `module` can be imported; torch or transformers take seconds to import, so only the spec is looked
    up. A module set to None in `sys.modules` (how tests hide one) or a broken install counts as not installed."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
