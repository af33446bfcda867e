"""`platoon harbor`: found through platoon-harbor's entry point, imported only when it runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from platoon.cli import main


def test_harbor_group_is_listed_and_imported_only_when_invoked():
    code = (
        "import sys, contextlib, io\nfrom platoon.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n    main(['--help'])\n"
        "assert 'harbor ' in out.getvalue() and 'platoon_harbor' not in sys.modules\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    main(['harbor', '--help'])\n"
        "assert 'platoon_harbor.cli' in sys.modules\nprint('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["harbor", "fetch", "hf://org/data"], "harbor fetch"),
        (["harbor", "verify"], "harbor verify"),
        (["harbor", "images", "build"], "harbor images build"),
        (["harbor", "images", "plan", "c.yaml"], "harbor images plan"),
    ],
)
def test_harbor_commands_say_they_are_not_available_yet(argv, command, capsys):
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"platoon: `platoon {command}` is not available yet in this build; it arrives with "
        + ("Harbor task images\n" if "images" in argv else "the Harbor service\n")
    )


@pytest.mark.parametrize(
    ("group", "subcommands"),
    [
        (["harbor"], ["fetch", "verify", "images"]),
        (["harbor", "images"], ["plan", "build", "verify", "alias"]),
    ],
)
def test_harbor_groups_list_their_subcommands_and_refuse_unknown_ones(group, subcommands, capsys):
    assert main([*group, "--help"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.split("Commands:\n", 1)[1].splitlines()]
    assert listed == subcommands
    assert main([*group, "bogus"]) == 64
    assert "No such command 'bogus'" in capsys.readouterr().err
