"""A training run directory's record files: the resolved config
snapshot, `lock.json`, `identity.json`, `process.json`, and the JSONL conventions every `*.jsonl` of a run follows.

Everything here is refused or computed before anything is written, and every rewrite is an atomic replacement.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import errno
import json
import logging
import os
import platform
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

import platoon
from platoon import plugins
from platoon._version import running_version
from platoon.config.site import default_cache_root
from platoon.errors import ConfigError, PlatoonError

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig

__all__ = [
    "IDENTITY_FILE",
    "LOCK_FILE",
    "NO_SPACE_ERRNOS",
    "PROCESS_FILE",
    "RESOLVED_CONFIG_FILE",
    "IdentityRecord",
    "ProcessRecord",
    "RunDirInUse",
    "RunDirWriteError",
    "append_jsonl",
    "append_jsonl_rows",
    "build_lock",
    "check_identity",
    "check_name_collision",
    "check_run_dir_free",
    "hold_run_dir",
    "parse_row",
    "process_start_time",
    "read_identity",
    "read_json",
    "read_jsonl",
    "read_lock",
    "read_process",
    "refuse_resume",
    "repair_jsonl",
    "replace_jsonl_rows",
    "run_dir_of",
    "settle_identity",
    "snapshot_data",
    "update_lock",
    "update_process",
    "writable_dir_problem",
    "write_bytes_atomic",
    "write_identity",
    "write_json_atomic",
    "write_lock",
    "write_resolved_config",
]

log = logging.getLogger(__name__)

RESOLVED_CONFIG_FILE = "config.resolved.yaml"
LOCK_FILE = "lock.json"
IDENTITY_FILE = "identity.json"
PROCESS_FILE = "process.json"
IMAGE_PULLS_VAR = "PLATOON_IMAGE_PULLS"
DEFAULT_HARBOR_PROVIDER = "docker"
#: distributions whose versions the lock records, keyed as `versions` names them
LOCKED_DISTRIBUTIONS: dict[str, str] = {
    "tinker": "tinker",
    "tinker_cookbook": "tinker-cookbook",
    "openreward": "openreward",
    "hpc_sandbox": "hpc-sandbox",
}
IMAGE_PULL_KEYS = ("reference", "path", "sha256", "manifest_digest")
_SHOWN_TASKS = 5

# One lock for every read-modify-write of a run's files in this process (lock.json, JSONL appends): the trainer's
# threads (pruning, evaluation) append and update concurrently.
_io_lock = threading.RLock()


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------------------------
# JSON files and JSONL
# ---------------------------------------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


#: the errors of a full disk or an exhausted quota
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class RunDirWriteError(PlatoonError, OSError):
    """A run's record could not be written (a full disk, a read-only remount): one line, exit 1.

    Also an OSError carrying the cause's errno, so code that tolerates a failed write (a viewer's copy) still does.
    """

    def __init__(self, path: str | os.PathLike[str], cause: OSError) -> None:
        if cause.errno in NO_SPACE_ERRNOS:
            why, fix = "no space left on its disk", "free space there"
        elif cause.errno == errno.EROFS:
            why, fix = "its file system is read-only", "make it writable"
        else:
            why, fix = (cause.strerror or str(cause)).lower(), "fix that"
        self.message = (
            f"could not write {path}: {why}; {fix} and run the same command again (a training run resumes from its "
            "last checkpoint)"
        )
        super().__init__(self.message)
        self.errno = cause.errno
        self.filename = os.fspath(path)

    def __str__(self) -> str:
        return self.message  # not OSError's "[Errno n] ..." rendering: this is the line the user reads


def writable_dir_problem(target: str | os.PathLike[str], *, key: str) -> str | None:
    """Why a run could not create and write `target` (the directory it writes its records under), as one line
    naming `key`; None when it can. Writes nothing that stays: the probe is an unnamed temporary file."""
    import tempfile

    wanted = Path(os.path.abspath(os.path.expanduser(target)))
    existing = wanted
    try:
        while not os.path.lexists(existing) and existing != existing.parent:
            existing = existing.parent
        is_dir = existing.is_dir()
    except OSError as exc:
        return f"{key}: {existing} cannot be looked at ({(exc.strerror or str(exc)).lower()}); set {key} elsewhere"
    if not is_dir:
        what = "a broken symbolic link" if existing.is_symlink() and not existing.exists() else "a file"
        where = "" if existing == wanted else f", so {wanted} cannot be created"
        return f"{key}: {existing} is {what}, not a directory{where}; set {key} to a directory"
    try:
        with tempfile.TemporaryFile(dir=existing) as probe:
            probe.write(b"\n")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        if exc.errno == errno.EROFS:
            why = "is on a read-only file system"
        elif exc.errno in (errno.EACCES, errno.EPERM):
            why = "is not writable by this user"
        elif exc.errno in NO_SPACE_ERRNOS:
            why = "is on a disk with no space left"
        else:
            why = f"cannot be written ({(exc.strerror or str(exc)).lower()})"
        return f"{key}: {existing} {why}; set {key} to a writable directory"
    return None


def write_json_atomic(path: Path, data: Any) -> None:
    """Indented, newline-terminated JSON, replaced atomically through `.<name>.partial` beside it (fsynced first,
    so a crash leaves the old file or the new one). A failed write removes the partial file and raises
    RunDirWriteError."""
    text = json.dumps(data, indent=2, ensure_ascii=False, default=_json_default) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, content: bytes) -> None:
    """Replace `path` with `content` through `.<name>.partial` beside it, fsynced first: a crash leaves the old
    file or the new one. A failed write removes the partial file and raises RunDirWriteError."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise RunDirWriteError(path, exc) from None


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing, unreadable or not an object (records are advisory)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The object lines of a JSONL file; unparsable and non-object lines (a cut-off last line) are skipped, and so
    is a file that cannot be read (records are advisory)."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return []
    rows = (parse_row(line) for line in raw.split(b"\n") if line.strip())
    return [row for row in rows if row is not None]


def parse_row(line: bytes) -> dict[str, Any] | None:
    """One JSONL line as an object, or None when it is not one (cut off, not JSON, not an object)."""
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def torn_path(path: str | os.PathLike[str]) -> Path:
    """Where a JSONL file's cut-off last line is moved: `<name>.torn` beside it."""
    target = Path(path)
    return target.with_name(f"{target.name}.torn")


def _line_start(fd: int, size: int) -> int:
    """The offset just after the file's last newline (0 when it has none): where a cut-off last line begins."""
    end = size
    while end > 0:
        begin = max(0, end - 65536)
        chunk = os.pread(fd, end - begin, begin)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return begin + newline + 1
        end = begin
    return 0


def _settle_tail(fd: int, path: Path) -> int:
    """Make the file end at a whole line; returns its size after. A last line without its newline that holds a
    whole row is terminated; one that does not (a writer died mid-line) is cut off and moved to `<name>.torn`,
    with a one-line warning, so the file stays parsable line by line."""
    size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
        return size
    start = _line_start(fd, size)
    tail = os.pread(fd, size - start, start)
    if parse_row(tail) is not None:
        _write_all(fd, b"\n")
        return size + 1
    kept = "kept"
    try:
        with open(torn_path(path), "ab") as aside:
            aside.write(tail + b"\n")
    except OSError:
        kept = "not kept (it could not be written)"
    os.ftruncate(fd, start)
    print(
        f"platoon: {path} ended in a cut-off row ({len(tail)} bytes, from a write that never finished); cut it off "
        f"so the file parses, {kept} in {torn_path(path).name}",
        file=sys.stderr,
        flush=True,
    )
    return start


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def repair_jsonl(path: str | os.PathLike[str]) -> None:
    """Cut a cut-off last line off a JSONL file (see `append_jsonl`); nothing when the file is whole or missing."""
    target = Path(path)
    with _io_lock:
        try:
            fd = os.open(target, os.O_RDWR)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise RunDirWriteError(target, exc) from None
        try:
            _settle_tail(fd, target)
        except OSError as exc:
            raise RunDirWriteError(target, exc) from None
        finally:
            os.close(fd)


def append_jsonl(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Append one JSON line, whole or not at all (see `append_jsonl_rows`)."""
    append_jsonl_rows(path, [record])


def append_jsonl_rows(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> None:
    """Append JSON lines in one write, whole or not at all, and fsync them.

    A cut-off last line a dead writer left is cut off first (moved to `<name>.torn`, with a warning), so the file
    parses line by line; a write that fails (a full disk) is rolled back to the file's previous end and raises
    RunDirWriteError (one line, exit 1).
    """
    target = Path(path)
    lines = b"".join(
        json.dumps(dict(record), ensure_ascii=False, default=_json_default).encode("utf-8") + b"\n"
        for record in records
    )
    with _io_lock:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise RunDirWriteError(target, exc) from None
        size = None
        try:
            size = _settle_tail(fd, target)
            _write_all(fd, lines)
            os.fsync(fd)
        except OSError as exc:
            if size is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)  # no half line stays behind
            raise RunDirWriteError(target, exc) from None
        finally:
            os.close(fd)


def replace_jsonl_rows(
    path: str | os.PathLike[str], head: bytes, records: Iterable[Mapping[str, Any]]
) -> None:
    """Replace a JSONL file atomically with `head` (whole lines, as read) followed by `records`."""
    lines = b"".join(
        json.dumps(dict(record), ensure_ascii=False, default=_json_default).encode("utf-8") + b"\n"
        for record in records
    )
    with _io_lock:
        write_bytes_atomic(Path(path), head + lines)


# ---------------------------------------------------------------------------------------------------------------
# The run directory and config.resolved.yaml
# ---------------------------------------------------------------------------------------------------------------


def _absolute(value: str, cwd: Path) -> str:
    path = Path(os.path.expanduser(value))
    return os.path.normpath(path if path.is_absolute() else cwd / path)


def run_dir_of(data: Mapping[str, Any], *, cwd: str | os.PathLike[str] | None = None) -> Path:
    """`log_path/<stats.experiment_name>/<stats.trial_name>`, absolute (from a resolved config's data)."""
    workdir = Path(os.path.abspath(cwd if cwd is not None else os.getcwd()))
    stats = data.get("stats") or {}
    return (
        Path(_absolute(str(data["log_path"]), workdir))
        / str(stats.get("experiment_name") or "platoon_tinker")
        / str(stats.get("trial_name") or "run")
    )


def snapshot_data(loaded: LoadedConfig, *, cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The data `config.resolved.yaml` holds: outputs made absolute and the default Harbor provider written out.

    Inputs are already absolute after loading; outputs stay cwd-relative until here, so the
    snapshot loads the same from any directory.
    """
    workdir = Path(os.path.abspath(cwd if cwd is not None else os.getcwd()))
    data = copy.deepcopy(loaded.data)
    if isinstance(data.get("log_path"), str) and data["log_path"]:
        data["log_path"] = _absolute(data["log_path"], workdir)
    for holder in (data, data.get("inference")):
        if isinstance(holder, dict) and isinstance(holder.get("output_dir"), str) and holder["output_dir"]:
            holder["output_dir"] = _absolute(holder["output_dir"], workdir)
    for entry in data.get("environments") or []:
        if not isinstance(entry, dict) or entry.get("service") != "harbor":
            continue
        kwargs = entry.get("service_kwargs")
        if kwargs is None:
            kwargs = entry["service_kwargs"] = {}
        if isinstance(kwargs, dict) and kwargs.get("provider") is None:
            kwargs["provider"] = DEFAULT_HARBOR_PROVIDER
    return data


def _comment(text: str) -> str:
    # A newline inside an override or path would end the comment and corrupt the YAML below it.
    return text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")


def write_resolved_config(
    run_dir: str | os.PathLike[str], loaded: LoadedConfig, *, cwd: str | os.PathLike[str] | None = None
) -> Path:
    """Write `config.resolved.yaml` atomically; returns its path."""
    target = Path(run_dir) / RESOLVED_CONFIG_FILE
    header = [f"# Written by platoon {running_version()} at {_now()}: the resolved config of this run"]
    header += [f"# source: {_comment(str(Path(source).absolute()))}" for source in loaded.sources]
    header += [f"# override: {_comment(text)}" for text in loaded.overrides]
    if loaded.site is not None and loaded.site_gave:
        header.append(f"# site profile: {_comment(str(loaded.site.path))} (sha256 {loaded.site.sha256})")
        header += [f"# from the site profile: {_comment(key)}" for key in loaded.site_gave]
    body = yaml.safe_dump(
        snapshot_data(loaded, cwd=cwd), sort_keys=False, allow_unicode=True, default_flow_style=False
    )
    write_bytes_atomic(target, ("\n".join(header) + "\n" + body).encode("utf-8"))
    return target


# ---------------------------------------------------------------------------------------------------------------
# lock.json
# ---------------------------------------------------------------------------------------------------------------


def _distribution(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def _direct_url(dist: metadata.Distribution) -> dict[str, Any] | None:
    """PEP 610 `direct_url.json` of an installed distribution (how it was installed, a vcs commit), if any."""
    try:
        text = dist.read_text("direct_url.json")
        data = json.loads(text) if text else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _vcs_commit(dist: metadata.Distribution | None) -> str | None:
    info = (_direct_url(dist) or {}).get("vcs_info") if dist is not None else None
    commit = info.get("commit_id") if isinstance(info, dict) else None
    return commit if isinstance(commit, str) else None


def _git(args: Sequence[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _platoon_git() -> tuple[str | None, bool | None]:
    """(HEAD, dirty) when platoon runs from its own git checkout (the workspace root holds `packages/`)."""
    root = Path(platoon.__file__).resolve().parents[4]
    if not (root / ".git").exists() or not (root / "packages" / "platoon-core").is_dir():
        return None, None
    sha = _git(["rev-parse", "HEAD"], root)
    if sha is None:
        return None, None
    status = _git(["status", "--porcelain", "--untracked-files=no"], root)
    return sha.strip(), (bool(status.strip()) if status is not None else None)


def _image_pulls(environ: Mapping[str, str]) -> list[dict[str, Any]] | None:
    """The records `$PLATOON_IMAGE_PULLS` names; unlike run records, this file must be whole (exit 78)."""
    named = environ.get(IMAGE_PULLS_VAR, "")
    if not named:
        return None
    try:
        text = Path(os.path.expanduser(named)).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"${IMAGE_PULLS_VAR} names {named}, which cannot be read ({type(exc).__name__})"
        ) from None
    records: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        if not isinstance(value, dict) or any(not isinstance(value.get(k), str) for k in IMAGE_PULL_KEYS):
            raise ConfigError(
                f"${IMAGE_PULLS_VAR}: {named} line {number} is not a JSON object with string "
                + ", ".join(IMAGE_PULL_KEYS)
            )
        records.append({key: value[key] for key in IMAGE_PULL_KEYS})
    if not records:
        raise ConfigError(f"${IMAGE_PULLS_VAR} names {named}, which holds no image pulls")
    return records


def _extensions() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for info in plugins.entry_points():
        if info.distribution is None or info.distribution in out:
            continue
        dist = _distribution(info.distribution)
        out[info.distribution] = {
            "version": info.distribution_version,
            "requires": list(info.requires),
            "direct_url": _direct_url(dist) if dist is not None else None,
        }
    return out


def _site_record(loaded: LoadedConfig) -> dict[str, Any]:
    profile = loaded.site
    record: dict[str, Any] = {
        "path": str(profile.path) if profile is not None else None,
        "sha256": profile.sha256 if profile is not None else None,
    }
    if profile is not None:
        record.update(profile.values)
    from_site = profile is not None and profile.cache is not None
    record["cache_root"] = str(profile.cache_root if profile is not None else default_cache_root())
    record["cache_root_source"] = "site" if from_site else "default"
    record["gave"] = dict(loaded.site_gave)
    if loaded.named_after is not None:
        record["named_after"] = loaded.named_after
    return record


def build_lock(
    loaded: LoadedConfig,
    components: Sequence[Mapping[str, Any]],
    *,
    sandbox_providers: Sequence[Mapping[str, Any]] = (),
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The `lock.json` at record time (versions, components, the policy), computed without writing (so its
    refusals come first).

    `components` are the resolved component records (`{kind, ref, resolved, source, distribution, ...}`) and
    `sandbox_providers` the per-environment provider records; both are the resolver's, copied as given.
    A bad `$PLATOON_IMAGE_PULLS` raises ConfigError.
    """
    env = os.environ if environ is None else environ
    image_pulls = _image_pulls(env)
    versions: dict[str, str | None] = {"platoon": running_version()}
    commits: dict[str, str] = {}
    for key, name in LOCKED_DISTRIBUTIONS.items():
        dist = _distribution(name)
        versions[key] = dist.version if dist is not None else None
        commit = _vcs_commit(dist)
        if commit is not None:
            commits[key] = commit
    commit = _vcs_commit(_distribution("platoon-core"))
    if commit is not None:
        commits["platoon"] = commit
    git_sha, git_dirty = _platoon_git()
    lock: dict[str, Any] = {
        "versions": versions,
        "commits": commits,
        "platoon_git_sha": git_sha,
        "platoon_git_dirty": git_dirty,
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "started_at": _now(),
        "argv": list(sys.argv if argv is None else argv),
        "deprecations": [
            {"path": d.path, "replacement": d.key.replacement, "removed_in": d.key.removed_in}
            for d in loaded.deprecations
        ],
    }
    if image_pulls is not None:
        lock["image_pulls"] = image_pulls
    lock["components"] = [dict(component) for component in components]
    lock["extensions"] = _extensions()
    lock["site"] = _site_record(loaded)
    lock["sandbox_providers"] = [dict(record) for record in sandbox_providers]
    return lock


def write_lock(
    run_dir: str | os.PathLike[str],
    loaded: LoadedConfig,
    components: Sequence[Mapping[str, Any]],
    *,
    sandbox_providers: Sequence[Mapping[str, Any]] = (),
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    lock: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write `lock.json` (a fresh record; `lock` = one `build_lock` already made); returns what was written."""
    data = (
        dict(lock)
        if lock is not None
        else build_lock(loaded, components, sandbox_providers=sandbox_providers, argv=argv, environ=environ)
    )
    with _io_lock:
        write_json_atomic(Path(run_dir) / LOCK_FILE, data)
    return data


def read_lock(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    return read_json(Path(run_dir) / LOCK_FILE)


def update_lock(run_dir: str | os.PathLike[str], **fields: Any) -> dict[str, Any]:
    """Set top-level `lock.json` fields (`tool_call_parsing`, `excluded_tasks`, ...) by atomic replacement."""
    target = Path(run_dir) / LOCK_FILE
    with _io_lock:
        data = read_json(target) or {}
        data.update(fields)
        write_json_atomic(target, data)
    return data


def tool_call_parsing_record(model_name: str, renderer_name: str, renderer: Any) -> dict[str, Any]:
    """`lock.json.tool_call_parsing`: the chat-template renderer's parser choice (or why it failed),
    else the named renderer parsing its own format."""
    record = getattr(renderer, "tool_call_parsing", None)
    if callable(record):
        try:
            return dict(record())
        except Exception as exc:  # the choice failed: the lock says why ("or error")
            return {
                "model_name": model_name,
                "renderer_name": renderer_name,
                "error": f"{type(exc).__name__}: {exc}",
            }
    return {
        "model_name": model_name,
        "renderer_name": renderer_name,
        "setting": "renderer",
        "parser": renderer_name,
    }


def check_name_collision(run_dir: str | os.PathLike[str], loaded: LoadedConfig) -> str | None:
    """The refusal when the profile named this run dir after the config's stem and the
    existing `lock.json` says the dir belongs to another config file of that stem; None when it may proceed."""
    if loaded.named_after is None:
        return None
    previous = ((read_lock(run_dir) or {}).get("site") or {}).get("named_after")
    if not isinstance(previous, str) or previous == loaded.named_after:
        return None
    return (
        f"{run_dir} belongs to {previous}: the site profile names runs after their config file's stem, and "
        f"{loaded.named_after} has the same stem; set stats.experiment_name (or stats.trial_name) to tell them apart"
    )


# ---------------------------------------------------------------------------------------------------------------
# identity.json
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class IdentityRecord:
    """What a run may never change on resume: its model, renderer and, per entry label, its hold-out record."""

    model: str
    renderer: str
    environments: dict[str, dict[str, Any]] = field(default_factory=dict)
    written_at: str = field(default_factory=_now)
    version: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "model": self.model,
            "renderer": self.renderer,
            "environments": self.environments,
            "written_at": self.written_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IdentityRecord:
        environments = data.get("environments")
        return cls(
            model=str(data.get("model", "")),
            renderer=str(data.get("renderer", "")),
            environments=dict(environments) if isinstance(environments, dict) else {},
            written_at=str(data.get("written_at", "")),
            version=int(data.get("version", 1)),
        )


def read_identity(run_dir: str | os.PathLike[str]) -> IdentityRecord | None:
    data = read_json(Path(run_dir) / IDENTITY_FILE)
    return IdentityRecord.from_json(data) if data is not None else None


def write_identity(
    run_dir: str | os.PathLike[str],
    model: str,
    renderer: str,
    held_out: Mapping[str, Mapping[str, Any]] | None = None,
) -> IdentityRecord:
    record = IdentityRecord(
        model=model, renderer=renderer, environments={k: dict(v) for k, v in (held_out or {}).items()}
    )
    write_json_atomic(Path(run_dir) / IDENTITY_FILE, record.to_json())
    return record


def _ids(record: Mapping[str, Any] | None, key: str) -> set[str]:
    values = (record or {}).get(key)
    return {str(v) for v in values} if isinstance(values, (list, tuple, set, frozenset)) else set()


def _some(ids: Iterable[str]) -> str:
    ordered = sorted(ids)
    shown = ", ".join(ordered[:_SHOWN_TASKS])
    return shown + (f", ... ({len(ordered)} in all)" if len(ordered) > _SHOWN_TASKS else "")


_KEEP = "a resume keeps the run's hold-out; start a new run (another stats.trial_name) to change it"


def check_identity(
    run_dir: str | os.PathLike[str],
    model: str,
    renderer: str,
    held_out: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    training: Mapping[str, Iterable[str]] | None = None,
) -> list[str]:
    """Why a resume of `run_dir` must be refused; [] when it may go on.

    `held_out`: entry label -> the service's split record (`held_out`, `eval`, ...) for entries with a hold-out.
    `training`: entry label -> the task ids training draws from now. Without it, a task that was held out and no
    longer is counts as training (the safe reading); with it, one that left the selection is only logged, as are
    changes to the evaluated tasks (refusals moving tasks in or out of evaluation).
    """
    now = {label: dict(record) for label, record in (held_out or {}).items()}
    identity = read_identity(run_dir)
    if identity is None:
        if now:
            labels = ", ".join(f"environments[{label}]" for label in sorted(now))
            return [f"{IDENTITY_FILE} is missing and this start holds tasks out ({labels}): {_KEEP}"]
        return []
    problems: list[str] = []
    if identity.model != model:
        problems.append(
            f"train.model_name: this run trained {identity.model} and this start names {model}: a resume keeps "
            "its model; start a new run (another stats.trial_name) to change it"
        )
    if identity.renderer != renderer:
        problems.append(
            f"train.renderer_name: this run used {identity.renderer} and this start names {renderer}: a resume "
            "keeps its renderer; start a new run (another stats.trial_name) to change it"
        )
    for label in sorted(set(identity.environments) | set(now)):
        before, after = identity.environments.get(label), now.get(label)
        old, new = _ids(before, "held_out"), _ids(after, "held_out")
        if before is None:
            problems.append(f"environments[{label}]: a hold-out was added to a run that had none: {_KEEP}")
            continue
        released = old - new
        trains: set[str] = set(released)
        if training is not None:
            drawn = {str(t) for t in training.get(label, ())}
            trains = released & drawn
            if released - drawn:
                log.info(
                    "environments[%s]: %d held-out tasks left the selection: %s",
                    label,
                    len(released - drawn),
                    _some(released - drawn),
                )
        elif after is not None and "train" in after:
            trains = released & _ids(after, "train")
        if trains:
            problems.append(
                f"environments[{label}]: {len(trains)} task(s) the run held out would now train "
                f"({_some(trains)}): {_KEEP}"
            )
        if after is not None and new - old:
            problems.append(
                f"environments[{label}]: {len(new - old)} task(s) are newly held out ({_some(new - old)}): {_KEEP}"
            )
        if after is not None and _ids(before, "eval") != _ids(after, "eval"):
            log.info("environments[%s]: the evaluated held-out tasks changed (refusals moved tasks)", label)
    return problems


def refuse_resume(run_dir: str | os.PathLike[str], problems: Sequence[str]) -> ConfigError:
    """Record `resume_refused {identity, problems}` in the lock and return the exit-78 error to raise."""
    identity = read_json(Path(run_dir) / IDENTITY_FILE)
    update_lock(run_dir, resume_refused={"identity": identity, "problems": list(problems)})
    return ConfigError(list(problems), source=f"{Path(run_dir) / IDENTITY_FILE} (a resume may not change it)")


def settle_identity(
    run_dir: str | os.PathLike[str],
    model: str,
    renderer: str,
    held_out: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    resuming: bool,
    training: Mapping[str, Iterable[str]] | None = None,
) -> IdentityRecord | None:
    """Write identity on a fresh start; on resume check it (raising the refusal) and write it when the run had
    none and has no hold-out. Returns the record in force (None only when a resume found one and kept it)."""
    if not resuming:
        return write_identity(run_dir, model, renderer, held_out)
    problems = check_identity(run_dir, model, renderer, held_out, training=training)
    if problems:
        raise refuse_resume(run_dir, problems)
    existing = read_identity(run_dir)
    if existing is None:
        return write_identity(run_dir, model, renderer, held_out)
    return existing


# ---------------------------------------------------------------------------------------------------------------
# process.json
# ---------------------------------------------------------------------------------------------------------------


class RunDirInUse(ConfigError):
    """A live process on this host holds the run directory (exit 78, one line)."""

    def __init__(self, message: str) -> None:
        super().__init__([message])


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22); None if unknown.

    With the pid it names one process for good: a reused pid has another start time.
    """
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; the fields after its last ")" are plain.
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _alive(pid: Any, start_time: Any) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return False
    try:
        state = (
            Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace").rsplit(")", 1)[-1].split()
        )
        if state and state[0] in ("Z", "X"):
            return False  # exited, waiting to be reaped
    except OSError:
        pass
    if isinstance(start_time, int) and not isinstance(start_time, bool):
        now = process_start_time(pid)
        if now is not None and now != start_time:
            return False  # the pid was reused by another process
    return True


@dataclass
class ProcessRecord:
    """`process.json`: who holds a run dir (the `platoon train` process and, when supervised, its trainer)."""

    command: list[str]
    host: str
    pid: int
    start_time: int | None
    label: str = "train"
    trainer_pid: int | None = None
    trainer_start_time: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessRecord:
        command = data.get("command")

        def number(key: str) -> int | None:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return cls(
            command=[str(c) for c in command] if isinstance(command, list) else [str(command or "")],
            host=str(data.get("host", "")),
            pid=number("pid") or 0,
            start_time=number("start_time"),
            label=str(data.get("label", "")),
            trainer_pid=number("trainer_pid"),
            trainer_start_time=number("trainer_start_time"),
        )

    @classmethod
    def current(cls, *, label: str = "train", command: Sequence[str] | None = None) -> ProcessRecord:
        pid = os.getpid()
        return cls(
            command=list(sys.argv if command is None else command),
            host=socket.gethostname(),
            pid=pid,
            start_time=process_start_time(pid),
            label=label,
        )

    def live_pids(self) -> list[int]:
        """The recorded processes still running, when the record is from this host (else [])."""
        if self.host != socket.gethostname():
            return []
        pairs = [(self.pid, self.start_time), (self.trainer_pid, self.trainer_start_time)]
        return [pid for pid, start in pairs if pid is not None and _alive(pid, start)]


def read_process(run_dir: str | os.PathLike[str]) -> ProcessRecord | None:
    data = read_json(Path(run_dir) / PROCESS_FILE)
    return ProcessRecord.from_json(data) if data is not None else None


def check_run_dir_free(run_dir: str | os.PathLike[str]) -> None:
    """Raise RunDirInUse when `process.json` names a live process on this host other than this one.

    Writes nothing, so it can run before anything is prepared or written.
    """
    record = read_process(run_dir)
    if record is None:
        return
    # This process, and its parent when that is the supervisor whose child start this is.
    mine = {os.getpid(), os.getppid()}
    live = [pid for pid in record.live_pids() if pid not in mine]
    if not live:
        return
    which = f"pid {record.pid}" if record.pid in live else f"trainer pid {record.trainer_pid}"
    raise RunDirInUse(
        f"{run_dir} is in use: {PROCESS_FILE} names {which} ({record.label or 'a run'}) running on this host; "
        "stop that run, or set stats.trial_name to start another"
    )


@contextlib.contextmanager
def _dir_lock(run_dir: Path) -> Iterator[None]:
    # Two starts checking at the same moment would both find the dir free: check-and-write under a file lock.
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / f".{PROCESS_FILE}.lock", "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def hold_run_dir(
    run_dir: str | os.PathLike[str], *, label: str = "train", command: Sequence[str] | None = None
) -> ProcessRecord:
    """Refuse a run dir a live process holds (RunDirInUse, before writing anything), else record this process."""
    target = Path(run_dir)
    check_run_dir_free(target)
    record = ProcessRecord.current(label=label, command=command)
    with _dir_lock(target):
        check_run_dir_free(target)
        write_json_atomic(target / PROCESS_FILE, record.to_json())
    return record


def update_process(run_dir: str | os.PathLike[str], **fields: Any) -> ProcessRecord:
    """Replace fields of `process.json` atomically (e.g. `trainer_pid`, `trainer_start_time` per supervised start)."""
    target = Path(run_dir)
    with _io_lock, _dir_lock(target):
        data = read_json(target / PROCESS_FILE) or ProcessRecord.current().to_json()
        data.update(fields)
        write_json_atomic(target / PROCESS_FILE, data)
    return ProcessRecord.from_json(data)
