"""Named hooks (seams) that are not components: telemetry, diagnostics and trajectory completion ids.

`register(name, fn)` adds a function (once per function); `hooks(name)` returns the registered functions in
registration order followed by the matching hookimpls of every plugin module loaded so far.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from platoon.hookspecs import SEAM_HOOKS

_REGISTERED: dict[str, list[Callable[..., Any]]] = {}


def _check(name: str) -> str:
    if name not in SEAM_HOOKS:
        raise ValueError(f"unknown hook {name!r}; the hooks are: {', '.join(SEAM_HOOKS)}")
    return name


def register(name: str, fn: Callable[..., Any]) -> None:
    """Register `fn` under the hook `name`; registering the same function again changes nothing."""
    functions = _REGISTERED.setdefault(_check(name), [])
    if fn not in functions:
        functions.append(fn)


def hooks(name: str) -> list[Callable[..., Any]]:
    """The functions to call for the hook `name`: registered ones first, then loaded plugins' hookimpls."""
    from platoon import plugins

    functions = list(_REGISTERED.get(_check(name), []))
    caller = getattr(plugins.plugin_manager().hook, SEAM_HOOKS[name])
    for impl in reversed(caller.get_hookimpls()):  # pluggy keeps them last-registered-first
        functions.append(impl.function)
    return functions


def clear() -> None:
    _REGISTERED.clear()
