"""The root typer app: core's command groups, plus plugin groups found through `platoon.commands` entry points.

Plugin groups are listed from installed metadata and imported only when invoked, so a broken plugin cannot take
`platoon --help` down. The root's description and listing come from `platoon.cli.root`, which also prints
`platoon --help` without importing this module (or typer).
"""

from __future__ import annotations

from typing import Annotated

import typer
from typer import _click
from typer.core import TyperCommand, TyperGroup

from platoon.cli import components, config, extensions, plot, prepare, rollout, root, tinker, train
from platoon.cli import eval as eval_command
from platoon.cli.output import TOP_LEVEL, new_app
from platoon.cli.style import plain_help
from platoon.errors import ExtensionError, UsageError
from platoon.viz import cli as viz


class PlatoonGroup(TyperGroup):
    """The root group: core commands are registered; plugin groups are resolved lazily by name."""

    def _plugin_groups(self) -> dict[str, str | None]:
        """Extension group name -> distribution (metadata only; core's names cannot be taken)."""
        return {name: dist for name, dist in root.extension_groups().items() if name not in self.commands}

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return sorted([*self.commands, *self._plugin_groups()])

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        command = self.commands.get(cmd_name)
        if command is not None:
            return command
        groups = self._plugin_groups()
        if cmd_name not in groups:
            return None
        # A stand-in for help listings; running the group loads the real one (resolve_command).
        line = root.extension_group_help(cmd_name, groups[cmd_name])
        return TyperCommand(name=cmd_name, help=line, short_help=line)

    def resolve_command(
        self, ctx: _click.Context, args: list[str]
    ) -> tuple[str | None, _click.Command | None, list[str]]:
        name = args[0] if args else None
        if name is not None and name not in self.commands:
            if name in self._plugin_groups():
                return name, _load_plugin_group(name), args[1:]
            if (missing := root.missing_group_message(name)) is not None:
                raise UsageError(missing)
        return super().resolve_command(ctx, args)


def _load_plugin_group(name: str) -> _click.Command:
    from platoon import plugins

    try:
        group = plugins.get_command_group(name)
        app = plugins.resolve_target(group.app)
    except ExtensionError:
        raise
    except Exception as exc:  # the plugin's own import failure: its fault, reported by name
        raise ExtensionError(f"command group {name!r} failed to load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(app, typer.Typer):
        raise ExtensionError(f"command group {name!r} is {type(app).__name__}, not a typer.Typer")
    # Always a group: typer folds a one-command app into that command, which would hide the subcommand from
    # `--help` and run it for any unknown name (`platoon sandbox bogus` running `reap`).
    command = typer.main.get_group(app)
    command.name = name
    distribution = root.extension_groups().get(name)
    if distribution:  # the group's own help says which package it comes with
        command.help = f"{command.help or ''}\n\nFrom the {distribution} package.".lstrip()
    return plain_help(command)


def _version_callback(value: bool) -> None:
    if value:
        from platoon._version import UNKNOWN_VERSION, running_version

        version = running_version()
        print("unknown" if version == UNKNOWN_VERSION else version)
        raise typer.Exit(0)


def build_app() -> typer.Typer:
    app = new_app(root.DESCRIPTION, cls=PlatoonGroup, name="platoon", **TOP_LEVEL)

    @app.callback()
    def root_options(
        version: Annotated[
            bool,
            typer.Option(
                "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
            ),
        ] = False,
    ) -> None:
        """Train LLM agents with reinforcement learning through a Tinker-compatible service."""

    line = root.CORE_COMMANDS
    app.command("train", short_help=line["train"])(train.train)
    app.command("eval", short_help=line["eval"])(eval_command.eval_)
    app.command("rollout", short_help=line["rollout"])(rollout.rollout)
    app.command("prepare", short_help=line["prepare"])(prepare.prepare)
    app.command("plot", short_help=line["plot"])(plot.plot)
    app.add_typer(config.app, name="config", short_help=line["config"])
    app.add_typer(components.harness_app, name="harness", short_help=line["harness"])
    app.add_typer(components.program_app, name="program", short_help=line["program"])
    app.add_typer(components.env_app, name="env", short_help=line["env"])
    app.add_typer(extensions.app, name="extensions", short_help=line["extensions"])
    tinker_app = new_app("The local Tinker-compatible training server.")
    tinker_app.command("serve")(tinker.serve)
    app.add_typer(tinker_app, name="tinker", short_help=line["tinker"])
    # The viewer's own group (`main` hands `viz` to it directly; here it is listed and documented with the rest).
    app.add_typer(viz.app, name="viz", short_help=line["viz"])
    return app


def build_command() -> _click.Command:
    return plain_help(typer.main.get_command(build_app()))
