"""The one registry: every component platoon finds by name lands here, whichever door it came in by.

The doors are the `register_*` functions below, `@platoon.harness`, `@platoon.program`, `platoon.hooks.register`,
the answers of plugins' registration hooks (turned into their kind's record first, by `platoon.plugins` and the
lookup modules above it) and import strings. Each kind has one store, so it has one lookup path:

- the generic kinds (`dataset_loader`, `task_loader`, `rollout`, `reward_processor`, `workflow`,
  `trainer_config`): a name -> object store each, read by `lookup` and `registered`;
- the versioned kinds, records by `name@version`: `HARNESSES` (function harnesses), `HARNESS_SPECS` (TOML specs an
  entry point gave), `PROGRAMS` and `ENVIRONMENTS`;
- what plugins answered for the kinds named without versions (services, sandbox runtimes, commands, spec
  runners, reward processors): `component` and `remember_component`;
- the functions registered for the seams: `add_seam` and `seam_functions`.

`resolve_import_string` turns `module:attr.attr` (or the legacy dotted `module.attr`) into the object. This module
sits low: it imports no record type (not even for the type checker) and never `platoon.plugins`, which loads entry points and fills it.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from platoon.errors import ExtensionError
from platoon.versioned import VersionedRegistry

__all__ = [
    "ENVIRONMENTS",
    "HARNESSES",
    "HARNESS_SPECS",
    "KINDS",
    "PROGRAMS",
    "ImportStringError",
    "lookup",
    "register_dataset_loader",
    "register_reward_processor",
    "register_rollout",
    "register_task_loader",
    "register_trainer_config",
    "register_workflow",
    "registered",
    "resolve_import_string",
]

KINDS: tuple[str, ...] = (
    "dataset_loader",
    "task_loader",
    "rollout",
    "reward_processor",
    "workflow",
    "trainer_config",
)

_registries: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
_lock = threading.Lock()

# The versioned stores hold their records untyped here: the record modules import this one, so each names its
# store's record type where it takes it (`REGISTRY` in `platoon.harness.function`, `platoon.programs.registry`,
# `platoon.config.named`, `SPECS` in `platoon.harness.spec`), and code reads the stores through those.
#: function harnesses registered in this process (`@platoon.harness`, an entry point's module, a test)
HARNESSES: VersionedRegistry[Any] = VersionedRegistry("harness")
#: TOML specs that entry points gave (a spec path a config names directly is not here)
HARNESS_SPECS: VersionedRegistry[Any] = VersionedRegistry("harness")
#: episode programs (`@platoon.program`, an entry point's module)
PROGRAMS: VersionedRegistry[Any] = VersionedRegistry("program")
#: named environments that entry points gave
ENVIRONMENTS: VersionedRegistry[Any] = VersionedRegistry("environment")
_VERSIONED: tuple[VersionedRegistry[Any], ...] = (HARNESSES, HARNESS_SPECS, PROGRAMS, ENVIRONMENTS)

#: what plugins answered for kinds named without versions: (kind, name) -> record
_components: dict[tuple[str, str], Any] = {}
#: generic-kind names that a plugin's answer registered (forgotten with the plugin state)
_from_plugins: set[tuple[str, str]] = set()
#: seam name -> the functions `platoon.hooks.register` added, in registration order
_seams: dict[str, list[Callable[..., Any]]] = {}
#: caches above this module to drop when the plugin state is forgotten (each module hands in its own)
_on_forget: list[Callable[[], None]] = []


class ImportStringError(ExtensionError):
    """An import string that names nothing importable (a `ValueError`; the command line exits 78)."""


def _source(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if module and qualname:
        return f"{module}:{qualname}"
    return repr(obj)


def _check_kind(kind: str) -> dict[str, Any]:
    try:
        return _registries[kind]
    except KeyError:
        raise ValueError(f"unknown registry kind {kind!r}; expected one of {', '.join(KINDS)}") from None


def _register(kind: str, name: str, obj: Any, *, by_plugin: bool = False) -> Any:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {kind} name must be a non-empty string; got {name!r}")
    registry = _check_kind(kind)
    with _lock:
        current = registry.get(name)
        # The same object again is a no-op; the same source again is a module re-import and replaces the record.
        if current is not None and current is not obj and _source(current) != _source(obj):
            raise ValueError(
                f"{kind} {name!r} is already registered to {_source(current)}; cannot register {_source(obj)} under it"
            )
        registry[name] = obj
        if by_plugin:
            _from_plugins.add((kind, name))
    return obj


def register_dataset_loader[T](name: str, fn: T) -> T:
    """Register `fn` as the dataset loader called `name`; returns `fn`.

    The same object again is a no-op (a re-imported module replaces its own record); a different object under a
    registered name raises ValueError naming both. The other `register_*` functions behave the same way.
    """
    return _register("dataset_loader", name, fn)


def register_task_loader[T](name: str, fn: T) -> T:
    """Register `fn` as the task loader called `name`; returns `fn`."""
    return _register("task_loader", name, fn)


def register_rollout[T](name: str, fn: T) -> T:
    """Register `fn` as the rollout function called `name`; returns `fn`."""
    return _register("rollout", name, fn)


def register_reward_processor[T](name: str, fn: T) -> T:
    """Register `fn(trajectory_dict) -> (score, components)` as the reward processor called `name`; returns `fn`."""
    return _register("reward_processor", name, fn)


def register_workflow[T](name: str, fn: T) -> T:
    """Register `fn` as the workflow called `name`; returns `fn`."""
    return _register("workflow", name, fn)


def register_trainer_config[T](name: str, cls: T) -> T:
    """Register `cls` as the trainer config class called `name`; returns `cls`."""
    return _register("trainer_config", name, cls)


def lookup(kind: str, name: str) -> object | None:
    """The object registered as `name` in the `kind` registry, or None."""
    registry = _check_kind(kind)
    with _lock:
        return registry.get(name)


def registered(kind: str) -> dict[str, object]:
    """A copy of the `kind` registry, in registration order."""
    registry = _check_kind(kind)
    with _lock:
        return dict(registry)


def register_from_plugin(kind: str, name: str, obj: Any) -> Any:
    """Register what a plugin's hook gave under `name`, as `register_*` would: a different object already there
    (registered by code, or by another plugin) raises ValueError naming both. Forgotten with the plugin state."""
    return _register(kind, name, obj, by_plugin=True)


def component(kind: str, name: str) -> Any | None:
    """The record a plugin gave for `name` of a kind named without versions, once resolved in this process."""
    with _lock:
        return _components.get((kind, name))


def remember_component(kind: str, name: str, record: Any) -> Any:
    with _lock:
        _components[(kind, name)] = record
    return record


def component_names(kind: str) -> list[str]:
    with _lock:
        return [name for (k, name) in _components if k == kind]


def versioned_names() -> set[str]:
    """The names in the versioned stores: what importing a module registered shows up here."""
    return {record.name for store in _VERSIONED for record in store.records().values()}


def add_seam(name: str, fn: Callable[..., Any]) -> None:
    """Add `fn` to the seam `name` (the caller checks the name); the same function again changes nothing."""
    with _lock:
        functions = _seams.setdefault(name, [])
        if fn not in functions:
            functions.append(fn)


def seam_functions(name: str) -> list[Callable[..., Any]]:
    with _lock:
        return list(_seams.get(name, []))


def clear_seams() -> None:
    with _lock:
        _seams.clear()


def on_forget(forget: Callable[[], None]) -> None:
    """Have `forget_loaded` also call `forget` (a module above this one dropping its cache of loaded records)."""
    if forget not in _on_forget:
        _on_forget.append(forget)


def forget_loaded() -> None:
    """Drop the versioned records, the plugins' components and what plugins registered (with `plugins.reset`).

    What code registered with `register_*` stays, as the modules that registered it stay imported.
    """
    for store in _VERSIONED:
        store.clear()
    with _lock:
        _components.clear()
        for kind, name in _from_plugins:
            _registries[kind].pop(name, None)
        _from_plugins.clear()
    for forget in _on_forget:
        forget()


def _import_failure(ref: str, module: str, exc: BaseException) -> ImportStringError:
    return ImportStringError(
        f"cannot import {ref!r}: importing {module!r} failed ({type(exc).__name__}: {exc})"
    )


def _walk(ref: str, module_name: str, target: Any, attrs: list[str]) -> Any:
    for i, attr in enumerate(attrs):
        try:
            target = getattr(target, attr)
        except AttributeError:
            where = ".".join([module_name, *attrs[:i]])
            raise ImportStringError(f"cannot import {ref!r}: {where!r} has no attribute {attr!r}") from None
    return target


def resolve_import_string(ref: str) -> Any:
    """The object an import string names: `package.module:attr.attr`, or the legacy dotted `package.module.attr`.

    Raises `ImportStringError` (a ValueError) with one line when the module cannot be imported or lacks the name.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise ImportStringError(f"not an import string: {ref!r}")
    ref = ref.strip()
    if ":" in ref:
        module_name, _, attr_path = ref.partition(":")
        if not module_name or not attr_path or ":" in attr_path:
            raise ImportStringError(f"not an import string: {ref!r} (expected 'module:attr')")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise _import_failure(ref, module_name, exc) from exc
        return _walk(ref, module_name, module, attr_path.split("."))

    parts = ref.split(".")
    if len(parts) < 2 or not all(parts):
        raise ImportStringError(f"not an import string: {ref!r} (expected 'module:attr' or 'module.attr')")
    # Legacy dotted form: the longest prefix that imports is the module, the rest are attributes.
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only "this prefix is not a module" moves on to a shorter prefix; a missing dependency is the error.
            if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                continue
            raise _import_failure(ref, module_name, exc) from exc
        except Exception as exc:
            raise _import_failure(ref, module_name, exc) from exc
        return _walk(ref, module_name, module, parts[split:])
    raise ImportStringError(f"cannot import {ref!r}: no module named {parts[0]!r}")


def import_target(ref: str, *, what: str) -> Any:
    """The object `module:attr` (optionally `python://module:attr`) names, or one ExtensionError line saying why not."""
    try:
        return resolve_import_string(ref.removeprefix("python://"))
    except ExtensionError as exc:
        raise ExtensionError(f"{what}: {exc}") from exc
