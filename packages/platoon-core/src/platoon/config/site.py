"""The site profile: where a site keeps platoon's files and which runtime starts its sandboxes.

A profile holds four keys only (`cache`, `runs`, `provider`, `provider_options`). It fills gaps in a run config
after overrides and never moves what a config sets explicitly.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from platoon import plugins
from platoon.config.strict_yaml import DuplicateKey, StrictSafeLoader
from platoon.deprecations import DeprecatedKey, deprecation_message
from platoon.errors import ConfigError

SITE_KEYS = ("cache", "runs", "provider", "provider_options")
DEFAULT_CACHE_TEXT = "~/.cache/platoon"

#: The provider options a profile may set, and their kinds: nothing that weakens isolation, except `egress_allow`,
#: which says by name which private or host destinations (`host` or `host:port`) public and allowlist sandboxes
#: may reach: loosening the filter is the site's decision, so it is made here.
PROVIDER_OPTIONS: dict[str, str] = {
    "allow_network_none": "bool",
    "egress_allow": "hosts",
    "rootfs_layout": "text",
    "scratch_root": "path",
    "image_cache": "path",
    "stage_images": "bool",
    "gpu": "text",
    "runtime": "text",
    "egress_runtime": "text",
}

#: Built-in providers and whether they isolate; others are asked about through the plugin machinery.
KNOWN_PROVIDERS: dict[str, bool] = {"docker": True, "singularity": True, "enroot": True, "process": False}

UNKNOWN_KEY_HINT = (
    "a site profile holds only file locations (cache, runs) and the sandbox runtime (provider, provider_options), "
    "never training settings"
)

#: Deprecated variables and the directory under the profile's cache each one names.
DEPRECATED_VARIABLES: dict[str, str] = {"PLATOON_HARBOR_CACHE": "harbor", "PLATOON_TOOLCHAINS": "toolchains"}
DEPRECATED_VARIABLE_KEY = DeprecatedKey(removed_in="0.3.0", instead="the site profile's cache")

_VAR = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class SiteProfile:
    """A read profile: the keys it set (expanded, paths absolute), its path and sha256."""

    path: Path
    sha256: str
    cache: Path | None = None
    runs: Path | None = None
    provider: str | None = None
    provider_options: dict[str, Any] = field(default_factory=dict)

    @property
    def values(self) -> dict[str, Any]:
        """The keys the profile sets, in a fixed order (paths as strings)."""
        out: dict[str, Any] = {}
        if self.cache is not None:
            out["cache"] = str(self.cache)
        if self.runs is not None:
            out["runs"] = str(self.runs)
        if self.provider is not None:
            out["provider"] = self.provider
        if self.provider_options:
            out["provider_options"] = dict(self.provider_options)
        return out

    @property
    def cache_root(self) -> Path:
        return self.cache if self.cache is not None else default_cache_root()

    @property
    def harbor_cache(self) -> Path:
        return self.cache_root / "harbor"

    @property
    def toolchains(self) -> Path:
        return self.cache_root / "toolchains"


def default_cache_root() -> Path:
    return Path(os.path.expanduser(DEFAULT_CACHE_TEXT))


def _environ(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def default_site_path(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CONFIG_HOME/platoon/site.yaml`, default `~/.config/platoon/site.yaml`."""
    environ = _environ(env)
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "platoon" / "site.yaml"


def site_location(env: Mapping[str, str] | None = None) -> tuple[Path | None, Path]:
    """(the profile to read or None, the path looked at). `$PLATOON_SITE` must name an existing non-directory file;
    `/dev/null` is the usual way to say "no profile" and reads as an empty one."""
    environ = _environ(env)
    named = environ.get("PLATOON_SITE", "")
    if named:
        path = Path(os.path.expanduser(named))
        if not path.exists() or path.is_dir():
            raise ConfigError(f"$PLATOON_SITE names {named}, which is not a file")
        return path.absolute(), path.absolute()
    path = default_site_path(env)
    return (path if path.is_file() else None), path


def _expand(value: str, key: str, environ: Mapping[str, str], problems: list[str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("plain")
        if name not in environ:
            problems.append(f"{key}: ${name} is not set")
            return match.group(0)
        return environ[name]

    return os.path.expanduser(_VAR.sub(substitute, value))


def _as_path(value: str, base: Path) -> Path:
    path = Path(value)
    return Path(os.path.normpath(path if path.is_absolute() else base / path))


def _provider_problem(name: str) -> str | None:
    """Why a profile may not choose this provider, or None when it isolates."""
    isolates = KNOWN_PROVIDERS.get(name)
    if isolates is None:
        cls: Any = None
        try:
            if ":" in name:
                module, _, attr = name.partition(":")
                cls = importlib.import_module(module)
                for part in attr.split("."):
                    cls = getattr(cls, part)
            else:
                runtime = plugins.get_sandbox_runtime(name)
                cls = getattr(runtime, "provider", runtime)
                if isinstance(cls, str):
                    cls = plugins.resolve_target(cls)
        except Exception as exc:  # an unresolvable provider is refused, never a traceback
            return f"provider: {name} does not resolve ({type(exc).__name__}: {exc})"
        if cls is None:
            return f"provider: {name} is not a known sandbox provider (docker, singularity, enroot)"
        isolates = bool(getattr(cls, "isolates", False))
    if not isolates:
        return (
            f"provider: {name} does not isolate sandboxes, so a site profile may not choose it "
            "(docker, singularity or enroot do; a run config may name it itself)"
        )
    return None


def parse_site(path: Path, text: str, env: Mapping[str, str] | None = None) -> SiteProfile:
    """A profile from its text; every problem is reported together (ConfigError with the profile as source)."""
    environ = _environ(env)
    sha = hashlib.sha256(text.encode()).hexdigest()
    try:
        raw = yaml.load(text, Loader=StrictSafeLoader)  # a SafeLoader subclass: safe
    except DuplicateKey as exc:
        raise ConfigError(
            [
                f"line {exc.line}: duplicate key {exc.key!r} (first given on line {exc.first_line}); give the key once"
            ],
            source=str(path),
        ) from None
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError([f"invalid YAML: {detail}"], source=str(path)) from None
    if raw is None:
        return SiteProfile(path=path, sha256=sha)
    if not isinstance(raw, dict):
        raise ConfigError([f"config: expected a mapping, got {type(raw).__name__}"], source=str(path))
    problems: list[str] = []
    base = path.parent
    for key in raw:
        if key not in SITE_KEYS:
            problems.append(f"{key}: unknown key; {UNKNOWN_KEY_HINT}")

    def text_value(key: str, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            problems.append(f"{key}: {value!r} is not a non-empty string")
            return None
        return _expand(value, key, environ, problems)

    cache_text = text_value("cache", raw.get("cache"))
    runs_text = text_value("runs", raw.get("runs"))
    provider = text_value("provider", raw.get("provider"))
    cache = _as_path(cache_text, base) if cache_text else None
    runs = _as_path(runs_text, base) if runs_text else None
    if provider:
        problem = _provider_problem(provider)
        if problem:
            problems.append(problem)
    options: dict[str, Any] = {}
    raw_options = raw.get("provider_options")
    if raw_options is not None:
        if not isinstance(raw_options, dict):
            problems.append(f"provider_options: expected a mapping, got {type(raw_options).__name__}")
        else:
            if raw_options and not provider:
                problems.append("provider_options: set without a provider; name the provider they are for")
            for name, value in raw_options.items():
                where = f"provider_options.{name}"
                kind = PROVIDER_OPTIONS.get(str(name))
                if kind is None:
                    problems.append(
                        f"{where}: a site profile may set only {', '.join(PROVIDER_OPTIONS)} "
                        "(other options belong in a run config's provider_options)"
                    )
                elif kind == "hosts":
                    entries = value if isinstance(value, list) else None
                    if entries is None or not all(isinstance(e, str) and e.strip() for e in entries):
                        problems.append(
                            f"{where}: expected a list of host or host:port entries, got {value!r}"
                        )
                        continue
                    options[name] = [_expand(e.strip(), where, environ, problems) for e in entries]
                elif kind == "bool":
                    if isinstance(value, str):
                        value = _expand(value, where, environ, problems)
                        value = {"true": True, "false": False}.get(value.lower(), value)
                    if not isinstance(value, bool):
                        problems.append(f"{where}: {value!r} is not a bool")
                    options[name] = value
                else:
                    if isinstance(value, (int, float)) and not isinstance(value, bool) and kind == "text":
                        value = str(value)
                    if not isinstance(value, str) or not value:
                        problems.append(f"{where}: {value!r} is not a non-empty string")
                        continue
                    value = _expand(value, where, environ, problems)
                    options[name] = str(_as_path(value, base)) if kind == "path" else value
    if problems:
        raise ConfigError(problems, source=str(path))
    return SiteProfile(
        path=path, sha256=sha, cache=cache, runs=runs, provider=provider or None, provider_options=options
    )


# Profiles are re-read only when the file changes (mtime, size or inode).
_CACHE: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[tuple[int, int, int], SiteProfile]] = {}


def load_site(env: Mapping[str, str] | None = None) -> SiteProfile | None:
    """The site profile in effect, or None; re-read when the file's mtime, size or inode change."""
    environ = _environ(env)
    path, _ = site_location(environ)
    if path is None:
        return None
    stat = path.stat()
    stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    # Expansion depends on the variables the profile names, so they are part of the cache key.
    key = (str(path), tuple(sorted((k, v) for k, v in environ.items() if k in _referenced(path))))
    cached = _CACHE.get(key)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"site profile {path}: cannot be read as YAML text ({exc})") from None
    profile = parse_site(path, text, environ)
    _CACHE[key] = (stamp, profile)
    return profile


def _referenced(path: Path) -> set[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return set()
    return {m.group("braced") or m.group("plain") for m in _VAR.finditer(text)}


@dataclass(frozen=True)
class VariableDeprecation:
    """A deprecated environment variable in use (recorded before deprecated keys)."""

    path: str
    key: DeprecatedKey
    message: str


def deprecated_variables(
    profile: SiteProfile | None, env: Mapping[str, str] | None = None
) -> list[VariableDeprecation]:
    """The deprecated cache variables that are set; refused when they disagree with the profile's `cache`."""
    environ = _environ(env)
    found: list[VariableDeprecation] = []
    problems: list[str] = []
    for name, sub in DEPRECATED_VARIABLES.items():
        value = environ.get(name, "")
        if not value:
            continue
        path = f"${name}"
        found.append(
            VariableDeprecation(
                path, DEPRECATED_VARIABLE_KEY, deprecation_message(path, DEPRECATED_VARIABLE_KEY)
            )
        )
        if profile is not None and profile.cache is not None:
            expected = profile.cache / sub
            given = Path(os.path.normpath(os.path.abspath(os.path.expanduser(value))))
            if given != Path(os.path.normpath(expected)):
                problems.append(
                    f"${name} is {value}, but the site profile's cache puts it at {expected}: "
                    f"unset ${name} (deprecated) or point it at {expected}"
                )
    if problems:
        raise ConfigError(problems, source=str(profile.path) if profile is not None else None)
    return found


def _set_path(data: dict[str, Any], dotted_key: str, value: Any) -> None:
    node = data
    parts = dotted_key.split(".")
    for part in parts[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[parts[-1]] = value


@dataclass
class SiteApplication:
    """What the profile filled: dotted key -> value, and the config path a run was named after."""

    gave: dict[str, Any] = field(default_factory=dict)
    named_after: str | None = None


def apply_site(
    data: dict[str, Any], profile: SiteProfile | None, *, training: bool, config_path: Path | None
) -> SiteApplication:
    """Fill gaps from the profile, in place; explicit settings are never moved."""
    result = SiteApplication()
    if profile is None:
        return result
    if training and profile.runs is not None and data.get("log_path") is None:
        data["log_path"] = str(profile.runs)
        result.gave["log_path"] = str(profile.runs)
        stats = data.get("stats")
        if config_path is not None and (not isinstance(stats, dict) or stats.get("experiment_name") is None):
            _set_path(data, "stats.experiment_name", config_path.stem)
            result.gave["stats.experiment_name"] = config_path.stem
            result.named_after = str(config_path.absolute())
    entries = data.get("environments")
    if profile.provider and isinstance(entries, list):
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict) or entry.get("service") != "harbor":
                continue
            kwargs = entry.get("service_kwargs")
            if kwargs is None:
                kwargs = {}
                entry["service_kwargs"] = kwargs
            if not isinstance(kwargs, dict) or kwargs.get("provider") is not None:
                continue
            kwargs["provider"] = profile.provider
            result.gave[f"environments.{index}.service_kwargs.provider"] = profile.provider
            if profile.provider_options:
                own = kwargs.get("provider_options")
                merged = dict(profile.provider_options)
                if isinstance(own, dict):
                    merged.update(own)
                kwargs["provider_options"] = merged
                for option, value in profile.provider_options.items():
                    if not isinstance(own, dict) or option not in own:
                        result.gave[f"environments.{index}.service_kwargs.provider_options.{option}"] = value
    return result


def _flow(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def describe_site(
    profile: SiteProfile | None,
    gave: Mapping[str, Any] | None = None,
    *,
    looked_at: Path | None = None,
    env: Mapping[str, str] | None = None,
    mention_absence: bool = False,
) -> list[str]:
    """The stderr lines that say which site profile a command read and what it gave, without the `platoon: `
    prefix the command line adds. Without a profile there is nothing to say, unless `mention_absence` (a command
    that writes into the cache root says where it looked and which cache root it uses)."""
    lines: list[str] = []
    if profile is None:
        if not mention_absence:
            return lines
        where = looked_at if looked_at is not None else site_location(env)[1]
        lines.append(f"no site profile ({where} does not exist): cache root {DEFAULT_CACHE_TEXT}")
    else:
        values = profile.values
        if values:
            described = ", ".join(f"{key} {_flow(value)}" for key, value in values.items())
            lines.append(f"site profile {profile.path}: {described}")
        else:
            lines.append(f"site profile {profile.path}: sets nothing")
    if gave:
        lines.append("from the site profile: " + ", ".join(f"{k}={_flow(v)}" for k, v in gave.items()))
    return lines
