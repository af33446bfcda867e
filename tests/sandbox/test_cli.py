"""`platoon sandbox`: found through platoon-sandbox's entry point (its commands are tested in test_run_reaping)."""

from __future__ import annotations

from platoon.cli import main


def test_sandbox_group_shows_list_and_reap_and_refuses_unknown_subcommands(capsys):
    assert main(["--help"]) == 0
    assert "\n  sandbox " in capsys.readouterr().out
    assert main(["sandbox", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert "Commands:\n  list " in help_text and "\n  reap " in help_text
    assert main(["sandbox", "bogus"]) == 64
    assert "No such command 'bogus'" in capsys.readouterr().err


def test_reap_needs_a_run_dir(capsys):
    assert main(["sandbox", "reap"]) == 64
    assert "Missing argument 'RUN_DIR'" in capsys.readouterr().err
