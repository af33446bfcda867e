"""platoon: train LLM agents with reinforcement learning through a Tinker-compatible service.

`import platoon as pt` is cheap: every public name is imported on first use (core.md 2.1).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from platoon._version import running_version

__version__ = running_version()

# public name -> module that defines it
_EXPORTS: dict[str, str] = {}

__all__: list[str] = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'platoon' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # pragma: no cover
    pass
