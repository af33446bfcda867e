"""No import circles in a plugin package even counting the imports under `if TYPE_CHECKING:`.

Those imports never run, so `test_import_cycles` leaves them out; but a circle of them still ties two modules
together for a reader and for mypy, so the plugins keep none (a session names its service by a protocol; the
TextCraft export and its card share `harbor.variants`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from source_imports import PLUGIN_SRCS, imports, module_name
from test_import_cycles import cycles

HARBOR_SRC = next(src for src in PLUGIN_SRCS if src.parent.name == "platoon-harbor")


def typed_import_graph(src: Path, *, extra: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the modules of the same source tree it imports, those under `if TYPE_CHECKING:` included."""
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


@pytest.mark.parametrize("src", PLUGIN_SRCS, ids=lambda src: src.parent.name)
def test_no_plugin_package_has_a_circle_of_type_imports(src: Path):
    found = cycles(typed_import_graph(src))
    listing = "\n".join(" <-> ".join(sorted(cycle)) for cycle in sorted(found, key=sorted))
    assert not found, f"import circles in {src.parent.name} (counting TYPE_CHECKING imports):\n{listing}"


def test_a_type_checking_import_that_closes_a_circle_is_found():
    # service imports session at run time; session importing service back, even only for mypy, closes a circle.
    session = (HARBOR_SRC / "platoon_harbor" / "session.py").read_text(encoding="utf-8")
    typed = session + "\n\nif TYPE_CHECKING:\n    from platoon_harbor.service import HarborService\n"
    graph = typed_import_graph(HARBOR_SRC, extra={"platoon_harbor.session": typed})
    assert frozenset({"platoon_harbor.service", "platoon_harbor.session"}) in cycles(graph)
