"""Labels, registration and reaping: nothing a stopped rollout started keeps running.

Every built-in provider registers each sandbox here *before* starting it (so a worker killed mid-start still left a
record to reap by), attaches the live sandbox once started and unregisters it on stop. The registry mirrors the
distinct `{provider, options, labels}` records to a file (mode 0600, rewritten atomically) so that a supervisor can
reap what a dead worker left, without ever holding the worker's live objects.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import tempfile
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platoon.sandbox import Sandbox, SandboxError, as_provider_class

__all__ = [
    "LABELS_ENV",
    "MIRROR_ENV",
    "RUN_LABEL",
    "WORKER_LABEL",
    "Registration",
    "SandboxRegistry",
    "clear_process_labels",
    "environment_labels",
    "merge_labels",
    "process_labels",
    "read_mirror",
    "reap",
    "registry",
    "set_process_labels",
]

log = logging.getLogger(__name__)

RUN_LABEL = "platoon.run"
WORKER_LABEL = "platoon.worker"
#: Where the process's registry mirrors its records, when whoever runs the process did not say otherwise.
MIRROR_ENV = "PLATOON_SANDBOX_MIRROR"
#: The labels whoever started this process gave it (a JSON object): train and eval set `platoon.run` here (core
#: `platoon.sandbox_runs`, which must not import this package), and a rollout worker adds `platoon.worker`.
LABELS_ENV = "PLATOON_SANDBOX_LABELS"

_process_labels: dict[str, str] = {}


def set_process_labels(labels: Mapping[str, str] | None = None, /, **more: str) -> None:
    """Add labels that every sandbox this process starts carries (train/eval set `platoon.run`, a worker
    `platoon.worker`). Values must be non-empty text: an empty label could never be reaped by."""
    merged = {**(labels or {}), **more}
    for key, value in merged.items():
        if not isinstance(value, str) or not value:
            raise ValueError(f"sandbox label {key!r} must be non-empty text; got {value!r}")
    _process_labels.update(merged)


def clear_process_labels() -> None:
    _process_labels.clear()


def environment_labels() -> dict[str, str]:
    """The labels `$PLATOON_SANDBOX_LABELS` gives (read each time: a worker sets it once its request is known).
    A malformed value gives none, with a warning; empty values are dropped."""
    text = os.environ.get(LABELS_ENV)
    if not text:
        return {}
    try:
        loaded = json.loads(text)
    except ValueError:
        loaded = None
    if not isinstance(loaded, dict):
        log.warning("$%s is not a JSON object of labels; ignoring it", LABELS_ENV)
        return {}
    return {str(k): v for k, v in loaded.items() if isinstance(v, str) and v}


def process_labels() -> dict[str, str]:
    """The labels of every sandbox this process starts: the environment's, then those set here on top."""
    return {**environment_labels(), **_process_labels}


def merge_labels(spec_labels: Mapping[str, str]) -> dict[str, str]:
    """A sandbox's labels: its spec's, with the process's on top (a spec cannot pose as another run)."""
    return {**spec_labels, **process_labels()}


def class_path(obj: Any) -> str:
    """The `module:Class` a supervisor re-imports to reap."""
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


@dataclass(eq=False)
class Registration:
    """One sandbox, from just before its start until its stop."""

    provider: str
    options: dict[str, Any]
    labels: dict[str, str]
    reap_labels: dict[str, str]
    sandbox: Sandbox | None = field(default=None, repr=False)

    def record(self) -> dict[str, Any] | None:
        """What the mirror lists; None for a sandbox with no labels at all (there is nothing to reap it by)."""
        if not self.reap_labels:
            return None
        return {"provider": self.provider, "options": self.options, "labels": self.reap_labels}


class SandboxRegistry:
    """The sandboxes this process has registered. One per process (`registry()`); tests may make their own."""

    def __init__(self, mirror: str | Path | None = None) -> None:
        self.mirror = Path(mirror) if mirror else None
        self._entries: list[Registration] = []
        self._mirrored: list[dict[str, Any]] | None = None
        self._shut_down = False

    @property
    def live(self) -> list[Registration]:
        return list(self._entries)

    def register(self, provider: str, options: Mapping[str, Any], labels: Mapping[str, str]) -> Registration:
        """Record a sandbox about to start; refused (`SandboxError`) once the process has shut down."""
        if self._shut_down:
            raise SandboxError("this process is shutting down its sandboxes: no new sandbox may start")
        json.dumps(dict(options))  # options travel to a supervisor: refuse what it could never read back
        entry = Registration(
            provider,
            dict(options),
            dict(labels),
            process_labels() or dict(labels),  # the run's labels reap every sandbox of the run at once
        )
        self._entries.append(entry)
        self._write_mirror()
        return entry

    def attach(self, entry: Registration, sandbox: Sandbox) -> None:
        entry.sandbox = sandbox

    def unregister(self, entry: Registration) -> None:
        if entry in self._entries:
            self._entries.remove(entry)
            self._write_mirror()

    def shut_down(self) -> None:
        """From now on every start is refused (the live sandboxes are stopped by `stop_all`)."""
        self._shut_down = True

    @property
    def is_shut_down(self) -> bool:
        return self._shut_down

    async def stop_all(self, deadline_s: float) -> int:
        """Shut down and stop every live sandbox concurrently within `deadline_s`; failures are logged, never
        raised. Returns how many stopped."""
        self.shut_down()
        live = [e.sandbox for e in self._entries if e.sandbox is not None]
        if not live:
            return 0
        results = await _within(
            [sandbox.stop() for sandbox in live], deadline_s, "stop", "a sandbox failed to stop: %s"
        )
        return len(results)

    def records(self) -> list[dict[str, Any]]:
        """The distinct records, in registration order."""
        out: list[dict[str, Any]] = []
        for entry in self._entries:
            record = entry.record()
            if record is not None and record not in out:
                out.append(record)
        return out

    def _write_mirror(self) -> None:
        if self.mirror is None:
            return
        records = self.records()
        if records == self._mirrored:
            return  # a second sandbox of the same run changes nothing a supervisor would read
        self.mirror.parent.mkdir(parents=True, exist_ok=True)
        # mkstemp makes the file 0600; the rename makes the rewrite atomic, so a reader never sees half a list
        fd, tmp = tempfile.mkstemp(prefix=f".{self.mirror.name}.", dir=self.mirror.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(records, handle, indent=1, sort_keys=True)
            os.replace(tmp, self.mirror)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._mirrored = records


_registry: SandboxRegistry | None = None


def registry() -> SandboxRegistry:
    """This process's registry, mirrored to `$PLATOON_SANDBOX_MIRROR` when that is set."""
    global _registry
    if _registry is None:
        _registry = SandboxRegistry(os.environ.get(MIRROR_ENV) or None)
    return _registry


def read_mirror(path: str | Path) -> list[dict[str, Any]]:
    """The records a mirror lists; a missing file lists none."""
    try:
        return list(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        return []


def _import_class(path: str) -> Any:
    module, _, attr = path.partition(":")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


async def _reap_one(record: Mapping[str, Any]) -> int:
    labels = dict(record.get("labels") or {})
    if not labels:
        raise SandboxError("reaping with an empty label set is refused: it would reap every run's sandboxes")
    provider_class = as_provider_class(_import_class(str(record["provider"])))
    return int(await provider_class(**dict(record.get("options") or {})).reap(labels))


async def reap(records: Iterable[Mapping[str, Any]], deadline_s: float) -> int:
    """Reap every record (from a mirror) concurrently within `deadline_s`; failures are logged, never raised.
    Returns how many sandboxes were reaped."""
    results = await _within(
        [_reap_one(record) for record in records], deadline_s, "reap", "reaping sandboxes failed: %s"
    )
    return sum(results)


async def _within(
    jobs: list[Coroutine[Any, Any, Any]], deadline_s: float, what: str, failed: str
) -> list[Any]:
    """Run `jobs` concurrently for at most `deadline_s`: the results of those that finished; the late ones are
    cancelled and the failed ones logged, never raised."""
    if not jobs:
        return []
    tasks = [asyncio.ensure_future(job) for job in jobs]
    done, pending = await asyncio.wait(tasks, timeout=deadline_s)
    for task in pending:
        task.cancel()
    if pending:
        log.warning("%d %s(s) did not finish within %.0f s", len(pending), what, deadline_s)
    results = []
    for task in done:
        if task.exception() is not None:
            log.warning(failed, task.exception())
        else:
            results.append(task.result())
    return results
