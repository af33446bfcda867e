"""Lazy exports for a package's `__init__.py`: public names imported from their modules on first use.

Imports only the standard library, so a package that uses it stays as light to import as its own body.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    namespace: dict[str, Any],
    exports: Mapping[str, str],
    *,
    submodules: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's `__getattr__` and `__dir__` that resolve `exports` (public name -> the module defining it) and
    `submodules` (public name -> a module given whole) on first use.

    `namespace` is the package's `globals()`: each resolved name is stored there, so the second use costs nothing.
    An unknown name raises the AttributeError Python's own would.

        __getattr__, __dir__ = lazy_exports(globals(), {"Thing": "pkg.things"})
    """
    module_name = namespace["__name__"]
    whole_modules = dict(submodules or {})

    def __getattr__(name: str) -> Any:
        if name in whole_modules:
            value = importlib.import_module(whole_modules[name])
        elif name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
        else:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports) | set(whole_modules))

    return __getattr__, __dir__
