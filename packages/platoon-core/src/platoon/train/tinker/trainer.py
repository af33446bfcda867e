"""The Tinker training loop behind `platoon train` (train.md 2): groups of in-process rollouts per task, credit from
`advantages.group_advantages`, prefix-merged datums from `datums.group_datums`, per-microbatch depth weighting, the
zero-advantage filter and normalization, `forward_backward` + `optim_step` per minibatch, a fresh sampler every
step, checkpoints (with `keep_recovery` pruning) and per-step metrics in the run directory; a start resumes from the
newest resumable row of `checkpoints.jsonl` (train.md 2.13).

On-policy (no prefetch, no staleness) and in-process rollouts only. Heavy imports (tinker, the renderers) happen
inside functions.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.errors import ConfigError

if TYPE_CHECKING:
    import tinker

    from platoon.config.loader import LoadedConfig
    from platoon.gateway.records import Interaction
    from platoon.train.tinker.advantages import GroupResult
    from platoon.train.tinker.checkpoints import CheckpointLog, ResumePoint
    from platoon.train.tinker.config_defs import PlatoonTinkerRLTrainerConfig
    from platoon.train.tinker.task_order import Pool, TaskOrder
    from platoon.trajectory import TrajectoryCollection

__all__ = ["run_dir_of", "train"]

log = logging.getLogger("platoon.train")

#: the row field of `checkpoints.jsonl` holding the task order's position (TaskOrder.state)
ORDER_STATE_KEY = "task_order"
#: outcome statuses always logged (zeros included) under train/batch/outcome/
_STATUSES = ("scored", "failed", "error", "interrupted", "timeout", "cancelled")
#: HTTP answers meaning the service has no delete route: pruning stops for this start
_NO_DELETE = (405, 501)
_DELETE_TIMEOUT_SECONDS = 330.0
_MAX_DELETE_FAILURES = 3


def say(message: str) -> None:
    """One progress line on stderr, prefixed like every diagnostic."""
    print(f"platoon: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# One rollout, one group


@dataclass
class Member:
    """One rollout of a group: its converted result (None when it failed) and the exact tokens of its calls."""

    collection: TrajectoryCollection | None
    interactions: Mapping[str, Interaction] | None
    status: str
    seconds: float = 0.0
    #: the policy version its samples came from (the datums' checkpoint_version)
    version: int = 0


def _status(collection: TrajectoryCollection | None) -> str:
    root = collection.root if collection is not None else None
    if root is None:
        return "error"
    outcome = root.misc.get("outcome")
    return str(outcome.get("status", "error")) if isinstance(outcome, Mapping) else "error"


@dataclass
class GroupOutput:
    """A group's credit, its datums and their metrics (summed over the batch's groups)."""

    result: GroupResult
    datums: list[tinker.Datum]
    metrics: dict[str, float] = field(default_factory=dict)


def build_group(
    members: Sequence[Member], config: PlatoonTinkerRLTrainerConfig, *, reward_processor: str | None
) -> GroupOutput:
    """Credit (train.md 2.6 step 5, 2.8) and datums (2.7, 2.9) of one group, as the workflow config says."""
    from platoon.train.tinker.advantages import group_advantages
    from platoon.train.tinker.datums import group_datums

    workflow = config.train.workflow_config
    result = group_advantages(
        [m.collection for m in members],
        leave_one_out=workflow.leave_one_out_baseline,
        depth_level_weighting=workflow.depth_level_weighting,
        depth_level_discount_gamma=workflow.depth_level_discount_gamma,
        reward_processor=reward_processor,
        min_successful_group_size=workflow.min_successful_group_size,
    )
    batch = group_datums(
        result,
        [m.interactions for m in members],
        checkpoint_version=[m.version for m in members],
        filter_errors=workflow.filter_errors,
        filter_message_actions=workflow.filter_message_actions,
        subagent_datum_keep_probability=workflow.subagent_datum_keep_probability,
        subagent_datum_sampling_seed=workflow.subagent_datum_sampling_seed,
    )
    if result.rejection is not None:
        log.info("a group trains nothing: %s", result.rejection)
    return GroupOutput(result, batch.datums, batch.metrics)


def _merge_group_metrics(outputs: Sequence[GroupOutput]) -> dict[str, float]:
    """Counters summed over the groups; `credit/...` (per-group means and spreads) averaged over the groups."""
    sums: dict[str, float] = {}
    averaged: dict[str, list[float]] = {}
    for output in outputs:
        for key, value in output.metrics.items():
            if key.startswith("credit/"):
                averaged.setdefault(key, []).append(value)
            else:
                sums[key] = sums.get(key, 0.0) + value
    return {**sums, **{key: statistics.fmean(values) for key, values in averaged.items()}}


# ---------------------------------------------------------------------------------------------------------------
# Per microbatch (train.md 2.11)


def _data(datum: tinker.Datum, key: str) -> list[float]:
    tensor = datum.loss_fn_inputs.get(key)
    return [] if tensor is None else [float(x) for x in tensor.data]


def _action_tokens(datums: Sequence[tinker.Datum]) -> int:
    return int(sum(sum(1 for m in _data(d, "mask") if m > 0) for d in datums))


@dataclass
class Microbatch:
    """One microbatch ready to send: `sent` (the loss inputs) and `kept` (the same datums with their masks)."""

    kept: list[tinker.Datum]
    sent: list[tinker.Datum]


def prepare_microbatch(
    datums: Sequence[tinker.Datum], config: PlatoonTinkerRLTrainerConfig, metrics: dict[str, float]
) -> Microbatch | None:
    """Depth weighting, the zero-advantage filter, the zero-objective skip, then private keys stripped and
    advantages normalized (train.md 2.11 steps 1-6); None when nothing is sent. Adds the transforms' metrics."""
    from platoon.train.tinker.advantages import apply_depth_weighting
    from platoon.train.tinker.datums import filter_zero_advantage_datums, loss_datums, zero_objective

    train_cfg = config.train
    workflow = train_cfg.workflow_config
    if not datums:
        metrics["empty_microbatches"] = metrics.get("empty_microbatches", 0.0) + 1.0
        return None
    weighted, depth_metrics = apply_depth_weighting(
        datums,
        depth_level_weighting=workflow.depth_level_weighting,
        depth_level_discount_gamma=workflow.depth_level_discount_gamma,
    )
    for key, value in depth_metrics.items():
        metrics[key] = value  # per microbatch; the last one wins (one microbatch by default)
    kept, filter_metrics = filter_zero_advantage_datums(
        weighted,
        enabled=workflow.filter_zero_advantage_datums,
        loss_fn=train_cfg.loss_fn,
        loss_fn_config=train_cfg.loss_fn_config,
    )
    for key, value in filter_metrics.items():
        metrics[key] = metrics.get(key, 0.0) + value
    all_zero = all(
        a == 0.0 for d in kept for a, m in zip(_data(d, "advantages"), _data(d, "mask"), strict=True) if m > 0
    )
    if not kept or (zero_objective(train_cfg.loss_fn, train_cfg.loss_fn_config) and all_zero):
        return None  # under a zero-objective loss an all-zero microbatch is never sent (step 4)
    return Microbatch(kept=kept, sent=loss_datums(kept))


def optim_metrics(datums: Sequence[tinker.Datum], outputs: Sequence[Any], config: Any) -> dict[str, float]:
    """KL, entropy, importance-weight and clip metrics on action tokens from the returned training logprobs
    against the sampling logprobs (train.md 2.11); `datums` still carry their masks."""
    diffs: list[float] = []
    train_lps: list[float] = []
    for datum, output in zip(datums, outputs, strict=False):
        trained = output["logprobs"]
        values = list(getattr(trained, "data", trained))
        for sampled, lp, m in zip(_data(datum, "logprobs"), values, _data(datum, "mask"), strict=False):
            if m > 0:
                diffs.append(sampled - float(lp))
                train_lps.append(float(lp))
    if not diffs:
        return {}
    weights = [math.exp(-d) for d in diffs]  # exp(train - sample)
    out = {
        "optim/kl_sample_train_v1": statistics.fmean(diffs),
        "optim/kl_sample_train_v2": 0.5 * statistics.fmean(d * d for d in diffs),
        "optim/entropy": -statistics.fmean(train_lps),
        "optim/importance_weight_mean": statistics.fmean(weights),
        "optim/importance_weight_std": statistics.pstdev(weights),
        "optim/importance_weight_min": min(weights),
        "optim/importance_weight_max": max(weights),
    }
    if config.loss_fn in ("cispo", "ppo"):
        low = float(config.loss_fn_config.get("clip_low_threshold", 0.0))
        high = float(config.loss_fn_config.get("clip_high_threshold", 5.0))
        below = sum(1 for w in weights if w < low)
        above = sum(1 for w in weights if w > high)
        out["optim/clip_frac_low"] = below / len(weights)
        out["optim/clip_frac_high"] = above / len(weights)
        out["optim/clip_frac_total"] = (below + above) / len(weights)
    return out


def split_batch(groups: Sequence[Any], minibatches: int, microbatches: int) -> list[list[list[Any]]]:
    """Consumed groups split into M minibatches of m microbatches each, in order (train.md 2.5)."""
    per_mini = len(groups) // minibatches
    per_micro = per_mini // microbatches
    return [
        [
            list(groups[i * per_mini + j * per_micro : i * per_mini + (j + 1) * per_micro])
            for j in range(microbatches)
        ]
        for i in range(minibatches)
    ]


# ---------------------------------------------------------------------------------------------------------------
# The Tinker session


async def _call[T](what: str, base_url: str | None, make: Callable[[], Awaitable[T]]) -> T:
    from platoon.train.tinker.credentials import refused_key_error

    try:
        return await make()
    except Exception as exc:
        refused = refused_key_error(exc, base_url=base_url, what=what)
        if refused is not None:
            raise refused from None
        raise


def _http_status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


class Pruner:
    """`checkpoint.keep_recovery` pruning (train.md 2.12): after each recovery save, delete older recovery
    checkpoints through the REST delete call; the protected ones (permanent, the resume point, the newest
    `keep_recovery`, those rollouts may still sample) are never planned for deletion by `CheckpointLog.plan`."""

    def __init__(
        self, log_: CheckpointLog, keep: int | None, max_staleness: int | None, rest: Callable[[], Any]
    ) -> None:
        self.log = log_
        self.keep = keep
        self.max_staleness = max_staleness
        self._rest_factory = rest
        self._rest: Any = None
        self.active = keep is not None
        self.deleted = 0
        self.failures = 0
        self._consecutive = 0
        self._deleted_something = False
        self.recovery_kept = 0.0

    async def prune(self, current_version: int) -> None:
        if not self.active or self.keep is None:
            return
        plan = self.log.plan(
            self.keep,
            sampling_versions_in_use=[current_version],  # on-policy: rollouts sample only the current policy
            current_version=current_version,
            max_staleness=self.max_staleness,
        )
        self.recovery_kept = float(plan.recovery_kept)
        if plan.delete and self._rest is None:
            self._rest = self._rest_factory()
        for deletion in plan.delete:
            for path in deletion.paths:
                if not self.active:
                    return
                await self._delete(path, deletion.name, deletion.policy_version)

    async def _delete(self, path: str, name: str, version: int | None) -> None:
        delete = getattr(self._rest, "delete_checkpoint_from_tinker_path_async", None)
        if delete is None:
            self._stop("the Tinker client has no delete-checkpoint call")
            return
        try:
            await asyncio.wait_for(delete(path), _DELETE_TIMEOUT_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            status = _http_status(exc)
            if status in _NO_DELETE:
                self._stop(f"the service does not delete checkpoints (HTTP {status})")
                return
            # A 404 means "already gone" only once this service has shown it deletes at all.
            if status == 404 and self._deleted_something:
                self.log.record_deleted(path, name=name, policy_version=version, result="absent")
                self._consecutive = 0
                return
            self.failures += 1
            self._consecutive += 1
            log.warning("deleting checkpoint %s failed: %s: %s", path, type(exc).__name__, exc)
            if self._consecutive >= _MAX_DELETE_FAILURES:
                self._stop(f"{_MAX_DELETE_FAILURES} deletions failed in a row")
            return
        self.log.record_deleted(path, name=name, policy_version=version, result="deleted")
        self.deleted += 1
        self._deleted_something = True
        self._consecutive = 0

    def _stop(self, why: str) -> None:
        log.warning("checkpoint pruning stops for this start: %s", why)
        self.active = False

    def metrics(self) -> dict[str, float]:
        if self.keep is None:
            return {}
        return {
            "checkpoint/deleted": float(self.deleted),
            "checkpoint/delete_failures": float(self.failures),
            "checkpoint/pruning": 1.0 if self.active else 0.0,
            "checkpoint/recovery_kept": self.recovery_kept,
        }


# ---------------------------------------------------------------------------------------------------------------
# The loop


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _family(metrics: dict[str, float], prefix: str, values: Sequence[float]) -> None:
    metrics[f"{prefix}/count"] = float(len(values))
    if values:
        metrics[f"{prefix}/avg"] = statistics.fmean(values)
        metrics[f"{prefix}/min"] = min(values)
        metrics[f"{prefix}/max"] = max(values)


def _label_prefix(label: str) -> str:
    return "environment/" + label.replace("/", "--")


def total_steps(config: PlatoonTinkerRLTrainerConfig, n_tasks: int) -> tuple[int, int]:
    """(steps to run, batches per epoch): `max_training_steps`, else (or if fewer) `num_epochs` whole passes."""
    train = config.train
    per_epoch = max(1, n_tasks // train.batch_size)
    limits = []
    if train.max_training_steps is not None:
        limits.append(train.max_training_steps)
    if train.num_epochs is not None:
        limits.append(train.num_epochs * per_epoch)
    return min(limits), per_epoch


def run_dir_of(config: PlatoonTinkerRLTrainerConfig) -> Path:
    """`log_path/<experiment_name>/<trial_name>`, absolute (log_path is relative to the working directory)."""
    return Path(os.path.abspath(config.log_path)) / config.stats.experiment_name / config.stats.trial_name


def _write_records(run_dir: Path, config: PlatoonTinkerRLTrainerConfig, loaded: LoadedConfig | None) -> None:
    """`config.resolved.yaml` and `lock.json` (core.md 9.2, 9.3); a config built in Python gets its dump."""
    from platoon.train.tinker import records

    if loaded is not None:
        records.write_resolved_config(run_dir, loaded)
        records.write_lock(run_dir, loaded, [])
        return
    import yaml

    data = {**config.model_dump(mode="json", exclude_defaults=True), "log_path": str(run_dir.parents[1])}
    text = "# Written by platoon: the config this run trains from (built in Python)\n"
    (run_dir / records.RESOLVED_CONFIG_FILE).write_text(text + yaml.safe_dump(data, sort_keys=False))


def _batch_problems(config: PlatoonTinkerRLTrainerConfig) -> list[str]:
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


def _task_order(
    config: PlatoonTinkerRLTrainerConfig, pools: Sequence[Pool], resume: ResumePoint | None
) -> TaskOrder:
    """The task order, positioned at the resume point's batch (from the row's saved order state when it has one)."""
    from platoon.train.tinker.task_order import TaskOrder

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


def _settle_identity(
    run_dir: Path, config: PlatoonTinkerRLTrainerConfig, pools: Sequence[Pool], resuming: bool
) -> None:
    """Write identity.json on a fresh start; on a resume refuse (78) a changed model or renderer, one line each."""
    from platoon.train.tinker.records import settle_identity

    training = {pool.label: list(pool.task_ids) for pool in pools}
    try:
        settle_identity(
            run_dir, config.train.model_name, config.train.renderer_name, resuming=resuming, training=training
        )
    except ConfigError as exc:
        # settle_identity recorded lock.json.resume_refused; the user gets each problem on its own line.
        raise ConfigError(exc.problems) from None


async def train(config: PlatoonTinkerRLTrainerConfig, *, loaded: LoadedConfig | None = None) -> int:
    """Train `config` to the end (train.md 2); returns the exit status. User errors raise ConfigError (78).

    A run dir whose `checkpoints.jsonl` has a resumable row resumes from it: its identity is checked (a changed
    model or renderer is refused before any service opens), then training goes on at the next step.
    """
    from platoon.config.checks import component_problems
    from platoon.train.tinker import records
    from platoon.train.tinker.checkpoints import CheckpointLog
    from platoon.train.tinker.config_defs import training_problems
    from platoon.train.tinker.credentials import check_tinker_key, uses_local_server
    from platoon.train.tinker.task_order import list_training_tasks

    # Every component the config names resolves before anything is written or started (core.md 3.3, step 8).
    problems = training_problems(config) + _batch_problems(config) + component_problems(config)
    if problems:
        raise ConfigError(problems)
    api_key = check_tinker_key(config.tinker_base_url)
    run_dir = run_dir_of(config)
    records.check_run_dir_free(run_dir)
    base_dir = loaded.path.parent if loaded is not None else Path.cwd()
    pools = await list_training_tasks(config, base_dir=base_dir)
    resume = CheckpointLog(run_dir).resume_point(config.train.num_minibatches)
    order = _task_order(config, pools, resume)
    from platoon.train.tinker.supervisor import hold_for_trainer

    # Under `watchdog.max_restarts` the supervisor holds the run dir; this start records itself beneath it.
    supervised = hold_for_trainer(run_dir)
    if not supervised:
        records.hold_run_dir(run_dir)
    stop_server: Callable[[], None] | None = None
    base_url = config.tinker_base_url or os.environ.get("TINKER_BASE_URL") or None
    try:
        # Identity first: a refused resume leaves the run's records as they were (but for resume_refused).
        _settle_identity(run_dir, config, pools, resuming=resume is not None)
        _write_records(run_dir, config, loaded)
        end_batch, _ = total_steps(config, order.total_tasks)
        if resume is not None and resume.start_batch >= end_batch:
            say(f"nothing to train: {run_dir} already reached step {resume.start_batch} of {end_batch}")
            return 0
        if uses_local_server(config.tinker_base_url):
            from platoon.testing.local_server.process import start_local_server_process

            say(f"starting the local Tinker-compatible server for {config.train.model_name}")
            base_url, stop_server = await asyncio.to_thread(
                start_local_server_process, model=config.train.model_name
            )
        return await _train(config, order, run_dir=run_dir, base_url=base_url, api_key=api_key, resume=resume)
    finally:
        if stop_server is not None:
            await asyncio.to_thread(stop_server)
        if not supervised:
            (run_dir / records.PROCESS_FILE).unlink(missing_ok=True)


async def _training_client(
    service: Any, config: PlatoonTinkerRLTrainerConfig, resume: ResumePoint | None, base_url: str | None
) -> Any:
    """Resume: from the state with its optimizer; else `checkpoint.load_checkpoint_path` (weights only, a fresh
    optimizer); else a new LoRA client (train.md 2.13)."""
    train_cfg = config.train
    if resume is not None:
        path = resume.row.state_path
        assert path is not None  # a resume point is a row with a state_path
        say(f"resuming at step {resume.start_batch + 1} from {resume.row.name} ({path})")
        return await _call(
            "a training client",
            base_url,
            lambda: service.create_training_client_from_state_with_optimizer_async(path),
        )
    load = config.checkpoint.load_checkpoint_path
    if load is not None:
        return await _call(
            "a training client", base_url, lambda: service.create_training_client_from_state_async(load)
        )
    return await _call(
        "a training client",
        base_url,
        lambda: service.create_lora_training_client_async(
            base_model=train_cfg.model_name, rank=train_cfg.lora_rank
        ),
    )


async def _train(
    config: PlatoonTinkerRLTrainerConfig,
    order: TaskOrder,
    *,
    run_dir: Path,
    base_url: str | None,
    api_key: str,
    resume: ResumePoint | None,
) -> int:
    import tinker

    from platoon.episode.rollout import Route, recorded_rollout
    from platoon.gateway.core import ModelGateway
    from platoon.testing.episode import resolve_service
    from platoon.train.tinker.checkpoints import CheckpointLog, checkpoint_due, checkpoint_name
    from platoon.train.tinker.evaluation import eval_due, evaluate, evaluated_steps, list_eval_tasks
    from platoon.train.tinker.records import append_jsonl
    from platoon.train.tinker.renderers import get_renderer, get_tokenizer
    from platoon.train.tinker.supervisor import stop_requested
    from platoon.train.tinker.task_order import split_task_id

    train_cfg = config.train
    workflow = train_cfg.workflow_config
    if workflow.rollout_isolation != "inprocess":
        raise ConfigError(
            "train.workflow_config.rollout_isolation: process: this build runs rollouts in process only; "
            "use inprocess"
        )
    group_size = workflow.group_size
    concurrency = train_cfg.max_concurrent_rollouts or train_cfg.batch_size * group_size
    end_batch, per_epoch = total_steps(config, order.total_tasks)
    start_batch = resume.start_batch if resume is not None else 0
    # One service per entry, built the way the listing built it; each pool knows its entry's index.
    entries = {pool.label: config.environments[pool.entry] for pool in order.pools}
    services = {
        label: resolve_service(entry.service, entry.service_kwargs) for label, entry in entries.items()
    }
    mixture = len(order.pools) > 1

    tokenizer = await asyncio.to_thread(get_tokenizer, train_cfg.model_name)
    renderer = get_renderer(train_cfg.renderer_name, tokenizer, renderer_kwargs=train_cfg.renderer_kwargs)

    def _open_service() -> Any:
        kwargs: dict[str, Any] = {"api_key": api_key}
        if base_url is not None:
            kwargs["base_url"] = base_url
        return tinker.ServiceClient(**kwargs)

    service = await _call("a session", base_url, lambda: asyncio.to_thread(_open_service))
    client = await _training_client(service, config, resume, base_url)
    checkpoints = CheckpointLog(run_dir)
    version = resume.policy_version if resume is not None else 0
    optimizer_steps = resume.optimizer_steps if resume is not None else 0
    pruner = Pruner(
        checkpoints, config.checkpoint.keep_recovery, train_cfg.max_staleness, service.create_rest_client
    )

    async def save(kind: str, batch: int) -> Any:
        """A full checkpoint (state, then sampler weights, then its row with the task order's position);
        returns a sampler of the weights. Recovery saves (the launch one too) are followed by pruning."""
        name = checkpoint_name(kind, batch)
        state = await (await client.save_state_async(name)).result_async()
        weights = await (await client.save_weights_for_sampler_async(name)).result_async()
        checkpoints.record(
            name,
            kind=kind,
            batch=batch,
            state_path=state.path,
            sampler_path=weights.path,
            policy_version=version,
            optimizer_steps=optimizer_steps,
            task_order=order.state(),  # ORDER_STATE_KEY
        )
        sampler = await client.create_sampling_client_async(weights.path)
        if kind in ("recovery", "launch"):
            await pruner.prune(version)
        return sampler

    # Launch checkpoint: the first sampler is the saved starting (or resumed) weights (train.md 2.12).
    sampler = await save("launch", start_batch)
    gateway = ModelGateway(
        sampler,
        renderer,
        model_name=train_cfg.model_name,
        context_window_length=train_cfg.context_window_length,
        sample_timeout_seconds=train_cfg.sample_timeout_seconds,
    )
    semaphore = asyncio.Semaphore(concurrency)
    tasks_cache: dict[tuple[str | None, str], Any] = {}
    metrics_path = run_dir / "metrics.jsonl"
    adam = train_cfg.optimizer
    started = time.monotonic()
    say(f"training {train_cfg.model_name} for steps {start_batch + 1}..{end_batch} in {run_dir}")

    # Evaluation during training (train.md 2.15): `eval.every` steps, `eval.at_start` at step 0, and never a step
    # that an earlier start already evaluated.
    eval_config = config.eval
    eval_every = eval_config.every or 0  # no eval section: never
    eval_done = evaluated_steps(run_dir)
    eval_tasks = await list_eval_tasks(config, base_dir=run_dir, services=services) if eval_every >= 1 else []

    async def maybe_evaluate(step_number: int) -> dict[str, float]:
        if not eval_tasks or not eval_due(
            step_number, every=eval_every, at_start=eval_config.at_start, done=eval_done
        ):
            return {}
        eval_done.add(step_number)
        return await evaluate(
            config,
            step=step_number,
            sampler=gateway.sampler,
            renderer=renderer,
            run_dir=run_dir,
            tasks=eval_tasks,
            services=services,
        )

    if at_start := await maybe_evaluate(start_batch):
        append_jsonl(metrics_path, {"step": start_batch, **at_start})

    def pool_of(task_id: str) -> str:
        # A mixture's ids name their entry; the batch's labels may be `label_by` values instead.
        return (split_task_id(task_id)[0] or "") if mixture else order.pools[0].label

    async def rollout(label: str, task_id: str) -> Member:
        entry, service_ = entries[label], services[label]
        raw_id = split_task_id(task_id)[1] if mixture else task_id
        key = (label, raw_id)
        if key not in tasks_cache:
            tasks_cache[key] = await service_.get_task(raw_id)
        task = tasks_cache[key]
        route = Route.from_entry(entry, task_id=raw_id)
        rollout_config = workflow.rollout_config.model_copy(
            update={"model_name": train_cfg.model_name, "return_dict": True, "train": True}
        )
        async with semaphore:
            t0, sampled_at = time.monotonic(), version
            try:
                collection, recorder = await recorded_rollout(
                    task, service=service_, route=route, config=rollout_config, gateway=gateway
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one failed rollout is counted, not fatal (train.md 2.4)
                log.warning("rollout of %s failed: %s: %s", task_id, type(exc).__name__, exc)
                return Member(None, None, "failed", time.monotonic() - t0, sampled_at)
            seconds = time.monotonic() - t0
            return Member(collection, recorder.interactions, _status(collection), seconds, sampled_at)

    async def group(label: str, task_id: str) -> GroupOutput:
        members = await asyncio.gather(*(rollout(label, task_id) for _ in range(group_size)))
        return build_group(members, config, reward_processor=entries[label].reward_processor)

    for step in range(start_batch, end_batch):
        t_step = time.monotonic()
        batch = order.next_batch()
        groups: list[GroupOutput] = list(
            await asyncio.gather(*(group(pool_of(task_id), task_id) for _label, task_id in batch))
        )
        t_rollouts = time.monotonic() - t_step
        metrics: dict[str, float] = {}
        rewards: list[float] = []
        label_rewards: dict[str, list[float]] = {}
        statuses: dict[str, int] = {}
        for (label, _task_id), output in zip(batch, groups, strict=True):
            for member in output.result.members:
                status = _status(member.collection)
                statuses[status] = statuses.get(status, 0) + 1
                if member.task_reward_valid and member.task_reward is not None:
                    rewards.append(member.task_reward)
                    if mixture and label is not None:
                        label_rewards.setdefault(label, []).append(member.task_reward)
        metrics["train/batch/groups"] = float(len(groups))
        _family(metrics, "train/batch/task_reward", rewards)
        for status in _STATUSES:
            metrics[f"train/batch/outcome/{status}"] = float(statuses.get(status, 0))
        for label, values in sorted(label_rewards.items()):
            metrics[f"train/batch/{_label_prefix(label)}/groups"] = float(
                sum(1 for lb, _ in batch if lb == label)
            )
            _family(metrics, f"train/batch/{_label_prefix(label)}/task_reward", values)
        group_metrics = _merge_group_metrics(groups)
        metrics.update({f"train/{key}": value for key, value in group_metrics.items()})
        all_datums = [d for output in groups for d in output.datums]
        metrics["train/total_datums_per_batch"] = float(len(all_datums))
        for name in ("postmerge", "policy_eligible", "post_sampling"):
            metrics[f"train/workload/batch/total_{name}_datums"] = group_metrics.get(
                f"datums/{name}_datums", 0.0
            )
        metrics["train/workload/training_batch/total_action_tokens"] = float(_action_tokens(all_datums))

        # Minibatches (one optimizer step each) of microbatches (one forward_backward each), train.md 2.11.
        applied = 0
        submitted = 0
        attention_tokens = 0
        transform_metrics: dict[str, float] = {}
        optim_values: dict[str, list[float]] = {}
        for minibatch in split_batch(groups, train_cfg.num_minibatches, train_cfg.num_microbatches):
            pending: list[tuple[Microbatch, Any]] = []
            for microbatch in minibatch:
                ready = prepare_microbatch(
                    [d for output in microbatch for d in output.datums], config, transform_metrics
                )
                if ready is None:
                    continue
                submitted += len(ready.sent)
                attention_tokens += sum(d.model_input.length for d in ready.sent)
                fb = await client.forward_backward_async(
                    ready.sent, loss_fn=train_cfg.loss_fn, loss_fn_config=train_cfg.loss_fn_config
                )
                pending.append((ready, fb))
            if not pending:
                continue  # nothing sent: no optimizer step for this minibatch
            optim = await client.optim_step_async(
                tinker.AdamParams(
                    learning_rate=adam.learning_rate,
                    beta1=adam.beta1,
                    beta2=adam.beta2,
                    eps=adam.eps,
                    weight_decay=adam.weight_decay,
                    grad_clip_norm=adam.grad_clip_norm,
                )
            )
            for ready, fb in pending:
                # One deadline for the whole accumulated window: the service runs them in order.
                fb_result = await asyncio.wait_for(
                    fb.result_async(), train_cfg.forward_backward_timeout_seconds
                )
                for key, value in optim_metrics(ready.kept, fb_result.loss_fn_outputs, train_cfg).items():
                    optim_values.setdefault(key, []).append(value)
            optim_result = await asyncio.wait_for(optim.result_async(), train_cfg.optim_step_timeout_seconds)
            for key, value in (getattr(optim_result, "metrics", None) or {}).items():
                optim_values.setdefault(f"optim/{key}", []).append(float(value))
            applied += 1
            optimizer_steps += 1
        metrics.update({f"train/{key}": value for key, value in transform_metrics.items()})
        metrics.update({f"train/{key}": statistics.fmean(values) for key, values in optim_values.items()})
        metrics["train/workload/training_batch/total_submitted_datums"] = float(submitted)
        metrics["train/workload/training_batch/total_attention_tokens"] = float(attention_tokens)
        metrics["train/workload/training_batch/total_non_submitted_datums"] = float(
            len(all_datums) - submitted
        )

        t_update = time.monotonic()
        done = step + 1
        # Cadences count the steps completed since this start began (train.md 2.12), updated or not: a step
        # without an update still completed, and a resume must not repeat it.
        kind = checkpoint_due(done - start_batch, config.checkpoint.every, config.checkpoint.recovery_every)
        if applied:
            version += 1
        else:
            why = "no datums" if not all_datums else "its objective is zero (every advantage is 0)"
            log.info("step %d took no optimizer step: %s", step + 1, why)
        if kind is not None:
            gateway.sampler = await save(kind, done)
        elif applied:
            gateway.sampler = await client.save_weights_and_get_sampling_client_async()
        metrics["train/batch/optimizer_updates"] = float(applied)
        metrics["train/batch/skipped_optimizer"] = 0.0 if applied else 1.0
        metrics["train/policy/version"] = float(version)
        metrics["train/optim/updates_total"] = float(optimizer_steps)
        metrics["train/update_weights_time"] = time.monotonic() - t_update
        metrics["train/rollout_completion/rollout_time"] = t_rollouts
        metrics.update(pruner.metrics())
        metrics["train/step"] = float(step + 1)
        metrics["train/epoch"] = float((step + 1) // per_epoch)
        metrics["progress/done_frac"] = (step + 1) / end_batch
        metrics["optim/lr"] = adam.learning_rate
        metrics["timing/batch_total"] = time.monotonic() - t_step
        metrics["time/elapsed_seconds"] = time.monotonic() - started
        metrics.update(await maybe_evaluate(step + 1))
        append_jsonl(metrics_path, {"step": step + 1, **metrics})
        say(
            f"step {step + 1}/{end_batch}: reward {_mean(rewards):.3f} over {len(rewards)} rollouts"
            f"{'' if applied else ' (no update)'}; {metrics['timing/batch_total']:.1f} s"
        )
        if stop_requested() and step + 1 < end_batch:
            # A first SIGINT/SIGTERM (forwarded as SIGUSR2 under supervision): stop at this boundary with a
            # checkpoint, so a resume continues at the next step (train.md 2.16).
            await save("recovery", step + 1)
            say(f"stopped at step {step + 1} as asked; resume with the same command")
            return 130
    await save("final", end_batch)
    say(
        f"done: steps {start_batch + 1}..{end_batch} in {time.monotonic() - started:.1f} s; "
        f"checkpoints in {checkpoints.path}"
    )
    return 0
