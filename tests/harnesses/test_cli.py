"""`platoon toolchain`: found through platoon-harnesses' entry point."""

from __future__ import annotations

from platoon.cli import main


def test_toolchain_group_is_listed_and_build_needs_a_spec(capsys):
    assert main(["--help"]) == 0
    assert "\n  toolchain " in capsys.readouterr().out
    assert main(["toolchain", "build"]) == 64
    assert capsys.readouterr().err == (
        "platoon: toolchain build: name at least one spec (name[@version] or a .toml path)\n"
    )


def test_toolchain_group_shows_its_commands_and_refuses_unknown_subcommands(capsys):
    assert main(["toolchain", "--help"]) == 0
    help_text = capsys.readouterr().out
    for command in ("build", "list", "verify"):
        assert f"\n  {command} " in help_text
    assert main(["toolchain", "bogus"]) == 64
    assert "No such command 'bogus'" in capsys.readouterr().err
