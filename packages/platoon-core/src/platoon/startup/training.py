"""What `platoon train` refuses before it lists tasks (exit 78), one line each, and `config validate` reports: the
config's rules beyond its schema, every component it names resolving, a writable run directory, and what the
machine must give the run (the Tinker and W&B keys, a sample timeout, a run directory no live run holds).
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from platoon.errors import ConfigError
from platoon.extras import installed
from platoon.gateway.core import sample_timeout_with_source
from platoon.gateway.tinker_service import check_tinker_key
from platoon.rollouts import records
from platoon.startup.checks import component_problems, output_problems
from platoon.startup.training_rules import training_problems  # below startup.checks, which reports it too

if TYPE_CHECKING:
    from platoon.config.training import PlatoonTinkerRLTrainerConfig

__all__ = [
    "batch_problems",
    "config_problems",
    "machine_problems",
    "run_dir_of",
    "start_problems",
    "training_problems",
    "wandb_key_problem",
]


def run_dir_of(config: PlatoonTinkerRLTrainerConfig) -> Path:
    """`log_path/<experiment_name>/<trial_name>`, absolute (log_path is relative to the working directory)."""
    return Path(os.path.abspath(config.log_path)) / config.stats.experiment_name / config.stats.trial_name


def start_problems(config: PlatoonTinkerRLTrainerConfig) -> list[str]:
    """Every refusal `platoon train` makes before it lists tasks, one line each (`config validate` reports them)."""
    return config_problems(config) + machine_problems(config)


def config_problems(config: PlatoonTinkerRLTrainerConfig) -> list[str]:
    """The config's rules and batch split, every component it names resolving, a writable place for the run:
    problems under which listing the tasks means nothing."""
    # Every component the config names resolves before anything is written or started.
    problems = training_problems(config) + batch_problems(config) + component_problems(config)
    return problems + output_problems(config, kind="train")  # a file or read-only mount at log_path: one line


def machine_problems(config: PlatoonTinkerRLTrainerConfig) -> list[str]:
    """What the machine must give the run: the Tinker key, the W&B key of an online run, a valid sample timeout,
    and no live run holding the run directory."""
    problems: list[str] = []
    try:
        check_tinker_key(config.tinker_base_url)
    except ConfigError as exc:
        problems += exc.problems
    if (problem := wandb_key_problem(config)) is not None:
        problems.append(problem)
    try:
        sample_timeout_with_source(config.train.sample_timeout_seconds, "train.sample_timeout_seconds")
    except ValueError as exc:
        problems.append(str(exc))
    try:
        records.check_run_dir_free(run_dir_of(config))
    except ConfigError as exc:
        problems += exc.problems
    return problems


def batch_problems(config: PlatoonTinkerRLTrainerConfig) -> list[str]:
    """A batch the minibatches, or a minibatch the microbatches, do not divide."""
    train_cfg = config.train
    size, minis, micros = train_cfg.batch_size, train_cfg.num_minibatches, train_cfg.num_microbatches
    if size % minis:
        return [f"train.num_minibatches: {minis} does not divide train.batch_size {size}"]
    if (size // minis) % micros:
        return [
            f"train.num_microbatches: {micros} does not divide the {size // minis} tasks of a minibatch "
            f"(train.batch_size {size} / train.num_minibatches {minis})"
        ]
    return []


def wandb_key_problem(
    config: PlatoonTinkerRLTrainerConfig, env: Mapping[str, str] | None = None
) -> str | None:
    """Why an `online` W&B run could not start (no key anywhere W&B looks), as one line; None when it can, or when
    W&B is off, offline or not installed. Checked before anything is written (a run would die in wandb.init)."""
    settings = config.stats.wandb
    environ = os.environ if env is None else env
    if settings.mode != "online" or not installed("wandb"):
        return None
    if settings.api_key or environ.get("WANDB_API_KEY"):
        return None
    host = urlsplit(settings.base_url or environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        if host and netrc.netrc().authenticators(host):
            return None  # `wandb login` wrote it
    except (OSError, netrc.NetrcParseError):
        pass
    return (
        "stats.wandb.mode is online but no W&B key is set: set WANDB_API_KEY (or stats.wandb.api_key, or run wandb "
        "login), or set stats.wandb.mode to offline or disabled"
    )
