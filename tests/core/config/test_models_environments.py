"""The `environments` entries: defaults, validation, the environments-only schema and the mixture rules."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from platoon.config.environments import (
    AgentsConfig,
    EnvironmentConfig,
    EnvironmentsOnlyConfig,
    EvalOverrides,
    check_environments_defined,
    check_mixture,
    run_level_values,
)


def problems(data: Any, model: type[BaseModel] = EnvironmentConfig) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return [
        (
            ".".join(str(p) for p in e["loc"]),
            str(e["ctx"]["error"]) if e["type"] == "value_error" else e["type"],
        )
        for e in info.value.errors(include_url=False)
    ]


def test_entry_defaults() -> None:
    entry = EnvironmentConfig()
    for key in (
        "env",
        "package",
        "trainer_config",
        "dataset_loader",
        "eval_dataset_loader",
        "task_loader",
        "rollout",
        "eval_rollout",
        "reward_processor",
        "name",
        "service",
        "harness",
    ):
        assert getattr(entry, key) is None, key
    assert entry.workflow == "group_rollout" and entry.program == "single"
    assert entry.weight == "tasks" and entry.seed == 0
    assert (entry.placement, entry.builtins, entry.on_context_overflow) == ("auto", "default", "grade")
    assert (entry.on_harness_exit.timeout, entry.on_harness_exit.crash) == ("exclude", "exclude")
    for key in (
        "dataset_kwargs",
        "eval_dataset_kwargs",
        "workflow_kwargs",
        "eval_workflow_kwargs",
        "service_kwargs",
        "harness_options",
    ):
        assert getattr(entry, key) == {}, key
    assert entry.exclude_tasks == []
    assert entry.eval_overrides == EvalOverrides(harness_options={})


def test_agents_defaults() -> None:
    agents = AgentsConfig()
    assert agents.max_depth is None and agents.budget == "linear" and agents.child_max_steps == 15
    assert agents.child_grading == "none" and agents.child_access == "full"
    assert (agents.verifier.enabled, agents.verifier.max_steps, agents.verifier.access) == (
        True,
        20,
        "read_only",
    )
    assert agents.fork is None and agents.child_timeout_s is None


@pytest.mark.parametrize(
    ("data", "loc"),
    [
        ({"agents": {"max_depth": -1}}, "agents.max_depth"),
        ({"agents": {"child_max_steps": 0}}, "agents.child_max_steps"),
        ({"agents": {"child_timeout_s": 0}}, "agents.child_timeout_s"),
        ({"agents": {"budget": "fair"}}, "agents.budget"),
        ({"agents": {"child_grading": "judge"}}, "agents.child_grading"),
        ({"agents": {"child_access": "root"}}, "agents.child_access"),
        ({"agents": {"fork": "clone"}}, "agents.fork"),
        ({"agents": {"verifier": {"access": "all"}}}, "agents.verifier.access"),
        ({"placement": "remote"}, "placement"),
        ({"builtins": "none"}, "builtins"),
        ({"on_context_overflow": "retry"}, "on_context_overflow"),
        ({"program": ""}, "program"),
        ({"seed": True}, "seed"),
        ({"environment": "x"}, "environment"),
    ],
)
def test_entry_bounds(data: dict[str, Any], loc: str) -> None:
    assert [found[0] for found in problems(data)] == [loc]


def test_name() -> None:
    assert EnvironmentConfig(name="textcraft").name == "textcraft"
    assert problems({"name": "a::b"}) == [
        ("name", "'a::b' contains `::`, which separates the entry name from a task id")
    ]
    assert problems({"name": " "})[0][0] == "name"


@pytest.mark.parametrize("weight", [1, 2.5, 0.001, "tasks"])
def test_good_weights(weight: Any) -> None:
    assert EnvironmentConfig(weight=weight).weight == weight


@pytest.mark.parametrize("weight", [0, -1, float("inf"), float("nan"), True, False, "all", None])
def test_bad_weights(weight: Any) -> None:
    ((loc, message),) = problems({"weight": weight})
    assert loc == "weight"
    if weight is not None:
        assert "is not a weight: give a positive finite number or `tasks`" in message


def test_exclude_tasks() -> None:
    entry = EnvironmentConfig(exclude_tasks=["b", "a", "b", "task 3", "a"])
    assert entry.exclude_tasks == ["b", "a", "task 3"]
    for bad in ("", " a", "a ", "\tx"):
        ((loc, message),) = problems({"exclude_tasks": ["ok", bad]})
        assert loc == "exclude_tasks" and "non-empty and has no surrounding spaces" in message
    assert problems({"exclude_tasks": "a"})[0] == ("exclude_tasks", "list_type")


def test_harness_forms_and_needs_service() -> None:
    assert EnvironmentConfig(service="harbor", harness="platoon-codeact").harness == "platoon-codeact"
    mix = EnvironmentConfig(service="harbor", harness={"platoon-codeact": 1, "h.toml": 2.5})
    assert mix.harness == {"platoon-codeact": 1.0, "h.toml": 2.5}
    assert problems({"harness": "platoon-codeact"}) == [
        (
            "",
            "harness needs service: a harness works on tasks a service gives (service: table, "
            "python://... or module:Class)",
        )
    ]
    assert problems({"service": "harbor", "harness": {}})[0][1].startswith(
        "a harness mixture names at least one"
    )
    for weight in (0, -1, True):
        assert problems({"service": "harbor", "harness": {"a": weight}})


def test_on_harness_exit() -> None:
    both = EnvironmentConfig(on_harness_exit="grade").on_harness_exit
    assert (both.timeout, both.crash) == ("grade", "grade")
    mapping = EnvironmentConfig.model_validate({"on_harness_exit": {"crash": "grade_if_gateway_clean"}})
    assert (mapping.on_harness_exit.timeout, mapping.on_harness_exit.crash) == (
        "exclude",
        "grade_if_gateway_clean",
    )
    assert problems({"on_harness_exit": "retry"})[0][0] == "on_harness_exit"
    assert (
        problems({"on_harness_exit": {"timeout": "grade_if_gateway_clean"}})[0][0]
        == "on_harness_exit.timeout"
    )
    assert problems({"on_harness_exit": {"crash": "grade", "hang": "grade"}})[0] == (
        "on_harness_exit.hang",
        "extra_forbidden",
    )


def test_eval_overrides_hold_only_harness_options() -> None:
    entry = EnvironmentConfig.model_validate({"eval_overrides": {"harness_options": {"max_turns": 5}}})
    assert entry.eval_overrides.harness_options == {"max_turns": 5}
    assert problems({"eval_overrides": {"max_steps": 3}}) == [("eval_overrides.max_steps", "extra_forbidden")]
    assert set(EvalOverrides.UNKNOWN_KEY_HINTS) == {"max_steps", "inference_params", "dataset_kwargs"}


def test_free_form_mappings_take_any_keys() -> None:
    entry = EnvironmentConfig.model_validate(
        {"service": "table", "service_kwargs": {"path": "t.csv", "x": [1]}, "dataset_kwargs": {"anything": 1}}
    )
    assert entry.service_kwargs == {"path": "t.csv", "x": [1]}


def test_environments_only_config() -> None:
    cfg = EnvironmentsOnlyConfig.model_validate({"environments": [{"name": "a"}]})
    assert cfg.environments[0].name == "a"
    assert problems({}, EnvironmentsOnlyConfig) == [("environments", "missing")]
    assert problems({"environments": [], "train": {}}, EnvironmentsOnlyConfig) == [
        ("train", "extra_forbidden")
    ]
    ((loc, message),) = problems({"environments": {"a": {}}}, EnvironmentsOnlyConfig)
    assert loc == "environments" and message.startswith(
        "environments must be a list of entries, not a mapping"
    )


# ----------------------------------------------------------------------------------------------------------------
# Mixture rules


def test_at_least_one_environment() -> None:
    assert check_environments_defined([]) == [
        "environments: Config must define at least one environment in `environments`"
    ]
    assert check_environments_defined(None) != []
    assert check_environments_defined([EnvironmentConfig()]) == []


def test_a_single_entry_needs_no_name() -> None:
    assert check_mixture([{"service": "table"}]) == []
    assert check_mixture([EnvironmentConfig()]) == []


def test_mixture_entries_are_named_and_unique() -> None:
    entries: list[dict[str, Any]] = [{"name": "a"}, {}, {"name": "a"}, {"name": None}]
    assert check_mixture(entries) == [
        "environments.1.name: required in a mixture (several entries): name each entry",
        "environments.2.name: 'a' is already the name of environments.0",
        "environments.3.name: required in a mixture (several entries): name each entry",
    ]


def test_mixture_weights_are_all_numbers_or_all_tasks() -> None:
    assert check_mixture([{"name": "a", "weight": 1}, {"name": "b", "weight": 3.5}]) == []
    assert check_mixture([{"name": "a"}, {"name": "b", "weight": "tasks"}]) == []
    assert check_mixture([{"name": "a", "weight": 1}, {"name": "b"}, {"name": "c", "weight": 2}]) == [
        "environments.1.weight: tasks mixes with environments.0's weight: weights in a mixture are all numbers "
        "or all `tasks`"
    ]


def test_mixture_run_level_fields_take_one_value() -> None:
    ok = [{"name": "a", "workflow": "w"}, {"name": "b"}, {"name": "c", "workflow": "w"}]
    assert check_mixture(ok) == []
    bad = [
        {"name": "a", "trainer_config": "m:A", "workflow_kwargs": {"x": 1}},
        {"name": "b", "trainer_config": "m:B", "workflow_kwargs": {"x": 2}, "eval_workflow_kwargs": {}},
    ]
    assert check_mixture(bad) == [
        "environments.1.trainer_config: m:B differs from environments.0.trainer_config (m:A): a run-level field "
        "takes one value across a mixture",
        "environments.1.workflow_kwargs: {x: 2} differs from environments.0.workflow_kwargs ({x: 1}): a run-level "
        "field takes one value across a mixture",
    ]


def test_mixture_rules_on_validated_entries() -> None:
    entries = [EnvironmentConfig(name="a", workflow="w1"), EnvironmentConfig(weight=2, workflow="w2")]
    assert check_mixture(entries, path="config.environments") == [
        "config.environments.1.name: required in a mixture (several entries): name each entry",
        "config.environments.1.weight: 2.0 mixes with config.environments.0's weight: weights in a mixture are "
        "all numbers or all `tasks`",
        "config.environments.1.workflow: w2 differs from config.environments.0.workflow (w1): a run-level field "
        "takes one value across a mixture",
    ]


def test_run_level_values() -> None:
    entries = [
        EnvironmentConfig(name="a"),
        EnvironmentConfig(name="b", workflow="mine", workflow_kwargs={"k": 1}),
    ]
    values = run_level_values(entries)
    assert values == {
        "trainer_config": None,
        "workflow": "mine",
        "workflow_kwargs": {"k": 1},
        "eval_workflow_kwargs": {},
    }
