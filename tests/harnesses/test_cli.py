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
