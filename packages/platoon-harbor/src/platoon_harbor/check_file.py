"""The dataset check's verdicts, as a run reads them and `platoon harbor check` writes them: the entry's
`harbor_check` mode, where its check file lives (beside a fetched dataset's lock, else under the Harbor cache),
the verdicts keyed by each task's content digest, and what they say of the entry's current tasks.

The service reads this to skip quarantined tasks; running the check is `platoon_harbor.check`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platoon.config import choose_kind, load_config
from platoon.errors import ConfigError
from platoon.rollouts.records import write_json_atomic
from platoon_harbor.datasets import FetchSettings, content_hash

__all__ = [
    "CHECK_MODES",
    "CHECK_VERSION",
    "CheckState",
    "check_mode",
    "check_path",
    "check_state",
    "dataset_label",
    "parse_mode",
    "read_verdicts",
    "say_once",
    "summary",
    "task_digests",
    "write_verdicts",
]

CHECK_MODES = ("required", "warn", "off")
CHECK_VERSION = 1


def parse_mode(value: Any, where: str = "service_kwargs.harbor_check") -> str | None:
    """The entry's `harbor_check`, checked (None: the default of the run's kind)."""
    if value is None:
        return None
    if value is False:  # YAML reads a bare `off` as false
        return "off"
    if not isinstance(value, str) or value not in CHECK_MODES:
        raise ConfigError(f"{where}: required, warn or off; got {value!r}")
    return str(value)


def check_mode(options: Mapping[str, Any], config: str | None) -> str:
    """The entry's `harbor_check`, else `required` for a training config and `warn` for anything else (an
    evaluation config, or no config file): the kind is the one `platoon config show --kind auto` picks."""
    mode = parse_mode(options.get("harbor_check"))
    if mode is not None:
        return mode
    if config is None:
        return "warn"
    try:
        data = load_config(config, [], kind="none").data
    except ConfigError:
        return "warn"  # the run's own loading reports the file's problem
    return "required" if choose_kind(data) == "train" else "warn"


_SAID: set[str] = set()


def say_once(line: str) -> None:
    """A `platoon: ...` line on stderr, once per process (each service instance of a run lists its tasks)."""
    if line not in _SAID:
        _SAID.add(line)
        print(f"platoon: {line}", file=sys.stderr, flush=True)


def check_path(options: Mapping[str, Any], cache: Path, *, config: str | None = None) -> Path:
    """Where the entry's verdicts live: beside a fetched dataset's lock, else under `<harbor cache>/checks/`."""
    if options.get("dataset") or options.get("lock"):
        lock = FetchSettings.from_kwargs(options, cache=cache, config=config).lock_path
        return lock.with_name(lock.name.removesuffix(".json").removesuffix(".lock") + ".check.json")
    where = options.get("task_dirs") or [options.get("dataset_dir")]
    paths = sorted(os.path.abspath(os.path.expanduser(str(p))) for p in where if p)
    key = hashlib.sha256(json.dumps(paths).encode()).hexdigest()[:16]
    return cache / "checks" / f"{key}.check.json"


def task_digests(tasks: Mapping[str, Path], *, fetched: bool) -> dict[str, str]:
    """Task id -> content digest: a fetched task's cache directory is named by it; a directory read in place is
    hashed (Harbor's content hash, as a fetch records it)."""
    if fetched:
        return {task_id: f"sha256:{path.name}" for task_id, path in tasks.items()}
    return {task_id: f"sha256:{content_hash(path)}" for task_id, path in tasks.items()}


def read_verdicts(path: Path) -> dict[str, dict[str, Any]]:
    """The check file's task records (empty when there is none; an unreadable one is one line, exit 78)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"the dataset check file {path} is unreadable ({exc}): delete it and run `platoon harbor check`"
        ) from None
    tasks = data.get("tasks") if isinstance(data, dict) and data.get("version") == CHECK_VERSION else None
    if not isinstance(tasks, dict):
        raise ConfigError(
            f"the dataset check file {path} is not a version-{CHECK_VERSION} check file: delete it and run "
            "`platoon harbor check`"
        )
    return {str(k): v for k, v in tasks.items() if isinstance(v, dict)}


def write_verdicts(path: Path, dataset: str, records: Mapping[str, Mapping[str, Any]]) -> None:
    """Replace the check file at once (readers never see half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    data = {
        "version": CHECK_VERSION,
        "dataset": dataset,
        "checked_at": stamp,
        "tasks": dict(sorted(records.items())),
    }
    write_json_atomic(path, data)


@dataclass
class CheckState:
    """What the check file says about an entry's current tasks."""

    path: Path
    quarantined: dict[str, str] = field(default_factory=dict)  # task id -> reason
    unchecked: list[str] = field(default_factory=list)  # no verdict for the task's current content
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # the current tasks' verdicts

    @property
    def checked(self) -> bool:
        return not self.unchecked


def check_state(path: Path, digests: Mapping[str, str]) -> CheckState:
    """Each current task's verdict, when the check file has one for its digest."""
    verdicts = read_verdicts(path)
    state = CheckState(path)
    for task_id, digest in digests.items():
        record = verdicts.get(task_id)
        if record is None or record.get("digest") != digest:
            state.unchecked.append(task_id)
            continue
        state.records[task_id] = record
        if record.get("verdict") == "quarantined":
            state.quarantined[task_id] = str(record.get("reason") or "quarantined")
    return state


def dataset_label(options: Mapping[str, Any]) -> str:
    """What the check file says it checked: the dataset as the entry names it."""
    for key in ("dataset", "lock", "dataset_dir"):
        if options.get(key):
            return str(options[key])
    return ", ".join(str(p) for p in options.get("task_dirs") or [])


def summary(records: Mapping[str, Mapping[str, Any]], path: Path) -> str:
    """`N task(s) checked, Q quarantined (PATH)`."""
    quarantined = sum(1 for r in records.values() if r.get("verdict") == "quarantined")
    return f"{len(records)} task(s) checked, {quarantined} quarantined ({path})"
