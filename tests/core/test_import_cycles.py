"""No import circles inside a package, counting every import: inside functions and for the type checker too
(docs/architecture.md).

The graph is read from the source: every `import` and `from ... import` statement, at module level, inside a
function or under `if TYPE_CHECKING:`, is an edge from the module that holds it to the module it names.
`from a.b import c` goes to `a.b.c` when that is a module, else to `a.b` (so a name a package's `__init__`
re-exports, lazily or not, is an edge to the package). An import only the type checker reads never runs, but a
circle of them still ties two modules together for a reader: a lower module types what it uses of a higher one by
a protocol instead. A circle is a strongly connected component of more than one module.

There are none, and the tests require none: an import that would close one belongs in a lower module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from source_imports import CORE_SRC, PLUGIN_SRCS, imports, module_name


def import_graph(src: Path, *, extra: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the modules of the same source tree it imports (module level, inside functions, for the type
    checker).

    `extra` maps a module name to source text that stands in for its file (for the tests that the check can fail).
    """
    sources = {module_name(path, src): path.read_text(encoding="utf-8") for path in sorted(src.rglob("*.py"))}
    sources.update(extra or {})
    packages = {module_name(path, src) for path in src.rglob("__init__.py")}
    graph: dict[str, set[str]] = {}
    for module, text in sources.items():
        targets: set[str] = set()
        for found in imports(ast.parse(text), module, is_package=module in packages):
            if not found.names:
                targets.add(found.target)
            for name in found.names:
                submodule = f"{found.target}.{name}"
                targets.add(submodule if submodule in sources else found.target)
        graph[module] = {target for target in targets if target in sources and target != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = lowlink[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = lowlink[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    lowlink[node] = min(lowlink[node], index[child])
                continue
            work.pop()
            if work:
                lowlink[work[-1][0]] = min(lowlink[work[-1][0]], lowlink[node])
            if lowlink[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def _listing(found: set[frozenset[str]]) -> str:
    return "\n".join(" <-> ".join(sorted(cycle)) for cycle in sorted(found, key=sorted))


def test_platoon_core_has_no_import_circle():
    found = cycles(import_graph(CORE_SRC))
    assert not found, (
        f"import circles (counting imports inside functions and for the type checker):\n{_listing(found)}"
    )


@pytest.mark.parametrize("src", PLUGIN_SRCS, ids=lambda src: src.parent.name)
def test_no_plugin_package_has_an_import_circle(src: Path):
    found = cycles(import_graph(src))
    assert not found, f"import circles in {src.parent.name}:\n{_listing(found)}"


def test_an_import_inside_a_function_that_closes_a_circle_is_found():
    # platoon.naming imports nothing of platoon; making it import, inside a function, a module that imports it
    # closes a circle the check must report.
    naming = (CORE_SRC / "platoon" / "naming.py").read_text(encoding="utf-8")
    closing = naming + "\n\ndef _closes():\n    from platoon.versioned import VersionedRegistry\n"
    graph = import_graph(CORE_SRC, extra={"platoon.naming": closing})
    assert "platoon.naming" in import_graph(CORE_SRC)["platoon.versioned"]
    assert frozenset({"platoon.naming", "platoon.versioned"}) in cycles(graph)
    assert frozenset({"platoon.naming", "platoon.versioned"}) not in cycles(import_graph(CORE_SRC))


def test_an_import_only_for_the_type_checker_that_closes_a_circle_is_found():
    # The registry types its stores without importing the record modules, which import it; an import for the type
    # checker alone is still an edge this check counts.
    registry = (CORE_SRC / "platoon" / "registry.py").read_text(encoding="utf-8")
    typed = registry + "\n\nif TYPE_CHECKING:\n    from platoon.harness.function import FunctionHarness\n"
    graph = import_graph(CORE_SRC, extra={"platoon.registry": typed})
    assert frozenset({"platoon.registry", "platoon.harness.function"}) in cycles(graph)


def test_a_plugin_module_typing_its_caller_closes_a_circle():
    # platoon-harbor's service imports its session at run time; the session importing the service back, even only
    # for mypy, closes a circle (the session names its service by a protocol instead).
    harbor = next(src for src in PLUGIN_SRCS if src.parent.name == "platoon-harbor")
    session = (harbor / "platoon_harbor" / "session.py").read_text(encoding="utf-8")
    typed = session + "\n\nif TYPE_CHECKING:\n    from platoon_harbor.service import HarborService\n"
    graph = import_graph(harbor, extra={"platoon_harbor.session": typed})
    assert frozenset({"platoon_harbor.service", "platoon_harbor.session"}) in cycles(graph)


def _imports_by_string(tree: ast.AST) -> list[int]:
    """Lines calling `import_module`/`__import__` with a literal (or f-string) naming one of platoon's modules."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        called = ast.unparse(node.func)
        if not (called.endswith("import_module") or called == "__import__"):
            continue
        first = node.args[0]
        if isinstance(first, ast.JoinedStr) and first.values and isinstance(first.values[0], ast.Constant):
            first = first.values[0]
        if (
            isinstance(first, ast.Constant)
            and isinstance(first.value, str)
            and first.value.startswith("platoon")
        ):
            found.append(node.lineno)
    return found


def test_no_module_imports_another_of_platoon_by_a_string():
    # A string import is an edge the circle check cannot see; an import statement states it.
    found = [
        f"{path.relative_to(src)}:{line}"
        for src in [CORE_SRC, *PLUGIN_SRCS]
        for path in sorted(src.rglob("*.py"))
        for line in _imports_by_string(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not found, "import these modules with an import statement:\n" + "\n".join(found)


def test_a_string_import_of_a_platoon_module_is_found():
    assert _imports_by_string(ast.parse('importlib.import_module("platoon.plugins")')) == [1]
    assert _imports_by_string(ast.parse('importlib.import_module(f"platoon.gateway.http.{name}")')) == [1]
    assert _imports_by_string(ast.parse("importlib.import_module(module_name)")) == []
