"""Harbor task directories and the task ids of a local dataset directory.

The API the rest of platoon-harbor builds on:

- `read_task(path)` parses one task directory into a `HarborTask` without policy refusals: it raises `TaskRefused`
  only for what no entry can ever run (unreadable or malformed `task.toml`, a missing `instruction.md`, multi-step
  tasks, non-Linux tasks, verifier `collect` hooks (schema 1.3's `collect = []` asks for none and passes),
  artifacts with `..` or from another service, a separate verifier with `tests/docker-compose.yaml`). Compose stacks and `[agent]`/`[verifier]` users are recorded (`stack`,
  `agent_user`, `verifier_user`) so a fetch can record them as flags.
- `task_refusal(task, agent_user=...)` returns the load-time refusal of 6.1 that depends on the entry (a compose stack
  with sidecars, a task user unless `agent_user: ignore`), or None. `load_task` = `read_task` plus this check, raising.
- `resolve_env(mapping, passed=..., what=...)` resolves `${VAR}` / `${VAR:-default}` values from the host
  environment, reading only the variables the run passes on (`service_kwargs.pass_env`); it is called at session
  open (never at load). A variable not passed takes its default or raises `VariableNotPassed` (the run start
  refuses such a task first: `unpassed_variables`); a passed one the host does not set raises `UnsetVariable`.
- `discover_tasks(root)` maps task ids to directories (a `registry.json`, else a scan); `task_dirs_ids(dirs)` names
  an explicit list of task directories; `load_splits(spec, root, ids)` reads a `splits:` manifest, and
  `dataset_splits(root)` the dataset's own `splits.json` (what a service lists when no `splits:` is given).

Refusals carry a `kind` (the part of the lock's `refused` string before the first colon): `task_config` for
everything here.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from platoon.errors import ConfigError
from platoon_sandbox.egress import allowed_host_problem

__all__ = [
    "SPLITS_FILE",
    "AgentSettings",
    "Artifact",
    "EnvironmentSettings",
    "HarborTask",
    "HealthCheck",
    "McpServer",
    "TaskRefused",
    "UnsetVariable",
    "VariableNotPassed",
    "VerifierSettings",
    "dataset_splits",
    "discover_tasks",
    "ignored_users",
    "load_splits",
    "load_task",
    "parse_memory_mb",
    "read_splits_manifest",
    "read_task",
    "resolve_env",
    "runnable_splits",
    "strip_canary",
    "task_dirs_ids",
    "task_refusal",
    "unpassed_variables",
]

NetworkMode = Literal["public", "allowlist", "no-network"]
Stack = Literal["single", "trivial", "sidecars"]

COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
_NETWORK_MODES = ("public", "allowlist", "no-network")
_TRANSPORTS = {
    "stdio": "stdio",
    "sse": "sse",
    "streamable-http": "streamable-http",
    "http": "streamable-http",
}


class TaskRefused(ConfigError):
    """A task platoon does not run (exit 78 where it stops a run); `kind` heads the lock's `refused` string."""

    def __init__(self, task: str | Path, reason: str, *, kind: str = "task_config") -> None:
        self.task = str(task)
        self.reason = reason
        self.kind = kind
        super().__init__(f"Harbor task {self.task}: {reason}")

    @property
    def refused(self) -> str:
        """The lock's form: `<kind>: <reason>`."""
        return f"{self.kind}: {self.reason}"


class UnsetVariable(ConfigError):
    """A `${VAR}` without a default whose variable the host environment does not set."""

    def __init__(self, variable: str, what: str) -> None:
        self.variable = variable
        super().__init__(
            f"{what}: the host environment does not set {variable} (and no ${{{variable}:-default}})"
        )


@dataclass(frozen=True)
class HealthCheck:
    """`[environment.healthcheck]`, with Docker's meaning of each field."""

    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3

    @property
    def budget_s(self) -> float:
        """The longest a healthcheck may take: start period + (retries + 1) * (timeout + interval)."""
        return self.start_period_sec + (self.retries + 1) * (self.timeout_sec + self.interval_sec)


@dataclass(frozen=True)
class McpServer:
    """One `[[environment.mcp_servers]]` entry (`http` is read as its alias `streamable-http`)."""

    name: str
    transport: str
    url: str | None = None
    command: str | None = None
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnvironmentSettings:
    """`[environment]` (and `[verifier.environment]`, same schema). `env` values are unresolved here."""

    docker_image: str | None = None
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    network_mode: NetworkMode = "public"
    #: the hosts an `allowlist` reaches (`host` or `host:port`); None when the table does not say
    allowed_hosts: tuple[str, ...] | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int = 0
    os: str = "linux"
    healthcheck: HealthCheck | None = None
    mcp_servers: tuple[McpServer, ...] = ()

    @property
    def network_none(self) -> bool:
        return self.network_mode == "no-network"


@dataclass(frozen=True)
class AgentSettings:
    """`[agent]`: the agent time limit (before `agent_timeout_multiplier`), its network override, its user."""

    timeout_sec: float | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: tuple[str, ...] | None = None
    user: str | None = None


@dataclass(frozen=True)
class VerifierSettings:
    """`[verifier]`: timeout (default 600 s), host-resolved env, `shared` or `separate` mode and its environment."""

    timeout_sec: float = 600.0
    env: Mapping[str, str] = field(default_factory=dict)
    mode: Literal["shared", "separate"] = "shared"
    environment: EnvironmentSettings | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: tuple[str, ...] | None = None
    user: str | None = None


@dataclass(frozen=True)
class Artifact:
    """A path the separate verifier receives from the main sandbox (`destination` is ignored, as 6.1 says)."""

    source: str
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class HarborTask:
    """One parsed task directory. Paths are absolute; `tests_dir`/`solution_dir` may not exist (see `has_tests`)."""

    id: str
    name: str
    path: Path
    instruction: str
    environment: EnvironmentSettings
    agent: AgentSettings
    verifier: VerifierSettings
    artifacts: tuple[Artifact, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    stack: Stack = "single"

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def dockerfile(self) -> Path | None:
        """`environment/Dockerfile` when the task builds its image."""
        candidate = self.environment_dir / "Dockerfile"
        return candidate if candidate.is_file() else None

    @property
    def verifier_dockerfile(self) -> Path | None:
        candidate = self.tests_dir / "Dockerfile"
        return candidate if candidate.is_file() else None

    @property
    def has_tests(self) -> bool:
        return (self.tests_dir / "test.sh").is_file()

    @property
    def has_solution(self) -> bool:
        return (self.solution_dir / "solve.sh").is_file()

    @property
    def separate_verifier(self) -> bool:
        return self.verifier.mode == "separate"

    @property
    def agent_user(self) -> str | None:
        return self.agent.user

    @property
    def verifier_user(self) -> str | None:
        return self.verifier.user


# --- instruction ------------------------------------------------------------------------------------------------

_CANARY = re.compile("canary", re.IGNORECASE)


def strip_canary(text: str) -> str:
    """Drop the leading canary comment lines (HTML comments or `#` lines naming "canary") and the blanks after them."""
    lines = text.splitlines(keepends=True)
    i = 0
    stripped = False
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("<!--"):
            # An HTML comment, possibly over several lines: a canary only if its text says so.
            end = i
            while "-->" not in lines[end] and end + 1 < len(lines):
                end += 1
            if "-->" not in lines[end] or not _CANARY.search("".join(lines[i : end + 1])):
                break
            i = end + 1
        elif line.startswith("#") and _CANARY.search(line):
            i += 1
        else:
            break
        stripped = True
    if stripped:
        while i < len(lines) and not lines[i].strip():
            i += 1
    return "".join(lines[i:])


# --- host environment variables ---------------------------------------------------------------------------------

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class VariableNotPassed(ConfigError):
    """A task's `${VAR}` (without a default) names a host variable the run does not pass on to tasks: a dataset is
    data, so it reads only the variables `service_kwargs.pass_env` names, never a key it guessed."""

    def __init__(self, variable: str, what: str) -> None:
        self.variable = variable
        super().__init__(
            f"{what} reads the host variable {variable}, which this run does not pass on to tasks: add it to "
            "service_kwargs.pass_env if the dataset may read it"
        )


def unpassed_variables(mapping: Mapping[str, str], passed: Collection[str], *, what: str) -> list[str]:
    """One line per `${VAR}` without a default in `mapping` whose variable is not in `passed` (run-start checks)."""
    return [
        str(VariableNotPassed(match.group(1), f"{what}.{key}"))
        for key, value in mapping.items()
        for match in _VAR.finditer(value)
        if match.group(2) is None and match.group(1) not in passed
    ]


def resolve_env(
    mapping: Mapping[str, str],
    *,
    passed: Collection[str],
    what: str = "[environment].env",
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Resolve `${VAR}` and `${VAR:-default}` in each value from the host environment (`environ`, else os.environ),
    reading only the variables in `passed`: another one takes its default, or raises `VariableNotPassed`.

    A passed but unset variable without a default raises `UnsetVariable` (a config error at open; infra
    `verifier_setup` when grading resolves the verifier's env).
    """
    source = os.environ if environ is None else environ

    def one(key: str, value: str) -> str:
        def sub(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in passed and name in source:
                return source[name]
            if default is not None:
                return default
            if name not in passed:
                raise VariableNotPassed(name, f"{what}.{key}")
            raise UnsetVariable(name, f"{what}.{key}")

        return _VAR.sub(sub, value)

    return {key: one(key, value) for key, value in mapping.items()}


# --- task.toml --------------------------------------------------------------------------------------------------

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_MEMORY_UNITS = {"": 1 / (1024 * 1024), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def parse_memory_mb(value: str | int) -> int:
    """Legacy `memory = "2G"` / `"512M"` (an int is already megabytes) to megabytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _MEMORY.match(str(value))
    if not match:
        raise ValueError(f"memory {value!r} is not a size like '2G' or '512M'")
    return max(1, int(float(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()]))


class _Reader:
    """Typed access to one table of task.toml, raising `TaskRefused` with the key's dotted name."""

    def __init__(self, task: Path, table: Mapping[str, Any], prefix: str) -> None:
        self.task, self.table, self.prefix = task, table, prefix

    def fail(self, key: str, message: str) -> TaskRefused:
        return TaskRefused(self.task, f"task.toml {self.prefix}{key}: {message}")

    def get(self, key: str, kinds: type | tuple[type, ...], default: Any = None) -> Any:
        value = self.table.get(key, default)
        if value is default:
            return value
        if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
            raise self.fail(key, f"expected {_kind_names(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise self.fail(key, f"expected {_kind_names(kinds)}, got {type(value).__name__}")
        return value

    def number(self, key: str, default: float | None = None, *, positive: bool = True) -> float | None:
        value = self.get(key, (int, float), default)
        if value is not None and positive and value <= 0:
            raise self.fail(key, f"must be positive, got {value}")
        return None if value is None else float(value)

    def table_of(self, key: str) -> Mapping[str, Any]:
        return self.get(key, dict, {}) or {}

    def string_map(self, key: str) -> dict[str, str]:
        raw = self.table_of(key)
        out: dict[str, str] = {}
        for name, value in raw.items():
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise self.fail(f"{key}.{name}", "expected a string")
            out[str(name)] = str(value)
        return out

    def network(self, key: str) -> NetworkMode | None:
        value = self.get(key, str)
        if value is not None and value not in _NETWORK_MODES:
            raise self.fail(key, f"expected one of {', '.join(_NETWORK_MODES)}, got {value!r}")
        return value

    def hosts(self, key: str) -> tuple[str, ...] | None:
        """`allowed_hosts`: host names or addresses, each optionally with `:port`; a wildcard is refused (egress is
        filtered by address, so a pattern cannot be enforced)."""
        value = self.get(key, list)
        if value is None:
            return None
        for index, entry in enumerate(value):
            if not isinstance(entry, str):
                raise self.fail(f"{key}[{index}]", f"expected a host name, got {type(entry).__name__}")
            if (problem := allowed_host_problem(entry)) is not None:
                raise self.fail(f"{key}[{index}]", f"{entry!r}: {problem}")
        return tuple(entry.strip() for entry in value)


def _kind_names(kinds: type | tuple[type, ...]) -> str:
    names = {"str": "a string", "int": "an integer", "float": "a number", "dict": "a table", "list": "a list"}
    seq = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(dict.fromkeys(names.get(k.__name__, k.__name__) for k in seq))


def _megabytes(r: _Reader, table: Mapping[str, Any], name: str) -> int | None:
    """`<name>_mb`, else the legacy `<name> = "2G"` form, in megabytes (`memory`, `storage`)."""
    if f"{name}_mb" in table:
        return int(r.number(f"{name}_mb") or 0)
    if name in table:
        try:
            return parse_memory_mb(r.get(name, (str, int)))
        except ValueError as exc:
            raise r.fail(name, str(exc).replace("memory", name, 1)) from None
    return None


def _user(r: _Reader) -> str | None:
    """`user`: a name or a uid (an integer is read as one)."""
    user = r.get("user", (str, int))
    return None if user is None else str(user)


def _environment(task: Path, table: Mapping[str, Any], prefix: str) -> EnvironmentSettings:
    r = _Reader(task, table, prefix)
    network = r.network("network_mode")
    allow_internet = r.get("allow_internet", bool)
    if network is None:
        network = "no-network" if allow_internet is False else "public"
    memory_mb = _megabytes(r, table, "memory")
    storage_mb = _megabytes(r, table, "storage")
    os_name = r.get("os", str, "linux")
    if os_name.lower() != "linux":
        raise r.fail("os", f"only linux tasks run, got {os_name!r}")
    gpus = r.get("gpus", int, 0)
    if gpus < 0:
        raise r.fail("gpus", "must be 0 or more")
    health = None
    if "healthcheck" in table:
        h = _Reader(task, r.table_of("healthcheck"), f"{prefix}healthcheck.")
        command = h.get("command", str)
        if not command:
            raise h.fail("command", "is required")
        retries = h.get("retries", int, 3)
        if retries < 0:
            raise h.fail("retries", "must be 0 or more")
        health = HealthCheck(
            command=command,
            interval_sec=h.number("interval_sec", 5.0) or 5.0,
            timeout_sec=h.number("timeout_sec", 30.0) or 30.0,
            start_period_sec=h.number("start_period_sec", 0.0, positive=False) or 0.0,
            start_interval_sec=h.number("start_interval_sec", 5.0) or 5.0,
            retries=retries,
        )
    servers: list[McpServer] = []
    for i, raw in enumerate(r.get("mcp_servers", list, []) or []):
        m = _Reader(task, raw if isinstance(raw, dict) else {}, f"{prefix}mcp_servers[{i}].")
        if not isinstance(raw, dict):
            raise m.fail("", "expected a table")
        name = m.get("name", str)
        transport = m.get("transport", str, "stdio")
        if not name:
            raise m.fail("name", "is required")
        if transport not in _TRANSPORTS:
            raise m.fail("transport", f"expected one of {', '.join(_TRANSPORTS)}, got {transport!r}")
        url, command = m.get("url", str), m.get("command", str)
        args = m.get("args", list, []) or []
        if _TRANSPORTS[transport] == "stdio" and not command:
            raise m.fail("command", "a stdio server needs a command")
        if _TRANSPORTS[transport] != "stdio" and not url:
            raise m.fail("url", f"a {transport} server needs a url")
        servers.append(McpServer(name, _TRANSPORTS[transport], url, command, tuple(str(a) for a in args)))
    return EnvironmentSettings(
        docker_image=r.get("docker_image", str),
        workdir=r.get("workdir", str),
        env=r.string_map("env"),
        network_mode=network,
        allowed_hosts=r.hosts("allowed_hosts"),
        cpus=r.number("cpus"),
        memory_mb=memory_mb,
        storage_mb=storage_mb,
        gpus=gpus,
        os="linux",
        healthcheck=health,
        mcp_servers=tuple(servers),
    )


def _artifacts(task: Path, raw: Any) -> tuple[Artifact, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise TaskRefused(task, "task.toml artifacts: expected a list")
    out: list[Artifact] = []
    for i, item in enumerate(raw):
        source: Any
        exclude: Any
        service: Any
        if isinstance(item, str):
            source, exclude, service = item, [], "main"
        elif isinstance(item, dict):
            source = item.get("source")
            exclude = item.get("exclude") or []
            service = item.get("service", "main")
            if isinstance(exclude, str):
                exclude = [exclude]
        else:
            raise TaskRefused(task, f"task.toml artifacts[{i}]: expected a path or a table")
        if not isinstance(source, str) or not source:
            raise TaskRefused(task, f"task.toml artifacts[{i}]: a source path is required")
        if ".." in Path(source).parts:
            raise TaskRefused(task, f"task.toml artifacts[{i}]: {source!r} contains '..'")
        if service != "main":
            raise TaskRefused(
                task, f"task.toml artifacts[{i}]: artifacts from service {service!r} (only main)"
            )
        out.append(Artifact(source, tuple(str(e) for e in exclude)))
    return tuple(out)


def _stack(environment_dir: Path) -> tuple[Stack, Path | None]:
    for name in COMPOSE_FILES:
        compose = environment_dir / name
        if compose.is_file():
            return ("trivial" if _trivial_compose(compose) else "sidecars"), compose
    return "single", None


def _trivial_compose(path: Path) -> bool:
    """Only `services: {main: {}}` and an optional `version` (read without a YAML dependency for these shapes)."""
    try:
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception:
        return False
    if not isinstance(data, dict) or set(data) - {"services", "version"}:
        return False
    services = data.get("services")
    return isinstance(services, dict) and list(services) == ["main"] and not services["main"]


def read_task(path: str | Path, *, task_id: str | None = None) -> HarborTask:
    """Parse the task directory `path`. `task_id` defaults to `[task].name`, else the directory name."""
    root = Path(path).absolute()
    if not root.is_dir():
        raise TaskRefused(root, "not a directory")
    try:
        data = tomllib.loads((root / "task.toml").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskRefused(root, "no task.toml") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TaskRefused(root, f"task.toml is not readable TOML ({exc})") from None
    try:
        instruction = strip_canary((root / "instruction.md").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskRefused(root, "no instruction.md") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskRefused(root, f"instruction.md is not readable ({exc})") from None

    top = _Reader(root, data, "")
    if "steps" in data or (root / "steps").is_dir():
        raise TaskRefused(root, "multi-step tasks (steps) are not supported")
    task_table = _Reader(root, top.table_of("task"), "[task].")
    name = task_table.get("name", str) or root.name
    environment = _environment(root, top.table_of("environment"), "[environment].")

    a = _Reader(root, top.table_of("agent"), "[agent].")
    agent = AgentSettings(
        timeout_sec=a.number("timeout_sec"),
        network_mode=a.network("network_mode"),
        allowed_hosts=a.hosts("allowed_hosts"),
        user=_user(a),
    )

    v = _Reader(root, top.table_of("verifier"), "[verifier].")
    _refuse_collect_hooks(v)
    mode = v.get("environment_mode", str)
    if mode is not None and mode not in ("shared", "separate"):
        raise v.fail("environment_mode", f"expected shared or separate, got {mode!r}")
    verifier_env: EnvironmentSettings | None = None
    if "environment" in v.table:
        if mode == "shared":
            raise v.fail("environment", "conflicts with environment_mode = 'shared'")
        verifier_env = _environment(root, v.table_of("environment"), "[verifier.environment].")
        mode = "separate"
    if mode == "separate" and (root / "tests" / "docker-compose.yaml").is_file():
        raise TaskRefused(root, "tests/docker-compose.yaml for a separate verifier is not supported")
    verifier = VerifierSettings(
        timeout_sec=v.number("timeout_sec", 600.0) or 600.0,
        env=v.string_map("env"),
        mode=mode or "shared",
        environment=verifier_env,
        network_mode=v.network("network_mode"),
        allowed_hosts=v.hosts("allowed_hosts"),
        user=_user(v),
    )
    if verifier.mode == "shared" and not (root / "tests" / "test.sh").is_file():
        raise TaskRefused(root, "no tests/test.sh")
    metadata = top.table_of("metadata")
    stack, _ = _stack(root / "environment")
    return HarborTask(
        id=task_id or name,
        name=name,
        path=root,
        instruction=instruction,
        environment=environment,
        agent=agent,
        verifier=verifier,
        artifacts=_artifacts(root, data.get("artifacts")),
        metadata=dict(metadata),
        stack=stack,
    )


def _refuse_collect_hooks(verifier: _Reader) -> None:
    """Schema 1.3's `[[verifier.collect]]`: commands run in a service before its artifacts are collected. An empty
    list asks for nothing (task exporters write `collect = []`); any hook is refused, since grading here runs none."""
    hooks = verifier.get("collect", list, [])
    if hooks:
        raise verifier.fail(
            "collect",
            f"{len(hooks)} collect hook(s): commands run before artifacts are collected are not supported",
        )


def task_refusal(task: HarborTask, *, agent_user: str = "run") -> TaskRefused | None:
    """The entry-dependent load refusal of 6.1 (a compose stack with sidecars; a task user under `agent_user:
    refuse`), or None. Under `run` (the default) a task user is run as; whether the provider can is a run-start
    check of the service's."""
    if task.stack == "sidecars":
        return TaskRefused(task.path, "a compose stack with services beside main is not supported")
    if agent_user == "refuse":
        for key, user in (("[agent].user", task.agent.user), ("[verifier].user", task.verifier.user)):
            if user:
                return TaskRefused(
                    task.path, f"{key} = {user!r} (agent_user: refuse; run or ignore would run the task)"
                )
    return None


def ignored_users(task: HarborTask) -> dict[str, str]:
    """The users an `agent_user: ignore` entry drops, recorded as `ignored_users` in outcome metadata."""
    return {
        key: user
        for key, user in (("agent", task.agent.user), ("verifier", task.verifier.user))
        if user is not None
    }


def load_task(path: str | Path, *, task_id: str | None = None, agent_user: str = "run") -> HarborTask:
    """`read_task` plus the entry's load refusals (raised as `TaskRefused`)."""
    task = read_task(path, task_id=task_id)
    refusal = task_refusal(task, agent_user=agent_user)
    if refusal is not None:
        raise refusal
    return task


# --- task ids ---------------------------------------------------------------------------------------------

_SKIP_DIRS = {"__pycache__"}


def discover_tasks(root: str | Path) -> dict[str, Path]:
    """Task ids → directories of the dataset directory `root` (`dataset_dir` discovery).

    With a `registry.json` the ids are its task names (only tasks whose directory exists count); else every
    directory holding `task.toml` (not descending into tasks, skipping hidden dirs and `__pycache__`) is named by its
    directory name when directly under the root, else by its relative path `group/name`. A root that is itself a
    task is one task named by its directory. Duplicate ids raise `ConfigError`. Sorted by id.
    """
    base = Path(root).absolute()
    if not base.is_dir():
        raise ConfigError(f"Harbor dataset directory {base} does not exist")
    registry = base / "registry.json"
    found: dict[str, Path] = {}
    if registry.is_file():
        for task_name, rel in _registry_tasks(registry):
            directory = base / rel
            if not (directory / "task.toml").is_file():
                continue
            if task_name in found:
                raise ConfigError(f"{registry}: duplicate task id {task_name!r}")
            found[task_name] = directory
        return dict(sorted(found.items()))
    if (base / "task.toml").is_file():
        return {base.name: base}
    for directory in _scan(base):
        task_name = directory.relative_to(base).as_posix()
        if task_name in found:
            raise ConfigError(f"Harbor dataset {base}: duplicate task id {task_name!r}")
        found[task_name] = directory
    return dict(sorted(found.items()))


def _scan(base: Path) -> Iterable[Path]:
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(".") or entry.name in _SKIP_DIRS or not entry.is_dir():
            continue
        if (entry / "task.toml").is_file():
            yield entry
        else:
            yield from _scan(entry)


def _registry_tasks(registry: Path) -> list[tuple[str, str]]:
    try:
        data = json.loads(registry.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{registry}: not readable JSON ({exc})") from None
    datasets = data if isinstance(data, list) else [data]
    out: list[tuple[str, str]] = []
    for dataset in datasets:
        tasks = dataset.get("tasks") if isinstance(dataset, dict) else None
        if not isinstance(tasks, list):
            raise ConfigError(f"{registry}: each dataset needs a `tasks` list")
        for row in tasks:
            if not isinstance(row, dict) or not isinstance(row.get("name"), str):
                raise ConfigError(f"{registry}: each task needs a name")
            if row.get("git_url"):
                raise ConfigError(f"{registry}: task {row['name']!r} names a git_url (not supported)")
            rel = row.get("path", row["name"])
            if not isinstance(rel, str) or Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise ConfigError(f"{registry}: task {row['name']!r} has path {rel!r} (absolute or '..')")
            out.append((row["name"], rel))
    return out


def task_dirs_ids(dirs: Iterable[str | Path]) -> dict[str, Path]:
    """Ids for `task_dirs: [...]`: each directory's name; duplicates raise `ConfigError`."""
    found: dict[str, Path] = {}
    for item in dirs:
        directory = Path(item).absolute()
        if not (directory / "task.toml").is_file():
            raise ConfigError(f"task_dirs: {directory} holds no task.toml")
        if directory.name in found:
            raise ConfigError(f"task_dirs: duplicate task id {directory.name!r}")
        found[directory.name] = directory
    return found


#: the splits file a dataset may carry at its root (`{split: [task ids]}`; platoon-textcraft's export writes one)
SPLITS_FILE = "splits.json"


def read_splits_manifest(spec: Any, root: Path | None, *, where: str = "splits") -> dict[str, list[str]]:
    """A split manifest's shape checked: a mapping, or a JSON/TOML file relative to `root`, of split name to a list
    of task ids. ConfigError (one line, naming `where` or the file) for anything else."""
    data: Any = spec
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        if not path.is_absolute() and root is not None:
            path = root / path
        try:
            text = path.read_text(encoding="utf-8")
            data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{where}: {path} is not a readable JSON or TOML manifest ({exc})") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of split name to a list of task ids")
    out: dict[str, list[str]] = {}
    for split, members in data.items():
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise ConfigError(f"{where}.{split}: expected a list of task ids")
        out[str(split)] = list(members)
    return out


def load_splits(spec: Any, root: Path | None, ids: Iterable[str]) -> dict[str, list[str]]:
    """A `splits:` manifest (a mapping, or a JSON/TOML file relative to `root`) checked against the runnable `ids`."""
    known = set(ids)
    out = read_splits_manifest(spec, root)
    for split, members in out.items():
        unknown = [m for m in members if m not in known]
        if unknown:
            raise ConfigError(f"splits.{split}: unknown or refused task(s) {', '.join(unknown[:5])}")
    return out


def dataset_splits(root: Path) -> dict[str, list[str]] | None:
    """The dataset's own splits file (`<root>/splits.json`), shape-checked; None when the dataset has none."""
    path = root / SPLITS_FILE
    if not path.is_file():
        return None
    return read_splits_manifest(path, None, where=str(path))


def runnable_splits(splits: Mapping[str, list[str]], ids: Iterable[str]) -> dict[str, list[str]]:
    """A dataset's splits narrowed to the runnable `ids` (a selection or refusals leave tasks out), in file order;
    every split stays listed, even one left empty."""
    known = set(ids)
    return {split: [m for m in members if m in known] for split, members in splits.items()}
