"""One help style for every command, core's and extensions' alike: plain upper-case placeholders (`CONFIG`,
`TEXT`, `INTEGER`) and an off-by-default flag shown as the one switch it is (`--json-output`).

typer renders a required argument as `{CONFIG}`, an option's value as `<str>`, and a flag that is off by
default as `--json-output / --no-json-output [default: no-json-output]`. It builds its parameter objects itself,
with no setting for their class, so `plain_help` walks a finished command tree and gives each typer parameter a
subclass that only renders differently: what a command accepts is unchanged (`--no-json-output` still parses).
"""

from __future__ import annotations

from typing import Any

from typer import _click
from typer.core import TyperArgument, TyperOption

#: an option's value placeholder by its type's name; any other type shows its name upper-cased
_TYPE_PLACEHOLDERS = {
    "str": "TEXT",
    "int": "INTEGER",
    "int range": "INTEGER",  # the range itself is in the help's [default: ...; x>=1]
    "float": "FLOAT",
    "float range": "FLOAT",
}


class PlainArgument(TyperArgument):
    """An argument shown as `CONFIG` (required) or `[CONFIG]` (optional), never `{CONFIG}`."""

    def make_metavar(self, ctx: _click.Context, *, usage: bool = False) -> str:
        name = self.metavar or (self.name or "").upper()
        if self.metavar is None and self.nargs != 1:
            name += "..."
        if usage and not self.required and not name.startswith("["):
            name = f"[{name}]"
        return name


class PlainOption(TyperOption):
    """An option whose value shows as an upper-case placeholder, and an off-by-default flag as its switch alone."""

    def make_metavar(self, ctx: _click.Context) -> str:
        if self.metavar is not None:
            return self.metavar
        placeholder = _TYPE_PLACEHOLDERS.get(self.type.name, self.type.name.upper().replace(" ", "_"))
        return placeholder + ("..." if self.nargs != 1 else "")

    def get_help_record(self, ctx: _click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        if record is None or not _off_by_default(self):
            return record
        # Only the switch: its `--no-` twin restates the default (and still parses, for scripts that wrote it).
        return _click.formatting.join_options(self.opts)[0], record[1]


def _off_by_default(option: TyperOption) -> bool:
    return bool(option.is_bool_flag and option.secondary_opts and option.default is False)


def plain_help(command: Any) -> Any:
    """Give `command` and every command under it the plain help style; returns `command`."""
    for param in getattr(command, "params", []):
        if type(param) is TyperArgument:
            param.__class__ = PlainArgument
        elif type(param) is TyperOption:
            param.__class__ = PlainOption
            if _off_by_default(param):
                param.show_default = False
    for sub in (getattr(command, "commands", None) or {}).values():
        plain_help(sub)
    return command
