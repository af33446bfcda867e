"""Episode programs: `@platoon.program(name)` records `async def program(ep) -> Outcome` as `name@version`.

`get_program(ref)` resolves what an entry's `program:` names: `name@version`, a bare name with one registered
version, or `module:attr` (an undecorated callable becomes a record named by the reference, with no version).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from platoon import plugins, registry
from platoon.errors import ExtensionError
from platoon.naming import check_name, check_not_reserved, check_version, split_ref

# The record lives in a low module that the hookspecs can type against; it stays importable from here.
from platoon.programs.record import EpisodeProgram
from platoon.registry import import_target
from platoon.versioned import VersionedRegistry

PROGRAM_ATTR = "__platoon_program__"
F = TypeVar("F", bound=Callable[..., Any])


#: the one registry's store of programs
REGISTRY: VersionedRegistry[EpisodeProgram] = registry.PROGRAMS


def program(name: str, *, version: str = "1") -> Callable[[F], F]:
    """Register `async def program(ep: EpisodeContext) -> Outcome` as `name@version`; returns it unchanged."""
    check_name(name, what="program name")
    check_version(version)

    def decorate(fn: F) -> F:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"program {name!r} must be an async function (async def), got {fn!r}")
        check_not_reserved(name, "program", getattr(fn, "__module__", None))
        setattr(fn, PROGRAM_ATTR, REGISTRY.add(EpisodeProgram(name, version, fn)))
        return fn

    return decorate


def record_of(value: Any) -> EpisodeProgram | None:
    if isinstance(value, EpisodeProgram):
        return REGISTRY.add(value)
    record = getattr(value, PROGRAM_ATTR, None)
    return REGISTRY.add(record) if isinstance(record, EpisodeProgram) else None


def registered_programs() -> dict[str, EpisodeProgram]:
    return REGISTRY.records()


def clear_registry() -> None:
    REGISTRY.clear()


def _from_import_string(ref: str) -> EpisodeProgram:
    value = import_target(ref, what="program")
    record = record_of(value)
    if record is not None:
        return record
    if not callable(value):
        raise TypeError(f"program {ref!r} is {type(value).__name__}, not a callable")
    return EpisodeProgram(ref, "", value)


def program_record(name: str, answer: Any) -> EpisodeProgram:
    """The record a `platoon_register_programs` answer for `name` gives (registered): an `@platoon.program`
    function or an `EpisodeProgram` called `name`; anything else is one ExtensionError naming the entry point."""
    record = record_of(answer)
    if record is None:
        raise ExtensionError(f"program entry point {name!r} gave {type(answer).__name__}, not a program")
    if record.name != name:
        raise ExtensionError(
            f"program entry point {name!r} gave the program {record.name!r}: "
            "an entry point must be named after the program it provides"
        )
    return record


def get_program(ref: str) -> EpisodeProgram:
    """The program an entry's `program:` names; unknown or ambiguous names raise ExtensionError."""
    if not isinstance(ref, str) or not ref:
        raise ExtensionError(f"program reference {ref!r} is not a name or module:attr")
    if ":" in ref:
        return _from_import_string(ref)
    name, wanted = split_ref(ref)
    if plugins.candidates("program", name):
        for answer in plugins.load_named("program", name):
            program_record(name, answer)
    if not REGISTRY.versions(name):
        raise plugins.unknown_name_error(
            "program",
            name,
            list(REGISTRY.records()),
            "provide one with @platoon.program in a module that an entry point (group 'platoon.programs') or an "
            "environment's package: imports, or name it as module:attr",
        )
    return REGISTRY.pick(name, wanted)
