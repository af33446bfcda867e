"""`platoon extensions list|show|check`: what installed packages provide, read from metadata.

`list` and `show` import nothing unless `--load` is given; `check` is the command that imports on purpose.
"""

from __future__ import annotations

import contextlib
import re
from typing import Annotated, Any

import typer

from platoon.cli.output import dump_json, err, new_app, out, table
from platoon.errors import EX_CONFIG, ExtensionError

app = new_app("What installed extensions provide, and whether they load.")

KINDS = (
    "harness",
    "program",
    "environment",
    "reward_processor",
    "service",
    "sandbox_runtime",
    "command",
    "spec_runner",
)
KindOption = Annotated[
    str | None,
    typer.Option("--kind", metavar="KIND", help=f"Only this kind: {', '.join(KINDS)}.", show_default=False),
]
JsonOption = Annotated[bool, typer.Option(help="Print JSON instead of text.")]


def _check_kind(kind: str | None) -> None:
    if kind is not None and kind not in KINDS:
        raise typer.BadParameter(f"{kind!r} is not one of {', '.join(KINDS)}", param_hint="--kind")


def _record(info: Any) -> dict[str, Any]:
    from platoon import plugins

    return {
        "kind": info.kind,
        "name": info.name,
        "distribution": info.distribution,
        "version": info.distribution_version,
        "value": info.value,
        "status": plugins.status(info),
        "builtin": info.builtin,
        "requires": list(info.requires),
    }


@app.command("list")
def list_(kind: KindOption = None, json_output: JsonOption = False) -> None:
    """List every component installed extensions provide (metadata only; nothing is imported)."""
    from platoon import plugins

    _check_kind(kind)
    records = [_record(info) for info in plugins.entry_points(kind)]
    if json_output:
        out(dump_json(records))
        return
    if not records:
        out("(no extensions installed)")
        return
    rows = [(r["kind"], r["name"], r["distribution"], r["version"], r["status"], r["value"]) for r in records]
    out(table(("kind", "name", "distribution", "version", "status", "source"), rows))


def _loaded_versions(info: Any) -> list[str] | None:
    """The versions the component provides, once its entry point is loaded (None while it is not)."""
    from platoon import plugins
    from platoon.harness import function as harnesses
    from platoon.programs import registry as programs

    if plugins.status(info) != "loaded":
        return None
    records: list[Any] = []
    for answer in plugins.ask(info.kind, info.name, plugins.load(info)):
        if info.kind == "harness":
            record = harnesses.record_of(answer)
            if record is None and (
                isinstance(answer, str) or hasattr(answer, "__fspath__") or hasattr(answer, "launch")
            ):
                from platoon.harness.registry import specs_from

                with contextlib.suppress(ExtensionError):  # a spec that does not load: `check` reports it
                    records += specs_from(answer)
            records.append(record)
        elif info.kind == "program":
            records.append(programs.record_of(answer))
        else:
            records.append(answer)
    # Modules may register on import instead of answering the hook.
    if info.kind == "harness":
        from platoon.harness.spec import registered_specs

        records += harnesses.registered_harnesses().values()
        records += registered_specs().values()
    elif info.kind == "program":
        records += programs.registered_programs().values()
    return sorted(
        {r.version for r in records if getattr(r, "name", None) == info.name and getattr(r, "version", None)}
    )


def _requires_text(info: Any) -> str:
    if info.builtin:
        return "- (part of platoon)"
    return ", ".join(info.requires) if info.requires else "- (states no requirement on platoon)"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _unknown_name(name: str) -> str:
    return (
        f"{name!r} is neither a component nor a distribution of an installed extension "
        "(see `platoon extensions list`)"
    )


def _distribution_infos(name: str, kind: str | None = None) -> list[Any]:
    """The entry points of the installed distribution `name` (spelled any way its normalized name matches)."""
    from platoon import plugins

    return [
        i
        for i in plugins.entry_points(kind)
        if i.distribution and _normalize(i.distribution) == _normalize(name)
    ]


def _show_distribution(name: str, kind: str | None, load: bool, json_output: bool) -> int:
    """`show` given a distribution name: what it requires and every component it provides."""
    from platoon import plugins

    infos = _distribution_infos(name, kind)
    if not infos:
        err(
            f"{_distribution_infos(name)[0].distribution} provides no {kind} (see `platoon extensions show {name}`)"
        )
        return EX_CONFIG
    status_code = 0
    if load:
        for info in infos:
            if plugins.first_party_shadow(info) is None and not plugins.conflicting_claims(info):
                try:
                    plugins.load(info)
                except ExtensionError:
                    status_code = EX_CONFIG  # reported below, by name, with the components' status
    first = infos[0]
    if json_output:
        block = {
            "distribution": first.distribution,
            "version": first.distribution_version,
            "builtin": first.builtin,
            "requires": list(first.requires),
            "components": [_record(info) for info in infos],
        }
        out(dump_json([block]))
    else:
        rows = [(info.kind, info.name, plugins.status(info), info.value) for info in infos]
        head = f"{first.distribution} {first.distribution_version or ''}".rstrip()
        lines = [f"{head}  (distribution)", f"requires: {_requires_text(first)}", "provides:"]
        out("\n".join([*lines, table(("kind", "name", "status", "source"), rows, indent="  ")]))
    for info in infos:
        if (failure := plugins.failure(info)) is not None:
            err(f"{info.name} ({info.label}) failed to load: {plugins.failure_reason(failure)}")
    return status_code


@app.command()
def show(
    name: Annotated[
        str,
        typer.Argument(
            metavar="NAME",
            help="A component name as configs write it, or a distribution (as `check` takes it).",
            show_default=False,
        ),
    ],
    kind: KindOption = None,
    load: Annotated[bool, typer.Option("--load", help="Import the component to show its versions.")] = False,
    json_output: JsonOption = False,
) -> int:
    """Show where a component comes from, what it requires and whether it loads.

    NAME may also be a distribution (as `check` takes it): then what it requires and every component it provides.
    """
    from platoon import plugins

    _check_kind(kind)
    if ":" in name:
        err(f"{name!r} is an import string (module:attr), not an extension's component name")
        return EX_CONFIG
    bare = name.split("@", 1)[0]
    infos = [i for i in plugins.entry_points(kind) if i.name == bare]
    if not infos:
        if _distribution_infos(name):
            return _show_distribution(name, kind, load, json_output)
        err(_unknown_name(bare))
        return EX_CONFIG
    status_code = 0
    blocks = []
    for info in infos:
        error: str | None = None
        if load and plugins.first_party_shadow(info) is None:
            try:
                plugins.load(info)
            except ExtensionError as exc:
                error = str(exc)
                status_code = EX_CONFIG
        failure = plugins.failure(info)
        if failure is not None:
            error = str(failure)
        versions = _loaded_versions(info)
        record = _record(info) | {
            "entry_point": f"{info.group}: {info.name}",
            "used_in": plugins.USED_IN[info.kind],
            "registers": [n for n in plugins.registered_by(info) if n != info.name],
            "error": error,
            "versions": versions,
        }
        blocks.append(record)
    if json_output:
        out(dump_json(blocks))
        return status_code
    texts = []
    for record, info in zip(blocks, infos, strict=True):
        versions = record["versions"]
        failure = plugins.failure(info)
        lines = [
            f"{info.name}  ({info.kind})",
            "version: "
            + (
                ", ".join(versions) or "-"
                if versions is not None
                else "unknown: it failed to load"
                if failure is not None
                else "unknown until it is loaded (--load imports it)"
            ),
            f"distribution: {info.distribution or '-'} {info.distribution_version or ''}".rstrip(),
            f"entry point: {record['entry_point']}",
            f"source: {info.value}",
            f"requires: {_requires_text(info)}",
            f"status: {record['status']}"
            if failure is None
            else f"status: failed to load: {plugins.failure_reason(failure)}",
            f"used in: {record['used_in']}",
        ]
        if record["registers"]:
            lines.append("registers: " + ", ".join(record["registers"]))
        texts.append("\n".join(lines))
    out("\n\n".join(texts))
    for info in infos:
        if (failure := plugins.failure(info)) is not None:
            err(f"{info.name} ({info.label}) failed to load: {plugins.failure_reason(failure)}")
    return status_code


def suggested_requirement(version: str) -> str:
    """`platoon-core>=0.2,<0.3` below 1.0, `platoon-core>=1.4,<2` from 1.0; a prerelease is its own lower bound.

    platoon-core, not `platoon`: the registry's `platoon` is an unrelated project an installer would fetch for it.
    """
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        return "platoon-core>=0.2,<0.3"
    lower = str(v) if v.is_prerelease else f"{v.major}.{v.minor}"
    upper = f"0.{v.minor + 1}" if v.major == 0 else str(v.major + 1)
    return f"platoon-core>={lower},<{upper}"


def check_problems(dists: list[str], load: bool) -> list[tuple[str, str, str]]:
    """(severity, distribution label, message) for every problem of the installed extensions."""
    from packaging.requirements import Requirement

    from platoon import plugins
    from platoon._version import running_version
    from platoon.naming import NAME_RE, SCHEME_RE, is_reserved, owner

    wanted = {_normalize(d) for d in dists}

    def selected(info: Any) -> bool:
        return not wanted or _normalize(info.distribution or "") in wanted

    infos = [i for i in plugins.entry_points() if selected(i)]
    problems: list[tuple[str, str, str]] = []
    owners: dict[str, set[str]] = {}
    checked_dists: dict[str, Any] = {}
    for info in infos:
        where = f"{info.group}: {info.name}"
        scheme_ok = info.kind == "service" and SCHEME_RE.match(info.name) is not None
        if not (NAME_RE.match(info.name) or scheme_ok) or info.name.endswith(".toml"):
            problems.append(
                (
                    "error",
                    info.label,
                    f"{where}: {info.name!r} does not follow the naming rule (lower-case words "
                    "joined by '.', '_' or '-')",
                )
            )
        if info.builtin:
            continue
        checked_dists.setdefault(info.label, info)
        if is_reserved(info.name, info.kind):
            problems.append(
                (
                    "error",
                    info.label,
                    f"{where}: {info.name!r} is reserved for platoon's own components; "
                    f"use your own prefix, for example 'acme-{info.name.removeprefix('platoon-')}'",
                )
            )
        elif plugins.first_party_shadow(info) is not None:
            problems.append(
                (
                    "warning",
                    info.label,
                    f"{where}: a first-party component has this name, so platoon never loads "
                    "this one (first-party components take precedence)",
                )
            )
        owners.setdefault(info.label, set()).add(owner(info.name))
    # Two distributions claiming one name: using the name fails, so the check says so before any run does.
    conflicts: dict[tuple[str, str], list[Any]] = {}
    for info in plugins.entry_points():
        claims = plugins.conflicting_claims(info)
        if claims and any(selected(claim) for claim in claims):
            conflicts.setdefault((info.kind, info.name), claims)
    for claims in conflicts.values():
        labels = ", ".join(sorted({claim.label for claim in claims}))
        problems.append(("error", labels, plugins.claim_conflict_message(claims)))
    for label, names in owners.items():
        if len(names) > 1:
            problems.append(
                (
                    "warning",
                    label,
                    f"names components with more than one owner prefix ({', '.join(sorted(names))}); "
                    "use one prefix per distribution",
                )
            )
    suggestion = suggested_requirement(running_version())
    for label, info in checked_dists.items():
        problem = plugins.requirement_problem(info)
        if problem is not None:
            problems.append(("error", label, problem))
        elif not info.requires:
            problems.append(
                (
                    "warning",
                    label,
                    f"states no requirement on platoon; declare one, for example {suggestion!r}",
                )
            )
        else:
            for req in info.requires:
                if not any(s.operator in ("<", "<=", "==", "~=", "===") for s in Requirement(req).specifier):
                    problems.append(
                        (
                            "warning",
                            label,
                            f"requires {req} without an upper bound; a minor release of platoon may "
                            f"break it: use for example {suggestion!r}",
                        )
                    )
    for info in plugins.retired_entry_points():
        if selected(info):
            problems.append(
                (
                    "warning",
                    info.label,
                    f"{info.group}: {info.name}: the group 'platoon.plugins' is retired and "
                    "never read; declare each component in its own group (platoon.harnesses, platoon.programs, ...)",
                )
            )
    if load:
        for info in infos:
            if plugins.first_party_shadow(info) is not None or plugins.conflicting_claims(info):
                continue  # never loaded by a run either (the conflict is reported above)
            try:
                plugins.load(info)
                if info.kind == "harness":
                    # what the hook answers is loaded as a run would: a TOML spec that does not load fails here
                    from platoon.harness.registry import absorb_entry_point

                    absorb_entry_point(info)
                if info.kind == "reward_processor":
                    # a processor's `fn` may be an import string of its own: resolve it as a run would
                    plugins.get_reward_processor(info.name)
            except ExtensionError as exc:
                problems.append(("error", info.label, str(exc)))
    return problems


def _distributions_named(names: list[str]) -> list[str]:
    """The distributions `check NAME...` means: each name a distribution, or a component whose distribution it
    checks (as `show` takes both). An unknown name is a ConfigError naming it."""
    from platoon import plugins
    from platoon.errors import ConfigError

    found: list[str] = []
    for name in names:
        if _distribution_infos(name):
            found.append(name)
            continue
        bare = name.split("@", 1)[0]
        providers = {i.distribution for i in plugins.entry_points() if i.name == bare and i.distribution}
        if not providers:
            raise ConfigError(_unknown_name(name))
        found += sorted(providers)
    return found


@app.command()
def check(
    dists: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[DIST]...",
            help="Only these distributions (a component name checks the distribution that provides it).",
            show_default=False,
        ),
    ] = None,
    load: Annotated[bool, typer.Option("--load", help="Also import every component.")] = False,
) -> int:
    """Check installed extensions: names, platoon requirements and, with --load, that they import."""
    problems = check_problems(_distributions_named(list(dists or [])), load)
    for severity, label, message in problems:
        out(f"{severity}: {label}: {message}")
    errors = sum(1 for p in problems if p[0] == "error")
    warnings_ = len(problems) - errors
    if problems:
        out(f"{errors} error(s), {warnings_} warning(s)")
    else:
        out("ok: no problems found")
    return EX_CONFIG if errors else 0
