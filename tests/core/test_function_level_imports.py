"""Imports of platoon's own modules sit at module level (docs/architecture.md), so the import graph a reader
sees at the top of a file is the whole graph.

A function may import one of platoon's own modules (platoon, platoon_harnesses, platoon_sandbox, platoon_harbor,
platoon_textcraft; relative imports count) only when
- it is a command body: a module under platoon/cli/, or a module named cli.py, *_cli.py or __main__.py;
- it is in a plugin's entry-point module (the modules the packages' pyproject.toml name as entry points), which
  imports the implementation of a component only when a config or a command names it;
- it is a module's `__getattr__` (a lazy export: it imports a name when the name is asked for), or a function of a
  package's `__init__` importing one of that package's submodules (the `__init__` runs whenever any submodule is
  imported, so what it imports at module level every submodule pays for);
- the module it imports pulls in, at its module level (itself or through platoon's own module-level imports), a
  heavy third-party package: ruff's `banned-module-level-imports` (pyproject.toml) and HEAVY_ELSE below.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path

from source_imports import OWN, PACKAGES, SRCS, imports, lazy_exports, module_name

REPOSITORY = PACKAGES.parent

#: third-party packages ruff does not ban but that cost as much to import (ms on a warm cache, `python -X
#: importtime -c "import NAME"`, measured on the development machine); none is imported at module level by
#: platoon's modules except textual, by the trajectory viewer's app
HEAVY_ELSE = {
    "textual": "95 ms",
    "httpx": "103 ms",
    "IPython": "70 ms",
    "numpy": "57 ms",
    "tqdm": "49 ms",
    "jinja2": "44 ms",
}


@dataclass(frozen=True)
class Source:
    path: Path
    module: str
    is_package: bool
    tree: ast.Module


def _sources(extra: dict[str, str] | None = None) -> dict[str, Source]:
    """module -> its source, for every package; `extra` maps a path (relative to packages/) to text standing in for
    that file (for the test that the check can fail)."""
    found = {}
    texts = {path: path.read_text(encoding="utf-8") for src in SRCS for path in sorted(src.rglob("*.py"))}
    texts.update({PACKAGES / name: text for name, text in (extra or {}).items()})
    for path, text in texts.items():
        src = next(src for src in SRCS if path.is_relative_to(src))
        module = module_name(path, src)
        found[module] = Source(path, module, path.name == "__init__.py", ast.parse(text))
    return found


def heavy_packages() -> set[str]:
    settings = tomllib.loads((REPOSITORY / "pyproject.toml").read_text(encoding="utf-8"))
    banned = settings["tool"]["ruff"]["lint"]["flake8-tidy-imports"]["banned-module-level-imports"]
    return set(banned) | set(HEAVY_ELSE)


def entry_point_modules() -> set[str]:
    """The modules platoon's packages name as entry points (`module` or `module:attribute`)."""
    found = set()
    for project in PACKAGES.glob("*/pyproject.toml"):
        groups = tomllib.loads(project.read_text(encoding="utf-8")).get("project", {}).get("entry-points", {})
        found |= {value.partition(":")[0] for group in groups.values() for value in group.values()}
    return found


def is_command_body(source: Source) -> bool:
    name = source.path.name
    in_cli = source.module == "platoon.cli" or source.module.startswith("platoon.cli.")
    return in_cli or name in ("cli.py", "__main__.py") or name.endswith("_cli.py")


class ImportGraph:
    """Which of platoon's modules each import statement reaches, and which pull in a heavy package at import."""

    def __init__(self, sources: dict[str, Source]):
        self.sources = sources
        self.heavy = heavy_packages()
        self._exports: dict[str, dict[str, str]] = {}
        self._module_level: dict[str, tuple[set[str], set[str]]] = {}
        self._heavy: dict[str, str | None] = {}

    def _lazy(self, package: str) -> dict[str, str]:
        if package not in self._exports:
            source = self.sources.get(package)
            self._exports[package] = lazy_exports(package) if source and source.is_package else {}
        return self._exports[package]

    def reached(self, target: str, names: tuple[str, ...]) -> set[str]:
        """The own modules one statement runs: a submodule it names, the module a lazily exported name comes
        from, else the target itself."""
        if not names:
            return {target} if target in self.sources else set()
        found = set()
        for name in names:
            if f"{target}.{name}" in self.sources:
                found.add(f"{target}.{name}")
            elif name in self._lazy(target):
                found.add(self._lazy(target)[name])
            elif target in self.sources:
                found.add(target)
        return found

    def module_level(self, module: str) -> tuple[set[str], set[str]]:
        """(own modules, third-party top-level packages) a module imports when it is imported."""
        if module not in self._module_level:
            self._module_level[module] = self._read_module_level(module)
        return self._module_level[module]

    def _read_module_level(self, module: str) -> tuple[set[str], set[str]]:
        source = self.sources[module]
        parent_packages = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        own = set(parent_packages)
        third_party = set()
        for found in imports(source.tree, module, is_package=source.is_package):
            if found.in_function or found.type_checking:
                continue
            if found.target.split(".")[0] in OWN:
                own |= self.reached(found.target, found.names)
            elif found.target:
                third_party.add(found.target.split(".")[0])
        return own - {module}, third_party

    def heavy_at_import(self, module: str) -> str | None:
        """The heavy package importing `module` pulls in, if any."""
        if module not in self._heavy:
            self._heavy[module] = self._find_heavy(module)
        return self._heavy[module]

    def _find_heavy(self, module: str) -> str | None:
        seen, todo = set(), [module]
        while todo:
            current = todo.pop()
            if current in seen or current not in self.sources:
                continue
            seen.add(current)
            own, third_party = self.module_level(current)
            if third_party & self.heavy:
                return min(third_party & self.heavy)
            todo.extend(own)
        return None

    def offenders(self) -> list[tuple[Source, int, str]]:
        """(source, line, imported module) for each function-level import of a light own module that none of the
        rules in this file's docstring allows."""
        plugin_modules = entry_point_modules()
        found = []
        for source in self.sources.values():
            if is_command_body(source) or source.module in plugin_modules:
                continue
            for statement in imports(source.tree, source.module, is_package=source.is_package):
                if (
                    not statement.in_function
                    or statement.type_checking
                    or statement.function == "__getattr__"
                ):
                    continue
                if statement.target.split(".")[0] not in OWN:
                    continue
                for reached in sorted(self.reached(statement.target, statement.names) or {statement.target}):
                    own_submodule = source.is_package and reached.startswith(f"{source.module}.")
                    if not own_submodule and self.heavy_at_import(reached) is None:
                        found.append((source, statement.line, reached))
        return found


def _listing(found: list[tuple[Source, int, str]]) -> str:
    return "\n".join(
        f"{source.path.relative_to(PACKAGES)}:{line} imports {module}" for source, line, module in found
    )


def test_functions_import_only_heavy_modules_of_platoon():
    found = ImportGraph(_sources()).offenders()
    assert not found, (
        f"move these imports to the top of the module (or into a command body):\n{_listing(found)}"
    )


def test_a_function_importing_a_light_module_is_found():
    naming = "platoon-core/src/platoon/naming.py"
    text = (PACKAGES / naming).read_text(
        encoding="utf-8"
    ) + "\n\ndef _late():\n    from platoon.errors import EX_USAGE\n"
    found = ImportGraph(_sources({naming: text})).offenders()
    assert [
        (source.module, module) for source, _line, module in found if source.module == "platoon.naming"
    ] == [("platoon.naming", "platoon.errors")]


def test_a_function_importing_a_module_that_pulls_in_a_heavy_package_is_allowed():
    # platoon.viz.app imports textual; importing the viewer's model module does not.
    naming = "platoon-core/src/platoon/naming.py"
    late = (
        "\n\ndef _viewer():\n    from platoon.viz import app\n\ndef _model():\n    from .viz import model\n"
    )
    text = (PACKAGES / naming).read_text(encoding="utf-8") + late
    graph = ImportGraph(_sources({naming: text}))
    assert graph.heavy_at_import("platoon.viz.app") == "textual"
    assert [module for source, _line, module in graph.offenders() if source.module == "platoon.naming"] == [
        "platoon.viz.model"
    ]


def test_command_bodies_and_entry_points_are_recognised():
    sources = _sources()
    assert {
        "platoon_harnesses.plugin",
        "platoon.envs.ors",
        "platoon_textcraft.entries",
    } <= entry_point_modules()
    commands = {module for module, source in sources.items() if is_command_body(source)}
    assert {"platoon.cli.app", "platoon.viz.cli", "platoon_harbor.images_cli", "platoon.__main__"} <= commands
    assert "platoon.viz.app" not in commands


def test_a_package_init_may_import_its_own_submodules_late():
    init = "platoon-core/src/platoon/envs/__init__.py"
    late = "\n\ndef _table():\n    from platoon.envs import table\n\ndef _errors():\n    from platoon.errors import ConfigError\n"
    graph = ImportGraph(_sources({init: (PACKAGES / init).read_text(encoding="utf-8") + late}))
    assert [module for source, _line, module in graph.offenders() if source.module == "platoon.envs"] == [
        "platoon.errors"
    ]
