"""`platoon --help` printed without the command framework (platoon.cli.root) is typer's page, lists what
importlib.metadata lists, and imports neither."""

from __future__ import annotations

import importlib
import json
import zipfile
from pathlib import Path

import pytest

from platoon import plugins
from platoon.cli import main, root


def _typer_page() -> str:
    from typer import _click

    from platoon.cli.app import build_command

    command = build_command()
    return command.get_help(_click.Context(command, info_name="platoon", **command.context_settings))


@pytest.mark.parametrize("columns", [40, 60, 66, 70, 80, 200])
def test_the_page_printed_without_typer_is_typers_at_every_width(columns, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(columns))
    assert root.render_help() == _typer_page()


def test_help_and_dash_h_print_the_page_on_stdout(capsys):
    for argv in (["--help"], ["-h"]):
        assert main(argv) == 0
        captured = capsys.readouterr()
        assert captured.out == root.render_help() + "\n" and captured.err == ""


def test_no_arguments_prints_the_page_on_stderr_with_the_usage_status(capsys):
    assert main([]) == 64
    captured = capsys.readouterr()
    assert captured.err == root.render_help() + "\n" and captured.out == ""


def test_every_core_command_is_in_the_listing_and_nothing_else_of_core():
    from typer import _click

    from platoon.cli.app import build_command

    command = build_command()
    ctx = _click.Context(command, info_name="platoon")
    assert set(root.CORE_COMMANDS) == set(command.commands)  # type: ignore[attr-defined]
    assert [name for name, _ in root.listing()] == command.list_commands(ctx)


def test_extension_groups_are_what_importlib_metadata_finds(fresh_plugins):
    # whatever this environment installs: the workspace's plugins, or none where platoon-core is tested alone
    expected = {info.name: info.distribution for info in plugins.entry_points("command")}
    assert root.extension_groups() == expected


def _dist_info(folder: Path, name: str, version: str, commands: dict[str, str], *, egg: bool = False) -> None:
    stem = f"{name.replace('-', '_')}-{version}"
    meta = folder / (f"{stem}.egg-info" if egg else f"{stem}.dist-info")
    meta.mkdir(parents=True)
    (meta / ("PKG-INFO" if egg else "METADATA")).write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nA description.\n", encoding="utf-8"
    )
    lines = [f"{group} = {value}" for group, value in commands.items()]
    (meta / "entry_points.txt").write_text(
        "[console_scripts]\nacme = acme:main\n\n# a comment\n[platoon.commands]\n" + "\n".join(lines) + "\n",
        encoding="utf-8",
    )


def test_extension_groups_follow_sys_path_order_as_importlib_metadata_does(
    tmp_path, monkeypatch, fresh_plugins
):
    first, second = tmp_path / "first", tmp_path / "second"
    _dist_info(first, "Acme-Tools", "1.0", {"acme": "acme_tools.cli:app", "config": "acme_tools.cli:shadow"})
    # the same distribution again later on sys.path: the first one wins, as it does for imports
    _dist_info(second, "acme_tools", "2.0", {"acme-two": "acme_tools.cli:two"})
    _dist_info(second, "acme.legacy", "0.1", {"legacy": "acme_legacy:app"}, egg=True)
    monkeypatch.syspath_prepend(str(second))
    monkeypatch.syspath_prepend(str(first))
    importlib.invalidate_caches()
    plugins.reset()
    expected = {info.name: info.distribution for info in plugins.entry_points("command")}
    found = root.extension_groups()
    assert found == expected
    assert found["acme"] == "Acme-Tools" and "acme-two" not in found and found["legacy"] == "acme.legacy"
    listing = dict(root.listing())
    # an extension cannot take a core command's name
    assert listing["config"] == root.CORE_COMMANDS["config"]
    assert listing["acme"] == "Commands from Acme-Tools."
    assert root.render_help() == _typer_page()


def test_first_party_groups_are_listed_with_their_own_help_and_say_their_package(capsys):
    installed = root.extension_groups()
    for name, (distribution, line) in root.FIRST_PARTY_GROUPS.items():
        if installed.get(name) != distribution:
            continue  # platoon-core alone (CI's package step) or a distribution without it
        assert dict(root.listing())[name] == line
        assert main([name, "--help"]) == 0
        page = capsys.readouterr().out
        # the line is the group's own description, and the group's help names the package it comes with
        assert f"\n\n  {line}\n\n  From the {distribution} package.\n\n" in page, page
    assert "(an extension)" not in root.render_help()


def test_a_first_party_group_that_is_not_installed_names_the_package(monkeypatch, capsys):
    # platoon-core alone: the metadata lists no first-party group (whatever this environment installs)
    everything = root.extension_groups()
    monkeypatch.setattr(
        root,
        "extension_groups",
        lambda: {k: v for k, v in everything.items() if k not in root.FIRST_PARTY_GROUPS},
    )
    for argv in (["harbor"], ["harbor", "fetch", "c.yaml"], ["sandbox", "--help"], ["toolchain", "list"]):
        assert main(argv) == 64, argv
        captured = capsys.readouterr()
        distribution = root.FIRST_PARTY_GROUPS[argv[0]][0]
        assert captured.err == (
            f"platoon: `platoon {argv[0]}` comes with the {distribution} package: uv pip install {distribution}\n"
        )
        assert captured.out == ""
    assert main(["harbr"]) == 64  # any other name is click's usage error, as before
    assert "No such command 'harbr'" in capsys.readouterr().err


def test_a_zip_on_sys_path_is_left_to_importlib_metadata(tmp_path, monkeypatch, fresh_plugins):
    archive = tmp_path / "deps.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(
            "zipped_tools-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: zipped-tools\nVersion: 1.0\n"
        )
        zf.writestr("zipped_tools-1.0.dist-info/entry_points.txt", "[platoon.commands]\nzipped = zt:app\n")
    monkeypatch.syspath_prepend(str(archive))
    importlib.invalidate_caches()
    plugins.reset()
    assert root.extension_groups()["zipped"] == "zipped-tools"


def test_help_imports_neither_typer_nor_importlib_metadata(run_python):
    code = (
        "import contextlib, io, json, sys\nfrom platoon.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n    assert main(['--help']) == 0\n"
        "assert 'Commands:' in out.getvalue()\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout.splitlines()[-1]))
    heavy = {
        "typer",
        "click",
        "rich",
        "pydantic",
        "yaml",
        "pluggy",
        "packaging",
        "importlib.metadata",
        "platoon.cli.app",
        "platoon.plugins",
        "platoon.config",
    }
    assert loaded.isdisjoint(heavy), sorted(loaded & heavy)
    assert {"platoon.cli", "platoon.cli.root"} <= loaded
