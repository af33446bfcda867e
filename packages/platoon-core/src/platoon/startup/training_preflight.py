"""What a training start settles before it holds the run dir, writing nothing: the refusals of
`startup.training`, the tasks listed and ordered, the resume point, the services and hold-outs, the eval split's
tasks; then a stale cached listing listed afresh, and what a resume of the run dir would refuse.

`platoon config validate` runs `preflight` and `resume_problems`, so it refuses what the start would.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.envs import listing_cache
from platoon.envs.resolve import LazyServices, entry_service_kwargs
from platoon.errors import ConfigError
from platoon.rollouts.records import check_identity
from platoon.startup.training import config_problems, machine_problems, run_dir_of
from platoon.train.tinker import task_order
from platoon.train.tinker.checkpoints import CheckpointLog
from platoon.train.tinker.evaluation import list_eval_tasks
from platoon.train.tinker.heartbeat import say
from platoon.train.tinker.task_order import ORDER_STATE_KEY, TaskOrder
from platoon.train.tinker.trainer import Preflight

if TYPE_CHECKING:
    from platoon.config.training import PlatoonTinkerRLTrainerConfig
    from platoon.train.tinker.checkpoints import ResumePoint
    from platoon.train.tinker.task_order import Pool

__all__ = ["finished", "preflight", "relist_if_stale", "resume_problems"]


def _task_order(
    config: PlatoonTinkerRLTrainerConfig, pools: Sequence[Pool], resume: ResumePoint | None
) -> TaskOrder:
    """The task order, positioned at the resume point's batch (from the row's saved order state when it has one)."""
    kwargs: dict[str, Any] = {
        "seed": pools[0].seed,
        "batch_size": config.train.batch_size,
        "mode": config.train.task_order,
    }
    try:
        state = resume.row.extra.get(ORDER_STATE_KEY) if resume is not None else None
        if isinstance(state, Mapping):
            order = TaskOrder.restore(pools, state, **kwargs)
        else:
            order = TaskOrder(pools, **kwargs)
    except ValueError as exc:  # a batch larger than the training set
        raise ConfigError(f"train.batch_size: {exc}") from None
    if resume is not None:
        # Batch contents depend only on the batch number: the resumed run draws what the uninterrupted one would.
        order.seek(resume.start_batch)
    return order


async def _held_out(
    config: PlatoonTinkerRLTrainerConfig, services: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """label -> the service's split record, for the entries whose `service_kwargs` hold tasks out."""
    held: dict[str, dict[str, Any]] = {}
    for label in services:  # the labels only: a service is built only when its entry holds tasks out
        entry = _entry_of(config, label)
        if entry is None or entry.service_kwargs.get("holdout") is None:
            continue
        service = services[label]
        ask = getattr(service, "split_record", None)
        if ask is None:
            raise ConfigError(
                f"environments[{label}]: service_kwargs.holdout is set but the service {entry.service} keeps no "
                "split record (split_record()), so a resume could not check its hold-out"
            )
        record = ask()
        if inspect.isawaitable(record):
            record = await record
        held[label] = dict(record or {})
    return held


def _entry_of(config: PlatoonTinkerRLTrainerConfig, label: str) -> Any:
    entries = list(config.environments)
    if len(entries) == 1:
        return entries[0]
    return next((entry for entry in entries if entry.name == label), None)


async def preflight(config: PlatoonTinkerRLTrainerConfig, *, base_dir: Path) -> Preflight:
    """A start's checks before it holds the run dir, writing nothing: `platoon.startup.training`'s, then (unless the
    config itself is wrong) the tasks listed and what the listing lets a start refuse (a batch larger than the
    tasks, a `label_by` column without values, a hold-out no service records), then the eval split's tasks when the
    run evaluates (an unknown split is refused). Raises ConfigError with every problem."""
    refused_config = config_problems(config)
    problems = refused_config + machine_problems(config)
    pools: list[Pool] = []
    if not refused_config:
        # Listed even when a key is missing, so one look reports every problem a start would meet.
        try:
            pools = await task_order.list_training_tasks(config, base_dir=base_dir)
        except ConfigError as exc:
            problems += exc.problems
        else:
            problems += task_order.training_problems_after_listing(config, pools)
    if problems:
        raise ConfigError(problems)
    run_dir = run_dir_of(config)
    resume = CheckpointLog(run_dir).resume_point(config.train.num_minibatches)
    order = _task_order(config, pools, resume)
    # One service per entry, built the way the listing built it, on first use: a start with nothing to train and
    # a listing answered from the cache never import an environment's SDK. Rollout workers get the same kwargs.
    service_kwargs = {
        pool.label: entry_service_kwargs(config.environments[pool.entry], base_dir) for pool in pools
    }
    services = LazyServices(
        {
            pool.label: (
                config.environments[pool.entry].service,
                service_kwargs[pool.label],
                f"environments.{pool.entry}.service",
            )
            for pool in pools
        }
    )
    held_out = await _held_out(config, services)
    eval_tasks: list[tuple[str, Any]] | None = None
    if (config.eval.every or 0) >= 1:
        # An eval split that is misspelt or missing stops the start here, before any service starts, and
        # `platoon config validate` says so too.
        eval_tasks = await list_eval_tasks(config, base_dir=base_dir, services=services)
    return Preflight(run_dir, pools, resume, order, service_kwargs, services, held_out, eval_tasks)


async def relist_if_stale(
    config: PlatoonTinkerRLTrainerConfig, checked: Preflight, *, base_dir: Path
) -> Preflight:
    """`checked`, or a fresh preflight when a listing answered from the task listing cache no longer matches its
    service (the stale entry removed first, so the tasks are listed through the service). Only a start that will
    train checks: it builds the services anyway, while one with nothing to train never imports an SDK."""
    cached = [pool for pool in checked.pools if pool.cached is not None]
    if not cached or finished(config, checked):
        return checked
    stale: list[str] = []
    for pool in cached:
        reason = await task_order.stale_listing(pool, checked.services[pool.label])
        if reason is not None:
            assert pool.cached is not None
            listing_cache.remove(pool.cached)
            stale.append(pool.label)
            say(
                f"environments[{pool.label}]: the task listing cached in {listing_cache.cache_dir()} is stale "
                f"({reason}): listing the tasks afresh"
            )
    if not stale:
        return checked
    relisted = await preflight(config, base_dir=base_dir)
    if any(pool.cached is not None for pool in relisted.pools if pool.label in stale):
        raise ConfigError(
            f"the task listing cache {listing_cache.cache_dir()} holds a stale listing it cannot drop: delete that "
            f"directory, or set {listing_cache.DISABLE_VARIABLE}=0"
        )
    return relisted


def finished(config: PlatoonTinkerRLTrainerConfig, checked: Preflight) -> bool:
    """Whether the run already reached its last step (`Preflight.finished`: a start that says "nothing to train")."""
    return checked.finished(config)


def resume_problems(config: PlatoonTinkerRLTrainerConfig, checked: Preflight) -> list[str]:
    """What a resume of `checked.run_dir` would refuse (a changed model, renderer or hold-out), writing nothing.

    A start checks this once it holds the run dir (and records the refusal in lock.json); `config validate` asks
    here, so it refuses what the start would.
    """
    if checked.resume is None:
        return []
    training = {pool.label: list(pool.task_ids) for pool in checked.pools}
    return check_identity(
        checked.run_dir,
        config.train.model_name,
        config.train.renderer_name,
        checked.held_out,
        training=training,
    )
