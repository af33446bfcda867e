"""`platoon sandbox`: found through platoon-sandbox's entry point."""

from __future__ import annotations

from platoon.cli import main


def test_sandbox_reap_says_it_is_not_available_yet(capsys):
    assert main(["--help"]) == 0
    assert "\n  sandbox " in capsys.readouterr().out
    assert main(["sandbox", "reap", "runs/x"]) == 1
    assert capsys.readouterr().err == (
        "platoon: `platoon sandbox reap` is not available yet in this build; it arrives with the sandbox providers\n"
    )


def test_sandbox_group_shows_reap_and_refuses_unknown_subcommands(capsys):
    # a group with one subcommand stays a group: `reap` is listed, and an unknown name is not run as `reap`
    assert main(["sandbox", "--help"]) == 0
    assert "Commands:\n  reap " in capsys.readouterr().out
    assert main(["sandbox", "bogus"]) == 64
    assert "No such command 'bogus'" in capsys.readouterr().err
