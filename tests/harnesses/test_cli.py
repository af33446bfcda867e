"""`platoon toolchain`: found through platoon-harnesses' entry point."""

from __future__ import annotations

from platoon.cli import main


def test_toolchain_build_says_it_is_not_available_yet(capsys):
    assert main(["--help"]) == 0
    assert "\n  toolchain " in capsys.readouterr().out
    assert main(["toolchain", "build", "spec.toml"]) == 1
    assert capsys.readouterr().err == (
        "platoon: `platoon toolchain build` is not available yet in this build; it arrives with toolchain building\n"
    )


def test_toolchain_group_shows_build_and_refuses_unknown_subcommands(capsys):
    # a group with one subcommand stays a group: `build` is listed, and an unknown name is not run as `build`
    assert main(["toolchain", "--help"]) == 0
    assert "Commands:\n  build " in capsys.readouterr().out
    assert main(["toolchain", "bogus"]) == 64
    assert "No such command 'bogus'" in capsys.readouterr().err
