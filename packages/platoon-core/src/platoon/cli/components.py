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
    """List harnesses and their versions: those loaded in this process (functions and TOML specs), then installed
    entry points (not imported unless --load is given, so their versions show as `-`)."""
    from platoon import plugins
    from platoon.harness.registry import all_harnesses

    infos = plugins.entry_points("harness")
    spec_failures: dict[str, str] = {}
    if load:
        for info in infos:
            _load_harnesses(info, spec_failures)
    by_name = {info.name: info for info in infos}
    rows: list[tuple[str, ...]] = []
    loaded_names = set()
    for record in sorted(all_harnesses().values(), key=lambda r: (r.name, r.version)):
        loaded_names.add(record.name)
        provider = by_name.get(record.name)
        distribution = provider.label if provider is not None else "-"
        rows.append((record.name, record.version, record.kind, distribution, record.source))
    unknown_versions = False
    for info in infos:
        if info.name in loaded_names:
            continue
        state = "failed" if info.name in spec_failures else plugins.status(info)
        source = info.value if state in ("ok", "loaded") else f"{info.value} ({state})"
        rows.append((info.name, "-", "-", info.label, source))
        unknown_versions |= state == "ok"
    for info, error in plugins.failures("harness").items():
        err(f"{info.name} failed to load, so its harnesses are missing: {plugins.failure_reason(error)}")
    for name, why in spec_failures.items():
        err(f"{name} failed to load, so its harnesses are missing: {why}")
    if not rows:
        out("(no harnesses installed)")
        return
    out(table(("harness", "version", "kind", "distribution", "source"), rows))
    if unknown_versions:
        err(
            "a harness not imported yet shows version -: `platoon harness list --load` imports them to show theirs"
        )


def _load_harnesses(info: Any, spec_failures: dict[str, str]) -> None:
    """Import one harness entry point and register what its hook answers. An import failure is recorded by the
    plugin state; a spec that does not load is recorded in `spec_failures` (both are reported by the caller)."""
    from platoon import plugins
    from platoon.harness.registry import absorb_entry_point
    from platoon.harness.spec import SpecError

    if plugins.first_party_shadow(info) is not None or plugins.conflicting_claims(info):
        return  # never loaded by a run either
    try:
        absorb_entry_point(info)
    except SpecError as exc:
        spec_failures[info.name] = str(exc)
    except ExtensionError:
        return


@harness_app.command("show")
def harness_show(name: NameArg) -> int:
    """Load one harness and show its kind, source and documentation (a TOML spec: its fields and options)."""
    from platoon.errors import ConfigError
    from platoon.harness.registry import get_harness
    from platoon.harness.spec import HarnessSpec

    try:
        record = get_harness(name)
    except ConfigError as exc:
        err(str(exc))
        return EX_CONFIG
    out(f"{record.ref}  ({record.kind})")
    out(f"source: {record.source}")
    if isinstance(record, HarnessSpec):
        for line in spec_lines(record):
            out(line)
        return 0
    out(f"runtime: {record.runtime}")
    out(f"executes_model_code: {str(record.executes_model_code).lower()}")
    out()
    out(record.doc or "(no docstring)")
    return 0


def _number(value: float | int | None) -> str:
    from platoon.harness.spec import format_value

    if value is None:
        return "-"
    return str(int(value)) if isinstance(value, float) and value.is_integer() else format_value(value)


def _words(templates: Any) -> str:
    """Templates joined by spaces, quoting only those that hold spaces (argv stays a list: nothing is split)."""
    import shlex

    return " ".join(shlex.quote(t) if not t or any(c.isspace() for c in t) else t for t in templates)


def spec_lines(spec: Any) -> list[str]:
    """What `platoon harness show` prints for a TOML spec after its ref and source."""
    from platoon.harness.spec import format_value

    install = spec.install
    lines = [
        f"dialect: {spec.dialect}",
        f"timeout_s: {_number(spec.timeout_s)}",
        f"max_steps: {_number(spec.max_steps)}",
        "install: " + (" && ".join(install.commands) if install and install.commands else "-"),
        f"install toolchain: {install.toolchain if install and install.toolchain else '-'}",
        f"launch argv: {_words(spec.launch.argv)}",
        "launch env: " + (", ".join(spec.launch.env) or "-"),
    ]
    builtins = spec.builtins
    tools = ", ".join(builtins.tools) if builtins and builtins.tools else "-"
    lines.append(
        f"built-in tools: {tools}" + (" (can be disabled)" if builtins and builtins.can_disable else "")
    )
    lines.append(f"final message: {spec.final_message.describe() if spec.final_message else '-'}")
    codes = ", ".join(f"{code} {meaning}" for code, meaning in sorted(spec.exit_codes.items()))
    lines.append(f"exit codes: {codes or '-'} (otherwise 0 completed, non-zero error)")
    if spec.mcp is not None:
        mcp = spec.mcp
        parts = ["enabled" if mcp.enabled else "disabled"]
        if mcp.args:
            parts.append(f"args {_words(mcp.args)}")
        if mcp.env:
            parts.append(f"env {', '.join(mcp.env)}")
        if mcp.config_template is not None:
            parts.append(f"config file {mcp.config_file}")
        lines.append("mcp: " + "; ".join(parts))
    if install is not None and install.recipe is not None:
        recipe = install.recipe
        parts = [f"python {recipe.python}", f"lock {recipe.lock}"]
        if recipe.cache:
            parts.append(f"cache {', '.join(recipe.cache)}")
        if recipe.generate:
            parts.append(f"generate {', '.join(recipe.generate)}")
        lines.append("toolchain recipe: " + "; ".join(parts))
    lines.append(f"resources: memory_mb {_number(spec.resources_memory_mb)}")
    lines.append(f"step budget: enforced by the {spec.budget_enforce}")
    if not spec.options:
        lines.append("options: - (harness_options must be empty)")
        return lines
    rows = [
        (o.name, o.type, format_value(o.default), o.constraint, o.description or "-")
        for o in spec.options.values()
    ]
    lines.append("options:")
    lines.append(table(("option", "type", "default", "values", "description"), rows, indent="  "))
    return lines


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
    "ors+http": (
        "ors+http://HOST:PORT[,...]/EnvName",
        "ORS servers (also ors+https): a pool sharded by rollout, ?variant=Env",
    ),
}
#: more rows of one service (a second form of it), or none (a scheme another row covers)
SERVICE_EXTRA_ROWS: dict[str, list[tuple[str, str]]] = {
    "ors+http": [("ors+http:///EnvName", "ORS servers from OPENREWARD_SESSION_URLS_<LABEL>")],
    "ors+https": [],
}
IMPORT_STRING_SERVICE = ("pkg.module:Class", "any environment-service class")


def _service_rows() -> list[tuple[str, str]]:
    """The services a config can name in this installation (metadata only): planned ones are not listed."""
    from platoon import plugins

    rows = []
    for info in plugins.entry_points("service"):
        if info.name not in SERVICE_FORMS and info.name in SERVICE_EXTRA_ROWS:
            rows += SERVICE_EXTRA_ROWS[info.name]
            continue
        form, what = SERVICE_FORMS.get(info.name, (info.name, f"from {info.label}"))
        rows.append((form, what))
        rows += SERVICE_EXTRA_ROWS.get(info.name, [])
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
    from platoon.config.named import get_environment

    try:
        entry = get_environment(name)
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
    service = entry.entry().get("service")
    if isinstance(service, str) and plugins.service_scheme(service) in ("ors+http", "ors+https"):
        from platoon.envs.ors.remote import describe

        try:
            remote = describe(service, entry.entry().get("service_kwargs") or {})
        except ValueError as exc:
            err(f"{entry.ref}: {exc}")
            return EX_CONFIG
        out(yaml.safe_dump({"remote": remote}, sort_keys=False, allow_unicode=True).rstrip())
    return 0
