"""Generic registries filled by `package` modules or import strings.

Kinds: `dataset_loader`, `task_loader`, `rollout`, `reward_processor`, `workflow`, `trainer_config`. Plus
`resolve_import_string`, which turns `module:attr.attr` (or the legacy dotted `module.attr`) into the object.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from platoon.errors import ExtensionError

__all__ = [
    "KINDS",
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


def _register(kind: str, name: str, obj: Any) -> Any:
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
