"""The gateway's HTTP modules import one way, even counting imports under `if TYPE_CHECKING:`: the server imports
the dialect modules for its routes, and the dialects type their `server` against `DialectServer` in
`gateway/http/common.py`, never against `GatewayServer` (docs/architecture.md: no import circles)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter

import pytest
from source_imports import CORE_SRC, imports, module_name

HTTP = CORE_SRC / "platoon" / "gateway" / "http"
SERVER = "platoon.gateway.http.server"


def http_graph(extra: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module of gateway/http -> the modules of gateway/http it imports, type-checking imports included.

    `extra` maps a module name to source text that stands in for its file (for the test that the check can fail).
    """
    sources = {
        module_name(path, CORE_SRC): path.read_text(encoding="utf-8") for path in sorted(HTTP.glob("*.py"))
    }
    sources.update(extra or {})
    package = module_name(HTTP / "__init__.py", CORE_SRC)
    graph: dict[str, set[str]] = {}
    for module, text in sources.items():
        targets: set[str] = set()
        for found in imports(ast.parse(text), module, is_package=module == package):
            if not found.names:
                targets.add(found.target)
            # `from a import b` names the module `a.b` when there is one (a dialect), else `a`
            for name in found.names:
                submodule = f"{found.target}.{name}"
                targets.add(submodule if submodule in sources else found.target)
        graph[module] = {target for target in targets if target in sources and target != module}
    return graph


def test_no_dialect_module_imports_the_server_even_for_types():
    importers = sorted(module for module, targets in http_graph().items() if SERVER in targets)
    # The package re-exports GatewayServer; nothing else below the server names it.
    assert importers == ["platoon.gateway.http"]


def test_the_http_modules_have_no_import_circle_counting_type_checking_imports():
    graph = http_graph()
    assert {"platoon.gateway.http.openai_chat", "platoon.gateway.http.agents"} <= graph[SERVER]
    TopologicalSorter(graph).prepare()  # raises CycleError on a circle


def test_a_type_checking_import_of_the_server_from_a_dialect_is_a_circle():
    chat = (HTTP / "openai_chat.py").read_text(encoding="utf-8")
    typed = chat + "\n\nif TYPE_CHECKING:\n    from platoon.gateway.http.server import GatewayServer\n"
    with pytest.raises(CycleError):
        TopologicalSorter(http_graph({"platoon.gateway.http.openai_chat": typed})).prepare()
