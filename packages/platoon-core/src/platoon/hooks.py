"""Named hooks (seams) that are not components: telemetry, diagnostics and trajectory completion ids.

`register(name, fn)` adds a function (once per function) to the one registry's seam store; `hooks(name)` returns
the registered functions in registration order followed by the matching hookimpls of every plugin module loaded
so far.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from platoon import plugins, registry
from platoon.hookspecs import SEAM_HOOKS


def _check(name: str) -> str:
    if name not in SEAM_HOOKS:
        raise ValueError(f"unknown hook {name!r}; the hooks are: {', '.join(SEAM_HOOKS)}")
    return name


def register(name: str, fn: Callable[..., Any]) -> None:
    """Register `fn` under the hook `name`; registering the same function again changes nothing."""
    registry.add_seam(_check(name), fn)


def hooks(name: str) -> list[Callable[..., Any]]:
    """The functions to call for the hook `name`: registered ones first, then loaded plugins' hookimpls."""
    functions = registry.seam_functions(_check(name))
    caller = getattr(plugins.plugin_manager().hook, SEAM_HOOKS[name])
    for impl in reversed(caller.get_hookimpls()):  # pluggy keeps them last-registered-first
        functions.append(impl.function)
    return functions


def clear() -> None:
    registry.clear_seams()
