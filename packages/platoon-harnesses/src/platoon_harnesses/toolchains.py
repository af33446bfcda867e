"""Toolchains built once per site: a uv-managed CPython plus a spec's locked packages, built at
`ROOT/NAME` with a `manifest.json`, checked before a run starts, and staged node-locally for each rollout.

The API (the spec runner and `platoon toolchain` use it; core reaches it only through the hooks of `plugin.py`):

- `toolchain_root(explicit=None)`: the root (explicit, else the deprecated `$PLATOON_TOOLCHAINS`, else
  `<site cache>/toolchains`, default `~/.cache/platoon/toolchains`).
- `toolchain_path(spec, root)`: where a spec's toolchain lives (`ROOT/NAME`, or the spec's absolute path).
- `build(spec, root, force=False, uv=None) -> Built`: make it, under the `.<name>.lock` flock. A finished toolchain
  of the same recipe is a no-op; one of another recipe (or with an unreadable manifest) raises `StaleToolchain`
  unless `force`; a directory without a manifest is an interrupted build and is replaced.
- `check(spec, root) -> str | None`: the problem line a run refuses with (missing, unfinished, stale, unreadable),
  naming the build command; None when the toolchain is ready (or the spec needs none built).
- `stage(path) -> Path`: the node-local copy a rollout uses (`$PLATOON_TOOLCHAIN_CACHE`, else
  `<node scratch>/platoon-toolchains-<uid>`, then `<name>-<first 16 hex of the tree hash>`), made once under an
  exclusive flock through a `.partial` directory verified against the tree hash.
- `tree_hash(dir)`, `read_manifest(dir)`, `verify(dir)`, `node_scratch()`.

Errors: `ToolchainError` (a build or staging failure, exit 1), `StaleToolchain` (a toolchain of another recipe that
only `--force` replaces), `NoRecipe` (the spec gives nothing to build: a configuration error, exit 78).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from platoon import __version__, get_harness
from platoon.config import default_cache_root, load_site
from platoon.errors import ConfigError
from platoon.harness.spec import HarnessSpec, RecipeSpec

__all__ = [
    "FORMAT",
    "MANIFEST",
    "TIKTOKEN_ENCODINGS",
    "Built",
    "NoRecipe",
    "StaleToolchain",
    "ToolchainError",
    "build",
    "build_command",
    "check",
    "lock_sha256",
    "node_scratch",
    "prepare",
    "read_manifest",
    "recipe_of",
    "recipe_sha256",
    "stage",
    "state",
    "toolchain_path",
    "toolchain_root",
    "tree_hash",
    "verify",
]

MANIFEST = "manifest.json"
FORMAT = 1
TIKTOKEN_ENCODINGS = ("cl100k_base", "o200k_base")

#: Variables a build step keeps from the caller's environment (locale, certificates, proxies); everything else is
#: dropped so a build does not depend on who ran it. `UV_*` settings are kept too (a site's index or Python mirror),
#: except those that would pick another interpreter or install location than the build's own.
_KEPT_VARIABLES = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)
_DROPPED_UV_VARIABLES = frozenset(
    {
        "UV_PYTHON",
        "UV_PYTHON_DOWNLOADS",
        "UV_PYTHON_INSTALL_DIR",
        "UV_PYTHON_BIN_DIR",
        "UV_PYTHON_PREFERENCE",
        "UV_PROJECT_ENVIRONMENT",
        "UV_SYSTEM_PYTHON",
        "UV_BREAK_SYSTEM_PACKAGES",
        "UV_LINK_MODE",
        "UV_COMPILE_BYTECODE",
        "UV_REQUIRE_HASHES",
    }
)
#: The most output of a failed step a message quotes.
_TAIL_LINES = 12


class ToolchainError(Exception):
    """A toolchain that could not be built, read or staged (a runtime failure: exit 1)."""


class StaleToolchain(ToolchainError):
    """A finished toolchain of another recipe (or an unreadable manifest) that only `--force` replaces."""


class NoRecipe(ToolchainError):
    """A spec that names no toolchain or no `[install.recipe]` to build it from (a configuration error)."""


@dataclass(frozen=True)
class Built:
    """What `build` did: the toolchain's path, its manifest and whether it was made now (False: already current)."""

    path: Path
    manifest: dict[str, Any]
    made: bool


# ---------------------------------------------------------------------------------------------- where


def toolchain_root(
    explicit: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> Path:
    """The toolchain root: `explicit`, else `$PLATOON_TOOLCHAINS` (deprecated), else the site cache's `toolchains`.

    The deprecated variable's conflict with the site profile is the caller's to refuse (`deprecated_variables`).
    """
    environ = os.environ if env is None else env
    if explicit is not None and os.fspath(explicit) != "":
        return _absolute(os.fspath(explicit))
    if environ.get("PLATOON_TOOLCHAINS"):
        return _absolute(environ["PLATOON_TOOLCHAINS"])
    site = load_site(environ)
    return site.toolchains if site is not None else default_cache_root() / "toolchains"


def _absolute(path: str) -> Path:
    return Path(os.path.normpath(os.path.abspath(os.path.expanduser(path))))


def toolchain_path(spec: HarnessSpec, root: str | os.PathLike[str]) -> Path:
    """`ROOT/NAME` for a named toolchain; the spec's own absolute path for one given as a path."""
    name = _toolchain_name(spec)
    return Path(name) if os.path.isabs(name) else _absolute(os.fspath(root)) / name


def _toolchain_name(spec: HarnessSpec) -> str:
    if spec.toolchain is None:
        raise NoRecipe(f"{spec.ref} names no toolchain ([install] toolchain)")
    return spec.toolchain


def recipe_of(spec: HarnessSpec) -> RecipeSpec:
    name = _toolchain_name(spec)
    assert spec.install is not None  # a spec naming a toolchain has [install]
    if spec.install.recipe is None:
        raise NoRecipe(f"{spec.ref} has no [install.recipe] to build its toolchain {name} from")
    return spec.install.recipe


def node_scratch(env: Mapping[str, str] | None = None) -> Path:
    """The node's scratch directory: `$PLATOON_NODE_SCRATCH`, `$PBS_LOCALDIR`, `$SLURM_TMPDIR`, `$TMPDIR`, `/tmp`."""
    environ = os.environ if env is None else env
    for name in ("PLATOON_NODE_SCRATCH", "PBS_LOCALDIR", "SLURM_TMPDIR", "TMPDIR"):
        if environ.get(name):
            return Path(environ[name])
    return Path("/tmp")


# ---------------------------------------------------------------------------------------------- identity


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def lock_sha256(recipe: RecipeSpec) -> str:
    return _file_sha256(recipe.lock)


def recipe_sha256(recipe: RecipeSpec) -> str:
    """SHA-256 of the sorted-keys JSON of `{python (as written), lock_sha256, caches, generate: {path: sha256}}`."""
    identity = {
        "python": recipe.python,
        "lock_sha256": lock_sha256(recipe),
        "caches": sorted(set(recipe.cache)),
        "generate": {path: _file_sha256(script) for path, script in recipe.generate.items()},
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def _entries(directory: Path) -> Iterator[tuple[bytes, os.DirEntry[str]]]:
    """Every entry below `directory` (symlinks not followed) with its POSIX relative path, leaving out the
    top-level manifest and every `__pycache__` directory."""
    pending: list[tuple[str, Path]] = [("", directory)]
    while pending:
        prefix, folder = pending.pop()
        with os.scandir(folder) as scan:
            for entry in scan:
                if entry.name == "__pycache__" and entry.is_dir(follow_symlinks=False):
                    continue
                if not prefix and entry.name == MANIFEST:
                    continue
                relative = f"{prefix}{entry.name}"
                yield os.fsencode(relative), entry
                if entry.is_dir(follow_symlinks=False):
                    pending.append((relative + "/", Path(entry.path)))


@dataclass(frozen=True)
class TreeSummary:
    tree_hash: str
    files: int
    bytes: int


def summarize(directory: str | os.PathLike[str]) -> TreeSummary:
    """The tree hash of a directory with its file count and total file size."""
    lines: list[bytes] = []
    files = size = 0
    for relative, entry in sorted(_entries(Path(directory)), key=lambda item: item[0]):
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            lines.append(b"l\0" + relative + b"\0" + os.fsencode(os.readlink(entry.path)))
        elif stat.S_ISDIR(info.st_mode):
            lines.append(b"d\0" + relative)
        elif stat.S_ISREG(info.st_mode):
            executable = b"x" if info.st_mode & stat.S_IXUSR else b"-"
            digest = _file_sha256(Path(entry.path)).encode()
            lines.append(b"f\0" + relative + b"\0" + digest + b"\0" + executable)
            files += 1
            size += info.st_size
        else:
            raise ToolchainError(f"{entry.path} is neither a file, a directory nor a symlink")
    total = hashlib.sha256(b"".join(line + b"\n" for line in lines)).hexdigest()
    return TreeSummary(f"sha256:{total}", files, size)


def tree_hash(directory: str | os.PathLike[str]) -> str:
    """`sha256:<hex>` over one line per entry in sorted relative-path order (directories `d\\0path`, symlinks
    `l\\0path\\0target`, files `f\\0path\\0<sha256>\\0<x|->`), without the manifest and `__pycache__` dirs."""
    return summarize(directory).tree_hash


# ---------------------------------------------------------------------------------------------- state


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of the toolchain at `path`, None when it has none; ToolchainError when it cannot be read."""
    manifest = Path(path) / MANIFEST
    try:
        text = manifest.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolchainError(f"{manifest} cannot be read: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ToolchainError(f"{manifest} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ToolchainError(f"{manifest} is not a JSON object")
    return data


@dataclass(frozen=True)
class State:
    """A toolchain as found: `current`, `missing`, `unfinished` (no manifest), `stale` (another recipe, or no
    recipe hash) or `unreadable` (the manifest), with a few words on why for the last two."""

    path: Path
    status: str
    why: str = ""
    manifest: dict[str, Any] | None = None


def state(spec: HarnessSpec, root: str | os.PathLike[str]) -> State:
    path = toolchain_path(spec, root)
    recipe = recipe_of(spec)
    if not path.exists() and not path.is_symlink():
        return State(path, "missing")
    if not path.is_dir():
        return State(path, "unreadable", "it is not a directory")
    try:
        manifest = read_manifest(path)
    except ToolchainError as exc:
        return State(path, "unreadable", str(exc))
    if manifest is None:
        return State(path, "unfinished")
    built_from = manifest.get("recipe_sha256")
    if not isinstance(built_from, str) or not built_from:
        return State(path, "stale", "its manifest has no recipe hash", manifest)
    try:
        wanted = recipe_sha256(recipe)
    except OSError as exc:
        return State(path, "unreadable", f"the recipe cannot be read: {exc}", manifest)
    if built_from != wanted:
        return State(
            path,
            "stale",
            f"it was built from another recipe ({built_from[:12]}, this one is {wanted[:12]})",
            manifest,
        )
    return State(path, "current", manifest=manifest)


def build_ref(spec: HarnessSpec) -> str:
    """How `platoon toolchain build` finds this spec: its ref when the ref resolves to this very file, else its path."""
    try:
        found = get_harness(spec.ref)
    except (ConfigError, ValueError):
        return str(spec.path)
    return spec.ref if isinstance(found, HarnessSpec) and found.path == spec.path else str(spec.path)


def build_command(spec: HarnessSpec, root: str | os.PathLike[str], *, force: bool = False) -> str:
    """`platoon toolchain build <ref> --root <root>` (`--force` for a stale one), shell-quoted."""
    argv = ["platoon", "toolchain", "build", build_ref(spec)]
    if not os.path.isabs(_toolchain_name(spec)):
        argv += ["--root", str(_absolute(os.fspath(root)))]
    if force:
        argv.append("--force")
    return shlex.join(argv)


def check(spec: HarnessSpec, root: str | os.PathLike[str]) -> str | None:
    """The line a run refuses with when the spec's toolchain is not ready to use, else None.

    A spec without `[install.recipe]` is not checked: its install commands may make the toolchain (the runner
    checks the directory after install).
    """
    if spec.toolchain is None or spec.install is None or spec.install.recipe is None:
        return None
    found = state(spec, root)
    name = spec.toolchain
    if found.status == "current":
        return None
    if found.status == "missing":
        what = f"toolchain {name} of {spec.ref} is not built ({found.path} does not exist)"
    elif found.status == "unfinished":
        what = f"toolchain {name} of {spec.ref} is unfinished ({found.path} has no {MANIFEST}: an interrupted build)"
    elif found.status == "stale":
        what = f"toolchain {name} of {spec.ref} at {found.path} is stale: {found.why}"
    else:
        what = f"toolchain {name} of {spec.ref} at {found.path} is unreadable: {found.why}"
    force = found.status in ("stale", "unreadable")
    return f"{what}; build it with: {build_command(spec, root, force=force)}"


# ---------------------------------------------------------------------------------------------- build


@contextlib.contextmanager
def _flock(path: Path, *, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive flock on `path` (created), held for the block; `waiting` is called once if another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _build_env(home: Path, tiktoken_dir: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in _KEPT_VARIABLES if os.environ.get(k)}
    env.update(
        {k: v for k, v in os.environ.items() if k.startswith("UV_") and k not in _DROPPED_UV_VARIABLES}
    )
    if "UV_CACHE_DIR" not in env:
        # The throwaway HOME would give uv an empty cache every build: keep the caller's (content-addressed).
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        env["UV_CACHE_DIR"] = os.path.join(base, "uv")
    env.update(
        {
            "HOME": str(home),
            "TIKTOKEN_CACHE_DIR": str(tiktoken_dir),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENHANDS_SUPPRESS_BANNER": "1",
        }
    )
    env.setdefault("PATH", os.defpath)
    return env


def _run_step(what: str, argv: list[str], env: Mapping[str, str], cwd: Path) -> str:
    """Run one build step; its output on success, else ToolchainError with the command and the output's tail."""
    try:
        done = subprocess.run(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        raise ToolchainError(f"{what}: cannot run {argv[0]}: {exc}") from None
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip().splitlines()
        tail = " | ".join(line.strip() for line in output[-_TAIL_LINES:] if line.strip())
        raise ToolchainError(f"{what} failed (exit {done.returncode}): {_shown(argv)}: {tail or 'no output'}")
    return done.stdout


def _shown(argv: list[str]) -> str:
    """A step's command line for a message: an inline `-c` script is shown as `-c ...`."""
    shown = [("..." if i > 0 and argv[i - 1] == "-c" else arg) for i, arg in enumerate(argv)]
    return shlex.join(shown).replace("'...'", "...")


def _version_matches(wanted: str, found: str) -> bool:
    """`3.12` matches `3.12.4`; `3.1` does not match `3.12.4` (a prefix by version parts)."""
    return found.split(".")[: len(wanted.split("."))] == wanted.split(".")


_PACKAGES_SCRIPT = (
    "import importlib.metadata as m, json, re\n"
    "out = {}\n"
    "for d in m.distributions():\n"
    "    name = d.metadata['Name']\n"
    "    if name:\n"
    "        out[re.sub(r'[-_.]+', '-', name).lower()] = d.version\n"
    "print(json.dumps(out))\n"
)
_TIKTOKEN_SCRIPT = "import sys, tiktoken\nfor name in sys.argv[1:]:\n    tiktoken.get_encoding(name)\n"


def _install_python(uv: str, recipe: RecipeSpec, work: Path, env: Mapping[str, str]) -> Path:
    """`uv python install` into a directory of its own; the single `cpython-*` directory it made."""
    install_dir = work / "python"
    argv = [uv, "python", "install", recipe.python, "--install-dir", str(install_dir), "--no-bin"]
    _run_step("uv python install", [*argv, "--compile-bytecode"], env, work)
    # uv also writes its lock and temp files and, for minor versions, a `cpython-3.N-...` symlink: skip those.
    made = [
        p
        for p in install_dir.iterdir()
        if p.name.startswith("cpython-") and p.is_dir() and not p.is_symlink()
    ]
    if len(made) != 1:
        names = ", ".join(sorted(p.name for p in install_dir.iterdir())) or "nothing"
        raise ToolchainError(f"uv python install made {names} in {install_dir}, not one cpython-* directory")
    return made[0]


def _make(
    spec: HarnessSpec, recipe: RecipeSpec, path: Path, uv: str, say: Callable[[str], None]
) -> dict[str, Any]:
    """Build into `path` (absent): every step docs/toolchains.md lists, the manifest written last."""
    wanted_recipe = recipe_sha256(recipe)
    locked = lock_sha256(recipe)
    work = Path(tempfile.mkdtemp(prefix=f".{path.name}.build-", dir=path.parent))
    try:
        home = work / "home"
        home.mkdir()
        env = _build_env(home, path / "share" / "tiktoken")
        say(f"{spec.ref}: installing CPython {recipe.python}")
        os.rename(_install_python(uv, recipe, work, env), path)
        python = path / "bin" / "python3"
        found = _run_step(
            "checking the interpreter",
            [str(python), "-I", "-c", "import platform; print(platform.python_version())"],
            env,
            work,
        ).strip()
        if not _version_matches(recipe.python, found):
            raise ToolchainError(f"uv python install {recipe.python} gave CPython {found}")
        say(f"{spec.ref}: installing {recipe.lock.name}")
        flags = ["--break-system-packages", "--require-hashes", "--compile-bytecode", "--link-mode", "copy"]
        _run_step(
            "uv pip install",
            [uv, "pip", "install", "--python", str(python), *flags, "-r", str(recipe.lock)],
            env,
            work,
        )
        caches = sorted(set(recipe.cache))
        if "tiktoken" in caches:
            say(f"{spec.ref}: warming the tiktoken encodings {', '.join(TIKTOKEN_ENCODINGS)}")
            target = path / "share" / "tiktoken"
            target.mkdir(parents=True, exist_ok=True)
            _run_step(
                "warming tiktoken",
                [str(python), "-I", "-c", _TIKTOKEN_SCRIPT, *TIKTOKEN_ENCODINGS],
                env,
                work,
            )
            if not any(target.iterdir()):
                raise ToolchainError(f"warming tiktoken left {target} empty")
        for relative, script in sorted(recipe.generate.items()):
            output = path / relative
            output.parent.mkdir(parents=True, exist_ok=True)
            _run_step(f"generating {relative}", [str(python), "-I", str(script), str(output)], env, work)
            if not output.is_file():
                raise ToolchainError(f"generating {relative}: {script.name} did not write {output}")
        packages = json.loads(
            _run_step("listing packages", [str(python), "-I", "-c", _PACKAGES_SCRIPT], env, work)
        )
        uv_version = _run_step("uv --version", [uv, "--version"], env, work).strip()
        summary = summarize(path)
        manifest = {
            "format": FORMAT,
            "name": path.name,
            "build_path": str(path),
            "spec": spec.ref,
            "python": found,
            "lock_sha256": locked,
            "recipe_sha256": wanted_recipe,
            "packages": dict(sorted(packages.items())),
            "caches": caches,
            "generated": sorted(recipe.generate),
            "tree_hash": summary.tree_hash,
            "files": summary.files,
            "bytes": summary.bytes,
            "built_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "builder": {"platoon": _platoon_version(), "uv": uv_version.removeprefix("uv ").split(" ")[0]},
        }
        partial = path / (MANIFEST + ".partial")
        partial.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        os.rename(partial, path / MANIFEST)  # last: a toolchain with a manifest is finished
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _platoon_version() -> str:
    return str(__version__)


def build(
    spec: HarnessSpec,
    root: str | os.PathLike[str],
    *,
    force: bool = False,
    uv: str | None = None,
    say: Callable[[str], None] | None = None,
) -> Built:
    """Build the spec's toolchain unless one of the same recipe is finished there."""
    recipe = recipe_of(spec)
    path = toolchain_path(spec, root)
    tell = say or (lambda _line: None)
    uv_path = uv or shutil.which("uv")
    if uv_path is None:
        raise ToolchainError("uv is not on PATH: install uv (https://docs.astral.sh/uv/) or give --uv PATH")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _flock(
        path.parent / f".{path.name}.lock", waiting=lambda: tell(f"{spec.ref}: waiting for another build")
    ):
        found = state(spec, root)
        if found.status == "current":
            assert found.manifest is not None
            return Built(path, found.manifest, made=False)
        if found.status in ("stale", "unreadable") and not force:
            raise StaleToolchain(
                f"{path} holds a toolchain that is {found.status}: {found.why}; it is replaced only on purpose: "
                f"{build_command(spec, root, force=True)}"
            )
        if found.status != "missing":
            tell(f"{spec.ref}: replacing {path} ({found.status})")
            _remove(path)
        for leftover in path.parent.glob(f".{path.name}.build-*"):  # a killed build's temp dir: ours to clear
            shutil.rmtree(leftover, ignore_errors=True)
        try:
            manifest = _make(spec, recipe, path, uv_path, tell)
        except BaseException:
            # Nothing half-built stays behind (a kill leaves a directory without a manifest, replaced next time).
            if path.exists() and not (path / MANIFEST).exists():
                shutil.rmtree(path, ignore_errors=True)
            raise
        return Built(path, manifest, made=True)


def prepare(spec: HarnessSpec, root: str | os.PathLike[str], *, dry_run: bool = False) -> tuple[str, str]:
    """The `toolchain <name>` step of `platoon prepare`: (status, detail). It never forces: a stale toolchain may be
    the one a live run is staging from, so it fails naming the `--force` command."""
    found = state(spec, root)
    if found.status == "current":
        return "current", str(found.path)
    if found.status in ("stale", "unreadable"):
        return "failed", f"{found.path} is {found.status} ({found.why}); replace it with: " + build_command(
            spec, root, force=True
        )
    if dry_run:
        return "missing", f"{found.path} would be built"
    try:
        built = build(spec, root)
    except ToolchainError as exc:
        return "failed", str(exc)
    return ("done" if built.made else "current"), f"{built.path} ({built.manifest.get('tree_hash')})"


def verify(path: str | os.PathLike[str]) -> str | None:
    """None when the toolchain at `path` still has the tree hash its manifest records, else what differs."""
    manifest = read_manifest(path)
    if manifest is None:
        return f"{path} has no {MANIFEST} (an unfinished build)"
    recorded = manifest.get("tree_hash")
    if not isinstance(recorded, str):
        return f"{path}/{MANIFEST} records no tree hash"
    now = tree_hash(path)
    return None if now == recorded else f"tree hash is {now}, the manifest records {recorded}"


# ---------------------------------------------------------------------------------------------- staging

_HEX16 = re.compile(r"^sha256:([0-9a-f]{16})")


def _fingerprint(path: Path) -> str:
    """A version for a toolchain without a tree hash: paths, modes, sizes and mtimes."""
    digest = hashlib.sha256()
    for relative, entry in sorted(_entries(path), key=lambda item: item[0]):
        info = entry.stat(follow_symlinks=False)
        digest.update(b"%s\0%o\0%d\0%d\n" % (relative, info.st_mode, info.st_size, info.st_mtime_ns))
    return digest.hexdigest()[:16]


def staging_dir(env: Mapping[str, str] | None = None) -> Path:
    """`$PLATOON_TOOLCHAIN_CACHE`, else `<node scratch>/platoon-toolchains-<uid>`."""
    environ = os.environ if env is None else env
    if environ.get("PLATOON_TOOLCHAIN_CACHE"):
        return Path(environ["PLATOON_TOOLCHAIN_CACHE"])
    return node_scratch(environ) / f"platoon-toolchains-{os.getuid()}"


def stage(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Path:
    """The node-local copy of the toolchain at `path`, made once per version under an exclusive flock.

    The copy goes to `<name>-<version>.partial`, is checked against the manifest's tree hash, then renamed, so a
    directory under the final name is always complete: later rollouts use it without taking the lock.
    """
    source = Path(path)
    manifest = read_manifest(source)
    recorded = manifest.get("tree_hash") if manifest is not None else None
    match = _HEX16.match(recorded) if isinstance(recorded, str) else None
    version = match.group(1) if match else _fingerprint(source)
    cache = staging_dir(env)
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = cache / f"{source.name}-{version}"
    if final.is_dir():
        return final
    with _flock(cache / f".{final.name}.lock"):
        if final.is_dir():  # staged by whoever held the lock before us
            return final
        partial = cache / f"{final.name}.partial"
        _remove(partial)  # a copy a killed stager left: the lock is ours, so nobody is writing it
        try:
            shutil.copytree(source, partial, symlinks=True)
            if match is not None and (now := tree_hash(partial)) != recorded:
                raise ToolchainError(
                    f"staging {source}: the copy's tree hash is {now}, the manifest records {recorded} "
                    f"(the toolchain changed since it was built: `platoon toolchain verify` names it)"
                )
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        os.rename(partial, final)
    return final
