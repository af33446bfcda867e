"""Plugin packages import only the declared plugin surface (platoon.surface), and docs/extending.md lists it."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import platoon
from platoon.surface import PLUGIN_SURFACE

CORE_SRC = Path(platoon.__file__).parent
PACKAGES = CORE_SRC.parents[2]
REPO = PACKAGES.parent
PLUGIN_SRCS = sorted(path for path in PACKAGES.glob("*/src") if path.parent.name != "platoon-core")


def _is_core_module(name: str) -> bool:
    relative = CORE_SRC.joinpath(*name.split(".")[1:])
    return relative.with_suffix(".py").is_file() or (relative / "__init__.py").is_file()


def _is_platoon(name: str) -> bool:
    return name == "platoon" or name.startswith("platoon.")


def core_imports(source: str) -> Iterator[tuple[int, str]]:
    """(line, core module) for every import of platoon's core in one file: at module level, inside functions and
    under TYPE_CHECKING, `from platoon import submodule`, and `importlib.import_module("platoon...")` strings."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names if _is_platoon(alias.name))
        elif isinstance(node, ast.ImportFrom) and not node.level and _is_platoon(node.module or ""):
            module = node.module or ""
            submodules = [f"{module}.{alias.name}" for alias in node.names]
            named = [name for name in submodules if _is_core_module(name)]
            # `from platoon.x import y` takes y from platoon.x, unless y is itself a module
            yield from ((node.lineno, name) for name in named)
            if len(named) < len(submodules):
                yield node.lineno, module
        elif (
            isinstance(node, ast.Call)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _is_platoon(node.args[0].value)
        ):
            yield node.lineno, node.args[0].value


def outside_the_surface() -> list[tuple[str, int, str]]:
    """(file under packages/, line, module) for every plugin import of a core module the surface does not list."""
    found = []
    for src in PLUGIN_SRCS:
        for path in sorted(src.rglob("*.py")):
            for line, module in core_imports(path.read_text(encoding="utf-8")):
                if module not in PLUGIN_SURFACE:
                    found.append((path.relative_to(PACKAGES).as_posix(), line, module))
    return found


def test_there_are_plugin_packages_to_check():
    names = {src.parent.name for src in PLUGIN_SRCS}
    assert {"platoon-harbor", "platoon-harnesses", "platoon-sandbox", "platoon-textcraft"} <= names


def test_every_surface_module_exists():
    assert [name for name in PLUGIN_SURFACE if not _is_core_module(name)] == []


def test_plugin_packages_import_only_the_declared_surface():
    offending = [
        f"packages/{file}:{line}: imports {module}, which is not in platoon.surface.PLUGIN_SURFACE"
        for file, line, module in outside_the_surface()
    ]
    assert offending == [], "\n".join(offending)


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("from platoon.gateway.core import ModelGateway", "platoon.gateway.core"),
        ("def f():\n    from platoon.config.loader import load_config", "platoon.config.loader"),
        ("import platoon.rollouts.slot_process", "platoon.rollouts.slot_process"),
        ("from platoon import plugins", "platoon.plugins"),
        ("import importlib\nimportlib.import_module('platoon.trajectory')", "platoon.trajectory"),
    ],
)
def test_an_import_outside_the_surface_is_named(source, module):
    assert [name for _, name in core_imports(source)] == [module]
    assert module not in PLUGIN_SURFACE


def test_extending_lists_exactly_the_surface():
    text = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
    section = text.split("## What a plugin may import", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- `(platoon[\w.]*)`", section, flags=re.MULTILINE)
    assert listed == list(PLUGIN_SURFACE)
