"""What a training config refuses from the config alone (exit 78): below `startup.checks` and `startup.training`,
which both report it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from platoon.config.training import MAX_ROLLOUTS_PER_STEP
from platoon.config_defs import yaml_scalar
from platoon.gateway.tinker_service import uses_local_server
from platoon.request_limits import gateway_limit_problems
from platoon.startup.tinker import (
    local_engine_problem,
    local_model_problem,
    loss_fn_problem,
    sampling_client_kind_problem,
)

if TYPE_CHECKING:
    from platoon.config.training import PlatoonTinkerRLTrainerConfig

__all__ = ["training_problems"]


def training_problems(config: PlatoonTinkerRLTrainerConfig) -> list[str]:
    """What a run refuses from the config alone, before the service opens (exit 78).

    Only what the config alone decides: no length of training, and judges turned off. (The keep_recovery rule is
    enforced when the config validates; a batch larger than the listed tasks needs the listing.)
    """
    problems: list[str] = gateway_limit_problems()
    train = config.train
    if train.num_epochs is None and train.max_training_steps is None:
        problems.append("train: set num_epochs or max_training_steps (at least one is required to train)")
    problems += _size_problems(config) + _service_problems(config)
    for section in ("train", "eval"):
        rollout = getattr(config, section).workflow_config.rollout_config
        # eval inherits train's rollout config: report the switch once, where it was made
        inherited = section == "eval" and not config.train.workflow_config.rollout_config.judges
        if not rollout.judges and not inherited:
            problems.append(
                f"{section}.workflow_config.rollout_config.judges: {yaml_scalar(rollout.judges)}: a training config "
                "may not turn judges off"
            )
    return problems


def _size_problems(config: PlatoonTinkerRLTrainerConfig) -> list[str]:
    """A step past what any run could hold: each size has its own bound in the schema, their product this one."""
    train = config.train
    rollouts = train.batch_size * train.workflow_config.group_size
    if rollouts <= MAX_ROLLOUTS_PER_STEP:
        return []
    return [
        f"train: batch_size {train.batch_size} x workflow_config.group_size {train.workflow_config.group_size}"
        f" = {rollouts} rollouts a step, more than {MAX_ROLLOUTS_PER_STEP}: lower one of them"
    ]


def _service_problems(config: PlatoonTinkerRLTrainerConfig) -> list[str]:
    """A loss function the service does not compute; on the local server, a model it cannot serve or an engine
    that cannot start; a sampling client the SDK cannot ask for."""
    local = uses_local_server(config.tinker_base_url)
    problems = [
        loss_fn_problem(config.train.loss_fn, local=local),
        sampling_client_kind_problem(config.train.sampling_client_kind),
    ]
    if local:
        problems.append(local_model_problem(config.train.model_name))
        problems.append(local_engine_problem(config.local_server.engine))
    return [problem for problem in problems if problem is not None]
