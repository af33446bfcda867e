"""No import circle inside the episode and the renderers packages even counting the imports under
`if TYPE_CHECKING:` (docs/architecture.md): a module types what it uses of a higher one by a protocol instead.

test_import_cycles.py leaves those imports out for the whole of platoon; these packages keep the stricter rule.
"""

from __future__ import annotations

import ast

import pytest
from source_imports import CORE_SRC, imports, module_name
from test_import_cycles import cycles

STRICT_PACKAGES = ["platoon.episode", "platoon.renderers"]


def type_level_graph(extra: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the modules of platoon-core it imports anywhere, `if TYPE_CHECKING:` blocks included (an import
    names a module as in test_import_cycles.py)."""
    sources = {
        module_name(path, CORE_SRC): path.read_text(encoding="utf-8") for path in CORE_SRC.rglob("*.py")
    }
    sources.update(extra or {})
    packages = {module_name(path, CORE_SRC) for path in CORE_SRC.rglob("__init__.py")}
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


def _within(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    inside = {module for module in graph if module == package or module.startswith(f"{package}.")}
    return {module: graph[module] & inside for module in inside}


@pytest.mark.parametrize("package", STRICT_PACKAGES)
def test_no_type_level_import_circle_inside(package: str):
    found = sorted(sorted(cycle) for cycle in cycles(_within(type_level_graph(), package)))
    assert not found, f"import circles in {package}, counting TYPE_CHECKING imports: {found}"


def test_a_type_checking_import_that_closes_a_circle_is_found():
    # The probe once imported ChatTemplateRenderer for its annotations, closing a circle with chat_template.
    probe = (CORE_SRC / "platoon" / "renderers" / "probe.py").read_text(encoding="utf-8")
    typed = (
        probe
        + "\n\nif TYPE_CHECKING:\n    from platoon.renderers.chat_template import ChatTemplateRenderer\n"
    )
    graph = _within(type_level_graph({"platoon.renderers.probe": typed}), "platoon.renderers")
    assert frozenset({"platoon.renderers.chat_template", "platoon.renderers.probe"}) in cycles(graph)
