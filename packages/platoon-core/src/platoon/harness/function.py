"""Function harnesses: `@platoon.harness(name)` records an async function as the harness `name@version`.

Its store, `platoon.registry.HARNESSES`, holds every function harness registered in this process, whoever
registered it (an entry point's module, a config's `package:`, a test); lookups by reference go through
`platoon.harness.registry`.

A harness may also give two functions of its options (an entry's `harness_options`): `check_options(options)`, the
lines a run refuses to start with (`platoon config validate` prints them), and `prepare(options, cache_root,
dry_run)`, the steps `platoon prepare` makes once per site for those options (a download, say), as `PrepareStep`s.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from platoon import registry
from platoon.naming import check_name, check_not_reserved, check_version
from platoon.plugin_records import PrepareStep
from platoon.versioned import VersionedRegistry

#: the attribute that ties a decorated function to its record
HARNESS_ATTR = "__platoon_harness__"
RUNTIMES = ("inline",)

F = TypeVar("F", bound=Callable[..., Any])

#: `check_options(options) -> problems`: each line names the option and what is wrong (no prefix: the caller adds
#: where the options are)
OptionsCheck = Callable[[Mapping[str, Any]], list[str]]
#: `prepare(options, cache_root, dry_run) -> steps`: `cache_root` is the site profile's cache (None: platoon's
#: default); with `dry_run` nothing is made, a step that would be made is `missing`
OptionsPrepare = Callable[[Mapping[str, Any], str | None, bool], list[PrepareStep]]


@dataclass(frozen=True)
class FunctionHarness:
    """A harness that is an `async def fn(ctx: AgentContext) -> AgentResult`, run inline in the rollout's loop."""

    name: str
    version: str
    runtime: str
    executes_model_code: bool
    fn: Callable[..., Any]
    check_options: OptionsCheck | None = None
    prepare: OptionsPrepare | None = None

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def source(self) -> str:
        return f"{self.fn.__module__}:{self.fn.__qualname__}"

    @property
    def kind(self) -> str:
        return "function"

    @property
    def doc(self) -> str:
        return inspect.getdoc(self.fn) or ""


#: the one registry's store of function harnesses
REGISTRY: VersionedRegistry[FunctionHarness] = registry.HARNESSES


def register(record: FunctionHarness) -> FunctionHarness:
    """Record a harness; the same function again replaces its record, a different one under its ref is refused."""
    return REGISTRY.add(record)


def harness(
    name: str,
    *,
    version: str = "1",
    runtime: str = "inline",
    executes_model_code: bool = False,
    check_options: OptionsCheck | None = None,
    prepare: OptionsPrepare | None = None,
) -> Callable[[F], F]:
    """Register `async def fn(ctx) -> AgentResult` as the function harness `name@version`; returns fn unchanged.

    `check_options` and `prepare` are the harness's checks and site preparation for its options (module docstring).
    """
    check_name(name, what="harness name")
    check_version(version)
    if runtime not in RUNTIMES:
        raise ValueError(f"harness runtime {runtime!r} is not supported: the only runtime is 'inline'")

    def decorate(fn: F) -> F:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"harness {name!r} must be an async function (async def), got {fn!r}")
        check_not_reserved(name, "harness", getattr(fn, "__module__", None))
        record = register(
            FunctionHarness(name, version, runtime, bool(executes_model_code), fn, check_options, prepare)
        )
        setattr(fn, HARNESS_ATTR, record)
        return fn

    return decorate


def record_of(value: Any, *, register_it: bool = True) -> FunctionHarness | None:
    """The record behind a FunctionHarness or a decorated function (registering it if it is not yet).

    `register_it=False` only reads the record: running a harness object that is not (or could not be)
    registered under its name, such as a test's inline harness, must not depend on the name being free.
    """
    record = value if isinstance(value, FunctionHarness) else getattr(value, HARNESS_ATTR, None)
    if not isinstance(record, FunctionHarness):
        return None
    return register(record) if register_it else record


def registered_harnesses() -> dict[str, FunctionHarness]:
    return REGISTRY.records()


def clear_registry() -> None:
    REGISTRY.clear()
