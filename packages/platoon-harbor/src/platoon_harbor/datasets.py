"""Harbor datasets: naming, task ids, fetch into the site cache, the lock, and verification.

A dataset is named by `service_kwargs.dataset`: `hf://org/name@<40-hex commit>[#subdir]` (also
`hf://datasets/org/name@...`) or a local directory. `fetch` copies its tasks into `<cache>/tasks/<content hash>/`
and writes a lock (version 1) that pins every task by its Harbor content hash; runs read the lock and never fetch.

API for the `harbor` service and `platoon prepare`:

- `FetchSettings.from_kwargs(service_kwargs, base_dir=..., cache=...)`: the entry's fetch settings, with the inputs
  digest (`inputs_digest()`) and the default lock path (`lock_path`).
- `fetch(settings, update=False, repair=False) -> FetchResult`: fetch and lock (a pinned HF dataset whose lock is
  current does nothing and sends no request).
- `lock_problem(settings) -> str | None`: why the lock does not answer the config (None: current).
- `resolve_dataset(ref, cache, *, lock=None, config=None, ...) -> ResolvedDataset`: the fetched dataset a run uses
  (`.tasks`: id -> cached task directory, `.lock`, `.lock_path`, `.splits()`: the dataset's `splits.json` as
  fetched); raises core's `EnvNotPrepared` naming
  `platoon prepare CONFIG` when it is not fetched or its lock is stale. A local `dataset_dir` is returned as is.
- `task_ids(root, fetched=False) -> dict[id, Path]`: the ids of a local dataset directory.
- `verify(lock, cache, ids=None) -> list[str]`: cache entries whose files no longer hash to their digests.
- `content_hash(task_dir)`: the Harbor content hash ("harbor-packager-v1"); `input_files(task_dir)`: the inputs
  the hold-out joins groups by.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import tomllib
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from platoon.config import default_cache_root, load_site
from platoon.envs.service import EnvNotPrepared
from platoon.errors import ConfigError, PlatoonError
from platoon_harbor import images
from platoon_harbor.tasks import TaskRefused, dataset_splits, discover_tasks, read_task, runnable_splits

__all__ = [
    "BUILD_KEY_RULE",
    "HASH_RULE",
    "LOCK_VERSION",
    "DatasetRef",
    "FetchError",
    "FetchResult",
    "FetchSettings",
    "ResolvedDataset",
    "content_hash",
    "default_cache",
    "fetch",
    "input_files",
    "lock_problem",
    "parse_dataset",
    "read_lock",
    "resolve_dataset",
    "task_ids",
    "verify",
]

HASH_RULE = "harbor-packager-v1"
BUILD_KEY_RULE = "platoon-buildkey-v1"
LOCK_VERSION = 1
FETCHED_WITH = "platoon-harbor 0.2.0"
_COMMIT = re.compile(r"[0-9a-f]{40}")
_COVERED_FILES = ("task.toml", "instruction.md", "README.md", "trajectory.json")
_COVERED_DIRS = ("environment", "tests", "solution", "steps")
_DEFAULT_IGNORES = ("__pycache__/", "*.pyc", ".DS_Store", "*.swp", "*.swo", "*~")
_BUILD_FILES = {"Dockerfile", ".dockerignore", "docker-compose.yaml", "docker-compose.yml"}
_BUILD_FILES |= {"compose.yaml", "compose.yml"}
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_REFUSE_DEFAULTS: dict[str, Any] = {
    "sidecars": True,
    "gpus": True,
    "agent_user": True,
    "per_task_build": False,
}


class FetchError(PlatoonError):
    """A fetch or verification that failed at runtime (exit 1): the hub, a download, a damaged cache entry."""


# ---------------------------------------------------------------------------------------------------------------
# Naming
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetRef:
    """A parsed `dataset` value: `kind` is `hf` or `local`."""

    text: str
    kind: str
    repo: str = ""
    revision: str | None = None
    subdir: str = ""
    path: Path | None = None

    @property
    def pinned(self) -> bool:
        return self.kind == "local" or (self.revision is not None and bool(_COMMIT.fullmatch(self.revision)))


def parse_dataset(text: str, base_dir: Path | None = None) -> DatasetRef:
    """Parse a `dataset` reference; a relative local path resolves against `base_dir` (the config's directory)."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(
            "service_kwargs.dataset: expected hf://org/name@<commit>[#subdir] or a local directory"
        )
    text = text.strip()
    if text.startswith(("harbor://", "git+")):
        scheme = "harbor://" if text.startswith("harbor://") else "git+"
        raise ConfigError(
            f"service_kwargs.dataset: {text}: {scheme} datasets are recognised but not supported"
        )
    if text.startswith("hf://"):
        rest = text[len("hf://") :]
        rest, _, subdir = rest.partition("#")
        rest = rest.removeprefix("datasets/")
        repo, at, revision = rest.partition("@")
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise ConfigError(
                f"service_kwargs.dataset: {text}: expected hf://org/name@<40-hex commit>[#subdir]"
            )
        subdir = subdir.strip("/")
        if subdir and any(part in ("", ".", "..") for part in subdir.split("/")):
            raise ConfigError(f"service_kwargs.dataset: {text}: the #subdir may not hold '.', '..' or '//'")
        return DatasetRef(text, "hf", repo=repo, revision=revision if at else None, subdir=subdir)
    if "://" in text:
        raise ConfigError(f"service_kwargs.dataset: {text}: unknown scheme (hf:// or a local directory)")
    path = Path(os.path.expanduser(text))
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    return DatasetRef(text, "local", path=Path(os.path.normpath(path)))


def _read_task_name(task_dir: Path) -> str | None:
    try:
        data = tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    name = data.get("task", {}).get("name") if isinstance(data.get("task"), dict) else None
    return name if isinstance(name, str) and name else None


def task_ids(root: Path, *, fetched: bool = False) -> dict[str, Path]:
    """The tasks of a local dataset directory by id: a registry.json's names, else (fetched sources only)
    task-index.json's `task_path` rows, else every task.toml directory (dir name, or `group/name` deeper down).

    The registry and the scan are platoon_harbor.tasks.discover_tasks; a fetched source adds the index rows and
    names a root that is itself a task by its `[task].name`."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{root}: no such dataset directory")
    index_file = root / "task-index.json"
    if fetched and not (root / "registry.json").is_file():
        paths = _index_paths(_read_json(index_file)) if index_file.is_file() else {}
        if paths:
            ids: dict[str, Path] = {}
            for task_id, rel in sorted(paths.items()):
                ids[task_id] = root / _safe_rel(rel, f"{index_file}: {task_id}")
            return ids
        if (root / "task.toml").is_file():
            return {_read_task_name(root) or root.name: root}
    return discover_tasks(root)


def _safe_rel(path: Any, where: str) -> str:
    if not isinstance(path, str) or not path or path.startswith("/") or ".." in Path(path).parts:
        raise ConfigError(f"{where}: {path!r}: task paths must be relative and may not hold '..'")
    return os.path.normpath(path)


def _index_paths(data: Any) -> dict[str, str]:
    if not isinstance(data, dict):
        return {}
    return {
        k: v["task_path"]
        for k, v in data.items()
        if isinstance(v, dict) and isinstance(v.get("task_path"), str)
    }


def _index_rows(data: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(data, dict):
        return {}
    return {
        k: {f: x for f, x in v.items() if f != "task_path"} for k, v in data.items() if isinstance(v, dict)
    }


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not readable JSON ({exc})") from None


# ---------------------------------------------------------------------------------------------------------------
# The Harbor content hash and a task's input files
# ---------------------------------------------------------------------------------------------------------------


def _glob_regex(pattern: str) -> str:
    """A gitignore glob as a regex body: `**` crosses directories, `*` and `?` do not, `[...]` is a class."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "]") else i + 1)
            if end < 0:
                out.append(re.escape(c))
                i += 1
                continue
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


class Ignore:
    """gitignore semantics for one file at a task's root: `#`, `!`, trailing `/`, anchored inner `/`, globs,
    `**`; the last matching rule wins, and nothing under an ignored directory comes back."""

    def __init__(self, lines: Iterable[str]) -> None:
        self.rules: list[_Rule] = []
        for raw in lines:
            line = raw.rstrip("\n").rstrip("\r")
            if not line.endswith("\\ "):
                line = line.rstrip(" ")
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            line = line[1:] if negate else line.removeprefix("\\")
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            if not line:
                continue
            anchored = "/" in line
            body = _glob_regex(line.lstrip("/"))
            regex = re.compile(("" if anchored else "(?:.*/)?") + body + "$", re.DOTALL)
            self.rules.append(_Rule(regex, negate, dir_only))

    def _decide(self, rel: str, is_dir: bool) -> bool | None:
        verdict: bool | None = None
        for rule in self.rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.match(rel):
                verdict = not rule.negate
        return verdict

    def ignored(self, rel: str) -> bool:
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            if self._decide("/".join(parts[:depth]), True):
                return True
        return bool(self._decide(rel, False))


def _ignore_for(task_dir: Path) -> Ignore:
    try:
        return Ignore((task_dir / ".gitignore").read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        return Ignore(_DEFAULT_IGNORES)
    except (OSError, UnicodeDecodeError):
        return Ignore(_DEFAULT_IGNORES)


def covered(rel: str) -> bool:
    """Whether the content hash covers a task-relative path (before the ignore rules)."""
    return rel in _COVERED_FILES or (rel.split("/", 1)[0] in _COVERED_DIRS and "/" in rel)


def _files(task_dir: Path) -> list[str]:
    """Task-relative paths the content hash covers (symlinks followed), sorted."""
    ignore = _ignore_for(task_dir)
    found: list[str] = [name for name in _COVERED_FILES if (task_dir / name).is_file()]
    for top in _COVERED_DIRS:
        base = task_dir / top
        if not base.is_dir():
            continue
        for dirpath, _dirnames, filenames in os.walk(base, followlinks=True):
            rel_dir = Path(dirpath).relative_to(task_dir).as_posix()
            for name in filenames:
                rel = f"{rel_dir}/{name}"
                if (task_dir / rel).is_file():
                    found.append(rel)
    return sorted(rel for rel in found if not ignore.ignored(rel))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def content_hash(task_dir: Path) -> str:
    """Harbor's content hash of a task: SHA-256 over the sorted lines `relpath\\0sha256(file)\\n`."""
    digest = hashlib.sha256()
    for rel in _files(Path(task_dir)):
        digest.update(f"{rel}\0{file_sha256(Path(task_dir) / rel)}\n".encode())
    return digest.hexdigest()


def text_digest(data: bytes) -> str:
    """The hold-out's digest of an input file: text normalised (line endings, BOM, trailing blanks, blank lines),
    binary (a NUL in the first 8000 bytes) hashed raw."""
    if b"\0" in data[:8000]:
        return hashlib.sha256(data).hexdigest()
    text = data.decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    normal = "\n".join(line for line in lines if line)
    return hashlib.sha256(normal.encode("utf-8", errors="surrogateescape")).hexdigest()


def _dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        line = (pending + stripped).strip()
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _copy_sources(args: str) -> list[str] | None:
    """The local sources of a COPY/ADD (None for `--from` copies); remote sources are left out."""
    try:
        import shlex

        words = [str(w) for w in json.loads(args)] if args.startswith("[") else shlex.split(args)
    except (ValueError, json.JSONDecodeError):
        return []
    flags = [w for w in words if w.startswith("--")]
    if any(f.startswith("--from") for f in flags):
        return None
    words = [w for w in words if not w.startswith("--")]
    sources = words[:-1]
    return [s for s in sources if "://" not in s and not s.startswith("git@") and not s.endswith(".git")]


def input_files(task_dir: Path) -> dict[str, str]:
    """A task's input files: `environment/...` path -> `sha256:<normalised digest>`.

    The build-context paths its Dockerfile's COPY/ADD take, minus the build's own files; a task without a
    Dockerfile takes all of `environment/`. Tests, solutions and remote content are never inputs.
    """
    task_dir = Path(task_dir)
    context = task_dir / "environment"
    if not context.is_dir():
        return {}
    chosen: set[Path] = set()
    dockerfile = context / "Dockerfile"
    if dockerfile.is_file():
        text = dockerfile.read_text(encoding="utf-8", errors="replace")
        for word, args in _dockerfile_instructions(text):
            if word not in ("COPY", "ADD"):
                continue
            for source in _copy_sources(args) or []:
                for match in sorted(context.glob(source.lstrip("/"))) if source.strip("./") else [context]:
                    if match.is_dir():
                        chosen.update(p for p in match.rglob("*") if p.is_file())
                    elif match.is_file():
                        chosen.add(match)
    else:
        chosen.update(p for p in context.rglob("*") if p.is_file())
    result: dict[str, str] = {}
    for path in sorted(chosen):
        rel = path.relative_to(context)
        if rel.as_posix() in _BUILD_FILES:
            continue
        result[f"environment/{rel.as_posix()}"] = "sha256:" + text_digest(path.read_bytes())
    return result


# ---------------------------------------------------------------------------------------------------------------
# Fetch settings and the inputs digest
# ---------------------------------------------------------------------------------------------------------------


def default_cache() -> Path:
    """The Harbor cache: `$PLATOON_HARBOR_CACHE` (deprecated) or the site profile's `<cache root>/harbor`."""
    legacy = os.environ.get("PLATOON_HARBOR_CACHE")
    if legacy:
        return Path(os.path.expanduser(legacy))
    profile = load_site()
    return (profile.cache_root if profile is not None else default_cache_root()) / "harbor"


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class FetchSettings:
    """One Harbor entry's fetch settings (its `service_kwargs`), resolved against the config's directory."""

    dataset: DatasetRef
    cache: Path
    lock: Path | None = None
    tasks: list[Path] = field(default_factory=list)
    select: dict[str, Any] = field(default_factory=dict)
    refuse: dict[str, Any] = field(default_factory=lambda: dict(_REFUSE_DEFAULTS))
    workers: int = 8
    config: str | None = None  # the config file, named in "run platoon prepare" messages

    @classmethod
    def from_kwargs(
        cls,
        kwargs: Mapping[str, Any],
        *,
        base_dir: Path | None = None,
        cache: Path | None = None,
        lock: Path | None = None,
        config: str | None = None,
    ) -> FetchSettings:
        where = "service_kwargs"
        for key in ("overlays", "index"):
            if kwargs.get(key):
                raise ConfigError(f"{where}.{key}: not supported by this build of platoon-harbor")
        base = base_dir or Path.cwd()

        def path_of(value: Any) -> Path:
            path = Path(os.path.expanduser(str(value)))
            return path if path.is_absolute() else base / path

        root = cache or (path_of(kwargs["cache"]) if kwargs.get("cache") else default_cache())
        tasks = kwargs.get("tasks") or []
        tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        select = kwargs.get("select") or {}
        if not isinstance(select, dict):
            raise ConfigError(f"{where}.select: expected a mapping of index field -> value(s)")
        select = {str(k).removeprefix("index."): v for k, v in select.items()}
        for key in select:
            if key.startswith("flags."):
                raise ConfigError(f"{where}.select.{key}: flags are not selectable")
        refuse = dict(_REFUSE_DEFAULTS)
        given = kwargs.get("refuse") or {}
        if not isinstance(given, dict):
            raise ConfigError(f"{where}.refuse: expected a mapping")
        for key, value in given.items():
            if key not in (*_REFUSE_DEFAULTS, "uploads_over_mb"):
                raise ConfigError(
                    f"{where}.refuse.{key}: unknown (one of {', '.join(_REFUSE_DEFAULTS)}, uploads_over_mb)"
                )
            refuse[key] = value
        workers = kwargs.get("workers", 8)
        if not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"{where}.workers: expected a positive integer")
        lock_given = lock or (path_of(kwargs["lock"]) if kwargs.get("lock") else None)
        return cls(
            dataset=parse_dataset(str(kwargs.get("dataset", "")), base),
            cache=Path(os.path.abspath(root)),
            lock=lock_given,
            tasks=[path_of(t) for t in tasks],
            select=select,
            refuse=refuse,
            workers=workers,
            config=config,
        )

    def inputs(self) -> dict[str, Any]:
        refuse = {k: v for k, v in self.refuse.items() if k != "uploads_over_mb" or v is not None}
        return {
            "dataset": self.dataset.text,
            "tasks": [file_sha256(p) if p.is_file() else None for p in self.tasks],
            "select": self.select,
            "overlays": [],
            "refuse": refuse,
            "index": None,
        }

    def inputs_digest(self) -> str:
        return _sha256_json(self.inputs())

    @property
    def lock_path(self) -> Path:
        return self.lock or self.cache / "locks" / f"{self.inputs_digest()[:16]}.lock.json"

    def prepare_hint(self) -> str:
        return (
            f"run `platoon prepare {self.config or 'CONFIG'}` (or `platoon harbor fetch`) on this site first"
        )


# ---------------------------------------------------------------------------------------------------------------
# The lock
# ---------------------------------------------------------------------------------------------------------------


def read_lock(path: Path) -> dict[str, Any]:
    """A lock file; ConfigError when it is unreadable or of another version or hash rule."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable lock ({exc})") from None
    if not isinstance(data, dict) or data.get("version") != LOCK_VERSION:
        raise ConfigError(f"{path}: not a version {LOCK_VERSION} lock")
    if data.get("hash_rule") != HASH_RULE:
        raise ConfigError(f"{path}: hash rule {data.get('hash_rule')!r} is not {HASH_RULE!r}: refetch")
    if not isinstance(data.get("tasks"), list):
        raise ConfigError(f"{path}: a lock needs a task list")
    return data


def write_lock(path: Path, lock: Mapping[str, Any]) -> None:
    """Written atomically, one task per line so that diffs of a lock read well."""
    head = {k: v for k, v in lock.items() if k != "tasks"}
    lines = ["{"]
    for key, value in head.items():
        lines.append(f"  {json.dumps(key)}: {json.dumps(value, sort_keys=True)},")
    tasks = [json.dumps(task, sort_keys=True) for task in lock["tasks"]]
    lines.append('  "tasks": [' + ("" if tasks else "]"))
    if tasks:
        lines.append(",\n".join(f"    {t}" for t in tasks))
        lines.append("  ]")
    lines.append("}")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(partial, path)


def lock_problem(settings: FetchSettings, lock: Mapping[str, Any] | None = None) -> str | None:
    """Why the lock does not answer `settings` (missing, other inputs, no input files, cache entries gone)."""
    path = settings.lock_path
    if lock is None:
        try:
            lock = read_lock(path)
        except FileNotFoundError:
            return f"{settings.dataset.text} is not fetched (no lock {path})"
        except ConfigError as exc:
            return str(exc)
    if lock.get("inputs") != settings.inputs_digest():
        return (
            f"the lock {path} pins {lock.get('dataset')} with other fetch settings than this config's "
            f"{settings.dataset.text}"
        )
    for task in lock["tasks"]:
        if "input_files" not in task:
            return f"the lock {path} records no input files (an old lock): refetch"
        if not task.get("refused") and not (settings.cache / task["path"]).is_dir():
            return f"the cache entry {settings.cache / task['path']} of task {task['name']} is missing"
    return None


# ---------------------------------------------------------------------------------------------------------------
# Fetching
# ---------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@dataclass
class FetchResult:
    lock_path: Path
    lock: dict[str, Any]
    fetched: bool  # False: the lock was current and nothing was done

    def summary(self) -> dict[str, Any]:
        tasks = self.lock["tasks"]
        return {
            "lock": str(self.lock_path),
            "tasks": len(tasks),
            "runnable": sum(1 for t in tasks if not t.get("refused")),
            "fetched": self.fetched,
        }


def _progress(total: int, desc: str) -> Any:
    """A tqdm bar on stderr (hidden when stderr is not a terminal)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="task", disable=None, leave=False)


def fetch(
    settings: FetchSettings,
    *,
    update: bool = False,
    repair: bool = False,
    say: Callable[[str], None] | None = None,
) -> FetchResult:
    """Fetch the dataset into the cache and write its lock; a current pinned HF lock is left as it is."""
    ref = settings.dataset
    if ref.kind == "hf" and not ref.pinned and not update:
        raise ConfigError(
            f"service_kwargs.dataset: {ref.text} is a moving reference (a branch, a tag or no revision): pin a "
            "40-hex commit, or resolve it with `platoon harbor fetch --update`"
        )
    path = settings.lock_path
    with _flock(
        settings.cache / ".locks" / f"fetch-{hashlib.sha256(str(path).encode()).hexdigest()[:16]}.lock"
    ):
        if ref.kind == "hf" and ref.pinned and not repair and lock_problem(settings) is None:
            return FetchResult(path, read_lock(path), fetched=False)
        if ref.kind == "hf":
            root, resolved = _fetch_hf(settings, update=update, repair=repair)
        else:
            assert ref.path is not None
            if not ref.path.is_dir():
                raise ConfigError(f"service_kwargs.dataset: {ref.text}: no such directory ({ref.path})")
            root, resolved = ref.path, str(ref.path)
        lock = _build_lock(settings, root, resolved, repair=repair, say=say)
        write_lock(path, lock)
        return FetchResult(path, lock, fetched=True)


def _hf_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _fetch_hf(settings: FetchSettings, *, update: bool, repair: bool) -> tuple[Path, str]:
    """Download the files the content hash covers (and the index files) into `<cache>/hf-snapshots/<commit>/`."""
    try:
        from huggingface_hub import HfApi, hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise FetchError(f"huggingface_hub is not importable ({exc})") from None
    ref = settings.dataset
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise FetchError(f"{ref.text}: HF_HUB_OFFLINE is set, so nothing can be fetched from the hub")
    api = HfApi(endpoint=_hf_endpoint())
    revision = ref.revision
    try:
        if revision is None or not _COMMIT.fullmatch(revision):
            info = api.dataset_info(ref.repo, revision=revision)
            revision = info.sha
            if not revision:
                raise FetchError(f"{ref.text}: the hub named no commit for it")
        listing = _listing(api, settings, revision)
        snapshot = settings.cache / "hf-snapshots" / ref.repo.replace("/", "--") / revision
        blobs = settings.cache / "hf-blobs"

        def download(rel: str) -> Path:
            meta, target = listing[rel], snapshot / rel
            if target.is_file() and not repair and _blob_ok(target, meta):
                return target
            for attempt in (0, 1):  # a mismatch re-downloads once, bypassing the cache, then fails
                got = Path(
                    hf_hub_download(
                        ref.repo,
                        rel,
                        repo_type="dataset",
                        revision=revision,
                        cache_dir=str(blobs),
                        endpoint=_hf_endpoint(),
                        force_download=attempt == 1 or repair,
                    )
                )
                if _blob_ok(got, meta):
                    break
                if attempt == 1:
                    raise FetchError(
                        f"{ref.text}: {rel} does not match the hub's listing after a second download"
                    )
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            try:
                os.link(os.path.realpath(got), target)  # the download cache and the snapshot share the file
            except OSError:
                shutil.copyfile(got, target)
            if target.name.endswith(".sh") or target.read_bytes()[:2] == b"#!":
                target.chmod(target.stat().st_mode | 0o111)
            return target

        # The index files and each task's .gitignore first: the ignore rules decide what else is downloaded.
        first, roots = _first_files(listing, ref.subdir)
        for rel in first:
            download(rel)
        wanted = _wanted_files(listing, roots, lambda root: _ignore_for(snapshot / root))
        bar = _progress(len(wanted), f"downloading {ref.text}")
        try:
            for rel in wanted:
                download(rel)
                bar.update(1)
        finally:
            bar.close()
    except OfflineModeIsEnabled:
        raise FetchError(f"{ref.text}: the hub is in offline mode (HF_HUB_OFFLINE)") from None
    except HfHubHTTPError as exc:
        raise FetchError(f"{ref.text}: {exc}".splitlines()[0]) from None
    return snapshot / ref.subdir if ref.subdir else snapshot, revision


def _listing(api: Any, settings: FetchSettings, revision: str) -> dict[str, dict[str, Any]]:
    """The recursive tree listing of the dataset at a commit, cached per commit under `<cache>/hf-listings/`."""
    ref = settings.dataset
    key = hashlib.sha256(ref.subdir.encode()).hexdigest()[:12]
    cached = settings.cache / "hf-listings" / ref.repo.replace("/", "--") / f"{revision}-{key}.json"
    if cached.is_file():
        with contextlib.suppress(OSError, json.JSONDecodeError):
            return dict(json.loads(cached.read_text(encoding="utf-8")))
    listing: dict[str, dict[str, Any]] = {}
    from huggingface_hub.hf_api import RepoFile

    for item in api.list_repo_tree(
        ref.repo, path_in_repo=ref.subdir or None, recursive=True, revision=revision, repo_type="dataset"
    ):
        if isinstance(item, RepoFile):
            listing[item.path] = {
                "size": item.size,
                "blob_id": item.blob_id,
                "lfs_sha256": item.lfs.sha256 if item.lfs is not None else None,
            }
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(listing, sort_keys=True), encoding="utf-8")
    return listing


def _first_files(listing: Mapping[str, Any], subdir: str) -> tuple[list[str], list[str]]:
    """The index files at the dataset root and the tasks' .gitignore files; and the task roots (directories
    holding task.toml, as `prefix/` strings, not nested in another task)."""
    prefix = f"{subdir}/" if subdir else ""
    candidates = sorted(
        {p[: -len("task.toml")] for p in listing if p.startswith(prefix) and p.endswith("task.toml")}
    )
    roots: list[str] = []
    for root in candidates:
        if (root == prefix or root.endswith("/")) and not any(root.startswith(r) for r in roots):
            roots.append(root)
    first = [prefix + n for n in ("registry.json", "task-index.json", "splits.json") if prefix + n in listing]
    first += [f"{r}.gitignore" for r in roots if f"{r}.gitignore" in listing]
    return first, roots


def _wanted_files(
    listing: Mapping[str, Any], roots: Sequence[str], ignore_for: Callable[[str], Ignore]
) -> list[str]:
    """In each task, the files the content hash covers after its ignore rules."""
    wanted: list[str] = []
    for root in roots:
        ignore = ignore_for(root)
        for rel in sorted(listing):
            if rel.startswith(root):
                inner = rel[len(root) :]
                if covered(inner) and not ignore.ignored(inner):
                    wanted.append(rel)
    return sorted(set(wanted))


def _blob_ok(path: Path, meta: Mapping[str, Any]) -> bool:
    """A downloaded file against the listing: its LFS SHA-256, else its git blob id."""
    data = path.read_bytes()
    if meta.get("lfs_sha256"):
        return hashlib.sha256(data).hexdigest() == meta["lfs_sha256"]
    if meta.get("blob_id"):
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == meta["blob_id"]
    return True


# ---------------------------------------------------------------------------------------------------------------
# Caching tasks and building the lock
# ---------------------------------------------------------------------------------------------------------------


def _stage(source: Path, staging: Path, *, link: bool) -> None:
    """Copy the covered files of a task, symlinks as their targets; `link` hard-links instead (files platoon
    downloaded itself, never a user's directory, whose in-place edits would reach the cache through the link)."""
    ignore = _ignore_for(source)
    extra = [".gitignore"] if (source / ".gitignore").is_file() else []
    for rel in [*_files(source), *extra]:
        if rel != ".gitignore" and ignore.ignored(rel):
            continue
        target = staging / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        real = os.path.realpath(source / rel)
        if link:
            with contextlib.suppress(OSError):
                os.link(real, target)
                continue
        shutil.copy2(real, target)


def _install(cache: Path, source: Path, digest: str, *, repair: bool, link: bool) -> Path:
    """`<cache>/tasks/<digest>/`, installed by rename under the tasks flock; a damaged entry is replaced."""
    entry = cache / "tasks" / digest
    if entry.is_dir() and not repair and content_hash(entry) == digest:
        return entry
    staging = cache / ".tmp" / uuid.uuid4().hex
    staging.mkdir(parents=True)
    try:
        _stage(source, staging, link=link)
        if content_hash(staging) != digest:
            raise FetchError(f"{source}: changed while it was being cached")
        with _flock(cache / ".locks" / "tasks.lock"):
            if entry.is_dir():
                if content_hash(entry) == digest:
                    return entry
                aside = cache / ".tmp" / f"damaged-{uuid.uuid4().hex}"
                os.replace(entry, aside)
                shutil.rmtree(aside, ignore_errors=True)
            entry.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging, entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entry


def _task_flags(task_dir: Path, task_id: str) -> tuple[dict[str, Any], str | None]:
    """The lock's `flags` and the loader's refusal (`task_config: ...`), through platoon_harbor.tasks."""
    try:
        task = read_task(task_dir, task_id=task_id)
    except TaskRefused as exc:
        return {}, exc.refused
    flags: dict[str, Any] = {
        "verifier": task.verifier.mode,
        "artifacts": len(task.artifacts),
        "stack": task.stack,
        "network": task.environment.network_mode,
        "gpus": task.environment.gpus,
        "agent_user": task.agent_user,
        "verifier_user": task.verifier_user,
        "os": task.environment.os,
    }
    if task.verifier.environment is not None:
        flags["verifier_network"] = task.verifier.environment.network_mode
    return flags, None


def _refusal(flags: Mapping[str, Any], refuse: Mapping[str, Any]) -> str | None:
    """The recorded refusals, in priority order."""
    if refuse.get("sidecars", True) and flags.get("stack") == "sidecars":
        return "sidecars: the environment is a compose stack with more than the main service"
    if refuse.get("gpus", True) and flags.get("gpus"):
        return f"gpus: the task asks for {flags['gpus']} GPU(s)"
    if refuse.get("agent_user", True) and (flags.get("agent_user") or flags.get("verifier_user")):
        return "agent_user: the task names an [agent] or [verifier] user"
    return None


def _allowlist(paths: Sequence[Path]) -> set[str] | None:
    if not paths:
        return None
    names: set[str] = set()
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"service_kwargs.tasks: {path}: cannot be read ({exc})") from None
        if path.suffix == ".json":
            data = json.loads(text)
            items = data if isinstance(data, list) else [i for v in data.values() for i in v]
            names.update(str(i) for i in items)
        elif path.suffix == ".toml":
            names.update(str(i) for v in tomllib.loads(text).values() for i in v)
        else:
            names.update(line.split("#", 1)[0].strip() for line in text.splitlines())
            names.discard("")
    return names


def _selected(task_id: str, row: Mapping[str, Any], select: Mapping[str, Any], metadata: set[str]) -> bool:
    for key, want in select.items():
        wants = want if isinstance(want, list) else [want]
        if key == "name":
            if not any(fnmatch.fnmatchcase(task_id, str(w)) for w in wants):
                return False
            continue
        if key not in row:
            hint = (
                " (a task.toml [metadata] field: add it with `index: [{metadata: [...]}]`)"
                if key in metadata
                else ""
            )
            raise ConfigError(f"service_kwargs.select.{key}: no such index field{hint}")
        if row[key] not in wants:
            return False
    return True


def _build_lock(
    settings: FetchSettings,
    root: Path,
    resolved: str,
    *,
    repair: bool,
    say: Callable[[str], None] | None,
) -> dict[str, Any]:
    fetched = settings.dataset.kind == "hf"
    found = task_ids(root, fetched=fetched)
    index_file = root / "task-index.json"
    rows = _index_rows(_read_json(index_file)) if index_file.is_file() else {}
    allow = _allowlist(settings.tasks)
    if allow is not None and allow - set(found):
        unknown = ", ".join(sorted(allow - set(found))[:5])
        raise ConfigError(f"service_kwargs.tasks: names tasks the dataset lacks: {unknown}")
    metadata: set[str] = set()
    for task_dir in found.values():
        with contextlib.suppress(OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            meta = tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8")).get("metadata")
            metadata.update(meta or {})
    chosen = {
        task_id: path
        for task_id, path in found.items()
        if (allow is None or task_id in allow)
        and _selected(task_id, rows.get(task_id, {}), settings.select, metadata)
    }
    tasks: list[dict[str, Any]] = []
    bar = _progress(len(chosen), f"caching {settings.dataset.text}")
    try:
        for task_id, task_dir in sorted(chosen.items()):
            digest = content_hash(task_dir)
            flags, refusal = _task_flags(task_dir, task_id)
            refusal = refusal or _refusal(flags, settings.refuse)
            entry = _install(settings.cache, task_dir, digest, repair=repair, link=fetched)
            task: dict[str, Any] = {
                "name": task_id,
                "digest": f"sha256:{digest}",
                "path": entry.relative_to(settings.cache).as_posix(),
                "source_path": task_dir.relative_to(root).as_posix() or ".",
                "index": rows.get(task_id, {}),
                "flags": flags,
                "image": None if refusal else _image_plan(entry),
                "refused": refusal,
                "input_files": input_files(entry),
            }
            image = task["image"] or {}
            if not task["refused"] and image.get("refused"):
                task["refused"] = str(image["refused"])  # an unplannable Dockerfile (`image: ...`)
            tasks.append(task)
            bar.update(1)
    finally:
        bar.close()
    _share_keys(tasks, settings.refuse)

    # The dataset's own splits, narrowed to what this config selected (null: it has no splits file).
    splits = dataset_splits(root)
    if splits is not None:
        splits = runnable_splits(splits, chosen)
    if say is not None:
        say(f"{settings.dataset.text}: {len(tasks)} task(s) cached in {settings.cache / 'tasks'}")
    return {
        "version": LOCK_VERSION,
        "dataset": settings.dataset.text,
        "resolved": resolved,
        "fetched_with": FETCHED_WITH,
        "hash_rule": HASH_RULE,
        "build_key_rule": BUILD_KEY_RULE,
        "overlay": None,
        "inputs": settings.inputs_digest(),
        "selection": {
            "tasks": [file_sha256(p) for p in settings.tasks],
            "select": settings.select,
            "selected": len(chosen),
            "of": len(found),
        },
        "modes": {"refuse": settings.refuse},
        # A list, not an object: the lock's objects are written with sorted keys, and a file's split order counts.
        "splits": None if splits is None else [{"split": k, "tasks": v} for k, v in splits.items()],
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "tasks": tasks,
    }


def _share_keys(tasks: list[dict[str, Any]], refuse: Mapping[str, Any]) -> None:
    """A build key several runnable tasks share is `shared`; with `refuse.per_task_build`, a task whose key no
    other runnable task shares is refused (`per_task_build`)."""
    users: dict[str, int] = {}
    for task in tasks:
        key = (task.get("image") or {}).get("key")
        if key and not task.get("refused"):
            users[key] = users.get(key, 0) + 1
    for task in tasks:
        image = task.get("image") or {}
        if image.get("kind") in ("per_task", "shared") and image.get("key"):
            image["kind"] = "shared" if users.get(image["key"], 0) > 1 else "per_task"
            if refuse.get("per_task_build") and image["kind"] == "per_task" and not task.get("refused"):
                task["refused"] = "per_task_build: no other runnable task shares this task's image"


def _image_plan(task_dir: Path) -> dict[str, Any] | None:
    """The task's build plan when platoon_harbor.images offers `plan_for_lock(task_dir)`; None before it does."""
    plan = getattr(images, "plan_for_lock", None)
    if not callable(plan):
        return None
    try:
        return dict(plan(task_dir))
    except (ConfigError, ValueError, OSError) as exc:
        return {"kind": "none", "key": None, "refused": f"image: {exc}"}


# ---------------------------------------------------------------------------------------------------------------
# What runs use: resolution, verification
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class ResolvedDataset:
    """A dataset as a run sees it: task id -> directory, and the lock when it was fetched."""

    tasks: dict[str, Path]
    lock: dict[str, Any] | None = None
    lock_path: Path | None = None
    refused: dict[str, str] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """The lock's task rows (the hold-out's input)."""
        return list(self.lock["tasks"]) if self.lock is not None else []

    def splits(self) -> dict[str, list[str]] | None:
        """The dataset's splits file as fetched (`splits` of the lock; None without one, or in a lock older than
        this field)."""
        recorded = (self.lock or {}).get("splits")
        if not isinstance(recorded, list):
            return None
        return {str(row["split"]): [str(t) for t in row["tasks"]] for row in recorded}


def resolve_dataset(
    ref: str | Mapping[str, Any],
    cache: Path | None = None,
    *,
    lock: Path | None = None,
    config: str | None = None,
    base_dir: Path | None = None,
    may_fetch: bool = False,
) -> ResolvedDataset:
    """The dataset a run uses: `ref` is a `dataset` string or the entry's `service_kwargs`.

    A `dataset_dir` is read in place. A fetched dataset comes from its lock: missing or stale, it raises
    `EnvNotPrepared` naming `platoon prepare CONFIG`, unless `may_fetch` (train/eval, for a pinned dataset).
    """
    kwargs: Mapping[str, Any] = {"dataset": ref} if isinstance(ref, str) else ref
    if kwargs.get("dataset_dir") and not kwargs.get("dataset"):
        root = Path(os.path.expanduser(str(kwargs["dataset_dir"])))
        root = root if root.is_absolute() else (base_dir or Path.cwd()) / root
        return ResolvedDataset(task_ids(root))
    settings = FetchSettings.from_kwargs(kwargs, base_dir=base_dir, cache=cache, lock=lock, config=config)
    problem = lock_problem(settings)
    if problem is not None and may_fetch and settings.dataset.pinned:
        fetch(settings)
        problem = lock_problem(settings)
    if problem is not None:
        raise EnvNotPrepared(f"Harbor dataset not prepared: {problem}; {settings.prepare_hint()}")
    data = read_lock(settings.lock_path)
    tasks = {t["name"]: settings.cache / t["path"] for t in data["tasks"] if not t.get("refused")}
    refused = {t["name"]: t["refused"] for t in data["tasks"] if t.get("refused")}
    return ResolvedDataset(tasks, data, settings.lock_path, refused)


def verify(lock: Mapping[str, Any], cache: Path, ids: Iterable[str] | None = None) -> list[str]:
    """Problems, one line each, of cache entries whose files do not hash to their recorded digests."""
    wanted = set(ids) if ids is not None else None
    problems: list[str] = []
    names = {t["name"] for t in lock["tasks"]}
    for missing in sorted((wanted or set()) - names):
        problems.append(f"{missing}: no such task in the lock")
    for task in lock["tasks"]:
        if wanted is not None and task["name"] not in wanted:
            continue
        entry = Path(cache) / task["path"]
        if not entry.is_dir():
            problems.append(f"{task['name']}: cache entry {entry} is missing")
            continue
        got = "sha256:" + content_hash(entry)
        if got != task["digest"]:
            problems.append(f"{task['name']}: {entry} hashes to {got}, the lock says {task['digest']}")
    return problems
