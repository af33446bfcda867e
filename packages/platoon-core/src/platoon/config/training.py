"""The training config (`PlatoonTinkerRLTrainerConfig`) and its sections, with every default, bound
and cross-field rule; deprecated keys are accepted and converted here, and warned about by the loader.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, ValidationError, field_validator, model_validator

from platoon.config.environments import EnvironmentList
from platoon.config.tinker import LocalServerConfig, check_tinker_base_url
from platoon.config_defs import (
    Bool,
    ConfigModel,
    Float,
    Int,
    RolloutConfig,
    lay_over,
    raise_problems,
    section_default,
)
from platoon.deprecations import DeprecatedKey

__all__ = [
    "EVAL_INHERITED_KEYS",
    "AdamParams",
    "CheckpointConfig",
    "EvalConfig",
    "PlatoonTinkerRLTrainerConfig",
    "StatsConfig",
    "StragglerPolicy",
    "TrainConfig",
    "WandbConfig",
    "WatchdogConfig",
    "WorkflowConfig",
]

_REMOVED_IN = "0.3.0"
DEFAULT_LABEL_COLUMN = "_platoon_environment"
DEFAULT_EVAL_CONCURRENCY = 256
#: Exit codes a supervisor never restarts after, so the watchdog may not exit with them.
_NO_RESTART_CODES = (0, 78, 130, 143)
#: the most rollouts in one group: far past any real run's (and the local server's most samples per request)
MAX_GROUP_SIZE = 1024
#: the most tasks one step draws
MAX_BATCH_SIZE = 8192
#: the most rollouts one step runs (batch_size x group_size): every one is held in memory until the step trains
MAX_ROLLOUTS_PER_STEP = 65536


class StragglerPolicy(ConfigModel):
    """The straggler cut-off of the groups of one label."""

    timeout_seconds: Float | None = Field(
        gt=0,
        description="seconds after which a group stops waiting for stragglers; null = never, for this label",
    )
    quorum: Int | None = Field(
        None, ge=1, description="members a group needs to stop early; None = group_size - 1"
    )


class WorkflowConfig(ConfigModel):
    """How rollout groups are formed, weighted and filtered, and how rollout workers run."""

    DEPRECATED_KEYS = {
        "straggler_policy_key": DeprecatedKey(
            _REMOVED_IN, instead="train.label_by (straggler policies key on its labels)"
        ),
    }

    group_size: Int = Field(
        8, ge=1, le=MAX_GROUP_SIZE, description=f"rollouts per task in a group (at most {MAX_GROUP_SIZE})"
    )
    rollout_config: RolloutConfig = Field(default_factory=RolloutConfig, description="how each rollout runs")
    leave_one_out_baseline: Bool = Field(False, description="baseline each member on the others' mean")
    depth_level_weighting: Bool = Field(False, description="inverse-frequency weights per agent depth")
    depth_level_discount_gamma: Float | None = Field(
        None, gt=0, description="discount per depth level; exclusive with depth_level_weighting"
    )
    subagent_datum_keep_probability: Float = Field(
        1.0, ge=0, le=1, description="probability of training on each subagent datum"
    )
    subagent_datum_sampling_seed: Int = Field(0, description="seed of the subagent datum sampling")
    filter_errors: Bool = Field(True, description="do not reinforce error tokens (sign-aware)")
    filter_message_actions: Bool = Field(False, description="train only on tool-call actions")
    filter_zero_advantage_datums: Bool = Field(True, description="leave zero-advantage datums out of compute")
    straggler_timeout_seconds: Float | None = Field(
        None, gt=0, description="seconds after which a group stops waiting for stragglers"
    )
    straggler_quorum: Int | None = Field(
        None, description="members a group needs to stop early (1..group_size); needs the timeout"
    )
    straggler_policy_key: str | None = Field(
        None, description="deprecated: straggler policies key on train.label_by"
    )
    straggler_policies: dict[str, StragglerPolicy] = Field(
        default_factory=dict, description="label -> its own straggler timeout and quorum"
    )
    min_successful_group_size: Int = Field(
        1, description="scored members a group needs to train (1..group_size)"
    )
    rollout_isolation: Literal["inprocess", "process"] = Field(
        "inprocess", description="rollouts as asyncio tasks, or one OS process per rollout"
    )
    worker_start_method: Literal["forkserver", "exec"] = Field(
        "forkserver", description="how rollout worker processes start"
    )
    worker_startup_budget_seconds: Float = Field(
        300.0, ge=0, description="seconds a worker may take to start"
    )
    worker_finalize_grace_seconds: Float = Field(
        120.0, ge=0, description="seconds a worker may take to finish up"
    )
    worker_parent_grace_seconds: Float = Field(
        60.0, ge=0, description="seconds the parent waits beyond a deadline"
    )
    worker_termination_grace_seconds: Float = Field(
        10.0, ge=0, description="seconds between SIGTERM and SIGKILL of a worker"
    )
    worker_launch_concurrent_groups: Int = Field(2, ge=1, description="groups whose workers launch at once")
    worker_rss_soft_limit_bytes: Int = Field(
        24 * 2**30, ge=0, description="a worker's soft RSS limit (24 GiB)"
    )
    worker_mem_available_floor_bytes: Int = Field(
        0, ge=0, description="refuse a launch below this MemAvailable; 0 = off"
    )
    worker_binding_poll_seconds: Float = Field(
        5.0, ge=0, description="how often workers re-check the published sampling client"
    )
    worker_unbounded_rollout_budget_seconds: Float = Field(
        86400.0, ge=0, description="deadline of a rollout without a time limit"
    )
    worker_python_env_isolation: Bool = Field(
        False, description="give each worker its own Python environment (needs process isolation)"
    )

    @model_validator(mode="after")
    def _rules(self) -> Self:
        problems: list[str] = []
        size = self.group_size
        if self.depth_level_weighting and self.depth_level_discount_gamma is not None:
            problems.append(
                "depth_level_discount_gamma and depth_level_weighting are exclusive: set one of them"
            )
        if self.straggler_quorum is not None:
            if self.straggler_timeout_seconds is None:
                problems.append("straggler_quorum needs straggler_timeout_seconds")
            if not 1 <= self.straggler_quorum <= size:
                problems.append(
                    f"straggler_quorum ({self.straggler_quorum}) must be between 1 and group_size ({size})"
                )
        for label, policy in self.straggler_policies.items():
            if policy.quorum is not None and not 1 <= policy.quorum <= size:
                problems.append(
                    f"straggler_policies.{label}.quorum ({policy.quorum}) must be between 1 and group_size ({size})"
                )
        if not 1 <= self.min_successful_group_size <= size:
            problems.append(
                f"min_successful_group_size ({self.min_successful_group_size}) must be between 1 and group_size "
                f"({size})"
            )
        if self.worker_python_env_isolation and self.rollout_isolation != "process":
            problems.append("worker_python_env_isolation requires rollout_isolation: process")
        raise_problems(type(self).__name__, problems, self)
        return self


#: The keys of `eval.workflow_config` that default to the built `train.workflow_config`'s values.
EVAL_INHERITED_KEYS: tuple[str, ...] = (
    "rollout_config",
    "rollout_isolation",
    *(name for name in WorkflowConfig.model_fields if name.startswith("worker_")),
)


class AdamParams(ConfigModel):
    """The Adam optimizer step (`tinker.AdamParams`)."""

    learning_rate: Float = Field(3e-5, gt=0, description="learning rate")
    beta1: Float = Field(0.9, ge=0, lt=1, description="first-moment decay")
    beta2: Float = Field(0.95, ge=0, lt=1, description="second-moment decay")
    eps: Float = Field(1e-8, gt=0, description="numerical epsilon")
    weight_decay: Float = Field(0.0, ge=0, description="decoupled weight decay")
    grad_clip_norm: Float = Field(0.0, ge=0, description="gradient clipping norm; 0 = off")


def _default_loss_fn_config() -> dict[str, Any]:
    return {"clip_low_threshold": 0.0, "clip_high_threshold": 5.0}


#: losses that take platoon's own `loss_fn_config` default when none is set; the others get the service's defaults
#: (an empty config): gspo's ratio and stable_reinforce's knobs are not the clip thresholds platoon widens
PLATOON_CLIP_DEFAULT_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro")


class TrainConfig(ConfigModel):
    """The policy trained, the batch shape, the optimizer and the rollout workflow."""

    UNKNOWN_KEY_HINTS = {
        "hosted": "hosted models are evaluation-only: set inference.hosted in an evaluation config (platoon eval)",
        "backend": "training always samples through Tinker; tinker_base_url (top level) picks the service",
    }
    DEPRECATED_KEYS = {
        "rollout_group_key": DeprecatedKey(_REMOVED_IN, renamed_to="label_by"),
        "num_concurrent_rollout_workflow_workers": DeprecatedKey(
            _REMOVED_IN, instead="train.max_concurrent_rollouts (the old value x workflow_config.group_size)"
        ),
    }

    model_name: str = Field(description="the Hugging Face base model")
    renderer_name: str = Field(description="a named renderer or `chat_template`")
    renderer_kwargs: dict[str, Any] = Field(default_factory=dict, description="set as renderer attributes")
    sample_timeout_seconds: Float | None = Field(
        None, gt=0, description="bound on one sampling call; None = $TINKER_SAMPLE_TIMEOUT_SECONDS, else 600"
    )
    context_window_length: Int | None = Field(
        None,
        ge=1,
        description="prompts that do not fit are refused; so are, window or not, prompts and max_tokens past "
        "$PLATOON_GATEWAY_MAX_PROMPT_TOKENS / $PLATOON_GATEWAY_MAX_TOKENS (1048576 each)",
    )
    batch_size: Int = Field(
        32, ge=1, le=MAX_BATCH_SIZE, description=f"tasks per step (at most {MAX_BATCH_SIZE})"
    )
    num_epochs: Int | None = Field(
        None, ge=1, description="passes over the tasks (this or max_training_steps)"
    )
    max_training_steps: Int | None = Field(
        None, ge=1, description="steps to train; the shorter of the two wins"
    )
    num_minibatches: Int = Field(1, ge=1, description="optimizer steps per batch")
    num_microbatches: Int = Field(1, ge=1, description="forward-backward calls per minibatch")
    max_staleness: Int | None = Field(
        None, ge=0, description="policy versions a group may lag; None = unbounded"
    )
    sampling_client_kind: Literal["snapshot", "inflight"] = Field(
        "snapshot",
        description="snapshot (the service's default): each policy version gets a sampler of fixed weights; "
        "inflight: running rollouts keep their sampling session and move to new weights as each step publishes "
        "them (needs max_staleness above 0 or unset, and a Tinker SDK with in-flight sampling)",
    )
    optimizer: AdamParams = Field(default_factory=AdamParams, description="Adam parameters")
    loss_fn: str = Field(
        "cispo",
        min_length=1,
        description="the Tinker loss function: cross_entropy, importance_sampling, ppo, cispo, gspo, "
        "stable_reinforce (its SDK samples with record_stability_info), dro (not on the local server)",
    )
    loss_fn_config: dict[str, Any] = Field(
        default_factory=_default_loss_fn_config,
        description="loss function settings (clip_low_threshold/clip_high_threshold: ppo, cispo, gspo; kl_coeff: "
        "stable_reinforce); replaced whole when set; unset under gspo and stable_reinforce: {} (the service's "
        "defaults)",
    )
    lora_rank: Int = Field(32, ge=1, description="LoRA rank")
    workflow_config: WorkflowConfig = Field(
        default_factory=WorkflowConfig, description="the rollout workflow"
    )
    max_concurrent_rollouts: Int | None = Field(
        None, ge=1, description="rollouts at once; None = batch_size x group_size; at least one group"
    )
    num_concurrent_rollout_workflow_workers: Int | None = Field(
        None, ge=1, description="deprecated: groups at once (use max_concurrent_rollouts)"
    )
    label_by: str | None = Field(
        None, min_length=1, description=f"the dataset column that labels tasks; None = {DEFAULT_LABEL_COLUMN}"
    )
    rollout_group_key: str | None = Field(None, min_length=1, description="deprecated name of label_by")
    rollout_group_limits: dict[str, Int] = Field(
        default_factory=dict, description="label -> the most groups of it in flight (a positive int)"
    )
    task_order: Literal["auto", "weighted"] = Field(
        "auto", description="task order: `weighted` interleaves entries"
    )
    forward_backward_timeout_seconds: Float = Field(
        5400.0, gt=0, description="bound on one forward-backward call"
    )
    optim_step_timeout_seconds: Float = Field(300.0, gt=0, description="bound on one optimizer step")
    service_unreachable_seconds: Float = Field(
        300.0,
        gt=0,
        description="how long the Tinker service may not answer before the run stops (exit 1, resumable)",
    )
    max_infra_failure_rate: Float = Field(
        0.5,
        ge=0,
        le=1,
        description=(
            "the share of rollouts over the last 5 steps that may end in an infrastructure failure before the run "
            "stops (exit 1, resumable); 1 never stops"
        ),
    )
    max_infra_failed_steps: Int = Field(
        3,
        ge=0,
        description=(
            "consecutive steps in which every rollout failed in the infrastructure with one same kind (sampling "
            "errors, say), so nothing trained, before the run stops naming that kind (exit 1, resumable); 0 never "
            "stops"
        ),
    )

    @field_validator("rollout_group_limits")
    @classmethod
    def _positive_limits(cls, value: dict[str, int]) -> dict[str, int]:
        bad = [f"{label}: {limit}" for label, limit in value.items() if limit < 1]
        if bad:
            raise ValueError(f"rollout_group_limits are positive ints ({', '.join(bad)})")
        return value

    @property
    def label_column(self) -> str:
        """The column that labels tasks: `label_by`, else `_platoon_environment`."""
        return self.label_by or DEFAULT_LABEL_COLUMN

    @model_validator(mode="after")
    def _convert(self) -> Self:
        problems: list[str] = []
        if "loss_fn_config" not in self.model_fields_set and self.loss_fn not in PLATOON_CLIP_DEFAULT_LOSSES:
            self.loss_fn_config = {}
        # The deprecated names of label_by must agree with it and with each other.
        named = {
            key: value
            for key, value in (
                ("label_by", self.label_by),
                ("rollout_group_key", self.rollout_group_key),
                ("workflow_config.straggler_policy_key", self.workflow_config.straggler_policy_key),
            )
            if value is not None
        }
        if len(set(named.values())) > 1:
            said = ", ".join(f"{key}: {value}" for key, value in named.items())
            problems.append(f"{said} conflict: all name the label column; keep only label_by")
        elif named:
            self.label_by = next(iter(named.values()))

        if self.sampling_client_kind == "inflight" and self.max_staleness == 0:
            problems.append(
                "sampling_client_kind inflight needs max_staleness above 0 (or unset): with 0 every rollout ends "
                "before the weights change, so there is nothing in flight to update"
            )
        size = self.workflow_config.group_size
        groups = self.num_concurrent_rollout_workflow_workers
        if groups is not None:
            if self.max_concurrent_rollouts is not None and self.max_concurrent_rollouts != groups * size:
                problems.append(
                    f"num_concurrent_rollout_workflow_workers ({groups} groups x group_size {size} = {groups * size} "
                    f"rollouts) conflicts with max_concurrent_rollouts ({self.max_concurrent_rollouts}); keep only "
                    "max_concurrent_rollouts"
                )
            else:
                self.max_concurrent_rollouts = groups * size
        if self.max_concurrent_rollouts is None:
            self.max_concurrent_rollouts = self.batch_size * size
        elif self.max_concurrent_rollouts < size:
            problems.append(
                f"max_concurrent_rollouts ({self.max_concurrent_rollouts}) must hold at least one group "
                f"(workflow_config.group_size {size})"
            )
        raise_problems(type(self).__name__, problems, self)
        return self


class EvalConfig(ConfigModel):
    """Evaluation during training: how often, and the workflow laid over training's."""

    UNKNOWN_KEY_HINTS = {
        "hosted": "hosted models are evaluation-only: use inference.hosted in an evaluation config (platoon eval); "
        "training-time evaluation samples the policy being trained",
        "backend": "training-time evaluation samples the policy being trained, through Tinker",
        "sample_timeout_seconds": "training-time evaluation uses train.sample_timeout_seconds",
    }
    DEPRECATED_KEYS = {
        "strategy": DeprecatedKey(_REMOVED_IN, instead="`every` alone (training steps, 0 never)"),
        "num_concurrent_rollout_workflow_workers": DeprecatedKey(
            _REMOVED_IN, instead="eval.max_concurrent_rollouts (the old value x workflow_config.group_size)"
        ),
    }

    every: Int | None = Field(
        None, ge=0, description="evaluate every N training steps; None = 0 (never), or 1 under `strategy`"
    )
    strategy: Literal["epoch", "step", "none"] | None = Field(None, description="deprecated: use every")
    at_start: Bool = Field(False, description="also evaluate the starting policy at step 0")
    max_concurrent_rollouts: Int | None = Field(
        None, ge=1, description=f"evaluation rollouts at once; None = {DEFAULT_EVAL_CONCURRENCY}"
    )
    num_concurrent_rollout_workflow_workers: Int | None = Field(
        None, ge=1, description="deprecated: groups at once (use max_concurrent_rollouts)"
    )
    workflow_config: WorkflowConfig = section_default(
        WorkflowConfig,
        description="laid over train.workflow_config for its rollout and worker keys",
        group_size=1,
        filter_errors=False,
        filter_zero_advantage_datums=False,
    )

    @model_validator(mode="after")
    def _convert(self) -> Self:
        if self.every is None:
            self.every = 1 if self.strategy in ("epoch", "step") else 0
        groups, size = self.num_concurrent_rollout_workflow_workers, self.workflow_config.group_size
        if groups is not None:
            if self.max_concurrent_rollouts is not None and self.max_concurrent_rollouts != groups * size:
                raise ValueError(
                    f"num_concurrent_rollout_workflow_workers ({groups} groups x group_size {size} = "
                    f"{groups * size} rollouts) conflicts with max_concurrent_rollouts "
                    f"({self.max_concurrent_rollouts}); keep only max_concurrent_rollouts"
                )
            self.max_concurrent_rollouts = groups * size
        if self.max_concurrent_rollouts is None:
            self.max_concurrent_rollouts = DEFAULT_EVAL_CONCURRENCY
        return self


class CheckpointConfig(ConfigModel):
    """How often checkpoints are saved, and where training starts from."""

    DEPRECATED_KEYS = {
        "strategy": DeprecatedKey(_REMOVED_IN, instead="`every` alone (training steps, 0 never)"),
    }

    every: Int = Field(
        0, ge=0, description="a full checkpoint every N steps; 0 = launch, recovery and final only"
    )
    strategy: Literal["epoch", "step", "none"] | None = Field(None, description="deprecated: use every")
    load_checkpoint_path: str | None = Field(
        None, description="`tinker://` weights to start from, with a fresh optimizer"
    )
    recovery_every: Int | None = Field(None, ge=1, description="a recovery checkpoint every N steps")
    keep_recovery: Int | None = Field(
        None, ge=1, description="recovery checkpoints kept; needs train.max_staleness"
    )

    @field_validator("load_checkpoint_path")
    @classmethod
    def _tinker_path(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("tinker://"):
            raise ValueError(f"{value!r} is not a tinker:// path (the weights of a Tinker checkpoint)")
        return value

    @model_validator(mode="after")
    def _convert(self) -> Self:
        # `strategy: step|epoch` without `every` meant a checkpoint each step (or epoch).
        if self.strategy in ("epoch", "step") and "every" not in self.model_fields_set:
            self.every = 1
        return self


class WandbConfig(ConfigModel):
    """Weights & Biases logging."""

    mode: Literal["online", "offline", "disabled"] = Field("online", description="W&B mode")
    project: str | None = Field(None, description="W&B project; None = stats.experiment_name")
    entity: str | None = Field(None, description="W&B entity")
    name: str | None = Field(None, description="W&B run name; None = stats.trial_name")
    group: str | None = Field(None, description="W&B group; None = <experiment_name>_<trial_name>")
    tags: list[str] = Field(default_factory=list, description="W&B tags")
    notes: str | None = Field(None, description="W&B notes")
    api_key: str | None = Field(None, description="W&B key; None = $WANDB_API_KEY")
    base_url: str | None = Field(None, description="W&B server")
    resume_run_id: str | None = Field(None, description="a W&B run id to resume")


def _check_name(value: str) -> str:
    # Both names are directories of the run dir (log_path/<experiment>/<trial>).
    if not value or value in (".", "..") or "/" in value or "\\" in value:
        raise ValueError(f"{value!r} is not a directory name (non-empty, no `/`, not `.` or `..`)")
    return value


class StatsConfig(ConfigModel):
    """Run naming and metrics logging: the run dir is log_path/<experiment_name>/<trial_name>."""

    experiment_name: str = Field("platoon_tinker", description="the experiment (a directory under log_path)")
    trial_name: str = Field("run", description="the trial (a directory under the experiment)")
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Weights & Biases logging")

    @field_validator("experiment_name", "trial_name")
    @classmethod
    def _names(cls, value: str) -> str:
        return _check_name(value)

    @model_validator(mode="after")
    def _wandb_names(self) -> Self:
        wandb = self.wandb
        if wandb.project is None:
            wandb.project = self.experiment_name
        if wandb.name is None:
            wandb.name = self.trial_name
        if wandb.group is None:
            wandb.group = f"{self.experiment_name}_{self.trial_name}"
        return self


class WatchdogConfig(ConfigModel):
    """The training watchdog and supervised restarts."""

    enabled: Bool = Field(True, description="exit when training makes no progress")
    timeout_seconds: Float = Field(600.0, gt=0, description="seconds without a heartbeat before it fires")
    exit_code: Int = Field(2, description="the exit code when it fires")
    max_restarts: Int = Field(0, ge=0, description="supervised restarts; 0 = train in process")

    @model_validator(mode="after")
    def _exit_code(self) -> Self:
        if self.enabled and self.max_restarts > 0:
            code = self.exit_code
            if not 0 <= code <= 255 or code in _NO_RESTART_CODES:
                raise ValueError(
                    f"exit_code ({code}) must be in 0..255 and not 0, 78, 130 or 143 when max_restarts is above 0: "
                    "the supervisor never restarts after those"
                )
        return self


def _inherited(workflow: WorkflowConfig) -> dict[str, Any]:
    """The raw values eval.workflow_config inherits from a built training workflow (deprecated keys dropped, since
    their values were carried into the new names)."""
    rollout_dump = workflow.rollout_config.model_dump(exclude=set(RolloutConfig.DEPRECATED_KEYS))
    values = {key: getattr(workflow, key) for key in EVAL_INHERITED_KEYS if key != "rollout_config"}
    return {"rollout_config": rollout_dump, **values}


def _valid_raw_keys(raw: dict[str, Any], exc: ValidationError) -> dict[str, Any]:
    """The raw keys of a training workflow that did not build which eval may inherit: those (and, inside a
    mapping such as rollout_config, the sub-keys) with no problem of their own. A problem of the whole section (a
    rule across keys) leaves nothing to inherit, since any of the keys it judges may be the wrong one."""
    locations = [tuple(error["loc"]) for error in exc.errors()]
    if () in locations:
        return {}
    inherited: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in EVAL_INHERITED_KEYS:
            continue
        inside = [loc[1:] for loc in locations if loc[0] == key]
        if not inside:
            inherited[key] = value
        elif isinstance(value, dict) and all(inside):
            bad = {loc[0] for loc in inside}
            inherited[key] = {name: item for name, item in value.items() if name not in bad}
    return inherited


class PlatoonTinkerRLTrainerConfig(ConfigModel):
    """A training config: `platoon train` (the base class of `trainer_config` subclasses)."""

    UNKNOWN_KEY_HINTS = {
        "inference": "inference belongs to evaluation configs (platoon eval); hosted models are evaluation-only, "
        "and a training config names its policy in train",
    }
    REQUIRED_KEY_HINTS = {
        "log_path": "set it, or set `runs` in the site profile (~/.config/platoon/site.yaml or $PLATOON_SITE) "
        "to have it filled",
    }

    train: TrainConfig = Field(description="the policy trained and how")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="evaluation during training")
    log_path: str = Field(min_length=1, description="where run dirs go; filled from the site profile's runs")
    tinker_base_url: str | None = Field(
        None,
        description="the Tinker service; None = $TINKER_BASE_URL, else hosted Tinker; `local` = local server",
    )
    local_server: LocalServerConfig = Field(
        default_factory=LocalServerConfig, description="the local server `tinker_base_url: local` starts"
    )
    environments: EnvironmentList = Field(default_factory=list, description="the environment entries")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="checkpoints")
    stats: StatsConfig = Field(default_factory=StatsConfig, description="run naming and metrics logging")
    watchdog: WatchdogConfig = Field(default_factory=WatchdogConfig, description="watchdog and restarts")

    @field_validator("tinker_base_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        return check_tinker_base_url(value)

    @model_validator(mode="before")
    @classmethod
    def _lay_eval_over_train(cls, data: Any) -> Any:
        """Give eval.workflow_config the built train.workflow_config's rollout and worker keys it leaves out.

        Which keys eval sets is read from the raw input (not `model_fields_set`), because the laying must happen
        before eval's workflow validates: its own rules (worker_python_env_isolation needs process isolation) judge
        the combined values. Training's workflow is built on its own first ("built": deprecated keys converted);
        if it does not build, eval inherits only the raw values training reports no problem with, so a problem is
        reported once, under train.
        """
        if not isinstance(data, dict):
            return data
        train = data.get("train", {})
        raw = train.get("workflow_config", {}) if isinstance(train, dict) else None
        if not isinstance(raw, dict):
            return data
        try:
            base = _inherited(WorkflowConfig.model_validate(raw))
        except ValidationError as exc:
            base = _valid_raw_keys(raw, exc)
        evaluation = data.get("eval", {})
        if not isinstance(evaluation, dict):
            return data
        own = evaluation.get("workflow_config", {})
        if not isinstance(own, dict):
            return data
        laid = lay_over(base, own, WorkflowConfig)
        return {**data, "eval": {**evaluation, "workflow_config": laid}}

    @model_validator(mode="after")
    def _rules(self) -> Self:
        problems: list[str] = []
        key = self.eval.workflow_config.straggler_policy_key
        if key is not None:
            if self.train.label_by is not None and self.train.label_by != key:
                problems.append(
                    f"eval.workflow_config.straggler_policy_key ({key}) conflicts with train.label_by "
                    f"({self.train.label_by}): straggler policies key on train.label_by; keep only that"
                )
            else:
                self.train.label_by = key
        keep, every = self.checkpoint.keep_recovery, self.checkpoint.recovery_every
        staleness = self.train.max_staleness
        if keep is not None:
            if staleness is None:
                problems.append(
                    "checkpoint.keep_recovery requires train.max_staleness: without it, rollouts may sample "
                    "any recovery checkpoint, so none could be pruned"
                )
            elif every is not None and keep * every <= staleness:
                problems.append(
                    f"checkpoint.keep_recovery x checkpoint.recovery_every ({keep} x {every} = {keep * every}) must "
                    f"exceed train.max_staleness ({staleness}), so rollouts never sample a pruned checkpoint"
                )
        raise_problems(type(self).__name__, problems, self)
        return self
