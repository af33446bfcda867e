"""Checkpoints of the local Tinker server: `tinker://<model_id>/<weights|sampler_weights>/<name>` <-> directories.

Each checkpoint is `<state>/runs/<model_id>/<kind>/<name>/` holding `checkpoint.json` and the backend's files, so
checkpoints (and the runs' `run.json`) survive a restart of the server on the same state directory.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from platoon.local_server.futures import UserError

PREFIX = "tinker://"
KINDS = ("weights", "sampler_weights")
#: checkpoint kind -> the SDK's `checkpoint_type`
CHECKPOINT_TYPES = {"weights": "training", "sampler_weights": "sampler"}
META = "checkpoint.json"
RUN_META = "run.json"
#: the name of the backend's files inside a checkpoint directory (a file or a directory, the backend's choice)
DATA = "state"


@dataclass(frozen=True)
class CheckpointRef:
    """A parsed `tinker://` path."""

    run: str
    kind: str
    name: str

    @property
    def tinker_path(self) -> str:
        return f"{PREFIX}{self.run}/{self.kind}/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        return f"{self.kind}/{self.name}"


def _segment(text: str) -> str:
    # quote() keeps names like `a:b` readable while making `/`, `..` and NULs harmless as one path segment
    quoted = quote(text, safe=":@=+,-_~")
    return "%2E" + quoted[1:] if quoted.startswith(".") else quoted


def check_name(name: Any) -> str:
    """A checkpoint name the SDK can parse back out of a `tinker://` path (one path segment)."""
    if not isinstance(name, str) or not name or "/" in name or name in {".", ".."}:
        raise UserError(f"checkpoint name must be a non-empty text without '/', got {name!r}")
    return name


def parse(path: Any) -> CheckpointRef:
    """`tinker://<run>/<weights|sampler_weights>/<name>` -> its parts; anything else is a user error."""
    if not isinstance(path, str) or not path.startswith(PREFIX):
        raise UserError(f"a checkpoint path starts with {PREFIX}, got {path!r}")
    parts = path[len(PREFIX) :].split("/")
    if len(parts) != 3 or parts[1] not in KINDS or not parts[0] or not parts[2]:
        raise UserError(f"not a checkpoint path (tinker://<run>/weights|sampler_weights/<name>): {path!r}")
    return CheckpointRef(run=parts[0], kind=parts[1], name=parts[2])


class CheckpointStore:
    """Checkpoint directories and run records under one state directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.runs_dir = self.root / "runs"
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def run_dir(self, run: str) -> Path:
        return self.runs_dir / _segment(run)

    def directory(self, ref: CheckpointRef) -> Path:
        return self.run_dir(ref.run) / ref.kind / _segment(ref.name)

    # -- runs

    def write_run(self, run: str, meta: dict[str, Any]) -> None:
        directory = self.run_dir(run)
        directory.mkdir(parents=True, exist_ok=True)
        _write_json(directory / RUN_META, {"training_run_id": run, **meta})

    def read_run(self, run: str) -> dict[str, Any] | None:
        path = self.run_dir(run) / RUN_META
        try:
            loaded: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return loaded

    def runs(self) -> list[dict[str, Any]]:
        out = []
        for directory in sorted(self.runs_dir.iterdir()) if self.runs_dir.is_dir() else []:
            meta = self.read_run(unquote(directory.name))
            if meta is not None:
                out.append(meta)
        return out

    # -- checkpoints

    def save(self, ref: CheckpointRef, meta: dict[str, Any], write: Any) -> None:
        """Write a checkpoint atomically: `write(data_path)` fills a staging directory that then replaces it."""
        final = self.directory(ref)
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = final.parent / f".staging-{uuid.uuid4().hex}"
        staging.mkdir()
        try:
            write(str(staging / DATA))
            _write_json(
                staging / META,
                {**meta, "tinker_path": ref.tinker_path, "time": datetime.now(UTC).isoformat()},
            )
            with self._lock:
                # saving under a used name replaces the earlier checkpoint (as the service does)
                if final.exists():
                    shutil.rmtree(final)
                staging.rename(final)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    def locate(self, path: Any) -> tuple[CheckpointRef, Path, dict[str, Any]]:
        """The checkpoint at a `tinker://` path: its parts, its data path and its metadata."""
        ref = parse(path)
        directory = self.directory(ref)
        try:
            meta: dict[str, Any] = json.loads((directory / META).read_text())
        except (OSError, ValueError):
            raise UserError(f"no checkpoint at {ref.tinker_path}") from None
        return ref, directory / DATA, meta

    def delete(self, run: str, checkpoint_id: str) -> bool:
        """Delete `<kind>/<name>` of a run; False when there is no such checkpoint."""
        ref = parse(f"{PREFIX}{run}/{checkpoint_id}")
        directory = self.directory(ref)
        with self._lock:
            if not (directory / META).is_file():
                return False
            shutil.rmtree(directory)
        return True

    def list_checkpoints(self, run: str | None = None) -> list[dict[str, Any]]:
        """The SDK's `Checkpoint` records, oldest first, of one run or of every run."""
        runs = [run] if run is not None else [unquote(d.name) for d in sorted(self.runs_dir.iterdir())]
        out: list[dict[str, Any]] = []
        for name in runs:
            for kind in KINDS:
                kind_dir = self.run_dir(name) / kind
                if not kind_dir.is_dir():
                    continue
                for directory in kind_dir.iterdir():
                    if directory.name.startswith(".staging-"):
                        continue
                    try:
                        meta = json.loads((directory / META).read_text())
                    except (OSError, ValueError):
                        continue
                    ref = CheckpointRef(run=name, kind=kind, name=unquote(directory.name))
                    out.append(
                        {
                            "checkpoint_id": ref.checkpoint_id,
                            "checkpoint_type": CHECKPOINT_TYPES[kind],
                            "time": meta.get("time"),
                            "tinker_path": ref.tinker_path,
                            "size_bytes": _size(directory),
                            "public": False,
                            "expires_at": None,
                        }
                    )
        out.sort(key=lambda c: c["time"] or "")
        return out


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    tmp.replace(path)


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
