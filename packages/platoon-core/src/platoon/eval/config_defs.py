"""The evaluation config (`PlatoonEvalConfig`): the policy (a Tinker sampler or a hosted model), the
evaluation workflow, and the refusals of settings that do not apply to the chosen policy.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from platoon.config.environments import EnvironmentList
from platoon.config.tinker import LocalServerConfig, check_checkpoint_path, check_tinker_base_url
from platoon.config_defs import Bool, ConfigModel, Float, Int, RolloutConfig, raise_problems

__all__ = ["EvalWorkflowConfig", "HostedConfig", "InferenceConfig", "PlatoonEvalConfig", "PricingConfig"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HARNESS_ROLLOUT = "harness_rollout"


class PricingConfig(ConfigModel):
    """Prices of a hosted model in USD per million tokens, for the report's cost."""

    input: Float = Field(ge=0, description="USD per million input tokens")
    output: Float = Field(ge=0, description="USD per million output tokens")
    cached_input: Float | None = Field(
        None, ge=0, description="USD per million cached input tokens; None = input"
    )
    cache_write: Float | None = Field(
        None, ge=0, description="USD per million cache-write tokens; None = input"
    )


class HostedConfig(ConfigModel):
    """A model behind a server that speaks the harness's own dialect (evaluation and `platoon rollout` only)."""

    UNKNOWN_KEY_HINTS = {
        "kind": "a hosted server needs no kind: each harness request is forwarded in its own dialect "
        "(chat/completions, responses or messages) to base_url",
        "require_api_key": "set api_key_env to the variable holding the key, or null for a server without auth",
        "headers": "headers are not configurable: the key goes from api_key_env, and only openai-beta, "
        "anthropic-version and anthropic-beta are forwarded from the harness's request",
        "headers_env": "headers are not configurable: name the key's variable in api_key_env",
        "extra_body": "request bodies are forwarded as the harness sent them; set sampling in "
        "rollout_config.inference_params",
        "drop_params": "the gateway already drops what a server would refuse (see the hosted inference docs); "
        "nothing to configure",
    }

    base_url: str = Field(description="http(s) URL of the server, without credentials, query or fragment")
    api_key_env: str | None = Field(
        None, description="the environment variable holding the key; None = no auth"
    )
    timeout_s: Float = Field(600.0, gt=0, description="seconds per attempt")
    max_retries: Int = Field(6, ge=0, description="retries after a failed attempt")
    max_concurrent_requests: Int | None = Field(
        None,
        ge=1,
        description="requests at once, split across worker processes (at least one each); None = none",
    )
    pricing: PricingConfig | None = Field(None, description="prices for the report's cost; None = unpriced")

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http or https URL with a host")
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "base_url must not carry credentials: put the key in the variable api_key_env names"
            )
        if parts.query or parts.fragment:
            raise ValueError(f"{value!r} has a query or fragment; give the server's base URL only")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _variable(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not an environment variable name (the key itself does not go here)"
            )
        return value


class EvalWorkflowConfig(ConfigModel):
    """How an evaluation rolls out: rollouts per task, concurrency and the success threshold."""

    num_rollouts_per_task: Int = Field(1, ge=1, description="rollouts of each task")
    num_concurrent_workers: Int = Field(32, ge=1, description="rollouts at once")
    success_threshold: Float = Field(1.0, description="a rollout with at least this reward succeeds")
    fail_fast: Bool = Field(False, description="stop at the first failed rollout")
    count_timeout_as_failure: Bool = Field(False, description="count timed-out rollouts as failures")
    use_subprocesses: Bool = Field(
        False, description="run rollouts in slot processes, each reused for one rollout at a time"
    )
    subprocess_max_workers: Int | None = Field(
        None, ge=1, description="slot processes at most; None = num_concurrent_workers"
    )
    rollout_config: RolloutConfig = Field(default_factory=RolloutConfig, description="how each rollout runs")

    @property
    def slot_count(self) -> int:
        """The slot processes `use_subprocesses` may start: `subprocess_max_workers`, else one per concurrent
        rollout."""
        return self.subprocess_max_workers or self.num_concurrent_workers


#: Settings of a Tinker policy: refused with a hosted model, and without a renderer (no Tinker policy).
_TINKER_SETTINGS = (
    "renderer_name",
    "model_path",
    "renderer_kwargs",
    "sample_timeout_seconds",
    "context_window_length",
)


class InferenceConfig(ConfigModel):
    """The policy evaluated: a Tinker sampler (with a renderer) or a hosted model, and the evaluation workflow."""

    UNKNOWN_KEY_HINTS = {
        "backend": "the backend follows from the config: inference.hosted for a hosted model, else Tinker "
        "(with renderer_name)",
    }

    model_name: str = Field(min_length=1, description="the model evaluated")
    renderer_name: str | None = Field(None, description="a named renderer; None = no Tinker policy")
    model_path: str | None = Field(
        None,
        description="a `tinker://<run>/sampler_weights/<name>` checkpoint (skyrl-tx: `tinker://<run>/<name>`); None "
        "= the base model",
    )
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
    output_dir: str | None = Field(
        None, description="the evaluation's directory; None = a fresh one under runs"
    )
    workflow: EvalWorkflowConfig = Field(
        default_factory=EvalWorkflowConfig, description="the evaluation workflow"
    )
    resume: Bool = Field(True, description="keep the rollouts an earlier start of this output_dir finished")
    retry_errored: Bool = Field(True, description="roll out again the tasks whose rollouts errored")
    judges: Bool = Field(True, description="run judges and verifiers (copied into rollout_config.judges)")
    hosted: HostedConfig | None = Field(None, description="a hosted model instead of a Tinker policy")

    @field_validator("model_path")
    @classmethod
    def _checkpoint_path(cls, value: str | None) -> str | None:
        return check_checkpoint_path(value)

    def _set_tinker_settings(self) -> list[str]:
        return [key for key in _TINKER_SETTINGS if getattr(self, key) not in (None, {})]

    @model_validator(mode="after")
    def _rules(self) -> Self:
        problems: list[str] = []
        given = self._set_tinker_settings()
        if self.hosted is not None and given:
            problems.append(
                f"{', '.join(given)} do not apply to a hosted model (inference.hosted is set): its server renders "
                "and samples, and hosted.timeout_s bounds a call"
            )
        elif self.hosted is None and self.renderer_name is None and given:
            problems.append(
                f"{', '.join(given)} are Tinker policy settings, and without renderer_name no Tinker policy is "
                "served: set renderer_name (or inference.hosted for a hosted model)"
            )
        if not self.workflow.rollout_config.judges:
            problems.append(
                "workflow.rollout_config.judges: set inference.judges instead; the evaluation copies it into "
                "the rollout config"
            )
        hosted, workflow = self.hosted, self.workflow
        if (
            hosted is not None
            and hosted.max_concurrent_requests is not None
            and workflow.use_subprocesses
            and hosted.max_concurrent_requests < workflow.slot_count
        ):
            counted = (
                f"workflow.subprocess_max_workers {workflow.subprocess_max_workers}"
                if workflow.subprocess_max_workers is not None
                else f"workflow.num_concurrent_workers {workflow.num_concurrent_workers}, as "
                "subprocess_max_workers is not set"
            )
            problems.append(
                f"hosted.max_concurrent_requests ({hosted.max_concurrent_requests}) is split across the worker "
                f"processes and must be at least their number ({counted}): raise it, or set "
                "workflow.subprocess_max_workers lower"
            )
        raise_problems(type(self).__name__, problems, self)
        return self

    @property
    def has_policy(self) -> bool:
        """Whether a policy is served: a hosted model, or a Tinker sampler (a renderer)."""
        return self.hosted is not None or self.renderer_name is not None


class PlatoonEvalConfig(ConfigModel):
    """An evaluation config: `platoon eval` (and `platoon rollout`)."""

    UNKNOWN_KEY_HINTS = {
        "train": "an evaluation config has no train section: it evaluates inference.model_name; "
        "a training config (with train, and no inference) is run by platoon train",
        "eval": "an evaluation config's workflow is inference.workflow; eval is a training config's section",
    }

    inference: InferenceConfig = Field(description="the policy evaluated and the evaluation workflow")
    tinker_base_url: str | None = Field(
        None,
        description="the Tinker service; None = $TINKER_BASE_URL, else hosted Tinker; `local` = local server",
    )
    local_server: LocalServerConfig = Field(
        default_factory=LocalServerConfig, description="the local server `tinker_base_url: local` starts"
    )
    environments: EnvironmentList = Field(default_factory=list, description="the environment entries")
    split: str = Field(
        "eval", min_length=1, description="the split; other than `train`, entries' eval settings apply"
    )
    stage: Literal["full", "rollouts", "report"] = Field(
        "full", description="`rollouts` collects without a report; `report` only rebuilds the report"
    )

    @field_validator("tinker_base_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        return check_tinker_base_url(value)

    @model_validator(mode="after")
    def _rules(self) -> Self:
        if self.tinker_base_url is not None and self.inference.hosted is not None:
            raise_problems(
                type(self).__name__,
                [
                    "tinker_base_url does not apply to a hosted model (inference.hosted is set): its base_url is used"
                ],
                self,
            )
        # A report rebuild serves no policy and resolves no component, so it needs none.
        if self.stage == "report" or self.inference.has_policy:
            return self
        problems = []
        for i, entry in enumerate(self.environments):
            rollout = entry.rollout if self.split == "train" else entry.eval_rollout or entry.rollout
            if rollout is None and entry.harness is not None:
                rollout = HARNESS_ROLLOUT
            if rollout == HARNESS_ROLLOUT:
                problems.append(
                    f"environments.{i} rolls out with {HARNESS_ROLLOUT}, whose agents need a policy: set "
                    "inference.renderer_name (a Tinker policy) or inference.hosted"
                )
        raise_problems(type(self).__name__, problems, self)
        return self
