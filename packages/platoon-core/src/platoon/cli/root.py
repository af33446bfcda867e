"""The root of the command line as data: its description, each command's one-line help, the command groups that
installed extensions declare, and the root help page printed from them without the command framework.

`platoon --help` (and `platoon` alone) is the first thing a new user runs. Importing typer with the click it
vendors, or importlib.metadata, costs several times what printing this page needs, so `platoon.cli.main` prints it
from here, and the typer app (`app.py`) takes its root listing from the same tables. Only the standard library is
imported. A test checks that this page and typer's are the same at several terminal widths.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap

DESCRIPTION = "Train LLM agents with reinforcement learning through a Tinker-compatible service."
COMMANDS_GROUP = "platoon.commands"

#: core command -> its line in the root listing (each command's own --help says more)
CORE_COMMANDS: dict[str, str] = {
    "config": "Show and validate configs as a run resolves them.",
    "env": "Environment services and named environments.",
    "eval": "Evaluate a policy on every task of a split and write a report.",
    "extensions": "What installed extensions provide, and whether they load.",
    "harness": "The harnesses a config can name.",
    "plot": "Write a PNG of a training run's reward curve (the plot extra).",
    "prepare": "Fetch and build once per site what a config needs.",
    "program": "The episode programs a config can name.",
    "rollout": "Roll out one task and print its agent tree.",
    "tinker": "The local Tinker-compatible training server.",
    "train": "Train on a config through a Tinker-compatible service.",
    "viz": "The trajectory viewer: platoon viz tail|replay|show-dump.",
}

#: the root's options as its help lists them
OPTIONS: list[tuple[str, str]] = [
    ("--version", "Print the version and exit."),
    ("-h, --help", "Show this message and exit."),
]

_USAGE = "Usage: platoon [OPTIONS] COMMAND [ARGS]..."


#: the command groups of platoon's own plugin distributions, which are installed apart from core: name ->
#: (distribution, its line in the root listing: the first paragraph of the group's own help). Core knows them by
#: name only (it never imports them): to list them as it lists its own commands, and to name the package to install
#: where one is missing.
FIRST_PARTY_GROUPS: dict[str, tuple[str, str]] = {
    "harbor": ("platoon-harbor", "Harbor datasets: fetch and lock, verify, check, task images."),
    "sandbox": ("platoon-sandbox", "List and reap the sandboxes a run started."),
    "toolchain": ("platoon-harnesses", "Build, list and verify the toolchains of sandboxed harnesses."),
}


def extension_group_help(name: str, distribution: str | None) -> str:
    """An extension's command group's line in the root listing. Its module is imported only to run it, so a third
    party's group is listed by the distribution it comes from."""
    first_party = FIRST_PARTY_GROUPS.get(name)
    if first_party is not None and _normalize(first_party[0]) == _normalize(distribution or ""):
        return first_party[1]
    return f"Commands from {distribution or 'an unknown distribution'}."


def missing_group_message(name: str) -> str | None:
    """What to install for a first-party command group that is not installed (None for any other name)."""
    if name not in FIRST_PARTY_GROUPS:
        return None
    distribution = FIRST_PARTY_GROUPS[name][0]
    return f"`platoon {name}` comes with the {distribution} package: uv pip install {distribution}"


# ---------------------------------------------------------------------------------------------- extension groups


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _section(text: str, section: str) -> list[tuple[str, str]]:
    """The `name = value` lines of one `[section]` of an entry_points.txt."""
    found: list[tuple[str, str]] = []
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            inside = line[1:-1].strip() == section
        elif inside and "=" in line:
            name, _, value = line.partition("=")
            found.append((name.strip(), value.strip()))
    return found


def _metadata_name(folder: str) -> str | None:
    """The `Name:` header of a distribution's METADATA (PKG-INFO for an egg-info)."""
    for filename in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(folder, filename), encoding="utf-8") as handle:
                for line in handle:
                    if not line.strip():
                        break
                    if line.startswith("Name:"):
                        return line[len("Name:") :].strip()
        except OSError:
            continue
    return None


def _standard_discovery() -> bool:
    """Whether installed distributions are found only by scanning sys.path folders, which `extension_groups`
    does itself; otherwise (a zip on sys.path, an import hook that provides distributions) it asks
    importlib.metadata."""
    import importlib.machinery

    for finder in sys.meta_path:
        if hasattr(finder, "find_distributions") and finder is not importlib.machinery.PathFinder:
            return False
    return not any(entry and os.path.isfile(entry) for entry in sys.path)


def extension_groups() -> dict[str, str | None]:
    """Command groups declared in installed metadata (the `platoon.commands` entry points): name ->
    distribution. Nothing is imported, and neither is importlib.metadata where sys.path holds only folders: the
    `*.dist-info` / `*.egg-info` folders on sys.path are read in its order, the first of a distribution winning,
    as importlib.metadata (and `platoon.plugins`) find them."""
    if not _standard_discovery():
        from platoon import plugins

        return {info.name: info.distribution for info in plugins.entry_points("command")}
    groups: dict[str, str | None] = {}
    seen: set[str] = set()
    for entry in sys.path:
        folder = entry or "."
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            normalized = _normalize(name.rpartition(".")[0].split("-")[0])
            if normalized in seen:
                continue
            path = os.path.join(folder, name)
            try:
                with open(os.path.join(path, "entry_points.txt"), encoding="utf-8") as handle:
                    text = handle.read()
            except OSError:
                text = ""
            if "platoon." not in text:
                continue
            seen.add(normalized)
            for group, _value in _section(text, COMMANDS_GROUP):
                groups.setdefault(group, _metadata_name(path) or normalized)
    return groups


# ---------------------------------------------------------------------------------------------- the help page


def listing() -> list[tuple[str, str]]:
    """(name, line) of every root command, extension groups included, sorted by name."""
    rows = dict(CORE_COMMANDS)
    for name, distribution in extension_groups().items():
        rows.setdefault(name, extension_group_help(name, distribution))
    return sorted(rows.items())


def help_width() -> int:
    """The width click lays help out in: the terminal's, at most 80, less a margin of 2, at least 50."""
    import shutil

    return max(min(shutil.get_terminal_size().columns, 80) - 2, 50)


def _definitions(rows: list[tuple[str, str]], width: int) -> list[str]:
    """Two columns, indented 2: the names padded to the longest (at most 30) plus 2, the text wrapped beside them."""
    first = min(max(len(name) for name, _ in rows), 30) + 2
    wrap = max(width - first - 2, 10)
    lines: list[str] = []
    for name, text in rows:
        wrapped = textwrap.wrap(text, wrap, replace_whitespace=False) or [""]
        if len(name) <= first - 2:
            lines.append(f"  {name}{' ' * (first - len(name))}{wrapped[0]}")
        else:
            lines += [f"  {name}", f"{' ' * (first + 2)}{wrapped[0]}"]
        lines += [f"{' ' * (first + 2)}{line}" for line in wrapped[1:]]
    return lines


def render_help(width: int | None = None) -> str:
    """The root help page, as `platoon --help` prints it (without its final newline)."""
    width = help_width() if width is None else width
    lines = [_USAGE, ""]
    lines += textwrap.wrap(DESCRIPTION, width, initial_indent="  ", subsequent_indent="  ")
    lines += ["", "Options:", *_definitions(OPTIONS, width)]
    lines += ["", "Commands:", *_definitions(listing(), width)]
    return "\n".join(lines)
