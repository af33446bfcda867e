"""`platoon harness|program|env list|show`: the components a config can name.

`list` reads installed metadata (and what this process already loaded); `show NAME` loads that one component.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from platoon.cli.output import err, new_app, out, table
from platoon.errors import EX_CONFIG, ExtensionError

harness_app = new_app("The harnesses a config can name.")
program_app = new_app("The episode programs a config can name.")
env_app = new_app("Environment services and named environments.")

NameArg = Annotated[
    str, typer.Argument(metavar="NAME", help="name, name@version or module:attr", show_default=False)
]


def _label(info: Any) -> str:
    return f"{info.distribution} {info.distribution_version}" if info.distribution else "-"


# ---------------------------------------------------------------------------------------------- harness


@harness_app.command("list")
def harness_list(
    load: Annotated[
        bool, typer.Option("--load", help="Import every harness entry point to show its versions.")
    ] = False,
) -> None:
    """List harnesses and their versions: those loaded in this process, then installed entry points (not imported
    unless --load is given, so their versions show as `-`)."""
    from platoon import plugins
    from platoon.harness.function import registered_harnesses

    infos = plugins.entry_points("harness")
    if load:
        for info in infos:
            _load_harnesses(info)
    by_name = {info.name: info for info in infos}
    rows: list[tuple[str, ...]] = []
    loaded_names = set()
    for record in sorted(registered_harnesses().values(), key=lambda r: (r.name, r.version)):
        loaded_names.add(record.name)
        provider = by_name.get(record.name)
        distribution = provider.label if provider is not None else "-"
        rows.append((record.name, record.version, record.kind, distribution, record.source))
    unknown_versions = False
    for info in infos:
        if info.name in loaded_names:
            continue
        state = plugins.status(info)
        source = info.value if state in ("ok", "loaded") else f"{info.value} ({state})"
        rows.append((info.name, "-", "-", info.label, source))
        unknown_versions |= state == "ok"
    for info, error in plugins.failures("harness").items():
        err(f"{info.name} failed to load, so its harnesses are missing: {plugins.failure_reason(error)}")
    if not rows:
        out("(no harnesses installed)")
        return
    out(table(("harness", "version", "kind", "distribution", "source"), rows))
    if unknown_versions:
        err(
            "a harness not imported yet shows version -: `platoon harness list --load` imports them to show theirs"
        )


def _load_harnesses(info: Any) -> None:
    """Import one harness entry point and register what its hook answers (a failure is reported by the caller)."""
    from platoon import plugins
    from platoon.harness.function import record_of

    if plugins.first_party_shadow(info) is not None or plugins.conflicting_claims(info):
        return  # never loaded by a run either
    try:
        loaded = plugins.load(info)
    except ExtensionError:
        return
    for answer in plugins.ask("harness", info.name, loaded):
        record_of(answer)


@harness_app.command("show")
def harness_show(name: NameArg) -> int:
    """Load one harness and show its kind, source and documentation."""
    from platoon.harness.registry import get_harness

    try:
        record = get_harness(name)
    except ExtensionError as exc:
        err(str(exc))
        return EX_CONFIG
    out(f"{record.ref}  ({record.kind})")
    out(f"source: {record.source}")
    out(f"runtime: {record.runtime}")
    out(f"executes_model_code: {str(record.executes_model_code).lower()}")
    out()
    out(record.doc or "(no docstring)")
    return 0


# ---------------------------------------------------------------------------------------------- program


@program_app.command("list")
def program_list() -> None:
    """List episode programs from installed metadata (first-party first)."""
    from platoon import plugins
    from platoon.programs.registry import registered_programs

    rows = [(info.name, info.distribution, info.value) for info in plugins.entry_points("program")]
    listed = {row[0] for row in rows}
    rows += [(r.ref, "-", r.source) for r in registered_programs().values() if r.name not in listed]
    out(table(("program", "distribution", "source"), rows) if rows else "(no programs installed)")


@program_app.command("show")
def program_show(name: NameArg) -> int:
    """Load one program and show its source, distribution and documentation."""
    from platoon import plugins
    from platoon.programs.registry import get_program

    try:
        record = get_program(name)
    except (ExtensionError, TypeError) as exc:
        err(str(exc))
        return EX_CONFIG
    infos = plugins.candidates("program", record.name)
    out(record.ref)
    out(f"source: {record.source}")
    out(f"distribution: {_label(infos[0]) if infos else '-'}")
    out()
    out(record.doc or "(no docstring)")
    return 0


# ---------------------------------------------------------------------------------------------- env

#: how a config names each first-party service, and what it is (third-party services show their distribution)
SERVICE_FORMS: dict[str, tuple[str, str]] = {
    "table": ("table", "a task table: rows of tasks from a file or inline"),
    "python": ("python://pkg.module:EnvClass", "an ORS environment class, in process"),
}
IMPORT_STRING_SERVICE = ("pkg.module:Class", "any environment-service class")


def _service_rows() -> list[tuple[str, str]]:
    """The services a config can name in this installation (metadata only): planned ones are not listed."""
    from platoon import plugins

    rows = []
    for info in plugins.entry_points("service"):
        form, what = SERVICE_FORMS.get(info.name, (info.name, f"from {info.label}"))
        rows.append((form, what))
    return [*rows, IMPORT_STRING_SERVICE]


def _environments_table(path: str) -> int:
    """`Environments of <config>:` with one row per entry (the file is read, not validated)."""
    from pathlib import Path

    from platoon.config.loader import read_yaml_mapping

    config = Path(path)
    if not config.is_file():
        err(f"{path}: no such config file")
        return EX_CONFIG
    data = read_yaml_mapping(config, path)
    entries = data.get("environments")
    out(f"Environments of {path}:")
    if entries is None:
        out("  (none: the config sets no environments)")
        return 0
    if not isinstance(entries, list):
        err(f"{path}: environments must be a list of entries, not {type(entries).__name__}")
        return EX_CONFIG
    rows = []
    for i, entry in enumerate(entries):
        entry = entry if isinstance(entry, dict) else {}
        harness = entry.get("harness")
        if isinstance(harness, dict):
            harness = ", ".join(f"{k}:{v}" for k, v in harness.items())
        rows.append(
            (
                entry.get("name") or ("default" if len(entries) == 1 else f"#{i}"),
                entry.get("weight", "tasks"),
                entry.get("service") or (f"(env {entry['env']})" if entry.get("env") else "-"),
                harness or "-",
                entry.get("program") or "single",
                "harness_rollout" if harness else entry.get("rollout") or "-",
            )
        )
    out(table(("name", "weight", "service", "harness", "program", "rollout"), rows, indent="  "))
    return 0


@env_app.command("list")
def env_list(
    config: Annotated[
        str | None, typer.Argument(metavar="[CONFIG]", help="Also list this config's environments.")
    ] = None,
) -> int:
    """List environment services and named environments (metadata only), and a config's entries."""
    from platoon import plugins

    out("Environment services (an environments entry's `service`):")
    out(table(("service", "what"), _service_rows(), indent="  "))
    out()
    out("Named environments (an environments entry's `env`):")
    named = plugins.entry_points("environment")
    if named:
        out(
            table(
                ("env", "distribution", "source"),
                [(i.name, i.distribution, i.value) for i in named],
                indent="  ",
            )
        )
    else:
        out("  (none installed)")
    if config is not None:
        out()
        return _environments_table(config)
    return 0


@env_app.command("show")
def env_show(name: NameArg) -> int:
    """Load one named environment and print its entry and harness defaults as YAML."""
    import yaml

    from platoon import plugins
    from platoon.envs.named import resolve_environment

    try:
        entry = resolve_environment(name)
    except ExtensionError as exc:
        err(str(exc))
        return EX_CONFIG
    infos = plugins.candidates("environment", entry.name)
    out(entry.ref)
    out(f"source: {entry.source or '-'}")
    out(f"distribution: {_label(infos[0]) if infos else '-'}")
    if entry.description:
        out(f"description: {entry.description}")
    out(
        yaml.safe_dump(
            {"entry": entry.entry(), "harness_defaults": entry.harness_defaults},
            sort_keys=False,
            allow_unicode=True,
        ).rstrip()
    )
    return 0
