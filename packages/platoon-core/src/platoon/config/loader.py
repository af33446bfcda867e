"""Load a config file into a validated model (in order).

read + `extends` (per-file input paths first) -> schema choice (`trainer_config` narrowing) -> overrides ->
named environments (lowest layer) -> remaining relative paths against the cwd -> site profile -> normalize,
validate, build -> deprecations. Every problem of a stage is reported at once in one ConfigError.
"""

from __future__ import annotations

import importlib
import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from platoon import plugins, registry
from platoon.config.messages import bool_number_problems, validation_problems
from platoon.config.named import get_environment
from platoon.config.overrides import (
    NUMERIC_TEXT,
    NoneType,
    Override,
    apply_overrides,
    child_type,
    deep_merge,
    did_you_mean,
    is_any,
    is_model,
    is_str_like,
    model_keys,
    parse_override,
    pick_member,
    split_library_argv,
    union_members,
    unwrap,
    yaml_kind,
)
from platoon.config.paths import resolve_entry_paths
from platoon.config.site import SiteProfile, apply_site, deprecated_variables, load_site, site_location
from platoon.config.strict_yaml import DuplicateKey, StrictSafeLoader
from platoon.deprecations import DeprecatedKey, PlatoonDeprecationWarning, deprecation_message
from platoon.errors import ConfigError, ExtensionError

KINDS = ("auto", "train", "eval", "environments", "none")

_SCHEMAS = {
    "train": ("platoon.config.training", "PlatoonTinkerRLTrainerConfig"),
    "eval": ("platoon.eval.config_defs", "PlatoonEvalConfig"),
    "environments": ("platoon.config.environments", "EnvironmentsOnlyConfig"),
}
_TRAINING_CLASS = "PlatoonTinkerRLTrainerConfig"
_IMPORT_STRING = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class ConfigFileNotFound(ConfigError, FileNotFoundError):
    """The top config file does not exist (`<config>: no such config file`, exit 78)."""


@dataclass(frozen=True)
class DeprecationRecord:
    """A deprecated key (or environment variable) in use: where, the declaration, the message to print."""

    path: str
    key: DeprecatedKey
    message: str


@dataclass
class LoadedConfig:
    """A resolved config: `data` is what `config show` prints, `config` the built model (None without schema)."""

    path: Path
    schema: type[BaseModel] | None
    data: dict[str, Any]
    config: BaseModel | None
    sources: list[Path]
    overrides: list[str]
    deprecations: list[DeprecationRecord] = field(default_factory=list)
    site: SiteProfile | None = None
    site_gave: dict[str, Any] = field(default_factory=dict)
    named_after: str | None = None
    kind: str = "none"
    site_looked_at: Path | None = None

    @property
    def schema_name(self) -> str:
        return self.schema.__name__ if self.schema is not None else "no schema"


def warn_deprecations(loaded: LoadedConfig) -> None:
    """Issue each deprecation as a PlatoonDeprecationWarning (filters apply; the command line catches them)."""
    for record in loaded.deprecations:
        warnings.warn(record.message, PlatoonDeprecationWarning, stacklevel=2)


# ---------------------------------------------------------------------------------------------------------------
# Files and `extends`
# ---------------------------------------------------------------------------------------------------------------


def _display(path: Path, cwd: Path) -> str:
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


Provenance = dict[tuple[Any, ...], str | None]


def _mark(prov: Provenance, path: tuple[Any, ...], origin: str | None) -> None:
    # Only what lies under `path` is replaced; an ancestor keeps naming the file of its other values.
    for key in [k for k in prov if k[: len(path)] == path]:
        del prov[key]
    prov[path] = origin


def _merge_into(
    dst: dict[str, Any],
    src: Mapping[str, Any],
    origin: str | None,
    prov: Provenance,
    prefix: tuple[Any, ...] = (),
) -> None:
    """Deep-merge `src` into `dst` in place, recording which file set each replaced value."""
    for key, value in src.items():
        path = (*prefix, key)
        if isinstance(value, Mapping) and isinstance(dst.get(key), dict):
            _merge_into(dst[key], value, origin, prov, path)
        elif isinstance(value, Mapping):
            dst[key] = {}
            _mark(prov, path, origin)
            _merge_into(dst[key], value, origin, prov, path)
        else:
            dst[key] = value
            _mark(prov, path, origin)


class _FileLoader:
    def __init__(self, top: Path, cwd: Path) -> None:
        self.top = top
        self.cwd = cwd
        self.problems: list[str] = []
        #: problems that begin with the file they are about (reading it failed), so need no header naming it
        self.self_named: set[str] = set()
        self.sources: list[Path] = []
        self.prov: Provenance = {}

    def show(self, path: Path) -> str:
        return _display(path, self.cwd)

    def load(self, path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any] | None:
        real = path.resolve()
        if real in chain:
            names = [self.show(p) for p in chain[chain.index(real) :]] + [self.show(real)]
            self.problems.append("extends cycle: " + " -> ".join(names))
            return None
        shown = self.show(path)
        try:
            data = read_yaml_mapping(path, shown)
        except ConfigError as exc:
            self.problems.extend(exc.problems)
            self.self_named.update(exc.problems)
            return None
        bases = self._bases(data.pop("extends", None), shown)
        origin = None if real == self.top.resolve() else shown
        # This file's input paths are relative to its own directory, so they resolve before anything merges.
        for problem in resolve_entry_paths(data, base_dir=path.parent, cwd=self.cwd, source=path):
            self.problems.append(f"{origin}: {problem}" if origin else problem)
        merged: dict[str, Any] = {}
        for base in bases:
            base_path = Path(os.path.expanduser(base))
            if not base_path.is_absolute():
                base_path = path.parent / base_path
            base_path = Path(os.path.normpath(base_path))
            if not base_path.is_file():
                what = "which is not a file" if base_path.exists() else "which does not exist"
                self.problems.append(f"{shown}: extends {base}, {what}")
                continue
            loaded = self.load(base_path, (*chain, real))
            if loaded is not None:
                _merge_into(merged, loaded, None, {})
        # Provenance is recorded once, in merge order, so the last writer of a value is the file named.
        _merge_into(merged, data, origin, {})
        if path not in self.sources:
            self.sources.append(path)
        self._record(data, origin)
        return merged

    def _record(self, data: Mapping[str, Any], origin: str | None) -> None:
        scratch: dict[str, Any] = {}
        _merge_into(scratch, data, origin, self.prov)

    def _bases(self, value: Any, shown: str) -> list[str]:
        if value is None:
            return []
        if isinstance(value, str) and value:
            return [value]
        if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
            return list(value)
        self.problems.append(f"{shown}: extends must be a path or a list of non-empty paths, got {value!r}")
        return []


def empty_config_problem(shown: str) -> str:
    """The refusal of a config with no keys at all (its file, bases and overrides hold nothing)."""
    return (
        f"{shown}: the config is empty: write a training config (train, environments) or an evaluation config "
        "(inference, environments); docs/reference/config.md lists the keys"
    )


def read_yaml_mapping(path: Path, shown: str) -> dict[str, Any]:
    """A YAML file's top-level mapping (an empty file is `{}`); one ConfigError line when it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{shown}: not a YAML file (its bytes are not UTF-8 text)") from None
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot be read ({exc.strerror or exc})") from None
    try:
        data = yaml.load(text, Loader=StrictSafeLoader)  # a SafeLoader subclass: safe
    except DuplicateKey as exc:
        raise ConfigError(
            f"{shown}:{exc.line}: duplicate key {exc.key!r} (first given on line {exc.first_line}): YAML would "
            "keep only the last value; give the key once"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{shown}: invalid YAML: {_yaml_error(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: the top level must be a mapping, got {yaml_kind(data)}")
    return data


def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


# ---------------------------------------------------------------------------------------------------------------
# Schemas
# ---------------------------------------------------------------------------------------------------------------


def import_object(ref: str) -> Any:
    """`module:attr.path` -> the object (ImportError/AttributeError propagate)."""
    module_name, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_schema(schema: type[BaseModel] | str) -> type[BaseModel]:
    """A schema given as a class or `module:Class`."""
    if isinstance(schema, str):
        if not _IMPORT_STRING.match(schema):
            raise ConfigError(f"schema {schema!r}: expected module:Class")
        try:
            obj = import_object(schema)
        except Exception as exc:
            raise ConfigError(f"schema {schema}: cannot import it ({type(exc).__name__}: {exc})") from None
    else:
        obj = schema
    if not is_model(obj):
        raise ConfigError(f"schema {schema!r}: not a pydantic model class")
    return obj


def schema_for_kind(kind: str) -> type[BaseModel] | None:
    if kind == "none":
        return None
    module_name, name = _SCHEMAS[kind]
    module = importlib.import_module(module_name)
    return getattr(module, name)


#: the top-level key that picks each schema under `auto`
_PICKING_KEYS = {"inference": "eval", "train": "train", "environments": "environments"}


def choose_kind(data: Mapping[str, Any]) -> str:
    """The schema a file's keys pick: only `environments` -> environments; `inference` -> eval; `train` -> train;
    else the schema whose picking key an unknown top-level key misspells (`trian:` -> train, so the file is
    refused as `platoon train` refuses it, not passed unvalidated); else none."""
    keys = set(data)
    if keys == {"environments"}:
        return "environments"
    if "inference" in keys:
        return "eval"
    if "train" in keys:
        return "train"
    return _misspelt_kind(keys)


def _misspelt_kind(keys: set[Any]) -> str:
    """The kind whose picking key one of `keys` nearly spells, among the keys no schema knows; else none."""
    known: set[str] = set()
    for kind in ("train", "eval"):
        schema = schema_for_kind(kind)
        if schema is not None:
            known.update(model_keys(schema))
    for key in sorted(str(k) for k in keys):
        if key in known:
            continue
        match = did_you_mean(key.lower(), _PICKING_KEYS)
        if match is not None:
            return _PICKING_KEYS[match]
    return "none"


def is_training_schema(schema: type[BaseModel] | None) -> bool:
    return schema is not None and any(c.__name__ == _TRAINING_CLASS for c in schema.__mro__)


def _registry_lookup(name: str) -> Any:
    """A trainer config registered with `platoon.registry.register_trainer_config` (LookupError if none)."""
    found = registry.lookup("trainer_config", name)
    if found is None:
        raise LookupError(f"no trainer_config is registered as {name!r}")
    return found


def resolve_trainer_config(ref: str, package: Any = None) -> type[BaseModel]:
    """An entry's `trainer_config` (`module:Class` or a registered name) -> the class; ConfigError otherwise."""
    if not isinstance(ref, str) or not ref:
        raise ConfigError(f"{ref!r} is not a module:Class or a registered name")
    try:
        if ":" in ref:
            obj = import_object(ref)
        else:
            try:
                obj = _registry_lookup(ref)
            except (LookupError, ImportError, ConfigError):
                if not isinstance(package, str) or not package:
                    raise
                importlib.import_module(package)  # its import registers names
                obj = _registry_lookup(ref)
    except Exception as exc:
        raise ConfigError(f"{ref} does not resolve ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, type):
        raise ConfigError(f"{ref} is not a class")
    return obj


def _trainer_refs(data: Mapping[str, Any]) -> list[tuple[int, Any, Any]]:
    entries = data.get("environments")
    if not isinstance(entries, list):
        return []
    return [
        (i, e.get("trainer_config"), e.get("package"))
        for i, e in enumerate(entries)
        if isinstance(e, dict) and e.get("trainer_config") is not None
    ]


def _narrow(schema: type[BaseModel], data: Mapping[str, Any], problems: list[str]) -> type[BaseModel]:
    classes: list[type[BaseModel]] = []
    for index, ref, package in _trainer_refs(data):
        where = f"environments.{index}.trainer_config"
        try:
            cls = resolve_trainer_config(ref, package)
        except ConfigError as exc:
            problems.append(f"{where}: {exc.problems[0]}")
            continue
        if not issubclass(cls, schema):
            problems.append(f"{where}: {ref} is not a subclass of {schema.__name__}")
            continue
        if cls not in classes:
            classes.append(cls)
    if len(classes) > 1:
        names = ", ".join(c.__name__ for c in classes)
        problems.append(
            f"environments: the entries name different trainer_config classes ({names}); a run has one"
        )
    return classes[0] if len(classes) == 1 else schema


# ---------------------------------------------------------------------------------------------------------------
# Named environments
# ---------------------------------------------------------------------------------------------------------------


def _expand_named(data: dict[str, Any], problems: list[str]) -> None:
    entries = data.get("environments")
    if not isinstance(entries, list):
        return
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("env"), str) or not entry.get("env"):
            continue
        where = f"environments.{index}.env"
        try:
            named = get_environment(entry["env"])
        except ConfigError as exc:  # ExtensionError included
            problems.append(f"{where}: {'; '.join(exc.problems)}")
            continue
        expanded = deep_merge(named.entry(), entry)
        harness = expanded.get("harness")
        try:
            defaults = named.defaults_for(harness) or {}
        except (ValueError, ExtensionError) as exc:
            # A mixture over a harness with defaults is fine when the entry says its options itself.
            if "harness_options" not in entry:
                problems.append(f"environments.{index}.harness_options: {exc}")
            defaults = {}
        if defaults or "harness_options" in expanded:
            own = expanded.get("harness_options")
            expanded["harness_options"] = (
                deep_merge(defaults, own)
                if isinstance(own, dict)
                else (own if own is not None else dict(defaults))
            )
        expanded.pop("env", None)
        entries[index] = {"env": named.ref, **expanded}


def expand_named_environment(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One `environments` entry with its `env: name[@version]` expanded exactly as a config's is: the named entry
    below the given keys, its harness defaults under `harness_options`. Raises ConfigError naming the problem."""
    data: dict[str, Any] = {"environments": [dict(entry)]}
    problems: list[str] = []
    _expand_named(data, problems)
    if problems:
        raise ConfigError(problems)
    expanded: dict[str, Any] = data["environments"][0]
    return expanded


# ---------------------------------------------------------------------------------------------------------------
# Normalization and deprecations
# ---------------------------------------------------------------------------------------------------------------


def _float_field(tp: Any) -> bool:
    tp = unwrap(tp)
    members = [unwrap(m) for m in (union_members(tp) or [tp]) if m is not NoneType]
    return float in members and not any(is_str_like(m) or is_any(m) for m in members)


def normalize_numbers(value: Any, tp: Any) -> Any:
    """Numeric strings in float fields become floats (YAML 1.1 reads `3e-5` as text)."""
    if tp is None:
        return value
    if isinstance(value, str):
        if _float_field(tp) and NUMERIC_TEXT.match(value.strip()):
            return float(value.strip())
        return value
    member = pick_member(unwrap(tp), value)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            ctp = child_type(member, key, value)
            out[key] = normalize_numbers(item, ctp) if ctp is not None else item
        return out
    if isinstance(value, list):
        return [normalize_numbers(item, child_type(member, i, value)) for i, item in enumerate(value)]
    return value


def _service_deprecations(service: Any) -> Mapping[str, DeprecatedKey]:
    """The deprecated `service_kwargs` keys a service class declares (its `DEPRECATED_KEYS`), if it resolves."""
    if not isinstance(service, str) or not service:
        return {}
    try:
        factory = plugins.get_service(plugins.service_scheme(service)).factory
        if isinstance(factory, str):
            factory = plugins.resolve_target(factory)
        declared = getattr(factory, "DEPRECATED_KEYS", None) or {}
        return {k: v for k, v in dict(declared).items() if isinstance(v, DeprecatedKey)}
    except Exception:
        # A service that does not resolve is reported by component resolution, not here.
        return {}


def collect_deprecations(data: Any, tp: Any, path: tuple[Any, ...] = ()) -> list[DeprecationRecord]:
    """Deprecated keys set in `data`, in order of appearance (a key set to null counts)."""
    found: list[DeprecationRecord] = []
    if tp is None:
        return found
    member = pick_member(unwrap(tp), data)
    if isinstance(data, dict):
        declared: Mapping[str, DeprecatedKey] = (
            getattr(member, "DEPRECATED_KEYS", {}) if is_model(member) else {}
        )
        options: Mapping[str, Any] = getattr(member, "DEPRECATED_OPTIONS", {}) if is_model(member) else {}
        for key, value in data.items():
            here = (*path, key)
            if key in (declared or {}):
                dotted = ".".join(str(p) for p in here)
                found.append(
                    DeprecationRecord(dotted, declared[key], deprecation_message(dotted, declared[key]))
                )
            inner: Mapping[str, DeprecatedKey] = {}
            if key in (options or {}) and isinstance(value, dict):
                spec = options[key]
                inner = spec(data) if callable(spec) else spec
            if key == "service_kwargs" and isinstance(value, dict):
                inner = {**_service_deprecations(data.get("service")), **(inner or {})}
            if inner and isinstance(value, dict):
                for option in value:
                    if option in inner:
                        dotted = ".".join(str(p) for p in (*here, option))
                        found.append(
                            DeprecationRecord(
                                dotted, inner[option], deprecation_message(dotted, inner[option])
                            )
                        )
            ctp = child_type(member, key, data)
            if ctp is not None:
                found.extend(collect_deprecations(value, ctp, here))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            ctp = child_type(member, index, data)
            if ctp is not None:
                found.extend(collect_deprecations(item, ctp, (*path, index)))
    return found


# ---------------------------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------------------------


def _attribution(prov: Provenance) -> Any:
    def attribute(path: Sequence[Any]) -> str | None:
        key = tuple(path)
        while True:
            if key in prov:
                return prov[key]
            if not key:
                return None
            key = key[:-1]

    return attribute


def load_config(
    path: str | os.PathLike[str] | None,
    overrides: Iterable[str] = (),
    *,
    kind: str = "auto",
    schema: type[BaseModel] | str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    use_site: bool = True,
    environ: Mapping[str, str] | None = None,
) -> LoadedConfig:
    """Resolve and validate a config file. Raises ConfigError (exit 78) for anything wrong.

    `overrides` may also be the library argv form (`--config PATH`, `--key=value`, `--key value`, `--key`);
    `path` may then be None. `environ` replaces `os.environ` for the site profile (tests).
    """
    env = os.environ if environ is None else environ
    if kind not in KINDS:
        raise ConfigError(f"kind {kind!r}: expected one of {', '.join(KINDS)}")
    override_texts = list(overrides)
    argv_config = None
    if any(item.startswith("-") for item in override_texts):
        # The library argv form; plain `k=v` lists (the command line's) keep malformed items for their message.
        argv_config, override_texts = split_library_argv(override_texts)
    if argv_config is not None:
        if path is not None:
            raise ConfigError(f"a config file is named twice: {os.fspath(path)} and --config {argv_config}")
        path = argv_config
    if path is None:
        raise ConfigError("no config file given (--config PATH)")
    workdir = Path(os.path.abspath(cwd if cwd is not None else os.getcwd()))
    given = os.fspath(path)
    config_path = Path(os.path.expanduser(given))
    if not config_path.is_absolute():
        config_path = workdir / config_path
    config_path = Path(os.path.normpath(config_path))
    if not config_path.is_file():
        if config_path.is_dir():
            raise ConfigError(f"{given}: is a directory, not a config file")
        raise ConfigFileNotFound(f"{given}: no such config file")

    # 1-3: the file, its bases and their input paths.
    files = _FileLoader(config_path, workdir)
    merged = files.load(config_path)
    if files.problems or merged is None:
        found = list(dict.fromkeys(files.problems))  # a base reached twice (diamond extends) reports once
        raise ConfigError(found, source=None if found and files.self_named.issuperset(found) else given)
    prov = files.prov

    # 4: the schema, narrowed by the files' trainer_config.
    problems: list[str] = []
    if schema is not None:
        chosen: type[BaseModel] | None = resolve_schema(schema)
        resolved_kind = "train" if is_training_schema(chosen) else "custom"
    else:
        resolved_kind = choose_kind(merged) if kind == "auto" else kind
        try:
            chosen = schema_for_kind(resolved_kind)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"the {resolved_kind} schema cannot be imported ({type(exc).__name__}: {exc})"
            ) from None
    base_schema = chosen
    if chosen is not None and is_training_schema(chosen):
        chosen = _narrow(chosen, merged, problems)
    if problems:
        raise ConfigError(problems, source=given)

    # 5: overrides, typed by the chosen schema.
    parsed: list[Override] = []
    for text in override_texts:
        try:
            parsed.append(parse_override(text))
        except ConfigError as exc:
            problems.extend(exc.problems)
    try:
        data = apply_overrides(merged, parsed, chosen)
    except ConfigError as exc:
        problems.extend(exc.problems)
        data = merged
    if problems:
        raise ConfigError(problems, source=given)
    if not data and schema is None:
        # One refusal for every command: `config validate` would otherwise pass what `platoon train` refuses.
        raise ConfigError(empty_config_problem(given))
    for ov in parsed:
        _mark(prov, tuple(ov.key.split(".")), None)
    if base_schema is not None and is_training_schema(base_schema):
        before = [(i, ref) for i, ref, _ in _trainer_refs(merged)]
        after = _trainer_refs(data)
        if before != [(i, ref) for i, ref, _ in after]:
            check: list[str] = []
            narrowed = _narrow(base_schema, data, check)
            if check or narrowed is not chosen:
                culprits = [
                    ov.text
                    for ov in parsed
                    if "trainer_config" in ov.key or ov.key.startswith("environments")
                ]
                named = ", ".join(repr(c) for c in culprits) or "an override"
                raise ConfigError(
                    [f"override {named} would change the trainer_config class: set trainer_config in a file"],
                    source=given,
                )

    # 6-7: named environments (the lowest layer of their entries), then the remaining relative paths.
    _expand_named(data, problems)
    if problems:
        raise ConfigError(problems, source=given)
    resolve_entry_paths(data, base_dir=None, cwd=workdir)
    if isinstance(data.get("log_path"), str) and data["log_path"].startswith("~"):
        data["log_path"] = os.path.expanduser(data["log_path"])
    inference = data.get("inference")
    if (
        isinstance(inference, dict)
        and isinstance(inference.get("output_dir"), str)
        and inference["output_dir"].startswith("~")
    ):
        inference["output_dir"] = os.path.expanduser(inference["output_dir"])

    # 8: the site profile: deprecated-variable conflicts, then filling gaps.
    profile: SiteProfile | None = None
    looked_at: Path | None = None
    if use_site:
        profile = load_site(env)
        looked_at = profile.path if profile is not None else site_location(env)[1]
    variable_records = [
        DeprecationRecord(v.path, v.key, v.message) for v in deprecated_variables(profile, env)
    ]
    application = apply_site(
        data,
        profile,
        training=is_training_schema(chosen) or resolved_kind == "train",
        config_path=config_path,
    )
    if profile is not None:
        for key in application.gave:
            _mark(prov, tuple(key.split(".")), str(profile.path))

    # 9: normalize, validate, build.
    config: BaseModel | None = None
    deprecations = list(variable_records)
    if chosen is not None:
        data = normalize_numbers(data, chosen)
        key_records = collect_deprecations(data, chosen)
        attribute = _attribution(prov)
        for where, problem in bool_number_problems(data, chosen):
            origin = attribute(where)
            problems.append(f"{origin}: {problem}" if origin else problem)
        try:
            config = chosen.model_validate(data)
        except ValidationError as exc:
            problems.extend(
                p for p in validation_problems(exc, data, chosen, attribute=attribute) if p not in problems
            )
        if problems:
            error = ConfigError(problems, source=given)
            error.deprecations = deprecations + key_records  # type: ignore[attr-defined]
            raise error
        # 10: deprecated variables first, then keys in order of appearance.
        deprecations += key_records

    return LoadedConfig(
        path=config_path,
        schema=chosen,
        data=data,
        config=config,
        sources=list(files.sources),
        overrides=list(override_texts),
        deprecations=deprecations,
        site=profile,
        site_gave=dict(application.gave),
        named_after=application.named_after,
        kind=resolved_kind,
        site_looked_at=looked_at,
    )
