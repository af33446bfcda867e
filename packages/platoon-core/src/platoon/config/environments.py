"""The `environments` entries of every config: `EnvironmentConfig` and its `agents` table, the
environments-only file schema, and the mixture rules (`check_mixture`) the loader reports with dotted paths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, field_validator, model_validator

from platoon.config_defs import Bool, ConfigModel, Float, Int, yaml_scalar

__all__ = [
    "RUN_LEVEL_FIELDS",
    "AgentTreeConfig",
    "AgentsConfig",
    "EnvironmentConfig",
    "EnvironmentList",
    "EnvironmentsOnlyConfig",
    "EvalOverrides",
    "HarnessExitPolicy",
    "VerifierConfig",
    "check_environments_defined",
    "check_mixture",
    "run_level_values",
]

Access = Literal["full", "no_terminal", "read_only"]
PositiveWeight = Annotated[Float, Field(gt=0)]

#: Fields one run applies to every entry, so a mixture sets each to at most one distinct value.
RUN_LEVEL_FIELDS = ("trainer_config", "workflow", "workflow_kwargs", "eval_workflow_kwargs")
NO_ENVIRONMENTS = "Config must define at least one environment in `environments`"


class VerifierConfig(ConfigModel):
    """Verifier agents, which grade children under `child_grading: verifier`."""

    enabled: Bool = Field(True, description="run verifier agents")
    max_steps: Int = Field(20, ge=1, description="a verifier's step budget")
    access: Access = Field("read_only", description="a verifier's access to the task sandbox")


class AgentsConfig(ConfigModel):
    """The agent tree of an entry: depth, step budgets, grading and access of children."""

    max_depth: Int | None = Field(
        None, ge=0, description="the deepest policy level (root 0); None = unlimited"
    )
    budget: Literal["linear", "depth_aware"] = Field(
        "linear", description="how children's steps are budgeted"
    )
    child_max_steps: Int = Field(15, ge=1, description="a child's step budget when its spawn gives none")
    child_grading: Literal["env", "verifier", "none"] = Field("none", description="how children are graded")
    child_access: Access = Field("full", description="the default access of children")
    verifier: VerifierConfig = Field(default_factory=VerifierConfig, description="verifier agents")
    fork: Literal["shared", "copy", "fresh"] | None = Field(
        None, description="the session fork mode of children; None = the session's default"
    )
    child_timeout_s: Float | None = Field(None, gt=0, description="per-child wall clock in seconds")


#: Another name for the `agents` table's config, kept for code that imports it.
AgentTreeConfig = AgentsConfig


class HarnessExitPolicy(ConfigModel):
    """How a harness that timed out or crashed is graded; `grade` or `exclude` alone set both."""

    timeout: Literal["grade", "exclude"] = Field("exclude", description="a harness that timed out")
    crash: Literal["grade", "grade_if_gateway_clean", "exclude"] = Field(
        "exclude", description="a harness that exited with an error"
    )


class EvalOverrides(ConfigModel):
    """What an entry changes for non-train splits: only its harness options, deep-merged over `harness_options`."""

    UNKNOWN_KEY_HINTS = {
        "max_steps": "eval_overrides holds only harness_options; an evaluation's step budget is "
        "rollout_config.max_steps of its workflow config",
        "inference_params": "eval_overrides holds only harness_options; an evaluation's sampling is "
        "rollout_config.inference_params of its workflow config",
        "dataset_kwargs": "eval_overrides holds only harness_options; use the entry's eval_dataset_kwargs",
    }

    harness_options: dict[str, Any] = Field(
        default_factory=dict, description="deep-merged over the entry's harness_options"
    )


def _refuse_mapping(value: Any) -> Any:
    if isinstance(value, Mapping):
        raise ValueError(
            "environments must be a list of entries, not a mapping: write each entry as a list item "
            "(`- name: ...`), with its key as `name`"
        )
    return value


def _check_weight(value: Any) -> Any:
    # One clear message instead of one per union member: a weight is `tasks` or a positive finite number.
    if value == "tasks" and isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    raise ValueError(f"{yaml_scalar(value)} is not a weight: give a positive finite number or `tasks`")


class EnvironmentConfig(ConfigModel):
    """One entry of `environments`: where tasks come from, how they roll out and what grades them."""

    env: str | None = Field(None, description="a named environment `name[@version]` or `module:attr`")
    package: str | None = Field(None, description="module imported first (registrations), also in workers")
    trainer_config: str | None = Field(
        None, description="training-config subclass (`module:Class` or a registered name); files only"
    )
    dataset_loader: str | None = Field(None, description="component ref of the training dataset loader")
    eval_dataset_loader: str | None = Field(
        None, description="component ref of the evaluation dataset loader"
    )
    task_loader: str | None = Field(None, description="component ref of the task loader")
    rollout: str | None = Field(
        None, description="rollout function; default `harness_rollout` with a harness"
    )
    eval_rollout: str | None = Field(None, description="rollout function of non-train splits")
    reward_processor: str | None = Field(None, description="reward processor, e.g. `platoon-delegation`")
    workflow: str = Field("group_rollout", description="the training workflow (run-level)")
    dataset_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="dataset loader kwargs (listing keys: split_name, shuffle_seed, limit)",
    )
    eval_dataset_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="dataset_kwargs of non-train splits"
    )
    exclude_tasks: list[str] = Field(
        default_factory=list, description="task ids or names left out; deduplicated in order"
    )
    workflow_kwargs: dict[str, Any] = Field(default_factory=dict, description="workflow kwargs (run-level)")
    eval_workflow_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="workflow kwargs of evaluations (run-level)"
    )
    name: str | None = Field(None, description="the entry's name; required and unique in a mixture; no `::`")
    weight: Annotated[Float | Literal["tasks"], BeforeValidator(_check_weight)] = Field(
        "tasks", description="mixture weight: a positive number, or `tasks` (its task count); all-or-none"
    )
    service: str | None = Field(
        None,
        description="`table`, `python://...`, `module:Class` or an installed service (`platoon env list`)",
    )
    service_kwargs: dict[str, Any] = Field(default_factory=dict, description="service factory kwargs")
    harness: str | dict[str, PositiveWeight] | None = Field(
        None, description="a harness ref, `.toml` path, `module:function`, or `{ref: weight}`; needs service"
    )
    placement: Literal["auto", "task_sandbox", "local"] = Field("auto", description="where the harness runs")
    builtins: Literal["default", "keep", "disable"] = Field(
        "default", description="the harness's built-in tools"
    )
    on_context_overflow: Literal["grade", "exclude"] = Field(
        "grade", description="a harness that overflowed the context window"
    )
    on_harness_exit: HarnessExitPolicy = Field(
        default_factory=HarnessExitPolicy, description="`grade`/`exclude`, or `{timeout, crash}`"
    )
    seed: Int = Field(0, description="seed of the harness draw and the mixture order")
    program: str = Field("single", min_length=1, description="the episode program")
    harness_options: dict[str, Any] = Field(default_factory=dict, description="options of the harness")
    eval_overrides: EvalOverrides = Field(
        default_factory=EvalOverrides, description="what non-train splits change (only harness_options)"
    )
    agents: AgentsConfig = Field(default_factory=AgentsConfig, description="the agent tree")

    @field_validator("on_harness_exit", mode="before")
    @classmethod
    def _exit_shorthand(cls, value: Any) -> Any:
        # `grade` / `exclude` alone set both fields.
        if isinstance(value, str) and value in ("grade", "exclude"):
            return {"timeout": value, "crash": value}
        if isinstance(value, str):
            raise ValueError(
                f"{value!r} is not one of 'grade', 'exclude' (or a mapping with timeout and crash)"
            )
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None:
            if not value.strip():
                raise ValueError("name must not be empty")
            if "::" in value:
                raise ValueError(f"{value!r} contains `::`, which separates the entry name from a task id")
        return value

    @field_validator("exclude_tasks")
    @classmethod
    def _exclude_tasks(cls, value: list[str]) -> list[str]:
        for item in value:
            if not item or item != item.strip():
                raise ValueError(
                    f"exclude_tasks item {item!r}: a task id or name is non-empty and has no surrounding spaces"
                )
        return list(dict.fromkeys(value))

    @field_validator("harness")
    @classmethod
    def _harness(cls, value: str | dict[str, float] | None) -> str | dict[str, float] | None:
        if isinstance(value, str) and not value.strip():
            raise ValueError("harness must not be empty")
        if isinstance(value, dict):
            if not value:
                raise ValueError("a harness mixture names at least one harness: `{ref: weight, ...}`")
            if any(not ref.strip() for ref in value):
                raise ValueError("a harness mixture's refs must not be empty")
        return value

    @model_validator(mode="after")
    def _harness_needs_service(self) -> EnvironmentConfig:
        if self.harness is not None and self.service is None:
            raise ValueError(
                "harness needs service: a harness works on tasks a service gives "
                "(service: table, python://... or module:Class)"
            )
        return self


EnvironmentList = Annotated[list[EnvironmentConfig], BeforeValidator(_refuse_mapping)]


class EnvironmentsOnlyConfig(ConfigModel):
    """A file whose only key is `environments` (for `platoon prepare` and `config validate`)."""

    environments: EnvironmentList = Field(description="the environment entries")


# ---------------------------------------------------------------------------------------------------------------
# Mixture rules, reported by the loader with dotted paths after the entries validate.

_UNSET = object()


def _get(entry: Mapping[str, Any] | BaseModel, key: str) -> Any:
    """The value `entry` sets for `key`, or _UNSET: raw mappings by presence, models by `model_fields_set`."""
    if isinstance(entry, BaseModel):
        return getattr(entry, key) if key in entry.model_fields_set else _UNSET
    if isinstance(entry, Mapping):
        return entry.get(key, _UNSET)
    return _UNSET


def _is_number(weight: Any) -> bool:
    return isinstance(weight, int | float) and not isinstance(weight, bool) and math.isfinite(weight)


def check_environments_defined(entries: Sequence[Any] | None, path: str = "environments") -> list[str]:
    """The "at least one environment" rule as problem lines (empty when there is an entry)."""
    return [] if entries else [f"{path}: {NO_ENVIRONMENTS}"]


def check_mixture(entries: Sequence[Mapping[str, Any] | BaseModel], path: str = "environments") -> list[str]:
    """The mixture rules (every entry named, names unique, weights all numbers or all `tasks`) as problem lines
    `<path>.<i>.<key>: ...`; none for a single entry.

    Every entry named, names unique, weights all numbers or all `tasks`, and each run-level field set to at most
    one distinct value (entries that leave it unset take that value). Entries may be raw mappings or validated
    `EnvironmentConfig`s (then "set" means `model_fields_set`).
    """
    if len(entries) < 2:
        return []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        name = _get(entry, "name")
        if name is _UNSET or name is None:
            problems.append(f"{path}.{i}.name: required in a mixture (several entries): name each entry")
        elif isinstance(name, str):
            if name in seen:
                problems.append(f"{path}.{i}.name: {name!r} is already the name of {path}.{seen[name]}")
            else:
                seen[name] = i
    weights = [_get(entry, "weight") for entry in entries]
    numeric = [i for i, w in enumerate(weights) if _is_number(w)]
    by_tasks = [i for i, w in enumerate(weights) if w is _UNSET or w == "tasks"]
    if numeric and by_tasks:
        # Blame the fewer side (where a weight was most likely forgotten or added); on a tie, the side
        # without the first entry, which sets the convention.
        if len(by_tasks) != len(numeric):
            wrong, right = (by_tasks, numeric) if len(by_tasks) < len(numeric) else (numeric, by_tasks)
        else:
            wrong, right = (numeric, by_tasks) if 0 in by_tasks else (by_tasks, numeric)
        for i in wrong:
            shown = "tasks" if weights[i] is _UNSET else yaml_scalar(weights[i])
            problems.append(
                f"{path}.{i}.weight: {shown} mixes with {path}.{right[0]}'s weight: weights in a mixture are "
                "all numbers or all `tasks`"
            )
    for key in RUN_LEVEL_FIELDS:
        first: tuple[int, Any] | None = None
        for i, entry in enumerate(entries):
            value = _get(entry, key)
            if value is _UNSET:
                continue
            if first is None:
                first = (i, value)
            elif value != first[1]:
                problems.append(
                    f"{path}.{i}.{key}: {yaml_scalar(value)} differs from {path}.{first[0]}.{key} "
                    f"({yaml_scalar(first[1])}): a run-level field takes one value across a mixture"
                )
    return problems


def run_level_values(entries: Sequence[EnvironmentConfig]) -> dict[str, Any]:
    """The value of each run-level field for the run: the one an entry sets, else the field's default."""
    values: dict[str, Any] = {}
    for key in RUN_LEVEL_FIELDS:
        chosen = [getattr(e, key) for e in entries if key in e.model_fields_set]
        values[key] = (
            chosen[0]
            if chosen
            else EnvironmentConfig.model_fields[key].get_default(call_default_factory=True)
        )
    return values
