"""The import statements of platoon's source, read from its files: the walker the layout tests share
(test_layout.py, test_import_cycles.py, test_function_level_imports.py)."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import platoon

CORE_SRC = Path(platoon.__file__).parent.parent
PACKAGES = CORE_SRC.parents[1]
#: every package's source folder, platoon-core's first
SRCS = [CORE_SRC, *sorted(path for path in PACKAGES.glob("platoon-*/src") if path != CORE_SRC)]
PLUGIN_SRCS = SRCS[1:]
#: the top-level import names of platoon's own packages
OWN = frozenset(path.parent.name for src in SRCS for path in src.glob("*/__init__.py"))


@dataclass(frozen=True)
class Import:
    """One import statement: `target` is the module it names (a relative one made absolute; for `from a import b`
    it is `a`), `names` what `from` takes from it."""

    target: str
    names: tuple[str, ...]
    line: int
    in_function: bool
    type_checking: bool
    #: the function holding it, as `name` or `Class.name` for one at module level (the outermost)
    function: str
    node: ast.Import | ast.ImportFrom


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(tree: ast.Module, module: str, *, is_package: bool) -> Iterator[Import]:
    """Every import statement of a parsed module, at module level and inside functions. Those under
    `if TYPE_CHECKING:` are marked: they exist for type hints and never run."""
    package = module if is_package else module.rpartition(".")[0]

    def walk(node: ast.AST, function: str, scope: str, type_checking: bool) -> Iterator[Import]:
        in_function = bool(function)
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, (), node.lineno, in_function, type_checking, function, node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names = tuple(alias.name for alias in node.names)
            yield Import(target, names, node.lineno, in_function, type_checking, function, node)
        elif _is_type_checking(node):
            assert isinstance(node, ast.If)
            for child in node.body:
                yield from walk(child, function, scope, True)
            for child in node.orelse:
                yield from walk(child, function, scope, type_checking)
        else:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not function:
                function = f"{scope}.{node.name}" if scope else node.name
            elif isinstance(node, ast.ClassDef) and not function:
                scope = f"{scope}.{node.name}" if scope else node.name
            for child in ast.iter_child_nodes(node):
                yield from walk(child, function, scope, type_checking)

    yield from walk(tree, "", "", False)


def file_imports(path: Path, src: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    yield from imports(tree, module_name(path, src), is_package=path.name == "__init__.py")


def lazy_exports(package: str) -> dict[str, str]:
    """The public names a package's `__init__` exports lazily (platoon._lazy), each with the module that defines
    it: `from package import name` runs that module."""
    module = importlib.import_module(package)
    for value in vars(module).values():
        code = getattr(value, "__code__", None)
        if code is not None and "exports" in code.co_freevars:
            found = inspect.getclosurevars(value).nonlocals
            return {**found["exports"], **found.get("whole_modules", {})}
    return {}
