"""Where the viewer's records come from, without Textual: files followed as they grow (`Tailer`, looked at on the
schedule `Backoff` keeps), files read whole and merged by time (`Replay`), and `TrajectoryCollection` dumps turned
into event files (`convert_dumps`).

A tailed file is read from the start; a line is taken only once its newline has arrived (a writer appending a
rollout is never seen half-way), and the file is read again from the start when it shrinks (truncated) or its
inode changes (replaced by an atomic rename, as `write_events` does).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platoon.trajectory import TrajectoryCollection
from platoon.trajectory_events import write_events
from platoon.viz.model import record_time

__all__ = [
    "POLL_INTERVAL",
    "POLL_LONGEST",
    "Backoff",
    "FileTail",
    "Replay",
    "Tailer",
    "convert_dumps",
    "dump_files",
    "event_files",
]

#: seconds between two looks at the tailed files while they grow
POLL_INTERVAL = 0.2
#: the longest wait between two looks: files that stopped growing (a finished run) are looked at this often
POLL_LONGEST = 2.0
#: `--rdir` walks a whole tree: it is rescanned for new files every this many polls, not on every one
RDIR_RESCAN_POLLS = 5
#: how much of a file's beginning is kept to notice it was rewritten in place
HEAD_BYTES = 256


def _visible(path: Path) -> bool:
    # `.events_x.jsonl.123.tmp` is a writer's file in progress; a hidden file is nobody's event file.
    return not path.name.startswith(".")


def event_files(
    paths: Sequence[str | os.PathLike[str]] = (),
    directories: Sequence[str | os.PathLike[str]] = (),
    recursive: Sequence[str | os.PathLike[str]] = (),
) -> list[Path]:
    """The files named, then every `*.jsonl` in `directories` (not descending) and under `recursive`, each once,
    in that order (sorted within a directory)."""
    found: list[Path] = [Path(p) for p in paths]
    for directory in directories:
        found += sorted(p for p in Path(directory).glob("*.jsonl") if p.is_file() and _visible(p))
    for directory in recursive:
        found += sorted(p for p in Path(directory).rglob("*.jsonl") if p.is_file() and _visible(p))
    unique: dict[Path, None] = {}
    for path in found:
        unique.setdefault(path, None)
    return list(unique)


def parse_lines(lines: Iterable[bytes | str]) -> list[dict[str, Any]]:
    """JSON objects of the lines; a line that does not parse (a torn or foreign line) is skipped."""
    records = []
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


@dataclass
class Backoff:
    """When to look at followed files next: `POLL_INTERVAL` after a look that found something, twice as long after
    each look that found nothing, up to `POLL_LONGEST`. A live run is shown within a fraction of a second; a
    finished one costs a look every two seconds, each a `stat` per file."""

    shortest: float = POLL_INTERVAL
    longest: float = POLL_LONGEST
    current: float = POLL_INTERVAL

    def after(self, changed: bool) -> float:
        """The seconds to wait after a look (`changed`: it found new records)."""
        self.current = self.shortest if changed else min(self.longest, self.current * 2)
        return self.current

    def reset(self) -> None:
        self.current = self.shortest


@dataclass
class FileTail:
    """One followed file: how far it was read, which inode that was, and the unfinished last line."""

    path: Path
    offset: int = 0
    inode: int | None = None
    partial: bytes = b""
    #: the file's first bytes as read: a file truncated and rewritten past the old length between two polls keeps
    #: its inode and does not look shorter, but its beginning changed
    head: bytes = b""
    #: how many times the file was opened and read: a file that does not change is only `stat`ed
    reads: int = 0

    def poll(self) -> tuple[list[dict[str, Any]], bool]:
        """(the records of the lines completed since the last poll, whether the file was reset: truncated or
        replaced, so everything read from it before is void and it is read again from the start)."""
        try:
            stat = os.stat(self.path)
        except OSError:  # not there yet, or gone for a moment between an unlink and a rename
            return [], False
        reset = self.inode is not None and (stat.st_ino != self.inode or stat.st_size < self.offset)
        if reset:
            self.offset, self.partial, self.head = 0, b"", b""
        self.inode = stat.st_ino
        if stat.st_size == self.offset:
            return [], reset
        self.reads += 1
        try:
            with open(self.path, "rb") as handle:
                if os.fstat(handle.fileno()).st_ino != self.inode:
                    return [], reset  # replaced between the stat and the open: the next poll starts over
                if self.offset and handle.read(len(self.head)) != self.head:
                    self.offset, self.partial, self.head, reset = 0, b"", b"", True
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return [], reset
        if len(self.head) < HEAD_BYTES:
            self.head = (self.head + data)[:HEAD_BYTES]
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        return parse_lines(lines), reset


@dataclass
class Tailer:
    """Files followed from their start: the ones named (waited for when missing), and the `*.jsonl` of
    `directories` (non-recursive) and `recursive` (the whole tree), rescanned so new files are picked up."""

    paths: Sequence[str | os.PathLike[str]] = ()
    directories: Sequence[str | os.PathLike[str]] = ()
    recursive: Sequence[str | os.PathLike[str]] = ()
    tails: dict[Path, FileTail] = field(default_factory=dict)
    polls: int = 0

    def __post_init__(self) -> None:
        self._rescan(include_recursive=True)

    def _rescan(self, *, include_recursive: bool) -> None:
        found = event_files(self.paths, self.directories, self.recursive if include_recursive else ())
        for path in found:
            if path not in self.tails:
                self.tails[path] = FileTail(path)

    def restart(self) -> None:
        """Forget every position: the next poll reads every file from the start."""
        self.tails = {path: FileTail(path) for path in self.tails}

    def poll(self) -> list[tuple[Path, list[dict[str, Any]], bool]]:
        """(file, its new records, whether it was reset) for each file that changed."""
        self.polls += 1
        self._rescan(include_recursive=self.polls % RDIR_RESCAN_POLLS == 0)
        changes = []
        for path, tail in self.tails.items():
            records, reset = tail.poll()
            if records or reset:
                changes.append((path, records, reset))
        return changes


class Replay:
    """Every record of the files read to their end and merged by time (`ts`, or a bridge event's `time`; a
    stable sort, so one file's order is kept among equal times); stepped through one record at a time."""

    def __init__(self, files: Sequence[Path]) -> None:
        self.files = list(files)
        self.records: list[tuple[Path, dict[str, Any]]] = []
        self.position = 0
        self.reload()

    def reload(self) -> None:
        records: list[tuple[Path, dict[str, Any]]] = []
        for path in self.files:
            records += [(path, record) for record in parse_lines(path.read_bytes().split(b"\n"))]
        records.sort(key=lambda item: record_time(item[1]))
        self.records, self.position = records, 0

    @property
    def done(self) -> bool:
        return self.position >= len(self.records)

    def restart(self) -> None:
        self.position = 0

    def take(self, count: int | None = 1) -> list[tuple[Path, dict[str, Any]]]:
        """The next `count` records (None: all that are left)."""
        end = len(self.records) if count is None else min(len(self.records), self.position + count)
        taken = self.records[self.position : end]
        self.position = end
        return taken


def dump_files(
    paths: Sequence[str | os.PathLike[str]], directories: Sequence[str | os.PathLike[str]]
) -> tuple[list[Path], list[Path]]:
    """(dump files to read, files skipped for their suffix): `.json` and `.jsonl` are dumps, anything else is
    skipped; directories give their `.json` and `.jsonl` files."""
    named = [Path(p) for p in paths]
    for directory in directories:
        named += sorted(p for p in Path(directory).iterdir() if p.is_file() and _visible(p))
    kept = [p for p in named if p.suffix in (".json", ".jsonl")]
    return kept, [p for p in named if p.suffix not in (".json", ".jsonl")]


def convert_dumps(files: Sequence[Path], output_dir: Path) -> list[Path]:
    """Write each `TrajectoryCollection` dump (a `.json` object, or `.jsonl` with one dump a line) as an event file
    under `output_dir/events/`; returns the event files. A dump that is not a collection raises ValueError naming
    the file (and line)."""
    written = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            texts = [(str(path), text)]
        else:
            texts = [(f"{path}:{n}", line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        for where, dump_text in texts:
            try:
                dump = json.loads(dump_text)
            except ValueError as exc:
                raise ValueError(f"{where}: not JSON ({exc})") from None
            try:
                collection = TrajectoryCollection.from_dict(dump)
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                raise ValueError(
                    f"{where}: not a trajectory collection dump ({type(exc).__name__}: {exc})"
                ) from None
            root = collection.root
            task_id = root.task.id if root is not None and root.task is not None else None
            written.append(write_events(collection, output_dir, task_id=task_id))
    return written
