"""The command line as a user meets it: every command registered, exit codes, one-line errors."""

from __future__ import annotations

import re

from platoon.cli import main

CORE_COMMANDS = [
    "config",
    "env",
    "eval",
    "extensions",
    "harness",
    "plot",
    "prepare",
    "program",
    "rollout",
    "tinker",
    "train",
    "viz",
]


def test_help_lists_every_command(capsys):
    from platoon import plugins

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.split("Commands:\n", 1)[1].splitlines() if line.strip()]
    # core's commands, and the command groups installed plugin distributions declare (from metadata)
    assert listed == sorted(CORE_COMMANDS + [info.name for info in plugins.entry_points("command")])


def test_no_arguments_shows_help():
    assert main([]) in (0, 2, 64)


def test_unknown_command_is_a_usage_error(capsys):
    assert main(["bogus"]) == 64
    assert "No such command 'bogus'" in capsys.readouterr().err


def _commands(*, groups_only: bool) -> list[tuple[str, ...]]:
    """The path of every command (or only every command group) the installed `platoon` has, core's and installed
    plugins', nested ones too."""
    from typer import _click
    from typer.core import TyperGroup

    from platoon.cli.app import build_command

    root = build_command()
    paths: list[tuple[str, ...]] = []

    def walk(group: TyperGroup, path: tuple[str, ...]) -> None:
        ctx = _click.Context(group, info_name=path[-1] if path else "platoon")
        for name in group.list_commands(ctx):
            # resolve_command loads a plugin group for real (get_command gives only a stand-in for listings)
            _, command, _ = group.resolve_command(ctx, [name])
            if isinstance(command, TyperGroup):
                paths.append((*path, name))
                walk(command, (*path, name))
            elif not groups_only and name != "viz":  # viz parses its own arguments
                paths.append((*path, name))

    walk(root, ())
    return paths


def _command_groups() -> list[tuple[str, ...]]:
    return _commands(groups_only=True)


def test_every_command_group_lists_its_subcommands_and_refuses_unknown_ones(capsys):
    from platoon import plugins

    groups = _command_groups()
    core_groups = {("config",), ("env",), ("extensions",), ("harness",), ("program",), ("tinker",)}
    # every plugin command group stays a group, however many subcommands it has
    plugin_groups = {(info.name,) for info in plugins.entry_points("command")}
    assert core_groups | plugin_groups <= set(groups)
    for path in groups:
        assert main([*path, "--help"]) == 0, path
        help_text = capsys.readouterr().out
        assert "Commands:\n" in help_text, path
        assert main([*path, "bogus"]) == 64, path
        assert "No such command 'bogus'" in capsys.readouterr().err, path


def test_every_help_page_shows_plain_placeholders_and_flags(capsys):
    # `CONFIG`, not typer's `{CONFIG}`; `TEXT`, not `<str>`; `--json-output`, not
    # `--json-output / --no-json-output [default: no-json-output]`
    pages = {}
    for path in _commands(groups_only=False):
        assert main([*path, "--help"]) == 0, path
        pages[path] = capsys.readouterr().out
    assert len(pages) > 20
    for path, page in pages.items():
        usage = page.splitlines()[0]
        assert "{" not in usage and "<" not in usage, (path, usage)
        assert not re.search(r"<(str|int|float|int range|float range)>", page), (path, page)
        assert "[default: no-" not in page and "/ --no-json-output" not in page, (path, page)
    assert "Usage: platoon train [OPTIONS] CONFIG [K=V]...\n" in pages[("train",)]
    assert re.search(r"\n  --json-output +Print JSON instead of text\.\n", pages[("extensions", "list")])
    assert re.search(r"\n  --task TEXT +The task id", pages[("rollout",)])


def test_the_negative_twin_of_a_flag_still_parses(capsys):
    assert main(["extensions", "list", "--kind", "program", "--no-json-output"]) == 0
    assert capsys.readouterr().out.startswith("kind ")


def test_bad_option_is_a_usage_error(capsys):
    assert main(["extensions", "list", "--kind", "gizmo"]) == 64
    assert "'gizmo' is not one of harness, program" in capsys.readouterr().err


def test_viz_hands_its_arguments_to_the_viewer(capsys):
    # The viewer's own command group answers, in the same style as every other (tests/platoon/viz has the rest).
    assert main(["viz", "tail"]) == 64
    assert capsys.readouterr().err.splitlines() == [
        "Usage: platoon viz tail [OPTIONS] [PATH]...",
        "Try 'platoon viz tail -h' for help.",
        "",
        "Error: name at least one file, --dir or --rdir",
    ]


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


def test_env_list_lists_only_the_services_this_installation_has(capsys):
    from platoon import plugins

    assert main(["env", "list"]) == 0
    out = capsys.readouterr().out
    services = out.split("Environment services (an environments entry's `service`):\n", 1)[1].split("\n\n")[0]
    listed = [line.split()[0] for line in services.splitlines()[1:]]
    assert "table" in listed and "python://pkg.module:EnvClass" in listed and "pkg.module:Class" in listed
    # remote ORS servers in their two forms (ors+https is named in the ors+http row); harbor is offered exactly
    # when platoon-harbor is installed
    assert [name for name in listed if name.startswith("ors+")] == [
        "ors+http://HOST:PORT[,...]/EnvName",
        "ors+http:///EnvName",
    ]
    assert ("harbor" in listed) == ("harbor" in {info.name for info in plugins.entry_points("service")})
    assert len(listed) == len(plugins.entry_points("service")) + 1


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
