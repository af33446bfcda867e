"""The generated reference pages (docs/reference/commands.md, python-api.md, config.md) are what the code generates
now: a command, option, public name, docstring or config key that changes without regenerating them fails here.

Here rather than in tests/core because the command page includes the first-party plugins' command groups, which the
`platoon` distribution installs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "docs_reference.py"


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("docs_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.mark.parametrize("page", ["commands.md", "python-api.md", "config.md"])
def test_generated_page_is_current(generator, page):
    path = generator.REFERENCE / page
    render = generator.pages()[path]
    assert path.read_text(encoding="utf-8") == render(), (
        f"docs/reference/{page} is stale: regenerate it with `uv run python scripts/docs_reference.py`"
    )


def test_every_command_and_public_name_is_listed(generator):
    from platoon.cli import root

    commands = (generator.REFERENCE / "commands.md").read_text(encoding="utf-8")
    for name in [*root.CORE_COMMANDS, "harbor", "sandbox", "toolchain"]:
        assert f"\n## platoon {name}\n" in commands
    assert "Usage: platoon plot [OPTIONS] RUN_DIR\n" in commands

    import platoon
    import platoon.testing

    api = (generator.REFERENCE / "python-api.md").read_text(encoding="utf-8")
    for name in platoon.__all__:
        assert f"### `platoon.{name}`" in api
    for name in platoon.testing.__all__:
        assert f"### `platoon.testing.{name}`" in api
    assert " at 0x" not in api  # no per-process addresses in reprs


def test_check_mode_names_a_stale_page(generator, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(generator, "REFERENCE", tmp_path)
    monkeypatch.setattr(generator, "ROOT", tmp_path.parent)
    (tmp_path / "commands.md").write_text("# old\n", encoding="utf-8")
    assert generator.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path.name}/commands.md is stale" in err and f"{tmp_path.name}/config.md is stale" in err
