"""The training config models: defaults, bounds, cross-field rules, deprecated keys and eval laid over train."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from platoon.config.training import (
    EVAL_INHERITED_KEYS,
    AdamParams,
    CheckpointConfig,
    EvalConfig,
    PlatoonTinkerRLTrainerConfig,
    StatsConfig,
    TrainConfig,
    WatchdogConfig,
    WorkflowConfig,
)
from platoon.config_defs import InferenceParams, RolloutConfig, kept_defaults, lay_over
from platoon.deprecations import DeprecatedKey
from platoon.startup.training import training_problems


def config(**sections: Any) -> dict[str, Any]:
    train = {"model_name": "Qwen/Qwen3-4B", "renderer_name": "qwen3", **sections.pop("train", {})}
    return {"train": train, "log_path": "runs", **sections}


def build(**sections: Any) -> PlatoonTinkerRLTrainerConfig:
    return PlatoonTinkerRLTrainerConfig.model_validate(config(**sections))


def errors(model: type[BaseModel], data: Any) -> list[tuple[str, str, str]]:
    """(dotted path, error type, message) of each problem."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return [
        (
            ".".join(str(p) for p in e["loc"]),
            e["type"],
            str(e["ctx"]["error"]) if e["type"] == "value_error" else e["msg"],
        )
        for e in info.value.errors(include_url=False)
    ]


def messages(model: type[BaseModel], data: Any) -> str:
    return "\n".join(f"{loc}: {msg}" for loc, _, msg in errors(model, data))


# ----------------------------------------------------------------------------------------------------------------
# Defaults


def test_training_defaults() -> None:
    cfg = build()
    train = cfg.train
    assert (train.batch_size, train.num_minibatches, train.num_microbatches, train.lora_rank) == (
        32,
        1,
        1,
        32,
    )
    assert train.num_epochs is None and train.max_training_steps is None and train.max_staleness is None
    assert train.loss_fn == "cispo"
    assert train.loss_fn_config == {"clip_low_threshold": 0.0, "clip_high_threshold": 5.0}
    assert train.task_order == "auto"
    assert (train.forward_backward_timeout_seconds, train.optim_step_timeout_seconds) == (5400.0, 300.0)
    assert train.sample_timeout_seconds is None and train.context_window_length is None
    assert train.optimizer == AdamParams(
        learning_rate=3e-5, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0, grad_clip_norm=0.0
    )
    assert train.label_by is None and train.label_column == "_platoon_environment"
    assert train.rollout_group_limits == {}
    assert cfg.tinker_base_url is None and cfg.environments == []


def test_workflow_defaults() -> None:
    wf = WorkflowConfig()
    assert wf.group_size == 8
    assert (wf.leave_one_out_baseline, wf.depth_level_weighting, wf.depth_level_discount_gamma) == (
        False,
        False,
        None,
    )
    assert (wf.subagent_datum_keep_probability, wf.subagent_datum_sampling_seed) == (1.0, 0)
    assert (wf.filter_errors, wf.filter_message_actions, wf.filter_zero_advantage_datums) == (
        True,
        False,
        True,
    )
    assert (wf.straggler_timeout_seconds, wf.straggler_quorum, wf.straggler_policies) == (None, None, {})
    assert wf.min_successful_group_size == 1
    assert (wf.rollout_isolation, wf.worker_start_method) == ("inprocess", "forkserver")
    assert wf.worker_startup_budget_seconds == 300
    assert wf.worker_finalize_grace_seconds == 120
    assert wf.worker_parent_grace_seconds == 60
    assert wf.worker_termination_grace_seconds == 10
    assert wf.worker_launch_concurrent_groups == 2
    assert wf.worker_rss_soft_limit_bytes == 24 * 1024**3
    assert wf.worker_mem_available_floor_bytes == 0
    assert wf.worker_binding_poll_seconds == 5
    assert wf.worker_unbounded_rollout_budget_seconds == 86400
    assert wf.worker_python_env_isolation is False


def test_rollout_and_inference_defaults() -> None:
    rc = RolloutConfig()
    assert rc.model_name is None and rc.train is False and rc.max_steps is None
    assert rc.output_dir == "rollout_results" and rc.verbose is True
    assert rc.timeout is None and rc.step_timeout == 300
    assert rc.return_dict is False and rc.propagate_root_success is None
    assert rc.skip_subagent_reward_computation is False and rc.enable_subagent_verifiers is True
    assert rc.sampling_precedence == "request" and rc.extra == {} and rc.judges is True
    assert rc.inference_params == InferenceParams(
        temperature=None, top_p=None, top_k=None, max_completion_tokens=None
    )


def test_other_section_defaults() -> None:
    cfg = build()
    assert cfg.eval.every == 0 and cfg.eval.at_start is False and cfg.eval.max_concurrent_rollouts == 256
    assert cfg.checkpoint == CheckpointConfig(every=0)
    assert cfg.checkpoint.load_checkpoint_path is None
    assert (cfg.checkpoint.recovery_every, cfg.checkpoint.keep_recovery) == (None, None)
    assert (cfg.stats.experiment_name, cfg.stats.trial_name) == ("platoon_tinker", "run")
    wandb = cfg.stats.wandb
    assert wandb.mode == "online" and wandb.tags == [] and wandb.api_key is None
    assert (wandb.project, wandb.name, wandb.group) == ("platoon_tinker", "run", "platoon_tinker_run")
    watchdog = cfg.watchdog
    assert (watchdog.enabled, watchdog.timeout_seconds, watchdog.exit_code, watchdog.max_restarts) == (
        True,
        600,
        2,
        0,
    )


def test_wandb_names_follow_stats() -> None:
    stats = StatsConfig.model_validate(
        {"experiment_name": "exp", "trial_name": "t1", "wandb": {"name": "mine"}}
    )
    assert (stats.wandb.project, stats.wandb.name, stats.wandb.group) == ("exp", "mine", "exp_t1")


def test_required_keys_and_log_path_hint() -> None:
    found = errors(PlatoonTinkerRLTrainerConfig, {"train": {"model_name": "m"}})
    assert ("train.renderer_name", "missing", "Field required") in found
    assert ("log_path", "missing", "Field required") in found
    assert "runs" in PlatoonTinkerRLTrainerConfig.REQUIRED_KEY_HINTS["log_path"]


def test_unknown_keys_are_refused_with_hints() -> None:
    found = errors(
        PlatoonTinkerRLTrainerConfig,
        {**config(), "inference": {}, "train": {**config()["train"], "hosted": {}}},
    )
    assert {(loc, kind) for loc, kind, _ in found} == {
        ("inference", "extra_forbidden"),
        ("train.hosted", "extra_forbidden"),
    }
    assert "evaluation" in PlatoonTinkerRLTrainerConfig.UNKNOWN_KEY_HINTS["inference"]
    assert set(TrainConfig.UNKNOWN_KEY_HINTS) == {"hosted", "backend"}
    assert set(EvalConfig.UNKNOWN_KEY_HINTS) == {"hosted", "backend", "sample_timeout_seconds"}


# ----------------------------------------------------------------------------------------------------------------
# Types and bounds


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("train", "batch_size"),
        ("train", "lora_rank"),
        ("train", "sample_timeout_seconds"),
        ("train", "max_staleness"),
        ("watchdog", "max_restarts"),
        ("watchdog", "exit_code"),
        ("checkpoint", "every"),
        ("eval", "every"),
    ],
)
def test_a_bool_is_never_a_number(section: str, key: str) -> None:
    data = config()
    data.setdefault(section, {})[key] = True
    (found,) = errors(PlatoonTinkerRLTrainerConfig, data)
    assert found[0] == f"{section}.{key}"
    assert found[1] in ("int_type", "float_type")


def test_a_bool_is_never_a_number_in_nested_sections() -> None:
    data = config(train={"optimizer": {"learning_rate": False}, "workflow_config": {"group_size": True}})
    found = {(loc, kind) for loc, kind, _ in errors(PlatoonTinkerRLTrainerConfig, data)}
    assert found == {
        ("train.optimizer.learning_rate", "float_type"),
        ("train.workflow_config.group_size", "int_type"),
    }
    assert errors(InferenceParams, {"temperature": True})[0][:2] == ("temperature", "float_type")
    assert errors(TrainConfig, {"model_name": "m", "renderer_name": "r", "rollout_group_limits": {"a": True}})


def test_bools_are_only_true_or_false() -> None:
    assert errors(EvalConfig, {"at_start": 1})[0][:2] == ("at_start", "bool_type")
    assert errors(EvalConfig, {"at_start": "yes"})[0][:2] == ("at_start", "bool_type")
    assert errors(WorkflowConfig, {"filter_errors": 0})[0][:2] == ("filter_errors", "bool_type")


def test_ints_and_floats() -> None:
    # An int is a fine float; a float with a fraction is not an int.
    assert TrainConfig.model_validate({"model_name": "m", "renderer_name": "r", "sample_timeout_seconds": 30})
    assert (
        errors(TrainConfig, {"model_name": "m", "renderer_name": "r", "batch_size": 2.5})[0][1]
        == "int_from_float"
    )
    assert errors(AdamParams, {"learning_rate": float("inf")})[0][:2] == ("learning_rate", "finite_number")
    assert errors(AdamParams, {"learning_rate": float("nan")})[0][0] == "learning_rate"


@pytest.mark.parametrize(
    ("model", "data", "loc"),
    [
        (TrainConfig, {"batch_size": 0}, "batch_size"),
        (TrainConfig, {"sample_timeout_seconds": 0}, "sample_timeout_seconds"),
        (TrainConfig, {"sample_timeout_seconds": -1.5}, "sample_timeout_seconds"),
        (TrainConfig, {"num_epochs": 0}, "num_epochs"),
        (TrainConfig, {"max_concurrent_rollouts": 0}, "max_concurrent_rollouts"),
        (TrainConfig, {"task_order": "random"}, "task_order"),
        (WorkflowConfig, {"group_size": 0}, "group_size"),
        (WorkflowConfig, {"subagent_datum_keep_probability": 1.5}, "subagent_datum_keep_probability"),
        (WorkflowConfig, {"subagent_datum_keep_probability": -0.1}, "subagent_datum_keep_probability"),
        (WorkflowConfig, {"depth_level_discount_gamma": 0}, "depth_level_discount_gamma"),
        (WorkflowConfig, {"worker_launch_concurrent_groups": 0}, "worker_launch_concurrent_groups"),
        (WorkflowConfig, {"worker_startup_budget_seconds": -1}, "worker_startup_budget_seconds"),
        (WorkflowConfig, {"worker_finalize_grace_seconds": -1}, "worker_finalize_grace_seconds"),
        (WorkflowConfig, {"worker_parent_grace_seconds": -1}, "worker_parent_grace_seconds"),
        (WorkflowConfig, {"worker_termination_grace_seconds": -1}, "worker_termination_grace_seconds"),
        (WorkflowConfig, {"worker_binding_poll_seconds": -1}, "worker_binding_poll_seconds"),
        (
            WorkflowConfig,
            {"worker_unbounded_rollout_budget_seconds": -1},
            "worker_unbounded_rollout_budget_seconds",
        ),
        (WorkflowConfig, {"worker_mem_available_floor_bytes": -1}, "worker_mem_available_floor_bytes"),
        (WorkflowConfig, {"rollout_isolation": "thread"}, "rollout_isolation"),
        (WorkflowConfig, {"worker_start_method": "spawn"}, "worker_start_method"),
        (WorkflowConfig, {"straggler_timeout_seconds": 0}, "straggler_timeout_seconds"),
        (CheckpointConfig, {"recovery_every": 0}, "recovery_every"),
        (CheckpointConfig, {"keep_recovery": 0}, "keep_recovery"),
        (CheckpointConfig, {"load_checkpoint_path": "/tmp/weights"}, "load_checkpoint_path"),
        (WatchdogConfig, {"max_restarts": -1}, "max_restarts"),
        (WatchdogConfig, {"timeout_seconds": 0}, "timeout_seconds"),
        (EvalConfig, {"every": -1}, "every"),
        (EvalConfig, {"strategy": "hourly"}, "strategy"),
        (StatsConfig, {"trial_name": ""}, "trial_name"),
        (StatsConfig, {"experiment_name": "a/b"}, "experiment_name"),
    ],
)
def test_bounds(model: type[BaseModel], data: dict[str, Any], loc: str) -> None:
    if model is TrainConfig:
        data = {"model_name": "m", "renderer_name": "r", **data}
    assert [found[0] for found in errors(model, data)] == [loc]


def test_time_like_worker_fields_accept_zero() -> None:
    wf = WorkflowConfig.model_validate(
        {
            name: 0
            for name in WorkflowConfig.model_fields
            if name.startswith("worker_") and name.endswith("_seconds")
        }
    )
    assert wf.worker_startup_budget_seconds == 0.0


def test_tinker_base_url() -> None:
    assert build(tinker_base_url="local").tinker_base_url == "local"
    assert build(tinker_base_url="http://127.0.0.1:8000").tinker_base_url == "http://127.0.0.1:8000"
    assert "http(s) URL" in messages(PlatoonTinkerRLTrainerConfig, config(tinker_base_url="tinker.example"))


# ----------------------------------------------------------------------------------------------------------------
# Cross-field rules


def test_depth_weighting_and_gamma_are_exclusive() -> None:
    assert WorkflowConfig(depth_level_discount_gamma=0.9).depth_level_discount_gamma == 0.9
    text = messages(WorkflowConfig, {"depth_level_weighting": True, "depth_level_discount_gamma": 0.9})
    assert "depth_level_discount_gamma and depth_level_weighting are exclusive" in text


def test_straggler_quorum_needs_the_timeout_and_fits_the_group() -> None:
    ok = WorkflowConfig.model_validate({"straggler_timeout_seconds": 60, "straggler_quorum": 8})
    assert ok.straggler_quorum == 8
    assert "straggler_quorum needs straggler_timeout_seconds" in messages(
        WorkflowConfig, {"straggler_quorum": 2}
    )
    text = messages(WorkflowConfig, {"straggler_timeout_seconds": 60, "straggler_quorum": 9})
    assert "straggler_quorum (9) must be between 1 and group_size (8)" in text
    text = messages(WorkflowConfig, {"straggler_timeout_seconds": 60, "straggler_quorum": 0})
    assert "between 1 and group_size" in text


def test_straggler_policies() -> None:
    wf = WorkflowConfig.model_validate(
        {"straggler_policies": {"hard": {"timeout_seconds": 120, "quorum": 6}}}
    )
    assert wf.straggler_policies["hard"].quorum == 6
    assert errors(WorkflowConfig, {"straggler_policies": {"hard": {"quorum": 2}}})[0][:2] == (
        "straggler_policies.hard.timeout_seconds",
        "missing",
    )
    text = messages(
        WorkflowConfig, {"group_size": 4, "straggler_policies": {"hard": {"timeout_seconds": 1, "quorum": 5}}}
    )
    assert "straggler_policies.hard.quorum (5) must be between 1 and group_size (4)" in text


def test_min_successful_group_size_fits_the_group() -> None:
    assert WorkflowConfig(group_size=4, min_successful_group_size=4).min_successful_group_size == 4
    assert "min_successful_group_size (5) must be between 1 and group_size (4)" in messages(
        WorkflowConfig, {"group_size": 4, "min_successful_group_size": 5}
    )
    assert "between 1 and group_size" in messages(WorkflowConfig, {"min_successful_group_size": 0})


def test_python_env_isolation_needs_process_isolation() -> None:
    assert WorkflowConfig(rollout_isolation="process", worker_python_env_isolation=True)
    text = messages(WorkflowConfig, {"worker_python_env_isolation": True})
    assert "worker_python_env_isolation requires rollout_isolation: process" in text


def test_every_problem_of_a_section_is_reported_at_once() -> None:
    found = errors(
        WorkflowConfig,
        {
            "group_size": 2,
            "min_successful_group_size": 3,
            "straggler_quorum": 3,
            "worker_python_env_isolation": True,
        },
    )
    assert len(found) == 4 and all(loc == "" and kind == "value_error" for loc, kind, _ in found)


def test_max_concurrent_rollouts() -> None:
    assert (
        build(train={"batch_size": 4, "workflow_config": {"group_size": 3}}).train.max_concurrent_rollouts
        == 12
    )
    assert build(train={"max_concurrent_rollouts": 8}).train.max_concurrent_rollouts == 8
    text = messages(PlatoonTinkerRLTrainerConfig, config(train={"max_concurrent_rollouts": 7}))
    assert "max_concurrent_rollouts (7) must hold at least one group (workflow_config.group_size 8)" in text


def test_watchdog_exit_code_with_restarts() -> None:
    assert WatchdogConfig(max_restarts=0, exit_code=78).exit_code == 78  # no restarts: no rule
    assert WatchdogConfig(max_restarts=3, enabled=False, exit_code=0).exit_code == 0  # watchdog off: no rule
    assert WatchdogConfig(max_restarts=3, exit_code=3).exit_code == 3
    for code in (0, 78, 130, 143, 256, -1):
        text = messages(WatchdogConfig, {"max_restarts": 1, "exit_code": code})
        assert f"exit_code ({code}) must be in 0..255 and not 0, 78, 130 or 143" in text


def test_keep_recovery_rules() -> None:
    ok = build(train={"max_staleness": 2}, checkpoint={"keep_recovery": 2, "recovery_every": 2})
    assert ok.checkpoint.keep_recovery == 2
    assert build(train={"max_staleness": 5}, checkpoint={"keep_recovery": 1}).checkpoint.keep_recovery == 1
    text = messages(PlatoonTinkerRLTrainerConfig, config(checkpoint={"keep_recovery": 2}))
    assert "checkpoint.keep_recovery requires train.max_staleness" in text
    text = messages(
        PlatoonTinkerRLTrainerConfig,
        config(train={"max_staleness": 4}, checkpoint={"keep_recovery": 2, "recovery_every": 2}),
    )
    assert "(2 x 2 = 4) must exceed train.max_staleness (4)" in text


def test_training_problems() -> None:
    assert training_problems(build(train={"num_epochs": 1})) == []
    assert training_problems(build(train={"max_training_steps": 10})) == []
    (problem,) = training_problems(build())
    assert "num_epochs or max_training_steps" in problem
    cfg = build(train={"num_epochs": 1, "workflow_config": {"rollout_config": {"judges": False}}})
    # eval inherits training's rollout config: the switch is reported once, where it was made
    assert [p.split(":")[0] for p in training_problems(cfg)] == [
        "train.workflow_config.rollout_config.judges"
    ]
    cfg = build(train={"num_epochs": 1}, eval={"workflow_config": {"rollout_config": {"judges": False}}})
    assert [p.split(":")[0] for p in training_problems(cfg)] == ["eval.workflow_config.rollout_config.judges"]


# ----------------------------------------------------------------------------------------------------------------
# Deprecated keys


def test_deprecated_keys_are_declared() -> None:
    assert {
        "propogate_root_success": DeprecatedKey("0.3.0", renamed_to="propagate_root_success")
    } == RolloutConfig.DEPRECATED_KEYS
    assert TrainConfig.DEPRECATED_KEYS["rollout_group_key"] == DeprecatedKey("0.3.0", renamed_to="label_by")
    assert (
        "max_concurrent_rollouts"
        in TrainConfig.DEPRECATED_KEYS["num_concurrent_rollout_workflow_workers"].replacement
    )
    assert (
        "max_concurrent_rollouts"
        in EvalConfig.DEPRECATED_KEYS["num_concurrent_rollout_workflow_workers"].replacement
    )
    assert "label_by" in WorkflowConfig.DEPRECATED_KEYS["straggler_policy_key"].replacement
    assert "every" in EvalConfig.DEPRECATED_KEYS["strategy"].replacement
    assert "every" in CheckpointConfig.DEPRECATED_KEYS["strategy"].replacement
    for model in (RolloutConfig, TrainConfig, EvalConfig, CheckpointConfig, WorkflowConfig):
        for key, record in model.DEPRECATED_KEYS.items():
            assert key in model.model_fields and record.removed_in == "0.3.0"


def test_propogate_root_success() -> None:
    assert RolloutConfig(propogate_root_success=True).propagate_root_success is True
    same = RolloutConfig(propogate_root_success=False, propagate_root_success=False)
    assert same.propagate_root_success is False
    text = messages(RolloutConfig, {"propogate_root_success": True, "propagate_root_success": False})
    assert "propogate_root_success (true) conflicts with propagate_root_success (false)" in text


def test_rollout_group_key_becomes_label_by() -> None:
    assert build(train={"rollout_group_key": "difficulty"}).train.label_by == "difficulty"
    assert build(train={"rollout_group_key": "d", "label_by": "d"}).train.label_by == "d"
    text = messages(PlatoonTinkerRLTrainerConfig, config(train={"rollout_group_key": "a", "label_by": "b"}))
    assert "label_by: b, rollout_group_key: a conflict" in text


def test_straggler_policy_key_becomes_label_by() -> None:
    cfg = build(train={"workflow_config": {"straggler_policy_key": "difficulty"}})
    assert cfg.train.label_by == "difficulty"
    cfg = build(eval={"workflow_config": {"straggler_policy_key": "difficulty"}})
    assert cfg.train.label_by == "difficulty"
    text = messages(
        PlatoonTinkerRLTrainerConfig,
        config(train={"label_by": "a", "workflow_config": {"straggler_policy_key": "b"}}),
    )
    assert "workflow_config.straggler_policy_key: b conflict" in text
    text = messages(
        PlatoonTinkerRLTrainerConfig,
        config(train={"label_by": "a"}, eval={"workflow_config": {"straggler_policy_key": "b"}}),
    )
    assert "eval.workflow_config.straggler_policy_key (b) conflicts with train.label_by (a)" in text


def test_num_concurrent_rollout_workflow_workers_counts_groups() -> None:
    cfg = build(train={"num_concurrent_rollout_workflow_workers": 3, "workflow_config": {"group_size": 4}})
    assert cfg.train.max_concurrent_rollouts == 12
    same = build(train={"num_concurrent_rollout_workflow_workers": 2, "max_concurrent_rollouts": 16})
    assert same.train.max_concurrent_rollouts == 16
    text = messages(
        PlatoonTinkerRLTrainerConfig,
        config(train={"num_concurrent_rollout_workflow_workers": 2, "max_concurrent_rollouts": 10}),
    )
    assert "(2 groups x group_size 8 = 16 rollouts) conflicts with max_concurrent_rollouts (10)" in text


def test_eval_num_concurrent_rollout_workflow_workers() -> None:
    cfg = build(eval={"num_concurrent_rollout_workflow_workers": 5, "workflow_config": {"group_size": 2}})
    assert cfg.eval.max_concurrent_rollouts == 10
    assert build(eval={"num_concurrent_rollout_workflow_workers": 5}).eval.max_concurrent_rollouts == 5
    text = messages(EvalConfig, {"num_concurrent_rollout_workflow_workers": 5, "max_concurrent_rollouts": 6})
    assert "conflicts with max_concurrent_rollouts (6)" in text


@pytest.mark.parametrize(("strategy", "every"), [("epoch", 1), ("step", 1), ("none", 0), (None, 0)])
def test_eval_strategy_defaults_every(strategy: str | None, every: int) -> None:
    assert EvalConfig.model_validate({"strategy": strategy}).every == every
    assert EvalConfig.model_validate({"strategy": strategy, "every": 5}).every == 5


def test_checkpoint_strategy_defaults_every() -> None:
    assert CheckpointConfig(strategy="step").every == 1
    assert CheckpointConfig(strategy="epoch", every=4).every == 4
    assert CheckpointConfig(strategy="none").every == 0


def test_built_config_round_trips() -> None:
    cfg = build(
        train={
            "rollout_group_key": "g",
            "num_concurrent_rollout_workflow_workers": 2,
            "workflow_config": {"rollout_config": {"propogate_root_success": True}},
        },
        eval={"strategy": "step", "workflow_config": {"group_size": 2}},
        checkpoint={"strategy": "step"},
    )
    again = PlatoonTinkerRLTrainerConfig.model_validate(cfg.model_dump())
    assert again == cfg


# ----------------------------------------------------------------------------------------------------------------
# Partial sections and eval laid over train


def test_eval_workflow_field_default() -> None:
    wf = build().eval.workflow_config
    assert (wf.group_size, wf.filter_errors, wf.filter_zero_advantage_datums) == (1, False, False)
    # The other keys are the class's.
    assert wf.filter_message_actions is False and wf.min_successful_group_size == 1


def test_a_partial_eval_workflow_keeps_the_field_default() -> None:
    wf = build(eval={"workflow_config": {"group_size": 2}}).eval.workflow_config
    assert (wf.group_size, wf.filter_errors, wf.filter_zero_advantage_datums) == (2, False, False)
    wf = build(eval={"workflow_config": {"filter_errors": True}}).eval.workflow_config
    assert (wf.group_size, wf.filter_errors, wf.filter_zero_advantage_datums) == (1, True, False)
    assert (
        EvalConfig.model_validate(
            {"workflow_config": {"leave_one_out_baseline": True}}
        ).workflow_config.group_size
        == 1
    )


def test_a_construction_error_says_which_defaults_the_section_kept() -> None:
    (found,) = errors(
        PlatoonTinkerRLTrainerConfig, config(eval={"workflow_config": {"min_successful_group_size": 4}})
    )
    assert found[0] == "eval.workflow_config"
    assert found[2].startswith("min_successful_group_size (4) must be between 1 and group_size (1)")
    assert "kept group_size: 1, filter_errors: false, filter_zero_advantage_datums: false" in found[2]
    (found,) = errors(EvalConfig, {"workflow_config": {"group_size": 2, "min_successful_group_size": 4}})
    assert found[2].endswith("it kept filter_errors: false, filter_zero_advantage_datums: false)")


def test_type_errors_in_a_laid_section_keep_their_path() -> None:
    found = errors(EvalConfig, {"workflow_config": {"group_size": "many", "filter_errors": 3}})
    assert {(loc, kind) for loc, kind, _ in found} == {
        ("workflow_config.group_size", "int_parsing"),
        ("workflow_config.filter_errors", "bool_type"),
    }


def test_eval_inherits_trainings_rollout_and_worker_keys() -> None:
    cfg = build(
        train={
            "workflow_config": {
                "group_size": 4,
                "filter_errors": False,
                "rollout_isolation": "process",
                "worker_start_method": "exec",
                "worker_python_env_isolation": True,
                "worker_rss_soft_limit_bytes": 1024,
                "rollout_config": {"max_steps": 30, "timeout": 900, "extra": {"a": 1}},
            }
        },
        eval={"every": 5, "workflow_config": {"group_size": 2}},
    )
    wf = cfg.eval.workflow_config
    assert (wf.rollout_isolation, wf.worker_start_method, wf.worker_python_env_isolation) == (
        "process",
        "exec",
        True,
    )
    assert wf.worker_rss_soft_limit_bytes == 1024
    assert (wf.rollout_config.max_steps, wf.rollout_config.timeout, wf.rollout_config.extra) == (
        30,
        900,
        {"a": 1},
    )
    # Group-shaping and filter keys keep eval's own defaults.
    assert (wf.group_size, wf.filter_errors, wf.filter_zero_advantage_datums) == (2, False, False)


def test_eval_is_laid_over_training_even_when_absent() -> None:
    cfg = build(
        train={"workflow_config": {"rollout_isolation": "process", "rollout_config": {"max_steps": 7}}}
    )
    assert cfg.eval.every == 0  # a training config without eval does not evaluate
    wf = cfg.eval.workflow_config
    assert wf.rollout_isolation == "process" and wf.rollout_config.max_steps == 7 and wf.group_size == 1


def test_eval_rollout_config_merges_key_by_key() -> None:
    cfg = build(
        train={
            "workflow_config": {
                "rollout_config": {
                    "max_steps": 30,
                    "timeout": 900,
                    "extra": {"a": 1, "b": 2},
                    "inference_params": {"temperature": 0.7, "max_completion_tokens": 2048},
                }
            }
        },
        eval={
            "workflow_config": {
                "rollout_config": {
                    "max_steps": 50,
                    "timeout": None,
                    "extra": {"c": 3},
                    "inference_params": {"temperature": 0.0},
                }
            }
        },
    )
    rc = cfg.eval.workflow_config.rollout_config
    assert rc.max_steps == 50
    assert rc.timeout is None  # a key set to null replaces
    assert rc.extra == {"c": 3}  # free-form mappings replace whole
    assert rc.inference_params.temperature == 0.0
    assert rc.inference_params.max_completion_tokens == 2048  # inference_params merge key by key
    train_rc = cfg.train.workflow_config.rollout_config
    assert (train_rc.max_steps, train_rc.timeout, train_rc.extra) == (30, 900, {"a": 1, "b": 2})


def test_eval_sets_its_own_worker_keys() -> None:
    cfg = build(
        train={"workflow_config": {"rollout_isolation": "process", "worker_startup_budget_seconds": 30}},
        eval={"workflow_config": {"rollout_isolation": "inprocess"}},
    )
    wf = cfg.eval.workflow_config
    assert wf.rollout_isolation == "inprocess" and wf.worker_startup_budget_seconds == 30


def test_eval_rules_judge_the_combined_workflow() -> None:
    # worker_python_env_isolation in eval alone is fine when training isolates processes.
    cfg = build(
        train={"workflow_config": {"rollout_isolation": "process"}},
        eval={"workflow_config": {"worker_python_env_isolation": True}},
    )
    assert cfg.eval.workflow_config.worker_python_env_isolation is True


def test_eval_inherits_the_built_rollout_config() -> None:
    # Training's deprecated spelling was converted before eval inherits it ...
    cfg = build(train={"workflow_config": {"rollout_config": {"propogate_root_success": True}}})
    assert cfg.eval.workflow_config.rollout_config.propagate_root_success is True
    # ... and a renamed key and its old name count as one key, so eval's old spelling does not conflict.
    cfg = build(
        train={"workflow_config": {"rollout_config": {"propagate_root_success": True}}},
        eval={"workflow_config": {"rollout_config": {"propogate_root_success": False}}},
    )
    assert cfg.eval.workflow_config.rollout_config.propagate_root_success is False
    assert cfg.train.workflow_config.rollout_config.propagate_root_success is True


def test_a_broken_training_workflow_is_reported_once() -> None:
    found = errors(PlatoonTinkerRLTrainerConfig, config(train={"workflow_config": {"group_size": 0}}))
    assert [loc for loc, _, _ in found] == ["train.workflow_config.group_size"]


def test_inherited_keys() -> None:
    assert EVAL_INHERITED_KEYS[:2] == ("rollout_config", "rollout_isolation")
    assert "worker_start_method" in EVAL_INHERITED_KEYS and "group_size" not in EVAL_INHERITED_KEYS
    assert all(key.startswith("worker_") for key in EVAL_INHERITED_KEYS[2:])


def test_lay_over_and_kept_defaults() -> None:
    base = {"a": 1, "rollout_config": {"max_steps": 3, "extra": {"x": 1}, "propagate_root_success": True}}
    over = {"rollout_config": {"extra": {"y": 2}, "propogate_root_success": False}}
    laid = lay_over(base, over, WorkflowConfig)
    assert laid == {
        "a": 1,
        "rollout_config": {"max_steps": 3, "extra": {"y": 2}, "propogate_root_success": False},
    }
    assert kept_defaults(base, over, WorkflowConfig) == {"a": 1, "rollout_config.max_steps": 3}


def test_loss_fn_config_replaces_whole() -> None:
    cfg = build(train={"loss_fn": "ppo", "loss_fn_config": {"clip_high_threshold": 1.2}})
    assert cfg.train.loss_fn_config == {"clip_high_threshold": 1.2}


@pytest.mark.parametrize("loss_fn", ["gspo", "stable_reinforce"])
def test_gspo_and_stable_reinforce_get_the_service_s_defaults_unless_configured(loss_fn: str) -> None:
    # platoon's wide clip thresholds are for the token-level losses; these two get what the service defaults to
    assert build(train={"loss_fn": loss_fn}).train.loss_fn_config == {}
    knobs = {"kl_coeff": 0.01} if loss_fn == "stable_reinforce" else {"clip_high_threshold": 1.0004}
    assert build(train={"loss_fn": loss_fn, "loss_fn_config": knobs}).train.loss_fn_config == knobs


def test_subclasses_keep_the_rules() -> None:
    class MyConfig(PlatoonTinkerRLTrainerConfig):
        """A `trainer_config` subclass."""

    cfg = MyConfig.model_validate(config(train={"workflow_config": {"rollout_isolation": "process"}}))
    assert cfg.eval.workflow_config.rollout_isolation == "process"
    assert "at least one group" in messages(MyConfig, config(train={"max_concurrent_rollouts": 1}))


def test_section_default_is_reusable_and_counts_a_renamed_key_as_one() -> None:
    from platoon.config_defs import ConfigModel, section_default

    class Holder(ConfigModel):
        rollout: RolloutConfig = section_default(RolloutConfig, propagate_root_success=True, max_steps=5)

    assert Holder().rollout.propagate_root_success is True and Holder().rollout.max_steps == 5
    # The old spelling replaces the default written under the new name instead of conflicting with it.
    held = Holder.model_validate({"rollout": {"propogate_root_success": False}})
    assert held.rollout.propagate_root_success is False and held.rollout.max_steps == 5
    assert Holder.model_validate({"rollout": {"verbose": False}}).rollout.propagate_root_success is True


def test_config_modules_import_nothing_heavy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, platoon.config.training, platoon.eval.run, platoon.config.environments;"
        "heavy = {'torch', 'transformers', 'tinker', 'openreward', 'docker', 'mcp', 'yaml', 'tokenizers'};"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
