"""Relative input paths in `environments` entries.

A path a config file writes is relative to that file's directory and is made absolute before the files merge;
paths from overrides and named environments are made absolute against the working directory afterwards. Which
values are paths: an entry's `harness` ending in `.toml` (and such keys of a harness mixture), the table service's
`path`, and each option its service class declares in `path_options`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from platoon import plugins

TABLE_PATH_OPTIONS: tuple[str, ...] = ("path",)


@dataclass(frozen=True)
class PathOption:
    """A service option holding a path: `name`, or `option[].key` for a key inside each mapping of a list.

    `written`: a file a later step writes (a lock), so it may be missing. `relative_to`: left as written when that
    sibling option is set (it is then relative to the sibling, which the service resolves).
    """

    name: str
    written: bool = False
    relative_to: str | None = None


def _as_option(item: Any) -> PathOption | None:
    if isinstance(item, PathOption):
        return item
    if isinstance(item, str):
        return PathOption(item) if item else None
    get = item.get if isinstance(item, dict) else lambda key, default=None: getattr(item, key, default)
    name = get("name")
    if not isinstance(name, str) or not name:
        return None
    return PathOption(name, written=bool(get("written", False)), relative_to=get("relative_to"))


def service_path_options(service: Any) -> tuple[PathOption, ...]:
    """The path options of an entry's service; a service that cannot be asked has none here (it fails later)."""
    if not isinstance(service, str) or not service:
        return ()
    found: list[Any] = list(TABLE_PATH_OPTIONS) if service == "table" else []
    try:
        found.extend(plugins.get_service_path_options(service) or ())
    except Exception:
        # Absent plugin machinery, an unknown service or one failing to import: component resolution reports it.
        pass
    options: list[PathOption] = []
    for item in found:
        option = _as_option(item)
        if option is not None and option.name not in {o.name for o in options}:
            options.append(option)
    return tuple(options)


def is_left_alone(value: Any) -> bool:
    """Non-strings, empty strings, URLs and `git+...` references are not paths to resolve."""
    return not isinstance(value, str) or not value or "://" in value or value.startswith("git+")


def _display(path: Path | str, cwd: Path) -> str:
    text = str(path)
    try:
        rel = os.path.relpath(text, cwd)
    except ValueError:
        return text
    return text if rel.startswith("..") else rel


class _Resolver:
    def __init__(self, base_dir: Path | None, source: Path | None, cwd: Path, problems: list[str]) -> None:
        self.base_dir = base_dir
        self.source = source
        self.cwd = cwd
        self.problems = problems

    def __call__(self, value: Any, where: str, *, written: bool = False) -> Any:
        if is_left_alone(value):
            return value
        expanded = os.path.expanduser(value)
        if os.path.isabs(expanded):
            return os.path.normpath(expanded)
        if self.base_dir is None:
            return os.path.normpath(self.cwd / expanded)
        resolved = Path(os.path.normpath(self.base_dir / expanded))
        if resolved.exists():
            return str(resolved)
        at_cwd = Path(os.path.normpath(self.cwd / expanded))
        if written and not at_cwd.exists():
            return str(resolved)
        problem = (
            f"{where}: {value} names {resolved}, which does not exist: a relative path in a config file is "
            f"relative to the file's directory, {self.base_dir}"
        )
        if at_cwd.exists():
            source = _display(self.source, self.cwd) if self.source is not None else "the config file"
            problem += (
                f"; {value} exists relative to the working directory, where relative paths resolved before: "
                f"write the path relative to {source}, or absolute"
            )
        self.problems.append(problem)
        return value


def _resolve_option(kwargs: dict[str, Any], option: PathOption, where: str, resolve: _Resolver) -> None:
    if "[]." in option.name:
        list_key, _, inner = option.name.partition("[].")
        items = kwargs.get(list_key)
        if isinstance(items, list):
            for index, item in enumerate(items):
                if isinstance(item, dict) and inner in item:
                    item[inner] = resolve(
                        item[inner], f"{where}.{list_key}.{index}.{inner}", written=option.written
                    )
        return
    if option.name not in kwargs:
        return
    if option.relative_to and not is_left_alone(kwargs.get(option.relative_to)):
        return
    value = kwargs[option.name]
    if isinstance(value, list):
        kwargs[option.name] = [
            resolve(v, f"{where}.{option.name}.{i}", written=option.written) for i, v in enumerate(value)
        ]
    else:
        kwargs[option.name] = resolve(value, f"{where}.{option.name}", written=option.written)


def resolve_entry_paths(
    data: dict[str, Any],
    *,
    base_dir: Path | None,
    cwd: Path,
    source: Path | None = None,
) -> list[str]:
    """Make the input paths of `data["environments"]` absolute, in place; returns the problems.

    With `base_dir` (a config file's directory) a relative path must name something that exists there; with
    None (overrides, named environments) relative paths resolve against `cwd` unchecked.
    """
    problems: list[str] = []
    entries = data.get("environments")
    if not isinstance(entries, list):
        return problems
    resolve = _Resolver(base_dir, source, cwd, problems)
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        where = f"environments.{index}"
        harness = entry.get("harness")
        if isinstance(harness, str) and harness.endswith(".toml"):
            entry["harness"] = resolve(harness, f"{where}.harness")
        elif isinstance(harness, dict):
            entry["harness"] = {
                (resolve(k, f"{where}.harness.{k}") if isinstance(k, str) and k.endswith(".toml") else k): v
                for k, v in harness.items()
            }
        kwargs = entry.get("service_kwargs")
        if isinstance(kwargs, dict) and kwargs:
            for option in service_path_options(entry.get("service")):
                _resolve_option(kwargs, option, f"{where}.service_kwargs", resolve)
    return problems
