"""`get_harness(ref)`: find a harness by `name[@version]`, a `.toml` path or `module:function`.

Names are looked up in installed entry points (group `platoon.harnesses`, imported when named) and in harnesses
registered by imported modules; version prefixes match at dots (`@2` matches `2.4.6`). An entry point may give
function harnesses or TOML specs (a `HarnessSpec`, a spec path or a directory of `*.toml`); both kinds share one
namespace: a ref matching versions of both kinds is ambiguous like any other, and where a spec and a function
have the same `name@version` the spec wins, with a warning.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

from platoon import plugins, registry
from platoon.errors import ExtensionError
from platoon.harness.function import REGISTRY, FunctionHarness, record_of, registered_harnesses
from platoon.harness.spec import HarnessSpec, SpecError, load_spec, register_spec, registered_specs
from platoon.naming import FIRST_PARTY_MODULES, is_reserved, pick_version, split_ref
from platoon.registry import import_target

Harness = FunctionHarness | HarnessSpec

#: specs loaded by path: absolute path -> ((mtime_ns, size), spec), so a rollout's lookups do not re-read the file
_by_path: dict[str, tuple[tuple[int, int], HarnessSpec]] = {}
_by_path_lock = threading.Lock()
#: refs already warned about (a spec beating a function), so a run warns once per ref
_warned: set[str] = set()


def forget_loaded_specs() -> None:
    """Drop the specs loaded by path and the warnings given (with `plugins.reset`, for tests)."""
    with _by_path_lock:
        _by_path.clear()
    _warned.clear()


registry.on_forget(forget_loaded_specs)


def _from_import_string(ref: str) -> FunctionHarness:
    record = record_of(import_target(ref, what="harness"))
    if record is None:
        raise ExtensionError(f"harness {ref!r} is not an @platoon.harness function")
    return record


def _cached(path: str | os.PathLike[str]) -> HarnessSpec:
    """`load_spec`, once per file version: a run looks its harness up for every rollout."""
    absolute = os.path.abspath(os.fspath(path))
    try:
        stat = os.stat(absolute)
        stamp = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        stamp = (-1, -1)  # load_spec says what is wrong with the path
    with _by_path_lock:
        cached = _by_path.get(absolute)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    spec = load_spec(absolute)
    with _by_path_lock:
        _by_path[absolute] = (stamp, spec)
    return spec


def spec_at(path: str | os.PathLike[str]) -> HarnessSpec:
    """The spec in a `.toml` file a config names. A reserved name (`platoon-*`) needs a file shipped inside one
    of platoon's own packages."""
    spec = _cached(path)
    if is_reserved(spec.name, "harness") and not _in_first_party_package(spec.path):
        raise SpecError(
            f"{spec.path}: name: harness name {spec.name!r} is reserved for platoon's own harnesses; "
            f"name yours with your own prefix, for example 'acme-{spec.name.removeprefix('platoon-')}'"
        )
    return spec


def _in_first_party_package(path: Path) -> bool:
    """Whether a spec file is shipped inside one of platoon's own packages (which may use reserved names)."""
    for module in FIRST_PARTY_MODULES:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            continue
        for location in (found.submodule_search_locations or []) if found else []:
            if path.is_relative_to(Path(location).resolve()):
                return True
    return False


def specs_from(answer: Any) -> list[HarnessSpec]:
    """The specs an entry point's answer gives: a spec, a spec path, or a directory of `*.toml`."""
    if isinstance(answer, HarnessSpec):
        return [answer]
    path = Path(os.fspath(answer))
    if path.is_dir():
        return [_cached(p) for p in sorted(path.glob("*.toml")) if p.is_file()]
    if path.suffix != ".toml":
        raise SpecError(f"{path}: a harness spec file ends in .toml")
    return [_cached(path)]


def harness_records(name: str, answer: Any) -> list[Harness]:
    """The records one `platoon_register_harnesses` answer for `name` gives: an `@platoon.harness` function or a
    `FunctionHarness` (registered by its decorator), a `HarnessSpec`, or a spec path or directory (loaded, not yet
    registered); a module gives none (its import registered its harnesses). Anything else is one ExtensionError."""
    if isinstance(answer, ModuleType):
        return []
    function = record_of(answer)
    if function is not None:
        return [function]
    if isinstance(answer, HarnessSpec | str) or hasattr(answer, "__fspath__"):
        return [*specs_from(answer)]
    raise ExtensionError(f"harness entry point {name!r} gave {type(answer).__name__}, which is not a harness")


def _absorb(answers: list[Any], name: str, *, first_party: bool) -> None:
    """Register what a plugin's hook gave for `name`: functions (by their decorator) and TOML specs.

    Specs are all loaded and checked before any is registered, so an entry point whose specs clash registers none
    of them (its harnesses are missing, and saying why is the caller's).
    """
    specs: dict[str, HarnessSpec] = {}
    for answer in answers:
        for record in harness_records(name, answer):
            if isinstance(record, FunctionHarness):
                if record.name != name:
                    warnings.warn(
                        f"the entry point {name!r} gave the harness {record.name!r}: "
                        "name each entry point after the harness",
                        stacklevel=3,
                    )
                continue
            if is_reserved(record.name, "harness") and not first_party:
                raise SpecError(
                    f"{record.path}: name: harness name {record.name!r} is reserved for platoon's own harnesses; "
                    "a third-party entry point cannot give it"
                )
            other = specs.get(record.ref)
            if other is not None and other.path != record.path:
                raise SpecError(
                    f"harness {record.ref} is defined twice: by {other.path} and by {record.path}; "
                    "give one of them another name or version"
                )
            specs[record.ref] = record
    for spec in specs.values():
        register_spec(spec)
        if spec.name != name:
            warnings.warn(
                f"the entry point {name!r} gave the harness {spec.name!r} ({spec.path}): "
                "name each entry point after the harness",
                stacklevel=3,
            )


def versions(name: str) -> dict[str, Harness]:
    """Every version of `name` registered in this process, both kinds; a spec replaces a function of its ref."""
    found: dict[str, Harness] = dict(REGISTRY.versions(name))
    for version, spec in {s.version: s for s in registered_specs().values() if s.name == name}.items():
        function = found.get(version)
        if isinstance(function, FunctionHarness) and spec.ref not in _warned:
            _warned.add(spec.ref)
            warnings.warn(
                f"harness {spec.ref} is both a TOML spec ({spec.path}) and a function ({function.source}): "
                "the spec is used",
                stacklevel=3,
            )
        found[version] = spec
    return found


def all_harnesses() -> dict[str, Harness]:
    """Every harness registered in this process by ref (a spec beating a function of its ref)."""
    found: dict[str, Harness] = dict(registered_harnesses())
    found.update(registered_specs())
    return found


def absorb_entry_point(info: plugins.EntryPointInfo) -> None:
    """Import one harness entry point and register what its hook answers (errors are the caller's)."""
    _absorb(plugins.ask("harness", info.name, plugins.load(info)), info.name, first_party=info.builtin)


def get_harness(ref: str) -> Harness:
    """The harness a config or code names: a `FunctionHarness` or a `HarnessSpec`.

    Unknown or ambiguous names raise ExtensionError (a ValueError); a spec that does not load raises SpecError
    (one of them) naming the file and the key.
    """
    if not isinstance(ref, str) or not ref:
        raise ExtensionError(f"harness reference {ref!r} is not a name, a .toml path or module:function")
    if ref.endswith(".toml"):
        return spec_at(ref)
    if ":" in ref:
        return _from_import_string(ref)
    name, wanted = split_ref(ref)
    found = plugins.candidates("harness", name)
    if found:
        _absorb(plugins.load_named("harness", name), name, first_party=all(i.builtin for i in found))
    known = versions(name)
    if not known and not is_reserved(name, "harness"):
        # Legacy names: an entry point may register harnesses under names other than its own.
        for info in plugins.entry_points("harness"):
            if plugins.first_party_shadow(info) is None:
                with contextlib.suppress(ExtensionError):  # recorded; the unknown-name error lists it
                    absorb_entry_point(info)
        known = versions(name)
        if known:
            warnings.warn(
                f"harness {name!r} was found only by loading every harness entry point; "
                "name each entry point after the harness it provides",
                stacklevel=2,
            )
    if not known:
        raise plugins.unknown_name_error(
            "harness",
            name,
            list(all_harnesses()),
            "provide one with @platoon.harness in a module that an entry point (group 'platoon.harnesses') or an "
            "environment's package: imports, a TOML spec that such an entry point gives, or name it as "
            "module:function or a .toml path",
        )
    try:
        return known[pick_version(name, wanted, known, kind="harness")]
    except (LookupError, ValueError) as exc:
        raise ExtensionError(str(exc)) from exc
