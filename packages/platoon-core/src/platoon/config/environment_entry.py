"""The record of a named environment, `platoon.EnvironmentEntry`: a versioned partial `environments` entry.

Its lookup (entry points, `module:attr`) is `platoon.config.named`; the record sits apart so that the hookspecs,
which `platoon.plugins` imports, can name its type without a circle through the lookup.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from platoon.config.environments import EnvironmentConfig
from platoon.naming import check_name, check_version, split_ref

#: keys a named environment may not set: they belong to the config that uses it
FORBIDDEN_KEYS = (
    "env",
    "name",
    "weight",
    "harness_options",
    "exclude_tasks",
    "trainer_config",
    "workflow",
    "workflow_kwargs",
    "eval_workflow_kwargs",
)


class EnvironmentEntry:
    """A named, versioned, partial `environments` entry, validated against the entry schema when built."""

    def __init__(
        self,
        name: str,
        /,
        version: str = "1",
        *,
        description: str = "",
        harness_defaults: Mapping[str, Mapping[str, Any]] | None = None,
        **keys: Any,
    ) -> None:
        check_name(name, what="environment name")
        check_version(version)
        problems = [f"{key}: a named environment cannot set it" for key in FORBIDDEN_KEYS if key in keys]
        overrides = keys.get("eval_overrides")
        if isinstance(overrides, Mapping) and "harness_options" in overrides:
            problems.append("eval_overrides.harness_options: a named environment cannot set it")
        defaults: dict[str, dict[str, Any]] = {}
        for harness, options in (harness_defaults or {}).items():
            try:
                check_name(harness, what="harness_defaults key")
            except ValueError as exc:
                problems.append(str(exc))
            if not isinstance(options, Mapping):
                problems.append(f"harness_defaults.{harness}: expected a mapping of options, got {options!r}")
            else:
                defaults[harness] = dict(options)
        if not problems:
            problems = _schema_problems(keys)
        if problems:
            raise ValueError(f"environment {name}@{version} is not a valid entry: " + "; ".join(problems))
        self.name = name
        self.version = version
        self.description = description
        self.harness_defaults = defaults
        self._keys = copy.deepcopy(dict(keys))
        self.source: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def entry(self) -> dict[str, Any]:
        """A fresh deep copy of the entry's keys."""
        return copy.deepcopy(self._keys)

    def defaults_for(self, harness: Any) -> dict[str, Any]:
        """The option defaults for the entry's chosen harness (by name; `.toml` and `module:fn` refs match none)."""
        if isinstance(harness, Mapping):
            named = [h for h in harness if split_ref(str(h))[0] in self.harness_defaults]
            if named:
                raise ValueError(
                    f"environment {self.ref} has harness_defaults for {', '.join(named)}, which a harness mixture "
                    "cannot apply: set harness_options in the entry"
                )
            return {}
        if not isinstance(harness, str) or harness.endswith(".toml") or ":" in harness:
            return {}
        return copy.deepcopy(self.harness_defaults.get(split_ref(harness)[0], {}))

    def __repr__(self) -> str:
        return f"EnvironmentEntry({self.ref!r})"


def _schema_problems(keys: Mapping[str, Any]) -> list[str]:
    """Validate the keys as an `environments` entry; a partial entry may leave out what configs add."""
    # pydantic and the schema load when an entry is built, not when plugins load this module for its record type.
    from pydantic import ValidationError

    try:
        EnvironmentConfig.model_validate(dict(keys))
    except ValidationError as exc:
        return [
            f"{'.'.join(str(p) for p in err['loc']) or 'entry'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        ]
    return []
