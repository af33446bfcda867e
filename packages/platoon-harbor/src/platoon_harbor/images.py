"""Harbor task images, built once per site: build plans, content-addressed build keys, the image
map of a provider, the `docker` builder, and the image a session opens on.

- **Plan**: a task either names a prebuilt `[environment].docker_image` (kind `prebuilt`), has an
  `environment/Dockerfile` (a build key; `shared` when other tasks have the same key, else `per_task`), or neither
  (`none`: the service's default image). This build plans the whole Dockerfile as the prefix (no deferred suffix):
  the key covers every instruction and every file of the build context, so a change to any of them is a new image,
  and tasks whose Dockerfiles and contexts are equal share one. A separate verifier without its own
  `docker_image` whose `tests/Dockerfile` exists gets a key of its own (role `verifier`, context `tests/`).
- **Build key** (`platoon-buildkey-v1`): `sha256:` of the compact sorted JSON `{rule, directives, prefix, context,
  dockerignore}` — parser directives, the normalized instructions (heredoc bodies included), `[path, sha256,
  executable]` of every file of the context, and the `.dockerignore` hash. Remote `ADD` sources count as written:
  planning reads no network.
- **Image map** (version 1, `<harbor cache>/images/<provider>.json`): `{"version": 1, "images": {key: entry}}`,
  updated under a flock with an atomic rename. A key in the map is never built again; a changed task has a new key.
- **Builders**: `docker` (the docker CLI, `$PLATOON_DOCKER`: BuildKit when the client can use the daemon's own, else
  the classic builder; images tagged `platoon-harbor:<first 32 hex of the key>`), and `alias` (keys pointed at an
  existing image, `local` for the process provider). `ADD` of a git repository is cloned on the host into a copy of
  the context and copied from there, because dockerd 20.10's built-in Dockerfile frontend cannot fetch git sources
  and a `# syntax=` frontend would be pulled from a registry. A failed build leaves nothing behind: no container,
  no image of the steps that ran, no scratch directory; only its log, which the error names.
- **Runs never build**: `image_for` answers from the map and raises `EnvNotPrepared` for a key it lacks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from platoon.envs.service import EnvNotPrepared

BUILD_KEY_RULE = "platoon-buildkey-v1"
MAP_VERSION = 1
#: the repository of the images the docker builder tags (`platoon-harbor:<32 hex>`)
IMAGE_REPOSITORY = "platoon-harbor"
#: where the git sources of `ADD <git repo>` go inside the copied build context
REMOTE_DIR = ".platoon-remote"
DEFAULT_TIMEOUT_S = 3600.0

#: provider -> its default builder; other providers have none (`--builder docker --push` or `alias`)
DEFAULT_BUILDERS = {"docker": "docker", "singularity": "oci", "apptainer": "oci", "process": "alias"}
#: builders this build runs; `oci` (SingularityCE) and `def` cannot run on this kind of machine
RUNNABLE_BUILDERS = ("docker", "alias")

_DIRECTIVE = re.compile(r"^#\s*([A-Za-z]+)\s*=\s*(.*?)\s*$")
_HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-+][^}]*)?\}|([A-Za-z_][A-Za-z0-9_]*))")
#: instructions a Dockerfile may hold (anything else makes the plan fail)
_KNOWN = frozenset(
    [
        "ADD",
        "ARG",
        "CMD",
        "COPY",
        "ENTRYPOINT",
        "ENV",
        "EXPOSE",
        "FROM",
        "HEALTHCHECK",
        "LABEL",
        "MAINTAINER",
        "ONBUILD",
        "RUN",
        "SHELL",
        "STOPSIGNAL",
        "USER",
        "VOLUME",
        "WORKDIR",
    ]
)
#: Docker's own Dockerfile frontend, the one `# syntax=` directive the builders drop rather than refuse
_DOCKER_FRONTEND = re.compile(r"^(docker\.io/)?docker/dockerfile:1(\.[0-9]+)*(-labs)?$")


class ImageError(Exception):
    """A task's image cannot be planned or built; the message is one line."""


# ----------------------------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class TaskSource:
    """What images need of a Harbor task: its id, its directory and the prebuilt image its task.toml names."""

    id: str
    path: Path
    docker_image: str | None = None
    #: `environment` (the task's own image) or `verifier` (a separate verifier's, built from `tests/Dockerfile`)
    role: str = "environment"

    @property
    def environment(self) -> Path:
        return self.path / "environment"

    @property
    def context(self) -> Path:
        """The build context: `environment/`, or `tests/` for a verifier image."""
        return self.environment if self.role == "environment" else self.path / "tests"

    @property
    def dockerfile(self) -> Path:
        return self.context / "Dockerfile"


def task_source(task: Any, task_id: str | None = None) -> TaskSource:
    """A `TaskSource` from a task directory path or a task object with a directory (`path`, `task_dir` or `dir`)
    and an id (`id`, `task_id` or `name`); the prebuilt image is the object's `docker_image` when it has one, else
    read from the directory's task.toml `[environment].docker_image`."""
    if isinstance(task, TaskSource):
        return task
    if isinstance(task, str | os.PathLike):
        path = Path(task)
        found: Any = None
    else:
        found = next((getattr(task, a) for a in ("path", "task_dir", "dir") if getattr(task, a, None)), None)
        if found is None:
            raise ImageError(f"{task!r} has no task directory (path, task_dir or dir)")
        path = Path(found)
    name = task_id or next(
        (str(getattr(task, a)) for a in ("id", "task_id", "name") if getattr(task, a, None)), path.name
    )
    image = getattr(task, "docker_image", None) if found is not None else None
    if image is None:
        environment = getattr(task, "environment", None)
        image = getattr(environment, "docker_image", None)
    if image is None:
        image = _toml_docker_image(path)
    return TaskSource(name, path, str(image) if image else None)


def _task_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path / "task.toml", "rb") as handle:
            return tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError):
        return {}  # the task loader reports a broken task.toml; images only need the key


def _toml_docker_image(path: Path) -> str | None:
    environment = _task_toml(path).get("environment")
    image = environment.get("docker_image") if isinstance(environment, dict) else None
    return image if isinstance(image, str) and image else None


def verifier_source(task: Any) -> TaskSource | None:
    """The separate verifier's image source of a task, when it is built from `tests/Dockerfile` (6.1: a separate
    verifier without `[verifier.environment].docker_image`); else None (the verifier uses another image)."""
    source = task_source(task)
    verifier = _task_toml(source.path).get("verifier")
    verifier = verifier if isinstance(verifier, dict) else {}
    environment = verifier.get("environment")
    separate = verifier.get("environment_mode") == "separate" or isinstance(environment, dict)
    if not separate or (isinstance(environment, dict) and environment.get("docker_image")):
        return None
    built = TaskSource(source.id, source.path, None, role="verifier")
    return built if built.dockerfile.is_file() else None


# ------------------------------------------------------------------------------------------ Dockerfiles


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str  # as written, continuation lines joined, heredoc bodies appended after a newline
    heredoc: bool = False

    @property
    def text(self) -> str:
        return f"{self.keyword} {self.args}".rstrip()


@dataclass(frozen=True)
class Remote:
    """A remote `ADD` source: `kind` is `url` or `git`; `index` is the instruction's position."""

    index: int
    kind: str
    source: str


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Instruction]]:
    """(parser directives, instructions): comment lines dropped, continuation lines joined, heredoc bodies kept."""
    lines = text.splitlines()
    directives: dict[str, str] = {}
    position = 0
    while position < len(lines):
        match = _DIRECTIVE.match(lines[position])
        if match is None or match.group(1).lower() in directives:
            break
        directives[match.group(1).lower()] = match.group(2)
        position += 1
    escape = directives.get("escape", "\\")
    instructions: list[Instruction] = []
    current: list[str] = []
    while position < len(lines):
        raw = lines[position]
        position += 1
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith(escape):
            current.append(stripped[: -len(escape)].strip())
            continue
        current.append(stripped)
        logical = " ".join(part for part in current if part)
        current = []
        keyword, _, args = logical.partition(" ")
        keyword = keyword.upper()
        bodies: list[str] = []
        for heredoc in _HEREDOC.finditer(args) if keyword in ("RUN", "COPY", "ADD") else ():
            terminator, strip_tabs = heredoc.group(3), heredoc.group(1) == "-"
            body: list[str] = []
            while position < len(lines):
                line = lines[position]
                position += 1
                if (line.lstrip("\t") if strip_tabs else line) == terminator:
                    break
                body.append(line)
            else:
                raise ImageError(f"heredoc {terminator} is never terminated")
            bodies.append("\n".join([*body, terminator]))
        args = "\n".join([args.strip(), *bodies])
        instructions.append(Instruction(keyword, args, heredoc=bool(bodies)))
    if current:
        logical = " ".join(part for part in current if part)
        keyword, _, args = logical.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
    return directives, instructions


def _split_args(args: str) -> tuple[list[str], list[str]]:
    """(flags, operands) of a COPY/ADD: the JSON array form or whitespace-separated words."""
    words = args.split("\n", 1)[0].split()
    flags = [w for w in words if w.startswith("--")]
    rest = args.split("\n", 1)[0].strip()
    for flag in flags:
        rest = rest.replace(flag, "", 1)
    rest = rest.strip()
    if rest.startswith("["):
        try:
            operands = json.loads(rest)
        except json.JSONDecodeError:
            operands = rest.split()
        if isinstance(operands, list) and all(isinstance(o, str) for o in operands):
            return flags, operands
    return flags, rest.split()


def _expand(text: str, variables: Mapping[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return variables.get(name, "")

    return _VARIABLE.sub(value, text)


def classify_source(source: str) -> str:
    """`git`, `url` or `context`, as BuildKit classifies an ADD source: `git://`, `ssh://`, `user@host:path` or an
    http(s) URL ending `.git` (before any `#ref`) is a git repository; another http(s) URL is a URL; anything else
    (`ftp://...`, a bare `github.com/...`) is a context path."""
    bare = source.split("#", 1)[0]
    if source.startswith(("git://", "ssh://", "git@")) or re.match(r"^[\w.-]+@[\w.-]+:", source):
        return "git"
    if re.match(r"^https?://", source):
        return "git" if bare.endswith(".git") else "url"
    return "context"


# ------------------------------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class ImagePlan:
    """A task's image plan: `kind` none | prebuilt | build (`shared`/`per_task` is a property of a collection)."""

    task: TaskSource
    kind: str
    key: str | None = None
    ref: str | None = None
    bases: tuple[str, ...] = ()
    remotes: tuple[Remote, ...] = ()
    directives: Mapping[str, str] = field(default_factory=dict)
    problem: str | None = None  # an unplannable Dockerfile: the task is refused ("image: ...")

    @property
    def tag(self) -> str | None:
        return docker_tag(self.key) if self.key else None


def docker_tag(key: str) -> str:
    return f"{IMAGE_REPOSITORY}:{key_hex(key)[:32]}"


def key_hex(key: str) -> str:
    return key.removeprefix("sha256:")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def context_entries(root: Path) -> list[list[Any]]:
    """`[path, sha256, executable]` for every file under the build context, in sorted POSIX path order; a symlink
    is `[path, "link:<target>", false]` (the context sends it as a link)."""
    entries: list[list[Any]] = []
    for directory, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(directory) / name
            relative = path.relative_to(root).as_posix()
            if path.is_symlink():
                entries.append([relative, f"link:{os.readlink(path)}", False])
            else:
                entries.append([relative, file_sha256(path), bool(path.stat().st_mode & 0o100)])
    return sorted(entries, key=lambda entry: entry[0])


def plan_task(task: Any) -> ImagePlan:
    """The image plan of one task (no network, no Docker): its build key and what the key covers."""
    source = task_source(task)
    if not source.dockerfile.is_file():
        if source.docker_image:
            return ImagePlan(source, "prebuilt", ref=source.docker_image)
        return ImagePlan(source, "none")
    try:
        return _plan_dockerfile(source)
    except (ImageError, OSError, UnicodeDecodeError) as exc:
        return ImagePlan(source, "build", problem=f"image: {exc}")


def _plan_dockerfile(source: TaskSource) -> ImagePlan:
    directives, instructions = parse_dockerfile(source.dockerfile.read_text(encoding="utf-8"))
    syntax = directives.get("syntax")
    if syntax is not None and not _DOCKER_FRONTEND.match(syntax):
        raise ImageError(f"the frontend {syntax} (# syntax=) is not Docker's own Dockerfile frontend")
    if not instructions:
        raise ImageError("the Dockerfile has no instructions")
    if instructions[0].keyword not in ("FROM", "ARG"):
        raise ImageError(f"the Dockerfile starts with {instructions[0].keyword}, not FROM or ARG")
    unknown = sorted({i.keyword for i in instructions} - _KNOWN)
    if unknown:
        raise ImageError(f"unknown instruction {unknown[0]}")
    variables: dict[str, str] = {}
    bases: list[str] = []
    stages: set[str] = set()
    remotes: list[Remote] = []
    for index, instruction in enumerate(instructions):
        if instruction.keyword in ("ARG", "ENV"):
            for word in instruction.args.split():
                name, sep, value = word.partition("=")
                if sep:
                    variables[name] = value.strip("\"'")
        elif instruction.keyword == "FROM":
            words = [w for w in instruction.args.split() if not w.startswith("--")]
            if not words:
                raise ImageError("FROM names no image")
            base = _expand(words[0], variables)
            if base.lower() not in stages:
                bases.append(base)
            if len(words) >= 3 and words[1].upper() == "AS":
                stages.add(words[2].lower())
        elif instruction.keyword in ("ADD", "COPY"):
            flags, operands = _split_args(instruction.args)
            if any(f.startswith("--from") for f in flags):
                continue  # another stage or image: the key covers it as written
            for operand in operands[:-1]:
                kind = classify_source(_expand(operand, variables))
                if kind == "context":
                    continue
                if instruction.keyword == "COPY":
                    raise ImageError(f"COPY of the remote source {operand} (only ADD fetches)")
                remotes.append(Remote(index, kind, _expand(operand, variables)))
    if not bases:
        raise ImageError("the Dockerfile has no FROM")
    dockerignore = source.context / ".dockerignore"
    payload = {
        "rule": BUILD_KEY_RULE,
        "directives": dict(sorted(directives.items())),
        "prefix": [instruction.text for instruction in instructions],
        "context": context_entries(source.context),
        "dockerignore": file_sha256(dockerignore) if dockerignore.is_file() else None,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    key = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
    return ImagePlan(
        source, "build", key=key, bases=tuple(bases), remotes=tuple(remotes), directives=directives
    )


@dataclass
class KeyPlan:
    """One build key of a collection: the tasks that share it and their bases."""

    key: str
    tasks: list[str]
    bases: tuple[str, ...]
    example: ImagePlan

    @property
    def kind(self) -> str:
        return "shared" if len(self.tasks) > 1 else "per_task"


def plan_tasks(tasks: Iterable[Any]) -> tuple[list[ImagePlan], dict[str, KeyPlan]]:
    """Plans of every task (and of each separate verifier built from `tests/Dockerfile`), and the build keys they
    need (sorted by key)."""
    plans: list[ImagePlan] = []
    for task in tasks:
        source = task_source(task)
        plans.append(plan_task(source))
        verifier = verifier_source(source)
        if verifier is not None:
            plans.append(plan_task(verifier))
    keys: dict[str, KeyPlan] = {}
    for plan in plans:
        if plan.key is None:
            continue
        if plan.key in keys:
            keys[plan.key].tasks.append(plan.task.id)
        else:
            keys[plan.key] = KeyPlan(plan.key, [plan.task.id], plan.bases, plan)
    return plans, dict(sorted(keys.items()))


# ------------------------------------------------------------------------------------------------- maps


def default_map_path(cache: str | os.PathLike[str], provider: str) -> Path:
    """`<harbor cache>/images/<provider>.json` (the provider name sanitised for a file name)."""
    return Path(cache) / "images" / f"{sanitize(provider)}.json"


def sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "provider"


class ImageMap:
    """The image map of one provider: reads are plain, updates flock-protected read-modify-atomic-write."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(f".{self.path.name}.lock")

    @property
    def files(self) -> Path:
        """`images/<provider>/`: build logs and key locks live here."""
        return self.path.with_suffix("")

    def read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ImageError(f"{self.path}: unreadable image map ({exc})") from None
        if (
            not isinstance(data, dict)
            or data.get("version") != MAP_VERSION
            or not isinstance(data.get("images"), dict)
        ):
            raise ImageError(f"{self.path}: not an image map of version {MAP_VERSION}")
        return data["images"]

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def update(self, changes: Mapping[str, dict[str, Any] | None]) -> None:
        """Set (or, for None, remove) entries by key, atomically, under the map's lock."""
        with self._locked(self.lock_path):
            images = self.read()
            for key, entry in changes.items():
                if entry is None:
                    images.pop(key, None)
                else:
                    images[key] = entry
            text = json.dumps({"version": MAP_VERSION, "images": dict(sorted(images.items()))}, indent=2)
            fd, temporary = tempfile.mkstemp(
                dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp"
            )
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(text + "\n")
                os.replace(temporary, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise

    @contextlib.contextmanager
    def building(self, key: str) -> Iterator[None]:
        """The flock one key is built under (`images/<provider>/.<32 hex>.lock`), so concurrent prepares build a
        key once: the second finds it in the map when it gets the lock."""
        with self._locked(self.files / f".{key_hex(key)[:32]}.lock"):
            yield


# -------------------------------------------------------------------------------------------- builders


def docker_binary() -> str:
    return os.environ.get("PLATOON_DOCKER") or "docker"


def _docker(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [docker_binary(), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise ImageError(f"the docker CLI ({docker_binary()}) is not installed; set PLATOON_DOCKER") from None
    except subprocess.TimeoutExpired:
        raise ImageError(
            f"`{docker_binary()} {' '.join(args[:2])}` did not answer in {timeout:.0f} s"
        ) from None


def engine_images(repository: str = IMAGE_REPOSITORY) -> dict[str, str]:
    """`repo:tag -> image id` of the engine's images of `repository`, in one call."""
    result = _docker("images", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}", repository)
    if result.returncode != 0:
        raise ImageError(f"the Docker engine does not answer: {result.stderr.strip().splitlines()[-1:]}")
    found: dict[str, str] = {}
    for line in result.stdout.splitlines():
        name, _, image_id = line.partition(" ")
        if image_id:
            found[name] = image_id.strip()
    return found


def present_keys(images: Mapping[str, Mapping[str, Any]], keys: Iterable[str]) -> set[str]:
    """The keys whose map entries still stand for an image: a docker entry whose image the engine still has (by
    id), an alias, or an entry whose local image file exists with its recorded size."""
    wanted = [key for key in keys if key in images]
    engine: dict[str, str] | None = None
    present: set[str] = set()
    for key in wanted:
        entry = images[key]
        builder = entry.get("builder")
        if builder == "alias":
            present.add(key)
        elif builder == "docker":
            if engine is None:
                engine = engine_images()
            if engine.get(str(entry.get("image"))) == entry.get("sha256"):
                present.add(key)
        else:
            path = Path(str(entry.get("image", "")))
            size = (entry.get("receipt") or {}).get("size_bytes")
            if path.is_file() and (size is None or path.stat().st_size == size):
                present.add(key)
    return present


_BUILDKIT: dict[str, bool] = {}
_NO_BUILDKIT = ("buildx component is missing", "BuildKit is enabled but", "unknown flag: --iidfile")


@dataclass
class BuildResult:
    key: str
    status: str  # built | skipped | failed
    detail: str = ""
    entry: dict[str, Any] | None = None


def _stage_context(plan: ImagePlan, scratch: Path) -> tuple[Path, Path]:
    """(context, Dockerfile) to build from: the task's own, or, when the Dockerfile ADDs a git repository, a copy
    whose Dockerfile COPYs each repository from a clone made here on the host."""
    environment = plan.task.context
    gits = [remote for remote in plan.remotes if remote.kind == "git"]
    directives = {k: v for k, v in plan.directives.items() if k != "syntax"}
    if not gits and "syntax" not in plan.directives:
        return environment, plan.task.dockerfile
    context = scratch / "context"
    shutil.copytree(environment, context, symlinks=True)
    _, instructions = parse_dockerfile(plan.task.dockerfile.read_text(encoding="utf-8"))
    for number, remote in enumerate(gits):
        target = context / REMOTE_DIR / str(number)
        _clone(remote.source, target)
        instruction = instructions[remote.index]
        flags, operands = _split_args(instruction.args)
        kept = [f for f in flags if f.startswith(("--chown", "--chmod"))]
        # ADD of several sources with one git repository among them keeps the others as they were written
        others = [o for o in operands[:-1] if o != remote.source and classify_source(o) != "git"]
        sources = [f"{REMOTE_DIR}/{number}/", *others]
        instructions[remote.index] = Instruction(
            "COPY" if not others else "ADD", " ".join([*kept, *sources, operands[-1]])
        )
    lines = [f"# {k}={v}" for k, v in directives.items()] + [i.text for i in instructions]
    dockerfile = scratch / "Dockerfile"
    dockerfile.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return context, dockerfile


def _clone(source: str, target: Path) -> None:
    """`url[#ref[:subdir]]` into `target`, without its .git directory (as BuildKit's ADD keeps none)."""
    url, _, fragment = source.partition("#")
    ref, _, subdir = fragment.partition(":")
    checkout = target.with_name(target.name + ".git")
    command = ["git", "clone", "--quiet", "--no-checkout", url, str(checkout)]
    try:
        for args in (command, ["git", "-C", str(checkout), "checkout", "--quiet", ref or "HEAD"]):
            result = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
            if result.returncode != 0:
                raise ImageError(f"git could not fetch {source}: {result.stderr.strip()[-300:]}")
    except FileNotFoundError:
        raise ImageError(f"ADD {source} needs git on this host") from None
    shutil.rmtree(checkout / ".git")
    found = checkout / subdir if subdir else checkout
    if not found.is_dir():
        raise ImageError(f"{source}: no directory {subdir} in the repository")
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(found, target)
    shutil.rmtree(checkout, ignore_errors=True)


def _run_build(argv: list[str], env: dict[str, str], log: Path, timeout: float) -> int:
    """Run one `docker build`, its output into `log`. An interrupt (SIGINT/SIGTERM) stops the client first, which
    cancels the daemon's build: nothing is tagged and the map is not written, so the next prepare builds it."""
    with open(log, "ab") as handle:
        process = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            handle.write(f"\nplatoon: the build ran past {timeout:.0f} s and was stopped\n".encode())
            return -1
        except BaseException:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            raise


#: the classic builder's log: a step that ran ends with its new image's id
_CLASSIC_STEP_IMAGE = re.compile(
    r"^Removing intermediate container \S+\n ---> ([0-9a-f]{12,64})$", re.MULTILINE
)


def _read_from(log: Path, offset: int) -> str:
    with open(log, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace")


def _remove_step_images(output: str) -> None:
    """Remove the untagged images a failed classic build made for the steps that ran (its cache hits and base
    images are not among them), newest first; one still in use elsewhere is left (docker refuses it)."""
    for image_id in reversed(_CLASSIC_STEP_IMAGE.findall(output)):
        _docker("image", "rm", "--no-prune", image_id)


def docker_build(
    plan: ImagePlan, image_map: ImageMap, *, scratch: Path | None = None, timeout: float
) -> dict:
    """Build one key with the docker CLI and return its map entry (raises ImageError with the log's tail)."""
    assert plan.key is not None
    tag = docker_tag(plan.key)
    logs = image_map.files / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{key_hex(plan.key)[:32]}.log"
    log.write_bytes(b"")
    binary = docker_binary()
    root = Path(scratch) if scratch is not None else node_scratch()
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="platoon-harbor-build-", dir=root) as work:
        context, dockerfile = _stage_context(plan, Path(work))
        # --network host: BuildKit RUN steps need a network the engine has (a bridgeless dockerd has none); the
        # classic builder takes it too, and Harbor task builds expect the host's network (apt, pip).
        common = ["build", "--network", "host", "--iidfile", str(Path(work) / "iid"), "-t", tag]
        common += ["-f", str(dockerfile), str(context)]
        # DOCKER_BUILDKIT, when set, chooses; else BuildKit first, the classic builder when this client has none.
        chosen = os.environ.get("DOCKER_BUILDKIT")
        if chosen is not None:
            modes = [chosen.strip().lower() in ("1", "true")]
        else:
            modes = [True, False] if _BUILDKIT.get(binary, True) else [False]
        code = 1
        used_buildkit = False
        for buildkit in modes:
            env = dict(os.environ, DOCKER_BUILDKIT="1" if buildkit else "0")
            # The classic builder keeps a failed step's container unless told otherwise (BuildKit keeps none).
            argv = [binary, *common] if buildkit else [binary, "build", "--force-rm", *common[1:]]
            logged = log.stat().st_size
            code = _run_build(argv, env, log, timeout)
            if not buildkit and code != 0:
                _remove_step_images(_read_from(log, logged))
            if buildkit and code != 0 and any(s in log.read_text(errors="replace") for s in _NO_BUILDKIT):
                _BUILDKIT[binary] = (
                    False  # this client cannot reach BuildKit: the classic builder from now on
                )
                with open(log, "a") as handle:
                    handle.write(
                        "platoon: this docker client has no BuildKit; building with the classic builder\n"
                    )
                continue
            used_buildkit = buildkit
            break
        if code != 0:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
            raise ImageError(f"docker build failed ({code}); log {log}: {tail}")
        image_id = (Path(work) / "iid").read_text().strip()
    seconds = time.monotonic() - started
    inspected = _docker("image", "inspect", image_id)
    if inspected.returncode != 0:
        raise ImageError(f"the built image {image_id} cannot be inspected: {inspected.stderr.strip()}")
    config = (json.loads(inspected.stdout)[0].get("Config") or {}) if inspected.stdout.strip() else {}
    size = json.loads(inspected.stdout)[0].get("Size")
    version = _docker("version", "--format", "{{.Client.Version}}/{{.Server.Version}}")
    return {
        "image": tag,
        "sha256": image_id,
        "builder": "docker",
        "env": list(config.get("Env") or []),
        "workdir": config.get("WorkingDir") or None,
        "user": config.get("User") or None,
        "entrypoint": config.get("Entrypoint"),
        "cmd": config.get("Cmd"),
        "receipt": {
            "builder_version": f"docker {version.stdout.strip() or 'unknown'} "
            + ("buildkit" if used_buildkit else "classic"),
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "seconds": round(seconds, 3),
            "log": str(log),
            "size_bytes": size,
            "bases": list(plan.bases),
            "base_digests": [None] * len(plan.bases),  # no registry here: bases build as written
            "example_task": plan.task.id,
            "role": plan.task.role,
        },
    }


def alias_entry(image: str, plan: ImagePlan) -> dict[str, Any]:
    return {
        "image": image,
        "sha256": None,
        "builder": "alias",
        "env": [],
        "workdir": None,
        "user": None,
        "entrypoint": None,
        "cmd": None,
        "receipt": {
            "builder_version": "alias",
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "seconds": 0.0,
            "log": None,
            "bases": list(plan.bases),
            "example_task": plan.task.id,
            "role": plan.task.role,
        },
    }


def node_scratch() -> Path:
    for name in ("PLATOON_NODE_SCRATCH", "PBS_LOCALDIR", "SLURM_TMPDIR", "TMPDIR"):
        value = os.environ.get(name)
        if value:
            return Path(value)
    return Path("/tmp")


def build_keys(
    keys: Sequence[KeyPlan],
    image_map: ImageMap,
    *,
    builder: str,
    force: bool = False,
    alias: str | None = None,
    scratch: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    progress: Callable[[int, int, KeyPlan, str], None] | None = None,
) -> list[BuildResult]:
    """Build (or alias) each key the map lacks, each under its own flock; a key another build added meanwhile is
    skipped. `force` rebuilds keys that are present. Failures are reported per key; the rest go on."""
    if builder not in RUNNABLE_BUILDERS:
        raise ImageError(
            f"the {builder} builder is not available in this build (it needs SingularityCE); "
            "use --builder docker, or `platoon harbor images alias`"
        )
    results: list[BuildResult] = []
    for number, plan in enumerate(keys, 1):
        with image_map.building(plan.key):
            images = image_map.read()
            if not force and plan.key in present_keys(images, [plan.key]):
                results.append(BuildResult(plan.key, "skipped", "already in the map", images[plan.key]))
                continue
            if progress is not None:
                progress(number, len(keys), plan, "building")
            try:
                if builder == "alias":
                    entry = alias_entry(alias or "local", plan.example)
                else:
                    entry = docker_build(plan.example, image_map, scratch=scratch, timeout=timeout)
            except ImageError as exc:
                results.append(BuildResult(plan.key, "failed", str(exc)))
                continue
            image_map.update({plan.key: entry})
            results.append(BuildResult(plan.key, "built", entry["image"], entry))
    return results


# ----------------------------------------------------------------------------------------- at session open


def image_for(
    task: Any,
    provider: str,
    cache: str | os.PathLike[str] | None = None,
    *,
    image_map: str | os.PathLike[str] | None = None,
    default: str | None = None,
    role: str = "environment",
) -> str:
    """The image a session of `task` opens on with `provider`: its map entry's image for a Dockerfile task (the
    map is `image_map`, else `<cache>/images/<provider>.json`), its `docker_image` for a prebuilt one, else
    `default`. Raises `EnvNotPrepared` when the map lacks the task's key: runs never build. `role="verifier"`
    asks for a separate verifier's image built from `tests/Dockerfile` (see `verifier_source`)."""
    if role == "verifier":
        source = verifier_source(task)
        if source is None:
            raise EnvNotPrepared(
                f"task {task_source(task).id} has no separate verifier built from tests/Dockerfile"
            )
        plan = plan_task(source)
    else:
        plan = plan_task(task)
    if plan.kind == "prebuilt" and plan.ref:
        return plan.ref
    if plan.kind == "none":
        if default:
            return default
        raise EnvNotPrepared(
            f"task {plan.task.id} has no Dockerfile and no docker_image, and no default_image is set"
        )
    if plan.problem is not None:
        raise EnvNotPrepared(f"task {plan.task.id}: {plan.problem}")
    assert plan.key is not None
    if image_map is None:
        if cache is None:
            raise EnvNotPrepared(
                f"task {plan.task.id}: no image map (neither image_map nor a cache is given)"
            )
        image_map = default_map_path(cache, provider)
    try:
        entry = ImageMap(image_map).read().get(plan.key)
    except ImageError as exc:
        raise EnvNotPrepared(str(exc)) from None
    if entry is None:
        what = "its verifier image" if role == "verifier" else "its image"
        raise EnvNotPrepared(
            f"task {plan.task.id}: {what} {plan.key[:19]} is not built for the {provider} provider "
            f"(map {image_map}); run `platoon prepare CONFIG`"
        )
    image = str(entry["image"])
    if entry.get("builder") not in ("docker", "alias") and not os.path.isabs(image):
        image = str(Path(image_map).parent / image)  # relative image files resolve against the map
    return image


def plan_for_lock(task_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The `image` record of a lock's task row: `kind` none | prebuilt | per_task (a fetch that
    sees several tasks with one key may call them `shared`), `key`, `deferred` (always empty: this build plans the
    whole Dockerfile), `base`, `notes`, `ref` for a prebuilt image, `upload_environment`, and `refused` (`image:
    ...`) for a Dockerfile that cannot be planned."""
    plan = plan_task(Path(task_dir))
    environment = plan.task.environment
    record: dict[str, Any] = {
        "kind": {"build": "per_task"}.get(plan.kind, plan.kind),
        "key": plan.key,
        "deferred": [],
        "base": plan.bases[0] if plan.bases else None,
        "notes": [f"ADD {r.kind} {r.source}" for r in plan.remotes],
        "upload_environment": plan.kind == "prebuilt" and environment.is_dir() and any(environment.iterdir()),
    }
    if plan.ref is not None:
        record["ref"] = plan.ref
    if plan.problem is not None:
        record["refused"] = plan.problem
    return record
