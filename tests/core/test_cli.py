"""The command line as a user meets it: every command registered, exit codes, one-line errors."""

from __future__ import annotations

import pytest

from platoon.cli import main

COMMANDS = ["config", "env", "eval", "extensions", "harbor", "harness", "prepare", "program", "rollout", "sandbox",
            "tinker", "toolchain", "train", "viz"]


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.split("Commands:\n", 1)[1].splitlines() if line.strip()]
    assert listed == COMMANDS


def test_no_arguments_shows_help():
    assert main([]) in (0, 2, 64)


def test_unknown_command_is_a_usage_error(capsys):
    assert main(["bogus"]) == 64
    assert "No such command 'bogus'" in capsys.readouterr().err


def test_bad_option_is_a_usage_error(capsys):
    assert main(["extensions", "list", "--kind", "gizmo"]) == 64
    assert "'gizmo' is not one of harness, program" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["train", "c.yaml"], "train"),
        (["eval", "c.yaml", "inference.model_name=x"], "eval"),
        (["rollout", "c.yaml", "--task", "7"], "rollout"),
        (["prepare", "c.yaml", "--dry-run"], "prepare"),
        (["tinker", "serve", "--port", "8000"], "tinker serve"),
        (["viz", "tail", "runs/x"], "viz"),
        (["harbor", "fetch", "hf://org/data"], "harbor fetch"),
        (["harbor", "images", "build"], "harbor images build"),
        (["sandbox", "reap", "runs/x"], "sandbox reap"),
        (["toolchain", "build", "spec.toml"], "toolchain build"),
    ],
)
def test_commands_of_later_releases_say_so_and_fail(argv, command, capsys):
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"platoon: `platoon {command}` is not available yet in this build; it arrives with ")


def test_plugin_group_is_imported_only_when_invoked(run_python):
    code = (
        "import sys, contextlib, io\nfrom platoon.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    main(['--help'])\n"
        "assert 'platoon_harbor' not in sys.modules\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    main(['harbor', '--help'])\n"
        "assert 'platoon_harbor.cli' in sys.modules\nprint('ok')"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_harness_show_unknown_is_a_config_error(capsys):
    assert main(["harness", "show", "acme-nothing"]) == 78
    err = capsys.readouterr().err
    assert err.startswith("platoon: unknown harness 'acme-nothing'.") and err.count("\n") == 1


def test_program_list_and_show(capsys):
    assert main(["program", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["program", "distribution", "source"]
    assert ["gym", "platoon-core", "platoon.programs.builtin"] in [line.split() for line in lines]
    assert main(["program", "show", "gym"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gym@1\nsource: platoon.programs.builtin:gym\ndistribution: platoon-core 0.2.0\n\n")


def test_env_list_with_a_config(tmp_path, capsys):
    config = tmp_path / "mix.yaml"
    config.write_text(
        "environments:\n"
        "  - name: math\n    weight: 2\n    service: table\n    harness: {acme-a: 1, acme-b: 3}\n"
        "  - name: code\n    weight: 1\n    env: acme-arith\n"
    )
    assert main(["env", "list", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"Environments of {config}:\n" in out
    table = out.split(f"Environments of {config}:\n", 1)[1].splitlines()
    assert table[0].split() == ["name", "weight", "service", "harness", "program", "rollout"]
    assert table[1].split() == ["math", "2", "table", "acme-a:1,", "acme-b:3", "single", "harness_rollout"]
    assert table[2].split() == ["code", "1", "(env", "acme-arith)", "-", "single", "-"]
    assert main(["env", "list", str(tmp_path / "missing.yaml")]) == 78
    config.write_text("environments: {name: x}\n")
    assert main(["env", "list", str(config)]) == 78
    assert "environments must be a list" in capsys.readouterr().err
