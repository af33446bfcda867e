"""Entry-point discovery (metadata only) and loading components by name: the facade that hides pluggy from core.

Listing reads installed metadata and imports nothing. A component's module is imported the first time a config
or command names it: find the entry point of that name, check that its distribution admits the running platoon,
import it once, register it with the plugin manager, ask the kind's hook for the name, and put what it answers,
as its kind's record, into the one registry (`platoon.registry`), where code's registrations are too.

This module sits above the registry and the record types it imports; the lookups of harnesses and programs
(`platoon.harness.registry`, `platoon.programs.registry`) sit above it, and nothing below imports it.
"""

from __future__ import annotations

import difflib
import os
import threading
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from platoon import hookspecs, registry
from platoon._version import running_version
from platoon.errors import ExtensionError
from platoon.naming import is_first_party_distribution

RETIRED_GROUP = "platoon.plugins"
IGNORE_REQUIREMENTS_VAR = "PLATOON_IGNORE_EXTENSION_REQUIREMENTS"

#: kind -> the config keys or places that name a component of that kind (`extensions show`'s "used in")
USED_IN: dict[str, str] = {
    "harness": "environments[].harness, ep.run(harness=...), ctx.agents.spawn(harness=...)",
    "program": "environments[].program",
    "environment": "environments[].env",
    "reward_processor": "environments[].reward_processor",
    "service": "environments[].service",
    "sandbox_runtime": "Harbor service_kwargs.provider, the site profile's provider",
    "command": "platoon <group> ...",
    "spec_runner": "environments[].harness naming a TOML spec (core asks for it when one runs)",
}

_GROUP_KINDS = {group: kind for kind, group in hookspecs.ENTRY_POINT_GROUPS.items()}


@dataclass(frozen=True)
class EntryPointInfo:
    """One installed entry point of a platoon group, as metadata describes it (nothing imported)."""

    kind: str
    name: str
    group: str
    value: str
    distribution: str | None
    distribution_version: str | None
    #: requirements of the distribution on `platoon` / `platoon-core`, as written (markers applied)
    requires: tuple[str, ...] = ()

    @property
    def builtin(self) -> bool:
        return is_first_party_distribution(self.distribution)

    @property
    def label(self) -> str:
        return self.distribution or "(no distribution)"

    def entry_point(self) -> metadata.EntryPoint:
        return metadata.EntryPoint(name=self.name, value=self.value, group=self.group)


@dataclass
class _State:
    """Per-process plugin state: the metadata scan, what was loaded, and what failed."""

    entry_points: list[EntryPointInfo] | None = None
    retired: list[EntryPointInfo] = field(default_factory=list)
    loaded: dict[EntryPointInfo, Any] = field(default_factory=dict)
    failures: dict[EntryPointInfo, ExtensionError] = field(default_factory=dict)
    registers: dict[EntryPointInfo, list[str]] = field(default_factory=dict)
    manager: pluggy.PluginManager | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)


_state = _State()


# ---------------------------------------------------------------------------------------------- discovery


def _distribution_name(dist: metadata.Distribution) -> str | None:
    # `Distribution.name` parses METADATA; the normalized folder name is enough to tell distributions apart.
    return getattr(dist, "_normalized_name", None) or dist.name


def _platoon_requirements(dist: metadata.Distribution) -> tuple[str, ...]:
    """The distribution's requirements on platoon or platoon-core that apply with no extra or one of its own."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    extras = ["", *list(dist.metadata.get_all("Provides-Extra") or [])]
    found: list[str] = []
    for line in dist.requires or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) not in ("platoon", "platoon-core"):
            continue
        if req.marker is None or any(req.marker.evaluate({"extra": extra}) for extra in extras):
            found.append(str(req).split(";")[0].strip())
    return tuple(found)


def _scan() -> list[EntryPointInfo]:
    infos: list[EntryPointInfo] = []
    retired: list[EntryPointInfo] = []
    seen: set[str | None] = set()
    for dist in metadata.distributions():
        # Cheap pre-filter: most distributions have no entry point in a platoon group.
        text = dist.read_text("entry_points.txt")
        if not text or "platoon." not in text:
            continue
        dist_name = _distribution_name(dist)
        if dist_name in seen:  # the same distribution twice on sys.path: the first one wins, as for imports
            continue
        seen.add(dist_name)
        eps = [ep for ep in dist.entry_points if ep.group in _GROUP_KINDS or ep.group == RETIRED_GROUP]
        if not eps:
            continue
        requires = _platoon_requirements(dist)
        name = dist.metadata["Name"] or dist_name
        for ep in eps:
            info = EntryPointInfo(
                kind=_GROUP_KINDS.get(ep.group, "retired"),
                name=ep.name,
                group=ep.group,
                value=ep.value,
                distribution=name,
                distribution_version=dist.version,
                requires=requires,
            )
            (retired if ep.group == RETIRED_GROUP else infos).append(info)
    # First-party first, then by kind and name: the order every listing shows.
    infos.sort(key=lambda i: (not i.builtin, i.kind, i.name, i.label))
    _state.retired = retired
    return infos


def entry_points(kind: str | None = None) -> list[EntryPointInfo]:
    """Installed entry points of platoon's groups (metadata only, scanned once per process)."""
    with _state.lock:
        if _state.entry_points is None:
            _state.entry_points = _scan()
        infos = _state.entry_points
    return [i for i in infos if kind is None or i.kind == kind]


def retired_entry_points() -> list[EntryPointInfo]:
    """Entry points in the retired group `platoon.plugins`, which platoon never reads."""
    entry_points()
    return list(_state.retired)


def reset() -> None:
    """Forget the metadata scan and everything loaded (for tests that install or remove distributions)."""
    global _state
    _state = _State()
    registry.forget_loaded()


# ---------------------------------------------------------------------------------------------- status


def requirement_problem(info: EntryPointInfo) -> str | None:
    """Why the distribution's requirement on platoon excludes the running version, or None if it admits it."""
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version

    try:
        running = Version(running_version())
    except InvalidVersion:
        return None
    for req in info.requires:
        if not Requirement(req).specifier.contains(running, prereleases=True):
            return (
                f"{info.distribution} {info.distribution_version} requires {req}, but platoon "
                f"{running_version()} is running: install a version of {info.distribution} that supports "
                f"platoon {running_version()}, or set {IGNORE_REQUIREMENTS_VAR}=1"
            )
    return None


def first_party_shadow(info: EntryPointInfo) -> EntryPointInfo | None:
    """The first-party entry point that takes `info`'s name, when `info` is a third party's."""
    if info.builtin:
        return None
    for other in entry_points(info.kind):
        if other.builtin and other.name == info.name:
            return other
    return None


def status(info: EntryPointInfo) -> str:
    """What listing shows for an entry point, from metadata and this process's loads (nothing imported)."""
    if info in _state.failures:
        return "failed"
    if info in _state.loaded:
        return "loaded"
    if first_party_shadow(info) is not None:
        return "shadowed"
    if requirement_problem(info) is not None:
        return "incompatible"
    if conflicting_claims(info):
        return "conflict"
    return "ok"


def failure(info: EntryPointInfo) -> ExtensionError | None:
    return _state.failures.get(info)


def failure_reason(error: BaseException) -> str:
    """Why an entry point failed to load, for a line that already names it: the import's own error
    (`RuntimeError: ...`), else the refusal (an incompatible requirement)."""
    cause = error.__cause__
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(error)


def failures(kind: str | None = None) -> dict[EntryPointInfo, ExtensionError]:
    return {i: e for i, e in _state.failures.items() if kind is None or i.kind == kind}


def registered_by(info: EntryPointInfo) -> list[str]:
    """Names other than its own that loading `info` registered."""
    return list(_state.registers.get(info, []))


# ---------------------------------------------------------------------------------------------- loading


def plugin_manager() -> pluggy.PluginManager:
    """The process's plugin manager, holding platoon's hookspecs and every plugin module loaded so far."""
    with _state.lock:
        if _state.manager is None:
            manager = pluggy.PluginManager("platoon")
            manager.add_hookspecs(hookspecs)
            _state.manager = manager
        return _state.manager


def _ignore_requirements() -> bool:
    return os.environ.get(IGNORE_REQUIREMENTS_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def load(info: EntryPointInfo) -> Any:
    """Import an entry point once (modules are registered as plugins) and return what it points at.

    A failure is recorded and raised again, unchanged, the next time the entry point is named; it never
    affects other entry points.
    """
    with _state.lock:  # concurrent loads of one entry point wait for the first
        if info in _state.loaded:
            return _state.loaded[info]
        if info in _state.failures:
            raise _state.failures[info]
        problem = requirement_problem(info)
        if problem is not None:
            if not _ignore_requirements():
                error = ExtensionError(problem)
                _state.failures[info] = error
                raise error
            warnings.warn(problem, stacklevel=2)
        before = registry.versioned_names()
        try:
            value = info.entry_point().load()
        except Exception as exc:  # an extension's import failure is the extension's, reported by name
            error = ExtensionError(
                f"{info.name} ({info.label}, entry point {info.group}: {info.value}) failed to load: "
                f"{type(exc).__name__}: {exc}"
            )
            error.__cause__ = exc
            _state.failures[info] = error
            raise error from exc
        if isinstance(value, ModuleType):
            manager = plugin_manager()
            if not manager.is_registered(value):
                manager.register(value, name=value.__name__)
        _state.loaded[info] = value
        _state.registers[info] = sorted(registry.versioned_names() - before - {info.name})
        return value


def _flatten(answers: Iterable[Any]) -> Iterator[Any]:
    for answer in answers:
        if answer is None or isinstance(answer, ModuleType):
            continue  # a module answers by what its import registered
        if isinstance(answer, list | tuple):
            yield from _flatten(answer)
        else:
            yield answer


def ask(kind: str, name: str, loaded: Any = None) -> list[Any]:
    """The components the loaded plugins give for `name`, plus the entry point's own value (the 0.2.0 form)."""
    hook = getattr(plugin_manager().hook, hookspecs.REGISTRATION_HOOKS[kind])
    answers = list(_flatten(hook(name=name)))
    if loaded is not None and not isinstance(loaded, ModuleType):
        answers.extend(_flatten([loaded]))
    return answers


def candidates(kind: str, name: str) -> list[EntryPointInfo]:
    """Entry points that may provide `name`: first-party ones alone if there are any (they cannot be shadowed)."""
    named = [i for i in entry_points(kind) if i.name == name]
    first_party = [i for i in named if i.builtin]
    return first_party or named


def conflicting_claims(info: EntryPointInfo) -> list[EntryPointInfo]:
    """Every entry point claiming `info`'s name when more than one distribution does, else an empty list.

    A first-party name has no conflict: a third party's claim on it is shadowed, never loaded.
    """
    found = candidates(info.kind, info.name)
    return found if len({i.distribution for i in found}) > 1 else []


def claim_conflict_message(claims: list[EntryPointInfo]) -> str:
    """The one line naming the distributions that claim one name (as using the name and `extensions check` say)."""
    owners = " and ".join(f"{i.label} ({i.group}: {i.value})" for i in claims)
    kind, name = claims[0].kind, claims[0].name
    return f"{kind} {name!r} is claimed by two distributions: {owners}; uninstall one of them"


def load_named(kind: str, name: str) -> list[Any]:
    """Load the entry point called `name` of `kind` and return what the plugins give for that name.

    Two third-party distributions claiming one name is an error naming both; a first-party component is never
    shadowed (the third party's entry point is not even imported).
    """
    found = candidates(kind, name)
    if len({i.distribution for i in found}) > 1:
        raise ExtensionError(claim_conflict_message(found))
    answers: list[Any] = []
    for info in found:
        answers.extend(ask(kind, name, load(info)))
    return answers


# ---------------------------------------------------------------------------------------------- lookups


def _component_name(kind: str, answer: Any) -> str | None:
    name = getattr(answer, "name", None)
    if isinstance(name, str):
        return name
    if kind == "command":
        info = getattr(answer, "info", None)  # a bare typer.Typer
        return getattr(info, "name", None)
    return None


def unknown_name_error(kind: str, name: str, registered: Iterable[str], how: str) -> ExtensionError:
    """The unknown-name message: what installed packages provide, what code registered besides, close names, how
    to add one. `registered` holds what this process registered (`name@version`), installed components once loaded
    included: only the others are named as registered by code."""
    installed = entry_points(kind)
    installed_names = {i.name for i in installed}
    by_code = sorted({ref for ref in registered if ref.split("@", 1)[0] not in installed_names})
    names = sorted({ref.split("@", 1)[0] for ref in by_code} | installed_names)
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    what = kind.replace("_", " ")
    head = f"unknown {what} {name!r}"
    if close:
        head += f" (did you mean {', '.join(close)}?)"
    parts = [
        "installed: " + ", ".join(f"{i.name} ({i.label})" for i in installed)
        if installed
        else f"no installed package provides a {what}"
    ]
    if by_code:
        parts.append("registered by code in this process: " + ", ".join(by_code))
    failed = failures(kind)
    if failed:
        parts.append("failed to load: " + ", ".join(f"{i.name} ({i.label})" for i in failed))
    return ExtensionError(f"{head}. {'; '.join(parts)}; {how}")


def get_component(kind: str, name: str) -> Any:
    """The record a plugin gives for `name`, for kinds named without versions (services, runtimes, commands,
    reward processors). Raises ExtensionError when nothing provides it."""
    known = registry.component(kind, name)
    if known is not None:
        return known
    answers = load_named(kind, name)
    matching = [a for a in answers if _component_name(kind, a) in (name, None)]
    if not matching:
        group = hookspecs.ENTRY_POINT_GROUPS[kind]
        raise unknown_name_error(
            kind,
            name,
            registry.component_names(kind),
            f"provide one with an entry point in the group {group!r}",
        )
    return registry.remember_component(kind, name, matching[0])


def get_command_group(name: str) -> hookspecs.CommandGroup:
    """The command group `platoon <name>` (imported now, when the group runs)."""
    answer = get_component("command", name)
    if isinstance(answer, hookspecs.CommandGroup):
        return answer
    return hookspecs.CommandGroup(name=name, summary="", app=answer)


def reward_processor_record(name: str, answer: Any) -> hookspecs.RewardProcessor:
    """The `RewardProcessor` a `platoon_register_reward_processors` answer for `name` is, or stands for (a bare
    callable, or an import string naming one, is the processor called `name`)."""
    if isinstance(answer, hookspecs.RewardProcessor):
        return answer
    return hookspecs.RewardProcessor(name=name, summary="", fn=answer)


def get_reward_processor(ref: str) -> Any:
    """The reward-processor callable for a name, a registered name or an import string.

    A `RewardProcessor` record's `fn` may itself be an import string: it is imported here, so a processor that
    cannot be imported, or is not callable, is one ExtensionError (78) naming it, at start rather than in every
    group of a run. What an entry point gives lands in the registry that `register_reward_processor` fills, so
    a different function under the same name, by code or another plugin, is one error naming both.
    """
    if ":" not in ref:
        if found := candidates("reward_processor", ref):
            named_as = f"{ref!r} ({found[0].label})"
            record = reward_processor_record(ref, get_component("reward_processor", ref))
            fn = _processor_callable(named_as, record)
            try:
                return registry.register_from_plugin("reward_processor", ref, fn)
            except ValueError as exc:
                raise ExtensionError(f"reward processor {named_as}: {exc}") from None
        registered = registry.lookup("reward_processor", ref)
        if registered is not None:
            return _processor_callable(repr(ref), registered)
        if "." not in ref:
            raise unknown_name_error(
                "reward_processor",
                ref,
                registry.registered("reward_processor"),
                "provide one with an entry point in the group 'platoon.reward_processors', "
                "register_reward_processor(), or name it as module:function",
            )
    try:
        answer = registry.resolve_import_string(ref)
    except ValueError as exc:
        raise ExtensionError(f"reward processor {ref!r}: {exc}") from exc
    return _processor_callable(repr(ref), answer)


def _processor_callable(named: str, answer: Any) -> Any:
    """The callable a reward processor's record (or the object itself) gives, its import-string `fn` imported;
    `named` says which processor, for the error."""
    fn = answer.fn if isinstance(answer, hookspecs.RewardProcessor) else answer
    if isinstance(fn, str):
        try:
            fn = registry.resolve_import_string(fn)
        except ValueError as exc:
            raise ExtensionError(f"reward processor {named}: {exc}") from exc
    if not callable(fn):
        raise ExtensionError(
            f"reward processor {named} is a {type(fn).__name__}, not a callable "
            "fn(trajectory_dict) -> (score, components)"
        )
    return fn


#: services of first-party distributions installed separately: name -> the distribution that provides it
SEPARATE_SERVICES: dict[str, str] = {"harbor": "platoon-harbor"}


def get_service(name: str) -> hookspecs.ServiceFactory:
    """The environment service for a service name or a URI scheme."""
    try:
        answer = get_component("service", name)
    except ExtensionError:
        if name in SEPARATE_SERVICES and not candidates("service", name):
            what = SEPARATE_SERVICES[name]
            raise ExtensionError(
                f"service {name!r} is provided by {what}, which is not installed: install it with `uv add {what}`"
            ) from None
        raise
    if isinstance(answer, hookspecs.ServiceFactory):
        return answer
    return hookspecs.ServiceFactory(name=name, summary="", factory=answer)


def service_scheme(service: str) -> str:
    """`python://pkg:Cls` -> `python`; `ors+http://host/Env` -> `ors+http`; `harbor` -> `harbor`."""
    scheme, sep, _ = service.partition("://")
    return scheme if sep else service


def get_service_path_options(service: str) -> tuple[str, ...]:
    """The options of a service that name input paths (resolved against the config file that writes them)."""
    factory = get_service(service_scheme(service)).factory
    if isinstance(factory, str):
        factory = resolve_target(factory)
    return tuple(getattr(factory, "path_options", ()) or ())


def get_sandbox_runtime(name: str) -> hookspecs.SandboxRuntime:
    answer = get_component("sandbox_runtime", name)
    if isinstance(answer, hookspecs.SandboxRuntime):
        return answer
    return hookspecs.SandboxRuntime(name=name, summary="", provider=answer)


def spec_runner_missing() -> str | None:
    """From metadata only: the one line refusing TOML specs when no installed distribution declares the spec
    runner (`platoon.spec_runners: platoon-spec-runner`), else None. Nothing is imported."""
    if candidates("spec_runner", hookspecs.SPEC_RUNNER_NAME):
        return None
    return (
        "running a TOML spec harness needs the spec runner, which no installed distribution provides: install it "
        "with `uv add platoon-harnesses` (or `pip install platoon-harnesses`)"
    )


def get_spec_runner() -> hookspecs.SpecRunner:
    """The spec runner's record (its module imported now, when a spec runs); ExtensionError when none is installed."""
    missing = spec_runner_missing()
    if missing is not None:
        raise ExtensionError(missing)
    answer = get_component("spec_runner", hookspecs.SPEC_RUNNER_NAME)
    if isinstance(answer, hookspecs.SpecRunner):
        return answer
    return hookspecs.SpecRunner(name=hookspecs.SPEC_RUNNER_NAME, summary="", runner=answer)


def resolve_target(target: Any) -> Any:
    """A record's lazy target: an import string `module:attr` is imported now; anything else is returned."""
    return registry.resolve_import_string(target) if isinstance(target, str) else target
