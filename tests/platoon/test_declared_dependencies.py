"""Every module a package imports, at the top of a file or inside a function, comes from a distribution that package
declares (a dependency or an extra), from the standard library, or from the package itself.

A lazy import of something only another package pulls in works in the shared workspace and fails for a user who
installs the package alone; this reads every import statement of every package's source, so such an import is
found without running the code path that makes it. (`.ci/run` also runs the plugin packages' tests each in an
environment holding only that package.)
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())

#: (package, module) -> why the package may import it without declaring it
ALLOWED = {
    (
        "platoon-core",
        "pydantic_core",
    ): "pydantic's own compiled core, pinned to one version by pydantic itself",
    (
        "platoon-core",
        "wandb",
    ): "optional: metrics go to W&B only when the user installed wandb (checked by find_spec)",
    ("platoon-harnesses", "openhands"): "specs/openhands/run_openhands.py runs in OpenHands' own toolchain",
}
#: module -> the distribution that provides it, for what the dev environment leaves out on purpose: torch (and its
#: CUDA libraries) is installed only in the torch-engine group's environment, so no metadata names its provider
#: there; an import of it counts as declared where the package declares that distribution.
NOT_IN_DEV_ENVIRONMENT = {"torch": "torch"}
#: modules of the test kit (`platoon.testing`) may also use the package's `test` dependency group
TEST_KIT = "testing"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalized(re.split(r"[\s<>=!~\[;@]", requirement.strip(), maxsplit=1)[0])


def project_table(package: Path) -> dict:
    return tomllib.loads((package / "pyproject.toml").read_text())


def declared(package: Path, *, test_group: bool) -> set[str]:
    data = project_table(package)
    project = data["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    if test_group:
        requirements += [r for r in data.get("dependency-groups", {}).get("test", []) if isinstance(r, str)]
    return {requirement_name(r) for r in requirements}


@functools.cache
def installed_modules() -> dict[str, frozenset[str]]:
    """top-level module -> the distributions that provide it: the installed ones', then the workspace's."""
    modules = {
        module: frozenset(map(normalized, dists)) for module, dists in packages_distributions().items()
    }
    modules.update({module: frozenset({owner}) for module, owner in workspace_modules().items()})
    return modules


@functools.cache
def workspace_modules() -> dict[str, str]:
    """top-level module -> the workspace package that ships it (editable installs are not in the metadata's map)."""
    modules = {}
    for package in PACKAGES:
        source = package / "src"
        if source.is_dir():
            for module in source.iterdir():
                if module.is_dir() and not module.name.startswith((".", "_")):
                    modules[module.name] = normalized(project_table(package)["project"]["name"])
    return modules


@functools.cache
def imported_modules(path: Path) -> frozenset[str]:
    """Top-level names of the absolute imports anywhere in a file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return frozenset(names)


def undeclared_imports(package: Path) -> list[str]:
    name = normalized(project_table(package)["project"]["name"])
    own = {module.name for module in (package / "src").iterdir() if module.is_dir()}
    problems = []
    for path in sorted((package / "src").rglob("*.py")):
        relative = path.relative_to(package / "src")
        allowed = declared(package, test_group=TEST_KIT in relative.parts[1:-1])
        for module in sorted(imported_modules(path)):
            if module in sys.stdlib_module_names or module in own or module == "__future__":
                continue
            if (name, module) in ALLOWED:
                continue
            sources = installed_modules().get(module)
            if not sources and module in NOT_IN_DEV_ENVIRONMENT:
                sources = frozenset({NOT_IN_DEV_ENVIRONMENT[module]})
            if not sources:
                problems.append(f"{relative}: imports {module}, which no installed distribution provides")
            elif not sources & allowed:
                problems.append(
                    f"{relative}: imports {module} (from {', '.join(sorted(sources))}), not declared"
                )
    return problems


def test_every_package_declares_what_its_source_imports():
    problems = {}
    for package in PACKAGES:
        if (package / "src").is_dir() and (found := undeclared_imports(package)):
            problems[package.name] = found
    assert problems == {}


def test_an_undeclared_import_inside_a_function_is_found(tmp_path):
    package = tmp_path / "demo"
    (package / "src" / "demo").mkdir(parents=True)
    (package / "pyproject.toml").write_text('[project]\nname = "demo"\ndependencies = ["httpx>=0.27"]\n')
    (package / "src" / "demo" / "load.py").write_text(
        "import json\nimport httpx\nfrom demo import other\nfrom . import sibling\n\n"
        "def load():\n    import yaml\n    from docker.errors import APIError\n"
    )
    assert undeclared_imports(package) == [
        "demo/load.py: imports docker (from docker), not declared",
        "demo/load.py: imports yaml (from pyyaml), not declared",
    ]


def test_a_module_the_dev_environment_leaves_out_must_still_be_declared(tmp_path):
    package = tmp_path / "demo"
    (package / "src" / "demo").mkdir(parents=True)
    (package / "pyproject.toml").write_text(
        '[project]\nname = "demo"\n[project.optional-dependencies]\ngpu = ["torch>=2.6"]\n'
    )
    (package / "src" / "demo" / "engine.py").write_text("def run():\n    import torch\n")
    assert undeclared_imports(package) == []
    (package / "pyproject.toml").write_text('[project]\nname = "demo"\n')
    assert undeclared_imports(package) == ["demo/engine.py: imports torch (from torch), not declared"]


def test_each_allowance_still_has_an_import_to_excuse():
    used = set()
    for package in PACKAGES:
        if not (package / "src").is_dir():
            continue
        name = normalized(project_table(package)["project"]["name"])
        for path in (package / "src").rglob("*.py"):
            used |= {(name, module) for module in imported_modules(path)}
    assert set(ALLOWED) <= used, f"allowances nothing needs any more: {sorted(set(ALLOWED) - used)}"
