"""The files a trainer and its rollout workers exchange: the node-local scratch dir, requests and
responses, ready and diag markers, the registry of live workers, and the sweeps of stale files and orphans.

The scratch dir holds pickles that carry the Tinker key (inside the sampling client), so it is private (0700,
ours, not a symlink) and every file in it is 0600 and written atomically.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import secrets
import signal
import socket
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.errors import ConfigError
from platoon.rollouts.records import process_start_time

if TYPE_CHECKING:
    from platoon.rollouts.one_rollout import MemberOutcome, MemberRequest

__all__ = [
    "PROTOCOL_VERSION",
    "BindingSpec",
    "WorkerPaths",
    "WorkerRequest",
    "WorkerResponse",
    "WorkerSetupError",
    "format_diag",
    "new_request_id",
    "parse_diag",
    "read_response",
    "scratch_dir",
    "sweep_orphans",
    "sweep_stale_files",
    "write_private",
]

log = logging.getLogger(__name__)

#: checked on both the request and the response: a worker of another platoon never answers this trainer
PROTOCOL_VERSION = 2
SCRATCH_BASE_VARIABLES = ("PLATOON_NODE_SCRATCH", "PBS_LOCALDIR", "SLURM_TMPDIR", "TMPDIR")
REGISTRY_DIR = "workers"
SESSIONS_DIR = "sessions"
BINDING_FILE = "model_binding.pkl"
#: files of the scratch dir older than this are removed when a supervisor starts
STALE_SECONDS = 24 * 3600.0
DIAG_LIMIT = 4096


class WorkerSetupError(ConfigError):
    """The rollout workers cannot be set up (exit 78): an unsafe scratch dir, or a binding that cannot be written."""

    def __init__(self, message: str) -> None:
        super().__init__([message])


# --------------------------------------------------------------------------------------------------------------
# The scratch dir


def scratch_base(environ: Mapping[str, str] | None = None) -> Path:
    """The node-local base: `PLATOON_NODE_SCRATCH`, then `PBS_LOCALDIR`, `SLURM_TMPDIR`, `TMPDIR`, else `/tmp`."""
    env = os.environ if environ is None else environ
    for name in SCRATCH_BASE_VARIABLES:
        if env.get(name):
            return Path(env[name])
    return Path("/tmp")


def scratch_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`<base>/platoon-rollout-ipc-<uid>`, created 0700; refused when it is a symlink, not a dir or not ours."""
    uid = os.getuid()
    path = scratch_base(environ) / f"platoon-rollout-ipc-{uid}"
    hint = "remove it or set PLATOON_NODE_SCRATCH to a directory of your own"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise WorkerSetupError(
            f"cannot create the rollout-worker scratch dir {path}: {exc.strerror}; "
            "set PLATOON_NODE_SCRATCH to a writable node-local directory"
        ) from None
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise WorkerSetupError(
            f"the rollout-worker scratch dir {path} is a symlink, which is refused: {hint}"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise WorkerSetupError(f"the rollout-worker scratch dir {path} is not a directory: {hint}")
    if info.st_uid != uid:
        raise WorkerSetupError(
            f"the rollout-worker scratch dir {path} belongs to uid {info.st_uid}, not to you (uid {uid}): {hint}"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)  # ours: make it private again rather than refuse
    (path / REGISTRY_DIR).mkdir(mode=0o700, exist_ok=True)
    (path / SESSIONS_DIR).mkdir(mode=0o700, exist_ok=True)
    return path


def new_session_dir(scratch: Path) -> Path:
    """A private dir for one supervisor's files (requests, responses, the binding, fork-server logs).

    Named `<pid>-<start time>-<hex>` so the stale sweep can tell a live supervisor's dir from a dead one's.
    """
    pid = os.getpid()
    path = scratch / SESSIONS_DIR / f"{pid}-{process_start_time(pid) or 0}-{secrets.token_hex(4)}"
    path.mkdir(mode=0o700)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (a 0600 temporary file in the same dir, then a rename)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _slug(text: str, limit: int = 48) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:limit] or "task"


def new_request_id(task_id: str, rollout_number: int) -> str:
    """`<task slug>-r<n>-<8 hex>`: unique per launch attempt (a retried launch gets a fresh one)."""
    return f"{_slug(task_id)}-r{rollout_number}-{secrets.token_hex(4)}"


# --------------------------------------------------------------------------------------------------------------
# Requests and responses


@dataclass(frozen=True)
class BindingSpec:
    """How a worker builds its policy: the followed binding file, the bootstrap copy, the renderer and sampling.

    The renderer travels as name + kwargs and is rebuilt in the worker (pickling a renderer drops its kwargs).
    """

    path: str
    #: the binding as published when the request was built, so a worker samples before it first reads the file
    bootstrap: bytes
    poll_seconds: float
    model_name: str
    renderer_name: str
    renderer_kwargs: Mapping[str, Any]
    context_window_length: int | None
    sample_timeout_seconds: float
    #: the gateway's sampling defaults (max_tokens, temperature, top_k, top_p, seed)
    sampling_defaults: Mapping[str, Any]
    version: int


@dataclass(frozen=True)
class WorkerPaths:
    response: str
    ready: str
    diag: str
    log: str


@dataclass(frozen=True)
class WorkerRequest:
    """One worker's `<req>.req`: the member request and everything the worker process needs besides."""

    protocol: int
    request_id: str
    member: MemberRequest
    binding: BindingSpec
    paths: WorkerPaths
    startup_budget_seconds: float
    rollout_budget_seconds: float
    rss_soft_limit_bytes: int
    monitor_interval_seconds: float
    environment_packages: tuple[str, ...]
    #: the trainer's sandbox labels plus `platoon.worker=<request id>`
    sandbox_labels: Mapping[str, str]
    trainer_pid: int
    trainer_start_time: int | None
    python_env_isolation: bool = False


@dataclass
class WorkerResponse:
    """A worker's `<req>.res`: the member outcome and what the worker saw while producing it."""

    protocol: int
    request_id: str
    outcome: MemberOutcome
    #: every binding version a sample came from (the outcome's version is the oldest)
    versions_sampled: tuple[int, ...] = ()
    startup_seconds: float = 0.0
    peak_rss_bytes: int = 0
    #: `rollout_worker.telemetry` hook counters
    counters: dict[str, float] = field(default_factory=dict)
    #: short facts for the trainer's warnings: `response_patch`, `telemetry`
    notes: dict[str, str] = field(default_factory=dict)


def read_response(path: Path, request_id: str) -> WorkerResponse | None:
    """The response at `path` when it is readable, of this protocol and of this request; else None."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        response = pickle.loads(data)
    except Exception as exc:  # a torn or foreign file is no response
        log.warning("the response %s is unreadable: %s: %s", path.name, type(exc).__name__, exc)
        return None
    if not isinstance(response, WorkerResponse):
        return None
    if response.protocol != PROTOCOL_VERSION:
        log.warning(
            "the response %s speaks worker protocol %s, not %s",
            path.name,
            response.protocol,
            PROTOCOL_VERSION,
        )
        return None
    return response if response.request_id == request_id else None


# --------------------------------------------------------------------------------------------------------------
# Diagnostic markers: tab-separated key=value, at most 4096 bytes


def _clean(value: Any) -> str:
    return re.sub(r"[\t\r\n=]", " ", str(value))[:256]


def format_diag(fields: Mapping[str, Any]) -> bytes:
    """`key=value` pairs joined by tabs, newline-terminated; fields that would pass 4096 bytes are left out."""
    out = b""
    for key, value in fields.items():
        item = f"{_clean(key)}={_clean(value)}".encode("utf-8", "replace")
        if len(out) + len(item) + 2 > DIAG_LIMIT:
            break
        out = out + b"\t" + item if out else item
    return out + b"\n"


def parse_diag(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in text.strip().split("\t"):
        key, sep, value = part.partition("=")
        if sep:
            fields[key] = value
    return fields


def read_diag(path: Path) -> dict[str, str]:
    try:
        return parse_diag(path.read_text(encoding="utf-8", errors="replace")[:DIAG_LIMIT])
    except OSError:
        return {}


# --------------------------------------------------------------------------------------------------------------
# Processes: identity by pid + start time, group signals


def start_time_of(pid: int) -> int | None:
    return process_start_time(pid)


def is_same_process(pid: int | None, start_time: int | None) -> bool:
    """Whether `pid` still names the process that had `start_time` (alive or a zombie not yet reaped)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    now = start_time_of(pid)
    return now is not None and (start_time is None or now == start_time)


def is_running(pid: int | None, start_time: int | None) -> bool:
    """`is_same_process` and not a zombie."""
    if not is_same_process(pid, start_time):
        return False
    try:
        state = (
            Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace").rsplit(")", 1)[-1].split()
        )
    except OSError:
        return False
    return bool(state) and state[0] not in ("Z", "X")


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the process group `pgid`; False when it has no members left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, pgid, sid) of every process this user can see."""
    table: dict[int, tuple[int, int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text(encoding="utf-8", errors="replace").rsplit(")", 1)[-1]
        except OSError:
            continue
        parts = fields.split()
        with contextlib.suppress(IndexError, ValueError):
            table[int(entry.name)] = (int(parts[1]), int(parts[2]), int(parts[3]))
    return table


def descendants(root: int) -> list[tuple[int, int]]:
    """(pid, pgid) of every live descendant of `root`, found through parent links."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _pgid, _sid) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: list[tuple[int, int]] = []
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        found.append((pid, table[pid][1]))
        stack.extend(children.get(pid, ()))
    return found


def group_members(pgid: int) -> list[int]:
    return [pid for pid, (_ppid, group, _sid) in _proc_table().items() if group == pgid]


# --------------------------------------------------------------------------------------------------------------
# The registry of live workers and fork servers


@dataclass(frozen=True)
class RegistryRecord:
    """One live process a supervisor started: a worker or a fork server, and the trainer it belongs to."""

    kind: str
    pid: int
    pgid: int
    start_time: int | None
    trainer_pid: int
    trainer_start_time: int | None
    request_id: str
    host: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RegistryRecord | None:
        try:
            return cls(
                kind=str(data["kind"]),
                pid=int(data["pid"]),
                pgid=int(data["pgid"]),
                start_time=None if data.get("start_time") is None else int(data["start_time"]),
                trainer_pid=int(data["trainer_pid"]),
                trainer_start_time=None
                if data.get("trainer_start_time") is None
                else int(data["trainer_start_time"]),
                request_id=str(data.get("request_id", "")),
                host=str(data.get("host", "")),
            )
        except (KeyError, TypeError, ValueError):
            return None


def register(scratch: Path, record: RegistryRecord) -> Path:
    path = scratch / REGISTRY_DIR / f"{record.kind}-{record.pid}-{record.request_id}.json"
    write_private(path, json.dumps(record.to_json()).encode())
    return path


def unregister(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def _records(scratch: Path) -> Iterable[tuple[Path, RegistryRecord | None]]:
    try:
        entries = list((scratch / REGISTRY_DIR).glob("*.json"))
    except OSError:
        return []
    found = []
    for path in entries:
        try:
            record = RegistryRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            record = None
        found.append((path, record))
    return found


def sweep_orphans(
    scratch: Path | None = None, *, grace_seconds: float = 10.0, environ: Mapping[str, str] | None = None
) -> int:
    """Stop the registered workers (and fork servers) whose trainer is gone: SIGTERM their group, wait
    `grace_seconds`, SIGKILL what is left. Returns how many were still running.

    A trainer or worker is named by pid + start time, so a reused pid is never taken for it. Records of this
    host's processes that are gone are removed; records of other hosts (a shared scratch base) are left alone.
    """
    where = scratch if scratch is not None else scratch_dir(environ)
    host = socket.gethostname()
    orphans: list[tuple[Path, RegistryRecord]] = []
    for path, record in _records(where):
        if record is None:
            unregister(path)
            continue
        if record.host and record.host != host:
            continue
        if is_running(record.trainer_pid, record.trainer_start_time):
            continue
        if is_running(record.pid, record.start_time):
            orphans.append((path, record))
            continue
        # The worker itself is gone; members of its group may still run.
        if is_same_process(record.pid, record.start_time):
            signal_group(record.pgid, signal.SIGKILL)  # an unreaped zombie still holds the group id
        else:
            for pid in group_members(record.pgid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        unregister(path)
    if not orphans:
        return 0
    for _path, record in orphans:
        log.warning(
            "stopping an orphaned rollout %s (pid %d) of trainer pid %d, which is gone",
            record.kind,
            record.pid,
            record.trainer_pid,
        )
        signal_group(record.pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(is_running(r.pid, r.start_time) for _p, r in orphans):
        time.sleep(0.05)
    for path, record in orphans:
        if is_same_process(record.pid, record.start_time):
            signal_group(record.pgid, signal.SIGKILL)
        unregister(path)
    return len(orphans)


def _session_alive(name: str) -> bool:
    pid, _, rest = name.partition("-")
    start, _, _token = rest.partition("-")
    try:
        return is_running(int(pid), int(start) or None)
    except ValueError:
        return False


def sweep_stale_files(scratch: Path, *, max_age_seconds: float = STALE_SECONDS) -> int:
    """Remove files older than 24 h (and the dirs of supervisors that are gone); returns how many went.

    The registry is the orphan sweep's, and a live supervisor's dir is kept whatever the age of its files.
    """
    removed = 0
    cutoff = time.time() - max_age_seconds
    sessions = scratch / SESSIONS_DIR
    with contextlib.suppress(OSError):
        for session in sessions.iterdir():
            if session.is_symlink() or not session.is_dir():
                continue
            if _session_alive(session.name):
                continue
            for path in list(session.iterdir()):
                with contextlib.suppress(OSError):
                    if path.lstat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
            with contextlib.suppress(OSError):
                if session.lstat().st_mtime < cutoff or not any(session.iterdir()):
                    session.rmdir()
    with contextlib.suppress(OSError):
        for path in scratch.iterdir():
            if path.name in (REGISTRY_DIR, SESSIONS_DIR):
                continue
            with contextlib.suppress(OSError):
                if not path.is_dir() and path.lstat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
    return removed
