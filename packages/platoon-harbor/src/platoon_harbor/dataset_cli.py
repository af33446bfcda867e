"""`platoon harbor fetch | verify | index`: fetch each Harbor entry's dataset once and pin it
with a lock, check the cache against the lock, and list a lock's tasks.

Exit codes: 0 ok; 1 a fetch that failed, or `verify` found a damaged or missing cache entry; 64 usage; 78 a config
problem (a moving reference, an unreadable lock, a bad hold-out rule, a hold-out entry whose lock lacks input files).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from platoon.console import err, out, table
from platoon.errors import EX_CONFIG, EX_FAILURE

Target = Annotated[
    str, typer.Argument(metavar="CONFIG|LOCK", help="A run config, or a lock file.", show_default=False)
]
Overrides = Annotated[
    list[str] | None, typer.Argument(metavar="[K=V]...", help="Config overrides.", show_default=False)
]
CacheOption = Annotated[
    str | None,
    typer.Option(
        "--cache",
        metavar="DIR",
        help="The Harbor cache (default: harbor under the site profile's cache).",
        show_default=False,
    ),
]
LockOption = Annotated[
    str | None, typer.Option("--lock", metavar="PATH", help="Write the lock here.", show_default=False)
]


class _Entry:
    """A Harbor entry of a config (or a lock named directly)."""

    def __init__(self, label: str, kwargs: dict[str, Any], base: Path, config: str | None) -> None:
        self.label, self.kwargs, self.base, self.config = label, kwargs, base, config


def _is_lock(path: Path) -> bool:
    if path.name.endswith(".lock.json"):
        return True
    if path.suffix != ".json":
        return False
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "hash_rule" in data and "tasks" in data


def _entries(target: str, overrides: list[str]) -> list[_Entry]:
    """The Harbor entries with a `dataset` (ConfigError, 78, when there are none)."""
    from platoon.config import load_config
    from platoon.errors import ConfigError

    loaded = load_config(target, overrides, kind="none")
    found: list[_Entry] = []
    for i, entry in enumerate(loaded.data.get("environments") or []):
        if not isinstance(entry, dict) or entry.get("service") != "harbor":
            continue
        kwargs = dict(entry.get("service_kwargs") or {})
        if not kwargs.get("dataset"):
            continue
        label = str(entry.get("name") or i)
        found.append(_Entry(label, kwargs, loaded.path.parent, str(target)))
    if not found:
        raise ConfigError(f"{target}: no Harbor entry (service: harbor) names a dataset")
    return found


def _settings(entry: _Entry, cache: str | None, lock: str | None = None) -> Any:
    from platoon_harbor.datasets import FetchSettings

    return FetchSettings.from_kwargs(
        entry.kwargs,
        base_dir=entry.base,
        cache=Path(os.path.abspath(cache)) if cache else None,
        lock=Path(os.path.abspath(lock)) if lock else None,
        config=entry.config,
    )


def fetch(
    config: Annotated[str, typer.Argument(metavar="CONFIG", help="A run config.", show_default=False)],
    overrides: Overrides = None,
    update: Annotated[
        bool, typer.Option("--update", help="Resolve moving references (a branch, a tag).")
    ] = False,
    repair: Annotated[
        bool, typer.Option("--repair", help="Re-hash and repair even when the lock is current.")
    ] = False,
    lock: LockOption = None,
    cache: CacheOption = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Parallel downloads.")] = 8,
) -> int:
    """Fetch each Harbor entry's dataset once and pin it with a lock (one JSON line per lock)."""
    from platoon.errors import ConfigError
    from platoon_harbor import datasets, holdout

    if update and repair:
        err("harbor fetch: --update and --repair do not go together")
        return 64
    try:
        entries = _entries(config, overrides or [])
        if lock and len(entries) > 1:
            raise ConfigError("--lock names one lock, and this config has several Harbor datasets")
        plans = [(entry, _settings(entry, cache, lock)) for entry in entries]  # every entry checked first
        rules = [
            holdout.HoldoutRule.parse(e.kwargs["holdout"]) if e.kwargs.get("holdout") else None
            for e in entries
        ]
    except ConfigError as exc:
        err(str(exc))
        return EX_CONFIG
    failed = False
    for (entry, settings), rule in zip(plans, rules, strict=True):
        settings.workers = workers
        try:
            result = datasets.fetch(settings, update=update, repair=repair)
            line: dict[str, Any] = {"environment": entry.label, **result.summary()}
            if rule is not None:
                split = holdout.holdout_split(result.lock["tasks"], rule, dataset=_identity(result.lock))
                for text in split.report_lines():
                    err(f"environments[{entry.label}]: {text}")
                line["holdout"] = {
                    "eval": len(split.eval),
                    "train": len(split.train),
                    "eval_digest": split.eval_digest,
                }
        except ConfigError as exc:
            err(f"environments[{entry.label}]: {exc}")
            return EX_CONFIG
        except datasets.FetchError as exc:
            err(f"environments[{entry.label}]: {exc}")
            failed = True
            continue
        out(json.dumps(line))
    return EX_FAILURE if failed else 0


def _identity(lock: dict[str, Any]) -> dict[str, Any]:
    return {"dataset": lock.get("dataset"), "resolved": lock.get("resolved"), "inputs": lock.get("inputs")}


def _locks(
    target: str, overrides: list[str], cache: str | None
) -> list[tuple[str, Path, dict[str, Any], Path, Any]]:
    """(label, lock path, lock, cache, holdout rule or None) for a lock file or each entry of a config."""
    from platoon.errors import ConfigError
    from platoon_harbor import datasets, holdout

    path = Path(target)
    if path.is_file() and _is_lock(path):
        if overrides:
            raise ConfigError("overrides apply to a config, not to a lock file")
        root = Path(os.path.abspath(cache)) if cache else datasets.default_cache()
        return [(path.name, path, datasets.read_lock(path), root, None)]
    found = []
    for entry in _entries(target, overrides):
        settings = _settings(entry, cache)
        rule = holdout.HoldoutRule.parse(entry.kwargs["holdout"]) if entry.kwargs.get("holdout") else None
        try:
            lock = datasets.read_lock(settings.lock_path)
        except FileNotFoundError:
            raise ConfigError(
                f"environments[{entry.label}]: {settings.dataset.text} is not fetched (no lock "
                f"{settings.lock_path}): run `platoon harbor fetch {target}`"
            ) from None
        found.append((entry.label, settings.lock_path, lock, settings.cache, rule))
    return found


def verify(
    target: Target,
    overrides: Overrides = None,
    cache: CacheOption = None,
    task: Annotated[list[str] | None, typer.Option("--task", metavar="ID", help="Only these tasks.")] = None,
) -> int:
    """Hash each cache entry against its digest in the lock (exit 1 on a mismatch)."""
    from platoon.errors import ConfigError
    from platoon_harbor import datasets

    try:
        locks = _locks(target, overrides or [], cache)
    except ConfigError as exc:
        err(str(exc))
        return EX_CONFIG
    code = 0
    for label, path, lock, root, rule in locks:
        if rule is not None and any("input_files" not in t for t in lock["tasks"]):
            err(f"{label}: the lock {path} records no input files, which the hold-out needs: refetch")
            return EX_CONFIG
        problems = datasets.verify(lock, root, task)
        for problem in problems:
            err(f"{label}: {problem}")
        checked = len(task) if task else len(lock["tasks"])
        out(
            json.dumps(
                {"environment": label, "lock": str(path), "checked": checked, "damaged": len(problems)}
            )
        )
        code = code or (EX_FAILURE if problems else 0)
    return code


def index(
    target: Target,
    overrides: Overrides = None,
    cache: CacheOption = None,
    json_output: Annotated[bool, typer.Option("--json-output", help="One JSON object per task.")] = False,
) -> int:
    """List a lock's tasks: id, digest, split (with a hold-out), refusal and index fields."""
    from platoon.errors import ConfigError
    from platoon_harbor import holdout

    try:
        locks = _locks(target, overrides or [], cache)
        rows: list[dict[str, Any]] = []
        for label, _path, lock, _root, rule in locks:
            split = holdout.holdout_split(lock["tasks"], rule) if rule is not None else None
            evals = set(split.eval) if split is not None else set()
            for task in lock["tasks"]:
                side = None
                if split is not None and not task.get("refused"):
                    side = "eval" if task["name"] in evals else "train"
                rows.append(
                    {
                        "environment": label,
                        "id": task["name"],
                        "digest": task["digest"],
                        "split": side,
                        "refused": task.get("refused"),
                        "index": task.get("index") or {},
                    }
                )
    except ConfigError as exc:
        err(str(exc))
        return EX_CONFIG
    if json_output:
        for row in rows:
            out(json.dumps(row, sort_keys=True))
        return 0
    shown = [
        (
            r["environment"],
            r["id"],
            r["digest"].removeprefix("sha256:")[:12],
            r["split"],
            (r["refused"] or "").split(":", 1)[0],
            " ".join(f"{k}={v}" for k, v in sorted(r["index"].items())),
        )
        for r in rows
    ]
    out(table(["ENVIRONMENT", "TASK", "DIGEST", "SPLIT", "REFUSED", "INDEX"], shown))
    return 0
