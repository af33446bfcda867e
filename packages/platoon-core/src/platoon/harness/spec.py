"""TOML harness specs: `HarnessSpec`, its strict loader, option checks and the templating rules.

A spec describes a command-line agent: how to install it, the argv and environment to launch it with, where its
final message is, what its exit codes mean and which options it takes. Everything a spec can get wrong is found
when it is loaded, as one `SpecError` line naming the file and the key: an unknown key, a wrong type, a shipped
file that is missing, a placeholder not allowed where it stands, a bad option schema. Running a spec (install,
launch, kill) is the spec runner's work in platoon-harnesses; this module only describes and renders.

Templating is one pass over a string: `{name}` and `{options.NAME}` tokens are replaced, the replacement text is
never scanned again, and argv stays a list, so nothing a value holds is ever read as a placeholder or as shell.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any

from platoon import registry
from platoon.errors import ConfigError, ExtensionError
from platoon.naming import check_name, check_version
from platoon.versioned import VersionedRegistry

__all__ = [
    "DIALECTS",
    "BuiltinsSpec",
    "FinalMessageSpec",
    "HarnessSetupError",
    "HarnessSpec",
    "InstallSpec",
    "LaunchSpec",
    "McpSpec",
    "OptionSpec",
    "RecipeSpec",
    "SpecError",
    "check_options",
    "format_value",
    "load_spec",
    "not_a_function_harness",
    "option_problems",
    "option_values",
    "placeholders",
    "render",
]

DIALECTS = ("openai_chat", "openai_responses", "anthropic_messages")
EXIT_MEANINGS = ("completed", "error")
BUDGET_ENFORCERS = ("harness", "gateway")
OPTION_TYPES = ("bool", "int", "float", "str")
KNOWN_CACHES = ("tiktoken",)
DEFAULT_INSTALL_TIMEOUT_S = 1200.0

#: `{lowercase_identifier}` with at most one `.segment`; anything else in braces (`${VAR}`, JSON) is literal
PLACEHOLDER_RE = re.compile(r"\{([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)?)\}")
OPTION_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
TOOLCHAIN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
PYTHON_VERSION_RE = re.compile(r"^3\.\d+(?:\.\d+)?$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EXIT_CODE_RE = re.compile(r"^-?\d+$")

#: the placeholders every template may use (the run's own values; no key, no options)
PUBLIC = frozenset({"instruction", "base_url", "model", "workdir", "state_dir", "max_steps"})


class HarnessSetupError(Exception):
    """A spec run that could not be set up before (or around) its launch: an install command failed, the sandbox
    has no way to the gateway, a toolchain could not be prepared. The rollout's outcome is infra `harness_setup`,
    never a score."""


class SpecError(ExtensionError):
    """A harness spec that cannot be loaded or options it does not take: a configuration error (exit 78).

    Each problem is one line naming the spec file (or the config key) and the key at fault.
    """

    def __init__(self, problems: str | Iterable[str]) -> None:
        ConfigError.__init__(self, problems)


# ---------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class OptionSpec:
    """One `[options.NAME]` entry: the option's type, default and constraints."""

    name: str
    type: str
    default: Any
    description: str = ""
    allowed: tuple[Any, ...] | None = None
    min: int | float | None = None
    max: int | float | None = None

    @property
    def constraint(self) -> str:
        """What `platoon harness show` prints: "one of ...", "a to b", ">= a", "<= b" or "-"."""
        parts = []
        if self.allowed is not None:
            parts.append("one of " + ", ".join(format_value(v) for v in self.allowed))
        if self.min is not None and self.max is not None:
            parts.append(f"{format_value(self.min)} to {format_value(self.max)}")
        elif self.min is not None:
            parts.append(f">= {format_value(self.min)}")
        elif self.max is not None:
            parts.append(f"<= {format_value(self.max)}")
        return "; ".join(parts) or "-"


@dataclass(frozen=True)
class RecipeSpec:
    """`[install.recipe]`: how `platoon toolchain build` makes the toolchain (paths resolved next to the spec)."""

    python: str
    lock: Path
    cache: tuple[str, ...] = ()
    #: relative path inside the toolchain -> the script (next to the spec) that generates it
    generate: Mapping[str, Path] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class InstallSpec:
    """`[install]`: shell commands run once per (install spec, host, toolchain), and the toolchain they need."""

    commands: tuple[str, ...] = ()
    toolchain: str | None = None
    timeout_s: float = DEFAULT_INSTALL_TIMEOUT_S
    recipe: RecipeSpec | None = None


@dataclass(frozen=True)
class LaunchSpec:
    """`[launch]`: templates of the argv, the environment, files written and assets copied before the launch."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: path template -> content template
    files: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: path template -> a file shipped next to the spec (resolved, known to exist)
    assets: Mapping[str, Path] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class BuiltinsSpec:
    """`[builtins]`: the harness's own tools (informational) and the knob that disables them, if any."""

    tools: tuple[str, ...] = ()
    disable_args: tuple[str, ...] | None = None
    disable_env: Mapping[str, str] | None = None

    @property
    def can_disable(self) -> bool:
        return self.disable_args is not None or self.disable_env is not None


@dataclass(frozen=True)
class McpSpec:
    """`[mcp]`: how the agent is pointed at the environment's tools over MCP."""

    enabled: bool = True
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    config_template: str | None = None
    config_file: str = "mcp.json"


@dataclass(frozen=True)
class FinalMessageSpec:
    """`[final_message]`: a file (optionally a dotted JSON key in it) or a regex over the captured output."""

    file: str | None = None
    stdout_regex: str | None = None
    json_key: str | None = None

    def describe(self) -> str:
        if self.file is not None:
            return f"file {self.file}" + (f" (JSON key {self.json_key})" if self.json_key else "")
        return f"last match of /{self.stdout_regex}/ in the output"


@dataclass(frozen=True)
class HarnessSpec:
    """A command-line agent described by a TOML file, as loaded and checked by `load_spec`."""

    name: str
    version: str
    path: Path
    launch: LaunchSpec
    dialect: str = "openai_chat"
    timeout_s: float | None = None
    max_steps: int | None = None
    install: InstallSpec | None = None
    builtins: BuiltinsSpec | None = None
    mcp: McpSpec | None = None
    final_message: FinalMessageSpec | None = None
    #: exit code -> `completed` or `error`
    exit_codes: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))
    resources_memory_mb: int | None = None
    budget_enforce: str = "harness"
    options: Mapping[str, OptionSpec] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def source(self) -> str:
        return str(self.path)

    @property
    def kind(self) -> str:
        return "spec"

    @property
    def mcp_enabled(self) -> bool:
        return self.mcp is not None and self.mcp.enabled

    @property
    def toolchain(self) -> str | None:
        return self.install.toolchain if self.install is not None else None

    def option_defaults(self) -> dict[str, Any]:
        return {name: option.default for name, option in self.options.items()}

    def exit_meaning(self, code: int | None) -> str:
        """`completed` or `error` for an exit status (None: killed, no exit code) per `[exit_codes]`."""
        if code is None:
            return "error"
        return self.exit_codes.get(code, "completed" if code == 0 else "error")

    def __hash__(self) -> int:  # the mappings inside are read-only views, which do not hash
        return hash((self.ref, self.path))


# ---------------------------------------------------------------------------------------------- values


def format_value(value: Any) -> str:
    """An option value as templates render it: `true`/`false`, floats in plain decimal, others via str."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # inf, nan: only in messages, since option values must be finite
    if isinstance(value, float):
        # repr is the shortest text that reads back as the same float; Decimal drops its exponent
        text = format(Decimal(repr(value)), "f")
        return text if "." in text else text + ".0"
    return str(value)


def option_values(spec: HarnessSpec, options: Mapping[str, Any]) -> dict[str, str]:
    """The `{options}` and `{options.NAME}` values of checked options (defaults filled by `check_options`)."""
    filled = {**spec.option_defaults(), **options}
    values = {f"options.{name}": format_value(value) for name, value in filled.items()}
    values["options"] = json.dumps(filled, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return values


def placeholders(template: str) -> list[str]:
    """The placeholder names a template uses, in order (`options.NAME` as written)."""
    return PLACEHOLDER_RE.findall(template)


def render(template: str, values: Mapping[str, Any]) -> str:
    """Replace every placeholder of `template` in one pass: substituted text is never scanned again.

    Values that are not strings are formatted as options are (`format_value`). A placeholder without a value is a
    SpecError: the spec's load-time check allowed it, so the runner must provide it.
    """

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values or values[name] is None:
            raise SpecError(f"placeholder {{{name}}} has no value for this launch")
        value = values[name]
        return value if isinstance(value, str) else format_value(value)

    return PLACEHOLDER_RE.sub(substitute, template)


def not_a_function_harness(ref: str) -> str:
    """The one line refusing a TOML spec where only a function harness runs (a subagent's harness)."""
    return (
        f"harness {ref} is a TOML spec: a subagent runs a function harness (an @platoon.harness function or its "
        "ref); TOML specs run only as an episode's root agent"
    )


# ---------------------------------------------------------------------------------------------- options


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return "an int"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a str"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


def _typed(option_type: str, value: Any) -> tuple[Any, str | None]:
    """(the value as the option holds it, None) or (None, why it is not of that type). Strict: a bool is no int;
    an int becomes a float for a float option; floats must be finite."""
    if option_type == "bool":
        ok = isinstance(value, bool)
    elif option_type == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif option_type == "float":
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value), None
        if isinstance(value, float) and not math.isfinite(value):
            return None, f"{format_value(value)} is not a finite float"
        ok = isinstance(value, float)
    else:
        ok = isinstance(value, str)
    if not ok:
        return (
            None,
            f"{_shown(value)} is {_kind_of(value)}, not {'an' if option_type == 'int' else 'a'} {option_type}",
        )
    return value, None


def _shown(value: Any) -> str:
    return (
        json.dumps(value)
        if isinstance(value, str)
        else format_value(value)
        if _scalar(value)
        else repr(value)
    )


def _scalar(value: Any) -> bool:
    return isinstance(value, bool | int | float | str)


def _option_value_problem(option: OptionSpec, value: Any) -> tuple[Any, str | None]:
    """The checked value of one option, or why it does not suit the option."""
    typed, problem = _typed(option.type, value)
    if problem is not None:
        return None, problem
    if option.allowed is not None and typed not in option.allowed:
        return None, f"{_shown(typed)} is not one of {', '.join(_shown(v) for v in option.allowed)}"
    if option.min is not None and typed < option.min:
        return None, f"{_shown(typed)} is below the minimum {format_value(option.min)}"
    if option.max is not None and typed > option.max:
        return None, f"{_shown(typed)} is above the maximum {format_value(option.max)}"
    return typed, None


def option_problems(
    spec: HarnessSpec, options: Mapping[str, Any], *, where: str = "harness_options"
) -> list[str]:
    """One line per option `spec` does not take or whose value does not suit it: `<where>.<key>: ...`."""
    problems: list[str] = []
    if not isinstance(options, Mapping):
        return [f"{where}: harness options are a mapping, not {_kind_of(options)}"]
    for key, value in options.items():
        option = spec.options.get(key) if isinstance(key, str) else None
        if option is None:
            if not spec.options:
                problems.append(
                    f"{where}.{key}: harness {spec.ref} ({spec.path}) takes no options: harness_options must be "
                    "empty"
                )
                continue
            close = difflib.get_close_matches(str(key), list(spec.options), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(
                f"{where}.{key}: not an option of harness {spec.ref} ({spec.path}){hint}; its options: "
                + ", ".join(spec.options)
            )
            continue
        _, problem = _option_value_problem(option, value)
        if problem is not None:
            problems.append(f"{where}.{key}: {problem} (option {key} of harness {spec.ref}, {spec.path})")
    return problems


def check_options(
    spec: HarnessSpec, options: Mapping[str, Any], *, where: str = "harness_options"
) -> dict[str, Any]:
    """The options a launch uses: `options` checked against `[options]`, defaults filled, ints of float options
    made floats. Any problem raises SpecError (one line each)."""
    problems = option_problems(spec, options, where=where)
    if problems:
        raise SpecError(problems)
    checked = spec.option_defaults()
    for key, value in options.items():
        checked[key], _ = _option_value_problem(spec.options[key], value)
    return checked


# ---------------------------------------------------------------------------------------------- loading


class _Table:
    """One TOML table read strictly: keys are taken one by one with their type checked, and whatever is left
    when the table is done is an unknown key."""

    def __init__(self, data: Any, key: str, path: Path) -> None:
        self.path = path
        self.key = key
        if not isinstance(data, dict):
            self.fail(None, f"must be a table, not {_kind_of(data)}")
        self.data: dict[str, Any] = dict(data)
        self.known: list[str] = []

    def where(self, key: str | None) -> str:
        return ".".join(k for k in (self.key, key) if k) or "(top level)"

    def fail(self, key: str | None, why: str) -> Any:
        raise SpecError(f"{self.path}: {self.where(key)}: {why}")

    def has(self, key: str) -> bool:
        return key in self.data

    def take(self, key: str, *, required: bool = False) -> Any:
        self.known.append(key)
        if key not in self.data:
            if required:
                self.fail(key, "required")
            return None
        return self.data.pop(key)

    def text(self, key: str, *, required: bool = False, one_line: bool = False) -> str | None:
        value = self.take(key, required=required)
        if value is None:
            return None
        if not isinstance(value, str):
            self.fail(key, f"must be a string, not {_kind_of(value)}")
        if one_line and "\n" in value:
            self.fail(key, "must be one line")
        return str(value)

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.text(key)
        if value is None:
            return default
        if value not in choices:
            self.fail(key, f"{json.dumps(value)} is not one of {', '.join(choices)}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.take(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, not {_kind_of(value)}")
        return bool(value)

    def positive_number(self, key: str) -> float | None:
        value = self.take(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(key, f"must be a positive number, not {_kind_of(value)}")
        if not math.isfinite(value) or value <= 0:
            self.fail(key, f"must be a positive number, not {format_value(value)}")
        return float(value)

    def positive_int(self, key: str) -> int | None:
        value = self.take(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"must be a positive whole number, not {_kind_of(value)}")
        if value <= 0:
            self.fail(key, f"must be a positive whole number, not {value}")
        return int(value)

    def strings(self, key: str, *, non_empty: bool = False) -> tuple[str, ...] | None:
        value = self.take(key)
        if value is None:
            return None
        if not isinstance(value, list):
            self.fail(key, f"must be a list of strings, not {_kind_of(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.fail(f"{key}.{i}", f"must be a string, not {_kind_of(item)}")
        if non_empty and not value:
            self.fail(key, "must not be empty")
        return tuple(value)

    def string_map(self, key: str, *, env_names: bool = False) -> dict[str, str] | None:
        value = self.take(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.fail(key, f"must be a table of strings, not {_kind_of(value)}")
        for name, item in value.items():
            if env_names and not ENV_NAME_RE.match(name):
                self.fail(f"{key}.{name}", "is not an environment variable name (letters, digits, _)")
            if not isinstance(item, str):
                self.fail(f"{key}.{name}", f"must be a string, not {_kind_of(item)}")
        return dict(value)

    def table(self, key: str, *, required: bool = False) -> _Table | None:
        value = self.take(key, required=required)
        if value is None:
            return None
        return _Table(value, self.where(key) if self.key else key, self.path)

    def done(self) -> None:
        """Refuse the first key nobody took, naming the keys this table does take."""
        for key in self.data:
            close = difflib.get_close_matches(key, self.known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            table = f"[{self.key}]" if self.key else "the top level"
            self.fail(key, f"unknown key{hint}; {table} takes {', '.join(self.known)}")


def _shipped(table: _Table, key: str, value: str, spec_dir: Path) -> Path:
    """A file shipped next to the spec: a relative path, resolved against the spec's directory, that exists."""
    if not value or os.path.isabs(value):
        table.fail(key, f"{json.dumps(value)} must be a path relative to the spec file")
    resolved = (spec_dir / value).resolve()
    if not resolved.is_file():
        table.fail(key, f"{resolved} does not exist (paths are relative to the spec file)")
    return resolved


def _relative_inside(table: _Table, key: str, value: str) -> str:
    """A path inside a directory: relative, with no empty, `.` or `..` parts."""
    parts = value.split("/")
    if value.startswith("/") or any(part in ("", ".", "..") for part in parts):
        table.fail(key, f"{json.dumps(value)} must be a relative path without empty, '.' or '..' parts")
    return str(PurePosixPath(value))


def _read_toml(path: Path) -> dict[str, Any]:
    import tomllib

    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such harness spec file") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory, not a harness spec file") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the harness spec: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not UTF-8 text, so not a TOML harness spec") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None


def load_spec(path: str | os.PathLike[str]) -> HarnessSpec:
    """Load and check a `.toml` harness spec. Every problem raises SpecError naming the file and the key."""
    spec_path = Path(os.path.abspath(os.fspath(path)))
    top = _Table(_read_toml(spec_path), "", spec_path)
    spec_dir = spec_path.parent

    name = top.text("name", required=True)
    try:
        check_name(name, what="harness name")
    except ValueError as exc:
        top.fail("name", str(exc))
    version = top.text("version", required=True)
    try:
        check_version(version)
    except ValueError as exc:
        top.fail("version", str(exc))
    assert name is not None and version is not None
    dialect = top.choice("dialect", DIALECTS, "openai_chat")
    timeout_s = top.positive_number("timeout_s")
    max_steps = top.positive_int("max_steps")

    install = _install(top.table("install"), spec_dir)
    options = _options(top.table("options"))
    launch = _launch(top.table("launch", required=True), spec_dir)
    builtins = _builtins(top.table("builtins"))
    mcp = _mcp(top.table("mcp"))
    final_message = _final_message(top.table("final_message"))
    exit_codes = _exit_codes(top.table("exit_codes"))
    resources = top.table("resources")
    memory_mb = None
    if resources is not None:
        memory_mb = resources.positive_int("memory_mb")
        resources.done()
    budget = top.table("budget")
    enforce = "harness"
    if budget is not None:
        enforce = budget.choice("enforce", BUDGET_ENFORCERS, "harness")
        budget.done()
    top.done()

    spec = HarnessSpec(
        name=name,
        version=version,
        path=spec_path,
        launch=launch,
        dialect=dialect,
        timeout_s=timeout_s,
        max_steps=max_steps,
        install=install,
        builtins=builtins,
        mcp=mcp,
        final_message=final_message,
        exit_codes=MappingProxyType(exit_codes),
        resources_memory_mb=memory_mb,
        budget_enforce=enforce,
        options=MappingProxyType(options),
    )
    _check_placeholders(spec)
    return spec


def _install(table: _Table | None, spec_dir: Path) -> InstallSpec | None:
    if table is None:
        return None
    commands = table.strings("commands") or ()
    for i, command in enumerate(commands):
        if not command.strip():
            table.fail(f"commands.{i}", "must not be empty")
    toolchain = table.text("toolchain")
    if toolchain is not None and not (os.path.isabs(toolchain) or TOOLCHAIN_NAME_RE.match(toolchain)):
        table.fail(
            "toolchain",
            f"{json.dumps(toolchain)} is neither an absolute path nor a toolchain name ([A-Za-z0-9][A-Za-z0-9._-]*)",
        )
    timeout_s = table.positive_number("timeout_s")
    recipe_table = table.table("recipe")
    recipe = None
    if recipe_table is not None:
        if toolchain is None:
            table.fail("recipe", "needs install.toolchain: a recipe builds the toolchain it names")
        recipe = _recipe(recipe_table, spec_dir)
    table.done()
    return InstallSpec(
        commands=commands,
        toolchain=toolchain,
        timeout_s=DEFAULT_INSTALL_TIMEOUT_S if timeout_s is None else timeout_s,
        recipe=recipe,
    )


def _recipe(table: _Table, spec_dir: Path) -> RecipeSpec:
    python = table.text("python", required=True)
    assert python is not None
    if not PYTHON_VERSION_RE.match(python):
        table.fail("python", f"{json.dumps(python)} is not a CPython version 3.N or 3.N.M")
    lock_name = table.text("lock", required=True)
    assert lock_name is not None
    lock = _shipped(table, "lock", lock_name, spec_dir)
    cache = table.strings("cache") or ()
    for i, item in enumerate(cache):
        if item not in KNOWN_CACHES:
            table.fail(
                f"cache.{i}", f"{json.dumps(item)} is not a known cache (known: {', '.join(KNOWN_CACHES)})"
            )
    generate: dict[str, Path] = {}
    for target, script in (table.string_map("generate") or {}).items():
        inside = _relative_inside(table, f"generate.{target}", target)
        generate[inside] = _shipped(table, f"generate.{target}", script, spec_dir)
    table.done()
    return RecipeSpec(python=python, lock=lock, cache=cache, generate=MappingProxyType(generate))


def _launch(table: _Table | None, spec_dir: Path) -> LaunchSpec:
    assert table is not None  # required
    argv = table.strings("argv", non_empty=True)
    if argv is None:
        table.fail("argv", "required: a non-empty list of templates")
    assert argv is not None
    env = table.string_map("env", env_names=True) or {}
    files = table.string_map("files") or {}
    for target in files:
        if not target.strip():
            table.fail("files", "a file path must not be empty")
    assets: dict[str, Path] = {}
    for target, source in (table.string_map("assets") or {}).items():
        if not target.strip():
            table.fail("assets", "an asset path must not be empty")
        assets[target] = _shipped(table, f"assets.{target}", source, spec_dir)
    table.done()
    return LaunchSpec(
        argv=argv, env=MappingProxyType(env), files=MappingProxyType(files), assets=MappingProxyType(assets)
    )


def _builtins(table: _Table | None) -> BuiltinsSpec | None:
    if table is None:
        return None
    tools = table.strings("tools") or ()
    disable = table.table("disable")
    args: tuple[str, ...] | None = None
    env: dict[str, str] | None = None
    if disable is not None:
        args = disable.strings("args")
        env = disable.string_map("env", env_names=True)
        if args is None and env is None:
            disable.fail(None, "needs args and/or env: what to append when built-in tools are disabled")
        disable.done()
    table.done()
    return BuiltinsSpec(
        tools=tools, disable_args=args, disable_env=None if env is None else MappingProxyType(env)
    )


def _mcp(table: _Table | None) -> McpSpec | None:
    if table is None:
        return None
    enabled = table.flag("enabled", True)
    args = table.strings("args") or ()
    env = table.string_map("env", env_names=True) or {}
    config_template = table.text("config_template")
    config_file = table.text("config_file")
    if config_file is not None:
        _relative_inside(table, "config_file", config_file)
    table.done()
    return McpSpec(
        enabled=enabled,
        args=args,
        env=MappingProxyType(env),
        config_template=config_template,
        config_file=config_file or "mcp.json",
    )


def _final_message(table: _Table | None) -> FinalMessageSpec | None:
    if table is None:
        return None
    file = table.text("file")
    regex = table.text("stdout_regex")
    json_key = table.text("json_key")
    if (file is None) == (regex is None):
        table.fail(None, "give exactly one of file or stdout_regex")
    if json_key is not None:
        if file is None:
            table.fail("json_key", "needs file: the key is looked up in the file's JSON")
        if any(not part for part in json_key.split(".")):
            table.fail("json_key", f"{json.dumps(json_key)} is not a dotted path (empty part)")
    if file is not None and not file.strip():
        table.fail("file", "must not be empty")
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            table.fail("stdout_regex", f"does not compile: {exc}")
    table.done()
    return FinalMessageSpec(file=file, stdout_regex=regex, json_key=json_key)


def _exit_codes(table: _Table | None) -> dict[int, str]:
    if table is None:
        return {}
    codes: dict[int, str] = {}
    for key in list(table.data):
        value = table.take(key)
        if not EXIT_CODE_RE.match(key):
            table.fail(key, "is not an integer exit code")
        if value not in EXIT_MEANINGS:
            table.fail(key, f"{_shown(value)} is not one of {', '.join(EXIT_MEANINGS)}")
        codes[int(key)] = value
    return codes


def _options(table: _Table | None) -> dict[str, OptionSpec]:
    if table is None:
        return {}
    options: dict[str, OptionSpec] = {}
    for name in list(table.data):
        if not OPTION_NAME_RE.match(name):
            table.fail(name, "is not an option name (a lower-case identifier: a-z, 0-9, _)")
        option = table.table(name)
        assert option is not None
        options[name] = _option(name, option)
    return options


def _option(name: str, table: _Table) -> OptionSpec:
    option_type = table.text("type", required=True)
    if option_type not in OPTION_TYPES:
        table.fail("type", f"{_shown(option_type)} is not one of {', '.join(OPTION_TYPES)}")
    assert option_type is not None
    if not table.has("default"):
        table.fail("default", "required (every option has a default, which must itself pass)")
    raw_default = table.take("default")
    description = table.text("description", one_line=True) or ""
    allowed: tuple[Any, ...] | None = None
    raw_allowed = table.take("allowed")
    if raw_allowed is not None:
        if option_type not in ("int", "str"):
            table.fail("allowed", f"applies to int and str options, not {option_type}")
        if not isinstance(raw_allowed, list) or not raw_allowed:
            table.fail("allowed", "must be a non-empty list")
        checked = []
        for i, item in enumerate(raw_allowed):
            typed, problem = _typed(option_type, item)
            if problem is not None:
                table.fail(f"allowed.{i}", problem)
            if typed in checked:
                table.fail(f"allowed.{i}", f"{_shown(typed)} is listed twice")
            checked.append(typed)
        allowed = tuple(checked)
    bounds: dict[str, int | float | None] = {}
    for key in ("min", "max"):
        bound = table.take(key)
        bounds[key] = None
        if bound is None:
            continue
        if option_type not in ("int", "float"):
            table.fail(key, f"applies to int and float options, not {option_type}")
        typed, problem = _typed(option_type, bound)
        if problem is not None:
            table.fail(key, problem)
        bounds[key] = typed
    low, high = bounds["min"], bounds["max"]
    if low is not None and high is not None and low > high:
        table.fail("max", f"{format_value(high)} is below min {format_value(low)}")
    table.done()
    option = OptionSpec(name, option_type, None, description, allowed, low, high)
    default, problem = _option_value_problem(option, raw_default)
    if problem is not None:
        table.fail("default", problem)
    return OptionSpec(name, option_type, default, description, allowed, low, high)


# ---------------------------------------------------------------------------------------------- placeholders


def _check_placeholders(spec: HarnessSpec) -> None:
    """Every template uses only the placeholders its location allows."""
    public = set(PUBLIC)
    if spec.toolchain is not None:
        public.add("toolchain")
    with_options = public | {"options"}
    has_config = spec.mcp is not None and spec.mcp.config_template is not None
    mcp_names = with_options | {"mcp_url"} | ({"mcp_config_path"} if has_config else set())

    def check(key: str, template: str, allowed: set[str]) -> None:
        for token in placeholders(template):
            head, _, option = token.partition(".")
            if head == "options" and option and "options" in allowed:
                if option not in spec.options:
                    declared = ", ".join(spec.options) or "none"
                    close = difflib.get_close_matches(option, list(spec.options), n=1, cutoff=0.6)
                    hint = f" (did you mean options.{close[0]}?)" if close else ""
                    raise SpecError(
                        f"{spec.path}: {key}: {{{token}}} names an option [options] does not declare{hint}; "
                        f"declared: {declared}"
                    )
                continue
            if token in allowed:
                continue
            raise SpecError(f"{spec.path}: {key}: {_why_not(token, allowed, spec)}")

    if spec.install is not None:
        for i, command in enumerate(spec.install.commands):
            check(f"install.commands.{i}", command, public)
    for i, arg in enumerate(spec.launch.argv):
        check(f"launch.argv.{i}", arg, with_options)
    for name, value in spec.launch.env.items():
        check(f"launch.env.{name}", value, with_options | {"api_key"})
    for target, content in spec.launch.files.items():
        check(f"launch.files.{target}", target, with_options)
        check(f"launch.files.{target}", content, with_options)
    for target in spec.launch.assets:
        check(f"launch.assets.{target}", target, public)
    if spec.builtins is not None:
        for i, arg in enumerate(spec.builtins.disable_args or ()):
            check(f"builtins.disable.args.{i}", arg, with_options)
        for name, value in (spec.builtins.disable_env or {}).items():
            check(f"builtins.disable.env.{name}", value, with_options)
    if spec.mcp is not None:
        for i, arg in enumerate(spec.mcp.args):
            check(f"mcp.args.{i}", arg, mcp_names)
        for name, value in spec.mcp.env.items():
            check(f"mcp.env.{name}", value, mcp_names | {"api_key"})
        if spec.mcp.config_template is not None:
            check("mcp.config_template", spec.mcp.config_template, public | {"mcp_url"})
        check("mcp.config_file", spec.mcp.config_file, public)
    if spec.final_message is not None and spec.final_message.file is not None:
        check("final_message.file", spec.final_message.file, public)


def _why_not(token: str, allowed: set[str], spec: HarnessSpec) -> str:
    """Why `{token}` may not stand here: a known placeholder in the wrong place says where it may go."""
    head = token.partition(".")[0]
    if token == "api_key":
        return (
            "{api_key} may appear only in [launch.env] and [mcp.env] values (never in argv, files or paths)"
        )
    if head == "options":
        return f"{{{token}}}: options render only in [launch] argv/env/files, [mcp] args/env and [builtins.disable]"
    if token == "toolchain" and spec.toolchain is None:
        return "{toolchain} needs install.toolchain"
    if token == "mcp_url":
        return "{mcp_url} may appear only inside [mcp]"
    if token == "mcp_config_path":
        if spec.mcp is None or spec.mcp.config_template is None:
            return "{mcp_config_path} needs mcp.config_template"
        return "{mcp_config_path} may appear only in [mcp] args and env"
    close = difflib.get_close_matches(token, sorted(allowed), n=1, cutoff=0.6)
    hint = f" (did you mean {{{close[0]}}}?)" if close else ""
    return f"unknown placeholder {{{token}}}{hint}; allowed here: " + ", ".join(
        f"{{{name}}}" for name in sorted(allowed)
    )


# ---------------------------------------------------------------------------------------------- registry

#: TOML specs that entry points gave in this process, by `name@version` (a spec path loaded directly is not here):
#: the one registry's store
SPECS: VersionedRegistry[HarnessSpec] = registry.HARNESS_SPECS


def register_spec(spec: HarnessSpec) -> HarnessSpec:
    """Record a spec under its ref; the same file again replaces it, another file under that ref is "defined twice"."""
    try:
        return SPECS.add(spec)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def registered_specs() -> dict[str, HarnessSpec]:
    return SPECS.records()


def clear_specs() -> None:
    SPECS.clear()
