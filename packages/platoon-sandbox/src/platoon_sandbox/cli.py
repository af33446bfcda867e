"""`platoon sandbox list | reap RUN_DIR`: the sandboxes a run's label still has,
and reaping those of a run that was killed.

Both read the run dir's `config.resolved.yaml` (a directory without one is no run dir: usage, exit 64) for the
providers the run could have used (core's `platoon.sandbox_runs.run_providers`), and `process.json` for who last
held it. `reap` refuses (exit 1) while a recorded process is alive on this host, or when the record names another
host; `list` only reads, so it never refuses.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from platoon.console import err, new_app, out, table
from platoon.sandbox import SandboxProvider

app = new_app("List and reap the sandboxes a run started.")

RunDirArgument = Annotated[
    str, typer.Argument(metavar="RUN_DIR", help="A run or evaluation directory.", show_default=False)
]


class _Refused(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _run(run_dir: str) -> tuple[Path, dict[str, Any], Any]:
    """The run dir (absolute), its resolved config and the site profile; `_Refused` for what is no run dir."""
    import yaml

    from platoon.config import load_site
    from platoon.errors import ConfigError
    from platoon.rollouts.records import RESOLVED_CONFIG_FILE

    path = Path(os.path.abspath(run_dir))
    snapshot = path / RESOLVED_CONFIG_FILE
    if not snapshot.is_file():
        raise _Refused(f"{run_dir} is not a run directory: it has no {RESOLVED_CONFIG_FILE}", 64)
    try:
        data = yaml.safe_load(snapshot.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise _Refused(f"{snapshot} cannot be read: {' '.join(str(exc).split())}", 1) from None
    try:
        site = load_site()
    except ConfigError as exc:
        raise _Refused(str(exc), 78) from None
    return path, data if isinstance(data, dict) else {}, site


def _label(path: Path, record: Any) -> str:
    """The recorded run label when `process.json` holds one (an absolute path), else the run dir's."""
    from platoon.sandbox_runs import run_label

    recorded = getattr(record, "label", "") if record is not None else ""
    # process.json's `label` says which command held the dir (`train`, `eval`) unless it is a run label itself
    return recorded if recorded and os.path.isabs(recorded) else run_label(path)


@app.command("list")
def list_(run_dir: RunDirArgument) -> int:
    """List the sandboxes labelled with a run directory, per provider that can list them."""
    from platoon.rollouts.records import read_process
    from platoon.sandbox_runs import RUN_LABEL, provider_missing, run_providers

    try:
        path, data, site = _run(run_dir)
    except _Refused as exc:
        err(str(exc))
        return exc.code
    label = _label(path, read_process(path))
    rows: list[list[Any]] = []
    for name, options in run_providers(data, site):
        missing = provider_missing(name)
        if missing is not None:
            err(f"{missing}; its sandboxes are not listed")
            continue
        listed = asyncio.run(_provider(name, options).labelled({RUN_LABEL: label}))
        if listed is None:
            err(f"sandbox provider {name!r} cannot list its sandboxes")
            continue
        for found in listed:
            rows.append(
                [name, found.get("id"), found.get("owner_pid"), found.get("state"), found.get("path")]
            )
    if rows:
        out(table(["PROVIDER", "ID", "OWNER PID", "STATE", "WHERE"], rows))
    err(f"{len(rows)} sandbox(es) of {path}")
    return 0


def _provider(name: str, options: dict[str, Any]) -> SandboxProvider:
    from platoon.sandbox_runs import provider_class

    return provider_class(name)(**options)


@app.command()
def reap(run_dir: RunDirArgument) -> int:
    """Reap the sandboxes labelled with a run directory whose run was killed."""
    from platoon.rollouts.records import PROCESS_FILE, read_process
    from platoon.sandbox_runs import REAP_BUDGET_SECONDS, provider_missing, reap_run_async, run_providers

    try:
        path, data, site = _run(run_dir)
    except _Refused as exc:
        err(str(exc))
        return exc.code
    record = read_process(path)
    if record is not None:
        if record.host and record.host != socket.gethostname():
            err(
                f"{path} last ran on {record.host} ({PROCESS_FILE}), not on this host: run "
                f"`platoon sandbox reap {path}` there"
            )
            return 1
        live = record.live_pids()
        if live:
            err(
                f"{path} is in use: {PROCESS_FILE} names pid {live[0]} ({record.label or 'a run'}), still "
                "running on this host; stop it first (its own exit reaps its sandboxes)"
            )
            return 1
    label = _label(path, record)
    providers = run_providers(data, site)
    for name, _ in providers:
        missing = provider_missing(name)
        if missing is not None:
            err(f"{missing}; its sandboxes are not reaped")
    try:
        reaped = asyncio.run(reap_run_async(providers, label, deadline_s=REAP_BUDGET_SECONDS, strict=True))
    except RuntimeError as exc:
        err(str(exc))
        return 1
    out(f"reaped {reaped} sandbox(es) of {path}")
    return 0
