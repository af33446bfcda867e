"""Named environments: `platoon.EnvironmentEntry`, a versioned partial `environments` entry a package ships.

A config's `env: name[@version]` expands to the entry's keys as the lowest layer of that entry.
Entries come from the `platoon.environments` entry-point group or are named by `module:attr`; those the group gives
are kept in the one registry's store, and `get_environment` looks them up.
"""

from __future__ import annotations

from typing import Any

from platoon import plugins, registry

# The record lives in a low module that the hookspecs can type against; it stays importable from here.
from platoon.config.environment_entry import FORBIDDEN_KEYS as FORBIDDEN_KEYS
from platoon.config.environment_entry import EnvironmentEntry
from platoon.errors import ExtensionError
from platoon.naming import split_ref
from platoon.versioned import VersionedRegistry

#: the one registry's store of named environments
REGISTRY: VersionedRegistry[EnvironmentEntry] = registry.ENVIRONMENTS


def environment_record(
    name: str, answer: Any, *, label: str, source: str, others: set[str]
) -> EnvironmentEntry | None:
    """The record a `platoon_register_environments` answer for `name` gives: the `EnvironmentEntry` called `name`,
    registered with `source` (the entry point of the distribution `label`) unless it has one; None for an entry
    named after another of `others` (a module shared by several entry points answers them all). Anything else is
    one ExtensionError."""
    if not isinstance(answer, EnvironmentEntry):
        raise ExtensionError(
            f"environment entry point {name!r} ({label}) gave {type(answer).__name__}, not a platoon.EnvironmentEntry"
        )
    if answer.name != name:
        if answer.name in others:
            return None
        raise ExtensionError(
            f"environment entry point {name!r} gave the environment {answer.name!r}: "
            "an entry point must be named after the environment it provides"
        )
    answer.source = answer.source or source
    try:
        return REGISTRY.add(answer)
    except ValueError as exc:
        raise ExtensionError(str(exc)) from exc


def clear_registry() -> None:
    REGISTRY.clear()


def get_environment(ref: str) -> EnvironmentEntry:
    """The named environment `name[@version]` (a `platoon.EnvironmentEntry`), or `module:attr` importing one."""
    if ":" in ref:
        value = registry.import_target(ref, what="environment")
        if not isinstance(value, EnvironmentEntry):
            raise ExtensionError(
                f"environment {ref!r} is {type(value).__name__}, not a platoon.EnvironmentEntry"
            )
        return value
    name, wanted = split_ref(ref)
    others = {i.name for i in plugins.entry_points("environment")}
    for info in plugins.candidates("environment", name):
        source = f"{info.label} ({info.group}: {info.value})"
        for answer in plugins.ask("environment", name, plugins.load(info)):
            environment_record(name, answer, label=info.label, source=source, others=others)
    if not REGISTRY.versions(name):
        raise plugins.unknown_name_error(
            "environment",
            name,
            list(REGISTRY.records()),
            "provide one with a platoon.EnvironmentEntry in an entry point of the group 'platoon.environments', "
            "or name it as module:attr",
        )
    return REGISTRY.pick(name, wanted)
