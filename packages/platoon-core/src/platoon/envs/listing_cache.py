"""The task listing cache: what listing a `python://` (in-process ORS) entry's training tasks gave, kept under the
site cache, so `platoon config validate --tasks` and a start with nothing to train answer without importing the
environment's SDK (seconds: openreward pulls in openai, anthropic and google-genai).

A listing is reused only for the same environment, which is what the key digests:

- the service reference and its options, and the entry's listing settings (splits, seed, limit, exclusions,
  label column, its place in a mixture);
- the content of every file under the environment module's directory (its package: code and data files side by
  side), and of the files and directories its options name by absolute path;
- the Python, platoon and openreward versions, and the listing code itself.

A module directory larger than `MAX_FILES` files or `MAX_BYTES` bytes is not cached (hashing it would cost what
the cache saves). A file that cannot be read makes the listing uncacheable; a cache file that cannot be read,
is corrupt or has another format is a miss: the tasks are listed through the service and the entry written anew.
What the key cannot see (a module elsewhere that the environment imports, data it reads from outside its
directory, environment variables) is why a training start checks a cached listing against the service once it has
built it (`task_order.stale_listing`), removes a stale entry and lists afresh, and why the cache can be turned off:
`PLATOON_TASK_CACHE=0`.

Location: `<cache root>/task-listings/<key>.json`, the cache root being the site profile's `cache`, else
`~/.cache/platoon`. Removing the directory clears it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from platoon._version import running_version
from platoon.config.site import default_cache_root, load_site

__all__ = ["CACHE_DIR_NAME", "DISABLE_VARIABLE", "cache_dir", "listing_key", "load", "remove", "store"]

log = logging.getLogger(__name__)

CACHE_DIR_NAME = "task-listings"
#: `0`, `off`, `false` or `no` turn the cache off (neither read nor written)
DISABLE_VARIABLE = "PLATOON_TASK_CACHE"
#: bumped whenever what a cache file holds, or how a listing turns into it, changes
FORMAT = 1
MAX_FILES = 500
MAX_BYTES = 32 << 20
#: directories never part of an environment's identity
_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules"})
_SCHEME = "python://"


class _Uncacheable(Exception):
    """The environment's identity cannot be settled cheaply: list without the cache."""


def enabled() -> bool:
    return os.environ.get(DISABLE_VARIABLE, "").strip().lower() not in ("0", "off", "false", "no")


def cache_dir() -> Path:
    """`<cache root>/task-listings`: the site profile's cache root, else platoon's default one."""
    try:
        profile = load_site()
    except Exception:  # a broken profile is the command's to report; the cache then uses the default root
        profile = None
    root = profile.cache_root if profile is not None else default_cache_root()
    return root / CACHE_DIR_NAME


def _files(root: Path) -> Iterator[Path]:
    """Every file under `root` (sorted, so the digest is stable), skipping dot and cache directories."""
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIPPED_DIRS)
        for name in sorted(filenames):
            if not name.endswith((".pyc", ".pyo")):
                yield Path(dirpath) / name


def _raise(exc: OSError) -> None:
    raise _Uncacheable(f"cannot read {exc.filename}: {exc.strerror}")


def _digest_tree(root: Path, digest: Any, budget: list[int]) -> None:
    """Add `root` (a file, or every file under a directory) to `digest`, path and content; `budget` is
    [files left, bytes left]."""
    paths = [root] if root.is_file() else list(_files(root))
    for path in paths:
        budget[0] -= 1
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise _Uncacheable(f"cannot read {path}: {exc.strerror}") from None
        budget[1] -= len(data)
        if budget[0] < 0 or budget[1] < 0:
            raise _Uncacheable(f"{root} holds more than {MAX_FILES} files or {MAX_BYTES >> 20} MiB")
        digest.update(f"{path}\0{len(data)}\0".encode())
        digest.update(hashlib.sha256(data).digest())


def _module_dir(reference: str) -> Path:
    """The directory of the module a `python://pkg.mod:Class` reference names, found without importing it (its
    parent packages are imported, as any import of it would)."""
    import importlib.util

    module_name, sep, attr = reference.removeprefix(_SCHEME).partition(":")
    if not sep or not module_name or not attr:
        raise _Uncacheable(f"{reference!r} is not python://pkg.module:Class")
    try:
        spec = importlib.util.find_spec(module_name)
    except Exception as exc:  # a parent package that fails to import: the listing will say so
        raise _Uncacheable(f"cannot find {module_name!r}: {exc}") from None
    if spec is None or not spec.has_location or not spec.origin or not os.path.isfile(spec.origin):
        raise _Uncacheable(f"{module_name!r} is not a module file")
    return Path(spec.origin).resolve().parent


def _named_paths(value: Any) -> Iterator[Path]:
    """The existing files and directories an option names by absolute path (in lists and mappings too)."""
    if isinstance(value, str):
        if os.path.isabs(value) and os.path.exists(value):
            yield Path(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _named_paths(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _named_paths(item)


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    try:
        openreward: str | None = metadata.version("openreward")
    except metadata.PackageNotFoundError:
        openreward = None
    return {"python": sys.version, "platoon": running_version(), "openreward": openreward}


def _listing_code() -> list[Path]:
    # The code that turns an ORS class into a listing: a change to it may change what a listing gives.
    here = Path(__file__).resolve().parent
    return [here / "ors" / "inprocess.py", here.parent / "train" / "tinker" / "task_order.py"]


def listing_key(service: Any, service_kwargs: Mapping[str, Any], settings: Mapping[str, Any]) -> str | None:
    """The cache key of a listing, or None when this entry's listing is not cached (not a `python://` reference,
    the cache turned off, or an identity too costly or impossible to settle)."""
    if not enabled() or not isinstance(service, str) or not service.startswith(_SCHEME):
        return None
    try:
        digest = hashlib.sha256()
        head = {
            "format": FORMAT,
            "service": service,
            "service_kwargs": service_kwargs,
            "settings": settings,
            "versions": _versions(),
        }
        digest.update(json.dumps(head, sort_keys=True, default=repr).encode())
        budget = [MAX_FILES, MAX_BYTES]
        for root in [*_listing_code(), _module_dir(service), *_named_paths(dict(service_kwargs))]:
            digest.update(f"\0root\0{root}\0".encode())
            _digest_tree(root, digest, budget)
    except (_Uncacheable, OSError, TypeError, ValueError) as exc:
        log.debug("task listing of %s not cached: %s", service, exc)
        return None
    return digest.hexdigest()


def load(key: str) -> dict[str, Any] | None:
    """The cached listing under `key`, or None (missing, unreadable, corrupt or of another format)."""
    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
        return None
    listing = data.get("listing")
    return listing if isinstance(listing, dict) else None


def store(key: str, listing: Mapping[str, Any]) -> None:
    """Write `listing` under `key` (atomically); a cache that cannot be written is skipped."""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"format": FORMAT, "key": key, "listing": dict(listing)}, sort_keys=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, directory / f"{key}.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except (OSError, TypeError, ValueError) as exc:
        log.debug("task listing cache not written in %s: %s", directory, exc)


def remove(key: str) -> None:
    """Drop the listing under `key` (a stale one): the next listing asks the service; a file already gone is fine."""
    try:
        (cache_dir() / f"{key}.json").unlink(missing_ok=True)
    except OSError as exc:
        log.debug("task listing cache entry %s not removed: %s", key, exc)
