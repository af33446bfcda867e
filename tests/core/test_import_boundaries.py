"""`import platoon` stays cheap, and core never imports a plugin package."""

from __future__ import annotations

import ast
import json
import pkgutil
from pathlib import Path

import platoon

HEAVY = [
    "torch",
    "transformers",
    "tinker",
    "openreward",
    "docker",
    "mcp",
    "starlette",
    "uvicorn",
    "tokenizers",
    # the trajectory viewer's TUI: imported only when a `platoon viz` command runs
    "textual",
    # `platoon plot`'s drawing: imported only when the command runs
    "matplotlib",
]
PLUGIN_PACKAGES = ["platoon_harnesses", "platoon_sandbox", "platoon_harbor", "platoon_textcraft"]
CORE_SRC = Path(platoon.__file__).parent


def _loaded_after(run_python, code: str) -> list[str]:
    result = run_python(code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def _top_level(modules: list[str]) -> set[str]:
    return {m.split(".", 1)[0] for m in modules}


def test_import_platoon_imports_no_heavy_dependency(run_python):
    loaded = _top_level(_loaded_after(run_python, "import platoon; platoon.__version__"))
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))


def test_import_platoon_leaves_the_version_lookup_until_it_is_asked_for(run_python):
    # importlib.metadata (and the checkout's pyproject reader) cost more than the rest of `import platoon`.
    loaded = _loaded_after(run_python, "import platoon")
    assert {"importlib.metadata", "tomllib", "platoon._version"}.isdisjoint(loaded)
    assert "__version__" in dir(__import__("platoon"))


def test_every_public_name_resolves_lazily_and_stays_light(run_python):
    code = "import platoon as pt\nfor name in pt.__all__: getattr(pt, name)\nassert len(pt.__all__) == 32"
    loaded = _top_level(_loaded_after(run_python, code))
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))


def test_unknown_attribute_names_module_and_attribute():
    try:
        platoon.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert str(exc) == "module 'platoon' has no attribute 'no_such_name'"
    else:
        raise AssertionError("expected AttributeError")


def test_cli_help_imports_no_plugin_and_no_heavy_dependency(run_python):
    code = (
        "import contextlib, io\nfrom platoon.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    assert main(['--help']) == 0\n"
    )
    loaded = _top_level(_loaded_after(run_python, code))
    assert loaded.isdisjoint(HEAVY + PLUGIN_PACKAGES), sorted(loaded & set(HEAVY + PLUGIN_PACKAGES))


def test_the_viewer_command_line_imports_textual_only_when_a_viewer_runs(run_python):
    code = (
        "import contextlib, io\nfrom platoon.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    assert main(['viz', '--help']) == 0\n"
        "with contextlib.redirect_stderr(io.StringIO()):\n    assert main(['viz', 'replay', 'missing.jsonl']) == 64\n"
        "import platoon.viz.model, platoon.viz.sources\n"
    )
    loaded = _top_level(_loaded_after(run_python, code))
    assert "textual" not in loaded
    loaded = _top_level(_loaded_after(run_python, "import platoon.viz.app"))
    assert "textual" in loaded  # the check above would notice it


def test_importing_every_core_module_imports_no_plugin_package(run_python):
    modules = [m.name for m in pkgutil.walk_packages([str(CORE_SRC)], prefix="platoon.")]
    assert "platoon.cli.app" in modules and "platoon.plugins" in modules
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    loaded = _top_level(_loaded_after(run_python, code))
    assert loaded.isdisjoint(PLUGIN_PACKAGES), sorted(loaded & set(PLUGIN_PACKAGES))


def test_no_core_source_names_a_plugin_package():
    offenders = []
    for path in CORE_SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(CORE_SRC)}: {n}" for n in names if n.split(".")[0] in PLUGIN_PACKAGES
            ]
    assert offenders == []


def test_version_agrees_everywhere(capsys):
    from platoon.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == platoon.__version__ == "0.2.0"
    assert json.dumps(platoon.__version__)


def test_a_scripted_episode_loads_neither_the_tinker_sdk_nor_torch(run_python):
    # The episode samples a scripted policy, not a Tinker client: the gateway hands it plain types, and neither the
    # SDK (seconds to import) nor torch (which the SDK imports where it is installed) is loaded.
    code = (
        "from platoon.testing import run_episode\n"
        "from platoon.testing.number_search import react_binary_search\n"
        "run = run_episode('train:0', service='python://platoon.envs.number_search.env:NumberSearchEnvironment',\n"
        "                  harness='platoon-react', policy=react_binary_search)\n"
        "assert run.reward == 1.0, run.reward\n"
    )
    loaded = _top_level(_loaded_after(run_python, code))
    assert {"tinker", "torch", "transformers"}.isdisjoint(loaded), sorted(loaded & {"tinker", "torch"})
    # the episode did run its environment and its gateway
    assert {"openreward", "tokenizers", "starlette"} <= loaded
