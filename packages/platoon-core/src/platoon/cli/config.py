"""`platoon config show|validate`: a config as a run resolves it, and every problem a run would refuse.

Both load through `platoon.config.load_config` (extends, overrides, named environments, paths, site profile,
validation), so what they print is what a run will use.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from platoon.cli.output import err, new_app, out
from platoon.deprecations import deprecation_lines
from platoon.errors import EX_CONFIG, EX_USAGE, ConfigError

app = new_app("Show and validate configs as a run resolves them.")

KIND_CHOICES = ("auto", "train", "eval", "none")
KindOption = Annotated[
    str,
    typer.Option(
        "--kind",
        metavar="auto|train|eval|none",
        help="Which schema: auto (from the file's keys), train, eval or none.",
    ),
]
SchemaOption = Annotated[
    str | None,
    typer.Option(
        "--schema",
        metavar="MODULE:CLASS",
        help="Validate against this class (module:Class).",
        show_default=False,
    ),
]


def _check_kind(kind: str) -> None:
    if kind not in KIND_CHOICES:
        raise typer.BadParameter(f"{kind!r} is not one of {', '.join(KIND_CHOICES)}", param_hint="--kind")


def _to_yaml(data: Any) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False).rstrip()


def _with_defaults(loaded: Any) -> Any:
    """The built object with every field, leaving out deprecated keys that are still at their defaults."""
    from pydantic import BaseModel

    def dump(model: BaseModel) -> dict[str, Any]:
        deprecated = getattr(type(model), "DEPRECATED_KEYS", {})
        result: dict[str, Any] = {}
        for name, info in type(model).model_fields.items():
            value = getattr(model, name)
            if name in deprecated and name not in model.model_fields_set and value == info.default:
                continue
            result[name] = walk(value)
        return result

    def walk(value: Any) -> Any:
        if isinstance(value, BaseModel):
            return dump(value)
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v) for v in value]
        if isinstance(value, Path):
            return str(value)
        if hasattr(value, "value") and type(value).__module__ != "builtins":  # enums
            return value.value
        return value

    return dump(loaded.config)


@app.command()
def show(
    config: Annotated[str, typer.Argument(metavar="CONFIG", help="The config file.", show_default=False)],
    overrides: Annotated[
        list[str] | None, typer.Argument(metavar="[K=V]...", help="k=v overrides.", show_default=False)
    ] = None,
    kind: KindOption = "auto",
    schema: SchemaOption = None,
    defaults: Annotated[bool, typer.Option("--defaults", help="Print every field, defaults filled.")] = False,
) -> int:
    """Print a config as a run resolves it: extends, overrides, named environments, paths, site profile."""
    from platoon.config import load_config

    _check_kind(kind)
    loaded = load_config(config, overrides or [], kind=kind, schema=schema)
    for line in deprecation_lines(loaded):
        err(line)
    if defaults:
        if loaded.config is None:
            err(f"{config}: --defaults needs a schema; this file has none (give --kind or --schema)")
            return EX_CONFIG
        out(_to_yaml(_with_defaults(loaded)))
    else:
        out(_to_yaml(loaded.data))
    return 0


def _split_files(items: list[str]) -> tuple[list[str], list[str]]:
    """Positional items with `=` that are not existing files are overrides applied to every file."""
    files: list[str] = []
    overrides: list[str] = []
    for item in items:
        (overrides if "=" in item and not Path(item).is_file() else files).append(item)
    return files, overrides


def _training_start_lines(loaded: Any) -> tuple[list[str], list[str]]:
    """Every check `platoon train` makes before it starts, run as the start runs them (`preflight`, then
    what a resume would refuse, then the service's capabilities): (problems, sampling plan lines). Writes nothing."""
    import asyncio

    from platoon.startup.capabilities import service_problems
    from platoon.startup.training_preflight import preflight, resume_problems
    from platoon.train.tinker.task_order import plan_lines

    config = loaded.config
    try:
        checked = asyncio.run(preflight(config, base_dir=loaded.path.parent))
    except ConfigError as exc:
        return exc.problems, []
    problems = resume_problems(config, checked)
    if not problems:
        # The start's capability check, where the service can be reached (the local server is only built by a start).
        problems = service_problems(config)
    # A plan for tasks the run refuses would describe a run that never happens.
    return problems, [] if problems else plan_lines(config, checked.pools)


def _listing_lines(loaded: Any) -> tuple[list[str], list[str]]:
    """List a training config's tasks without resolving its components (`--no-resolve --tasks`): (what the listing
    refuses, sampling plan lines)."""
    import asyncio

    from platoon.train.tinker.task_order import (
        list_training_tasks,
        plan_lines,
        training_problems_after_listing,
    )

    try:
        pools = asyncio.run(list_training_tasks(loaded.config, base_dir=loaded.path.parent))
    except ConfigError as exc:
        return exc.problems, []
    problems = training_problems_after_listing(loaded.config, pools)
    return problems, [] if problems else plan_lines(loaded.config, pools)


def _validate_one(
    path: str,
    overrides: list[str],
    *,
    kind: str,
    schema: str | None,
    resolve: bool,
    strict: bool,
    tasks: bool,
) -> bool:
    """Print one file's verdict; returns whether it failed."""
    from platoon.config import load_config
    from platoon.sandbox_runs import site_provider_problem
    from platoon.startup.checks import component_problems, output_problems, run_problems
    from platoon.startup.prepare import not_prepared_lines

    try:
        loaded = load_config(path, overrides, kind=kind, schema=schema)
    except ConfigError as exc:
        out(f"FAIL {path}")
        for problem in exc.problems:
            out(f"  {problem}")
        return True
    problems: list[str] = []
    task_lines: list[str] = []
    training = loaded.kind == "train" and loaded.config is not None
    evaluation = loaded.kind == "eval" and loaded.config is not None
    if training and resolve:
        # A training config gets every check of `platoon train`'s start, the task listing included.
        problems, plan = _training_start_lines(loaded)
        if tasks:
            task_lines = plan
    elif evaluation and resolve and getattr(loaded.config, "stage", None) != "report":
        # ... and an evaluation config every check of `platoon eval`'s start.
        import asyncio

        from platoon.eval.config_defs import PlatoonEvalConfig
        from platoon.startup.evaluation import preflight_problems

        assert isinstance(loaded.config, PlatoonEvalConfig)  # kind "eval" validates against it
        problems = asyncio.run(preflight_problems(loaded.config, loaded))
    elif loaded.config is not None:
        problems += run_problems(loaded.config, kind=loaded.kind)
        site_runs = loaded.site.runs if loaded.site is not None else None
        problems += output_problems(loaded.config, kind=loaded.kind, site_runs=site_runs)
        report_only = getattr(loaded.config, "stage", None) == "report"
        if resolve and not report_only:
            problems += component_problems(loaded.config)
    if resolve and (unavailable := site_provider_problem(loaded.site)) is not None:
        problems.insert(0, unavailable)  # the profile's provider is refused before anything the run would do
    if resolve and loaded.config is not None and getattr(loaded.config, "stage", None) != "report":
        problems += not_prepared_lines(loaded, path, overrides)
    if tasks and not training:
        task_lines = ["tasks: only a training config's tasks are listed"]
    elif tasks and not resolve and not problems:
        # Listed only for a config a run would accept: the listing's refusals are the run's next ones.
        listing_problems, task_lines = _listing_lines(loaded)
        problems += listing_problems
    deprecations = deprecation_lines(loaded)
    failed = bool(problems) or (strict and bool(deprecations))
    schema_name = type(loaded.config).__name__ if loaded.config is not None else "no schema"
    out(f"FAIL {path}" if failed else f"ok   {path} ({schema_name})")
    for line in [*problems, *deprecations, *task_lines]:
        out(f"  {line}")
    return failed


@app.command()
def validate(
    items: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="CONFIG... [K=V]...",
            help="Config files, then k=v overrides for all of them.",
            show_default=False,
        ),
    ] = None,
    kind: KindOption = "auto",
    schema: SchemaOption = None,
    resolve: Annotated[
        bool,
        typer.Option("--resolve/--no-resolve", help="Resolve (import) every component the config names."),
    ] = True,
    strict: Annotated[bool, typer.Option("--strict", help="Deprecations count as failures.")] = False,
    tasks: Annotated[
        bool, typer.Option("--tasks", help="Print the sampling plan of a training config's tasks.")
    ] = False,
) -> int:
    """Check configs as a run would: schema, mixture rules, components, deprecations; exit 78 if any fails.

    A training config gets every check `platoon train` makes before it starts: keys (Tinker, W&B), the run
    directory, the tasks listed against the batch size, and what a resume would refuse.
    """
    _check_kind(kind)
    files, overrides = _split_files(list(items or []))
    if not files:
        print("platoon config validate: name at least one config file", file=sys.stderr)
        return EX_USAGE
    any_failed = False
    for path in files:
        any_failed |= _validate_one(
            path, overrides, kind=kind, schema=schema, resolve=resolve, strict=strict, tasks=tasks
        )
    return EX_CONFIG if any_failed else 0
