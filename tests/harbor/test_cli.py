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
    ("argv", "code", "line"),
    [
        (["harbor", "images", "build"], 64, "Missing argument 'CONFIG|LOCK'"),
        (["harbor", "images", "plan", "missing.yaml"], 78, "platoon: missing.yaml: no such config file"),
        (["harbor", "images", "build", "c.yaml", "--shard", "2/2"], 64, "expected 0 <= i < n"),
    ],
)
def test_harbor_images_bad_input_is_one_line_with_its_exit_code(
    argv, code, line, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("environments: [{service: harbor, service_kwargs: {dataset_dir: .}}]\n")
    assert main(argv) == code
    captured = capsys.readouterr()
    assert captured.out == "" and line in captured.err and "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("group", "subcommands"),
    [
        (["harbor"], ["fetch", "verify", "index", "check", "images"]),
        (["harbor", "images"], ["plan", "build", "verify", "alias"]),
    ],
)
def test_harbor_groups_list_their_subcommands_and_refuse_unknown_ones(group, subcommands, capsys):
    assert main([*group, "--help"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.split("Commands:\n", 1)[1].splitlines()]
    assert listed == subcommands
    assert main([*group, "bogus"]) == 64
    assert "No such command 'bogus'" in capsys.readouterr().err
