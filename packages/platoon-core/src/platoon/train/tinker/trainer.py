"""The Tinker training loop behind `platoon train` (train.md 2): groups of in-process rollouts per task, advantages
centered within each group, datums from the exact sampled tokens, `forward_backward` + `optim_step`, a fresh
sampler every step, checkpoints and per-step metrics in the run directory.

A first loop: on-policy (no prefetch, no staleness), one minibatch and one microbatch per step, in-process
rollouts only. Heavy imports (tinker, the renderers) happen inside functions.
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
    from platoon.config.loader import LoadedConfig
    from platoon.train.tinker.config_defs import PlatoonTinkerRLTrainerConfig
    from platoon.trajectory import TrajectoryCollection

__all__ = ["run_dir_of", "train"]

log = logging.getLogger("platoon.train")

_UNTRAINABLE = ("trajectory_invalid", "trajectory_timed_out", "trajectory_cancelled")
#: losses whose objective is exactly zero when every advantage is (train.md 2.11)
_ZERO_OBJECTIVE_LOSSES = ("cispo", "ppo", "importance_sampling")


def say(message: str) -> None:
    """One progress line on stderr, prefixed like every diagnostic."""
    print(f"platoon: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Groups -> datums


@dataclass
class Member:
    """One rollout of a group: its reward (None when untrainable) and the exact tokens of its trajectories."""

    reward: float | None
    status: str
    #: per trainable trajectory: (reward, [interaction, ...]) in call order
    trajectories: list[tuple[float, list[Any]]] = field(default_factory=list)
    seconds: float = 0.0
    output_tokens: int = 0


def _member(collection: TrajectoryCollection, interactions: Mapping[str, Any], seconds: float) -> Member:
    from platoon.episode.rollout import process_rewards

    root = collection.root
    if root is None:
        return Member(None, "error", seconds=seconds)
    outcome = root.misc.get("outcome") or {}
    status = str(outcome.get("status", "error"))
    trainable = status == "scored" and not any(root.misc.get(marker) for marker in _UNTRAINABLE)
    processor = root.misc.get("reward_processor")
    scores = process_rewards(processor, collection) if processor else {}
    member = Member(None, status, seconds=seconds)
    if not trainable:
        return member
    for trajectory_id, trajectory in collection.trajectories.items():
        if any(trajectory.misc.get(marker) for marker in _UNTRAINABLE):
            continue
        reward = scores[trajectory_id][0] if trajectory_id in scores else float(trajectory.reward)
        calls = []
        for step in trajectory.steps:
            call_id = (step.misc.get("action_misc") or {}).get("completion_id")
            interaction = interactions.get(call_id) if call_id else None
            if interaction is not None:
                calls.append(interaction)
                member.output_tokens += len(interaction.sampled_tokens)
        member.trajectories.append((reward, calls))
    root_id = next(iter(collection.trajectories))
    member.reward = scores[root_id][0] if root_id in scores else float(root.reward)
    return member


@dataclass
class PreDatum:
    """A datum before normalization: tokens, sampling logprobs, per-position advantages, the action mask."""

    tokens: list[int]  # the full sequence (prompt + sampled)
    logprobs: list[float]  # per target position
    advantages: list[float]
    mask: list[float]


def _datums_of(calls: Sequence[Any], advantage: float) -> list[PreDatum]:
    """One datum per model call: the prompt, then the sampled tokens (those carry the advantage)."""
    out = []
    for interaction in calls:
        prompt, sampled = list(interaction.prompt_tokens), list(interaction.sampled_tokens)
        if not sampled:
            continue
        n = len(prompt) + len(sampled) - 1  # positions predicted
        mask = [0.0] * (len(prompt) - 1) + [1.0] * len(sampled)
        logprobs = [0.0] * (len(prompt) - 1) + [float(x) for x in interaction.logprobs]
        out.append(
            PreDatum(
                tokens=prompt + sampled,
                logprobs=logprobs[:n],
                advantages=[advantage * m for m in mask],
                mask=mask,
            )
        )
    return out


def group_datums(members: Sequence[Member], *, leave_one_out: bool) -> list[PreDatum]:
    """Advantages centered within the group (train.md 2.8): each trajectory's reward minus the group's mean
    root reward (or the others' mean); members that did not score are left out."""
    scored = [m for m in members if m.reward is not None]
    if not scored:
        return []
    rewards = [float(m.reward) for m in scored if m.reward is not None]
    total = sum(rewards)
    datums: list[PreDatum] = []
    for member in scored:
        if leave_one_out and len(scored) > 1:
            baseline = (total - float(member.reward or 0.0)) / (len(scored) - 1)
        else:
            baseline = total / len(scored)
        for reward, calls in member.trajectories:
            datums.extend(_datums_of(calls, reward - baseline))
    return datums


def to_tinker_datums(datums: Sequence[PreDatum]) -> list[Any]:
    """The wire shape of train.md 3: model input = all tokens but the last; targets shifted by one."""
    from tinker import types

    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(d.tokens[:-1]),
            loss_fn_inputs={
                "target_tokens": types.TensorData(
                    data=d.tokens[1:], dtype="int64", shape=[len(d.tokens) - 1]
                ),
                "logprobs": types.TensorData(data=d.logprobs, dtype="float32", shape=[len(d.logprobs)]),
                "advantages": types.TensorData(data=d.advantages, dtype="float32", shape=[len(d.advantages)]),
            },
        )
        for d in datums
    ]


def _optim_metrics(datums: Sequence[PreDatum], outputs: Sequence[Any]) -> dict[str, float]:
    """KL and importance-weight metrics on action tokens from the returned training logprobs (train.md 2.11)."""
    diffs: list[float] = []
    train_lps: list[float] = []
    for datum, output in zip(datums, outputs, strict=False):
        trained = output["logprobs"]
        values = list(getattr(trained, "data", trained))
        for sampled, lp, m in zip(datum.logprobs, values, datum.mask, strict=False):
            if m:
                diffs.append(sampled - float(lp))
                train_lps.append(float(lp))
    if not diffs:
        return {}
    weights = [math.exp(-d) for d in diffs]
    return {
        "optim/kl_sample_train_v1": statistics.fmean(diffs),
        "optim/kl_sample_train_v2": 0.5 * statistics.fmean(d * d for d in diffs),
        "optim/entropy": -statistics.fmean(train_lps),
        "optim/importance_weight_mean": statistics.fmean(weights),
        "optim/importance_weight_min": min(weights),
        "optim/importance_weight_max": max(weights),
    }


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


async def train(config: PlatoonTinkerRLTrainerConfig, *, loaded: LoadedConfig | None = None) -> int:
    """Train `config` to the end (train.md 2); returns the exit status. User errors raise ConfigError (78)."""
    from platoon.train.tinker import records
    from platoon.train.tinker.config_defs import training_problems
    from platoon.train.tinker.credentials import check_tinker_key, uses_local_server
    from platoon.train.tinker.task_order import TaskOrder, list_training_tasks

    problems = training_problems(config)
    if problems:
        raise ConfigError(problems)
    api_key = check_tinker_key(config.tinker_base_url)
    run_dir = run_dir_of(config)
    records.check_run_dir_free(run_dir)
    base_dir = loaded.path.parent if loaded is not None else Path.cwd()
    pools = await list_training_tasks(config, base_dir=base_dir)
    try:
        order = TaskOrder(
            pools, seed=pools[0].seed, batch_size=config.train.batch_size, mode=config.train.task_order
        )
    except ValueError as exc:  # a batch larger than the training set
        raise ConfigError(f"train.batch_size: {exc}") from None
    records.hold_run_dir(run_dir)
    stop_server: Callable[[], None] | None = None
    base_url = config.tinker_base_url or os.environ.get("TINKER_BASE_URL") or None
    try:
        _write_records(run_dir, config, loaded)
        if uses_local_server(config.tinker_base_url):
            from platoon.testing.local_server.process import start_local_server_process

            say(f"starting the local Tinker-compatible server for {config.train.model_name}")
            base_url, stop_server = await asyncio.to_thread(
                start_local_server_process, model=config.train.model_name
            )
        return await _train(config, order, run_dir=run_dir, base_url=base_url, api_key=api_key)
    finally:
        if stop_server is not None:
            await asyncio.to_thread(stop_server)
        (run_dir / records.PROCESS_FILE).unlink(missing_ok=True)


async def _train(
    config: PlatoonTinkerRLTrainerConfig,
    order: Any,
    *,
    run_dir: Path,
    base_url: str | None,
    api_key: str,
) -> int:
    import tinker

    from platoon.episode.rollout import Route, recorded_rollout
    from platoon.gateway.core import ModelGateway
    from platoon.testing.episode import resolve_service
    from platoon.train.tinker.checkpoints import CheckpointLog, checkpoint_due, checkpoint_name
    from platoon.train.tinker.records import append_jsonl
    from platoon.train.tinker.renderers import get_renderer, get_tokenizer
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
    steps, per_epoch = total_steps(config, order.total_tasks)
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
    client = await _call(
        "a training client",
        base_url,
        lambda: service.create_lora_training_client_async(
            base_model=train_cfg.model_name, rank=train_cfg.lora_rank
        ),
    )
    checkpoints = CheckpointLog(run_dir)
    version = 0
    optimizer_steps = 0

    async def save(kind: str, batch: int) -> Any:
        """A full checkpoint (state, then sampler weights, then its row); returns a sampler of the weights."""
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
        )
        return await client.create_sampling_client_async(weights.path)

    # Launch checkpoint: the first sampler is the saved starting weights (train.md 2.12).
    sampler = await save("launch", 0)
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
    say(f"training {train_cfg.model_name} for {steps} steps in {run_dir}")

    async def rollout(label: str | None, task_id: str) -> Member:
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
            t0 = time.monotonic()
            try:
                collection, recorder = await recorded_rollout(
                    task, service=service_, route=route, config=rollout_config, gateway=gateway
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one failed rollout is counted, not fatal (train.md 2.4)
                log.warning("rollout of %s failed: %s: %s", task_id, type(exc).__name__, exc)
                return Member(None, "failed", seconds=time.monotonic() - t0)
            return _member(collection, recorder.interactions, time.monotonic() - t0)

    async def group(label: str | None, task_id: str) -> list[Member]:
        return list(await asyncio.gather(*(rollout(label, task_id) for _ in range(group_size))))

    for step in range(steps):
        t_step = time.monotonic()
        batch = order.next_batch()
        groups = await asyncio.gather(*(group(label, task_id) for label, task_id in batch))
        t_rollouts = time.monotonic() - t_step
        metrics: dict[str, float] = {}
        pre: list[PreDatum] = []
        rewards: list[float] = []
        label_rewards: dict[str, list[float]] = {}
        statuses: dict[str, int] = {}
        for (label, _task_id), members in zip(batch, groups, strict=True):
            pre.extend(group_datums(members, leave_one_out=workflow.leave_one_out_baseline))
            for member in members:
                statuses[member.status] = statuses.get(member.status, 0) + 1
                if member.reward is not None:
                    rewards.append(member.reward)
                    if mixture and label is not None:
                        label_rewards.setdefault(label, []).append(member.reward)
        metrics["train/batch/groups"] = float(len(groups))
        _family(metrics, "train/batch/task_reward", rewards)
        for status in ("scored", "failed", "error", "interrupted", "timeout", "cancelled"):
            metrics[f"train/batch/outcome/{status}"] = float(statuses.get(status, 0))
        for label, values in sorted(label_rewards.items()):
            metrics[f"train/batch/{_label_prefix(label)}/groups"] = float(
                sum(1 for lb, _ in batch if lb == label)
            )
            _family(metrics, f"train/batch/{_label_prefix(label)}/task_reward", values)
        # Normalization over every action token of the batch, counted before the zero-advantage filter, so
        # Tinker's sum-reduced loss is a per-token mean (train.md 2.11).
        action_tokens = sum(sum(d.mask) for d in pre)
        zero_objective = train_cfg.loss_fn in _ZERO_OBJECTIVE_LOSSES and set(train_cfg.loss_fn_config) <= {
            "clip_low_threshold",
            "clip_high_threshold",
        }
        if zero_objective and workflow.filter_zero_advantage_datums:
            kept = [d for d in pre if any(a != 0.0 for a in d.advantages)]
        else:
            kept = pre
        if zero_objective and not any(a != 0.0 for d in kept for a in d.advantages):
            kept = []
        metrics["train/total_datums_per_batch"] = float(len(pre))
        metrics["train/workload/training_batch/total_submitted_datums"] = float(len(kept))
        metrics["train/workload/training_batch/total_action_tokens"] = float(action_tokens)
        applied = False
        if kept:
            scale = 1.0 / (action_tokens + 1e-8)
            for d in kept:
                d.advantages = [a * scale for a in d.advantages]
            fb = await client.forward_backward_async(
                to_tinker_datums(kept), loss_fn=train_cfg.loss_fn, loss_fn_config=train_cfg.loss_fn_config
            )
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
            fb_result = await asyncio.wait_for(fb.result_async(), train_cfg.forward_backward_timeout_seconds)
            metrics.update(
                {f"train/{k}": v for k, v in _optim_metrics(kept, fb_result.loss_fn_outputs).items()}
            )
            optim_result = await asyncio.wait_for(optim.result_async(), train_cfg.optim_step_timeout_seconds)
            for key, value in (getattr(optim_result, "metrics", None) or {}).items():
                metrics[f"train/optim/{key}"] = float(value)
            applied = True
            optimizer_steps += 1
        t_update = time.monotonic()
        if applied:
            version += 1
            done = step + 1
            kind = checkpoint_due(done, config.checkpoint.every, config.checkpoint.recovery_every)
            if kind is not None:
                gateway.sampler = await save(kind, done)
            else:
                gateway.sampler = await client.save_weights_and_get_sampling_client_async()
        else:
            why = "no datums" if not pre else "its objective is zero (every advantage is 0)"
            log.info("step %d took no optimizer step: %s", step, why)
        metrics["train/batch/optimizer_updates"] = 1.0 if applied else 0.0
        metrics["train/batch/skipped_optimizer"] = 0.0 if applied else 1.0
        metrics["train/policy/version"] = float(version)
        metrics["train/optim/updates_total"] = float(optimizer_steps)
        metrics["train/update_weights_time"] = time.monotonic() - t_update
        metrics["train/rollout_completion/rollout_time"] = t_rollouts
        metrics["train/step"] = float(step + 1)
        metrics["train/epoch"] = float((step + 1) // per_epoch)
        metrics["progress/done_frac"] = (step + 1) / steps
        metrics["optim/lr"] = adam.learning_rate
        metrics["timing/batch_total"] = time.monotonic() - t_step
        metrics["time/elapsed_seconds"] = time.monotonic() - started
        append_jsonl(metrics_path, {"step": step + 1, **metrics})
        say(
            f"step {step + 1}/{steps}: reward {_mean(rewards):.3f} over {len(rewards)} rollouts"
            f"{'' if applied else ' (no update)'}; {metrics['timing/batch_total']:.1f} s"
        )
    await save("final", steps)
    say(f"done: {steps} steps in {time.monotonic() - started:.1f} s; checkpoints in {checkpoints.path}")
    return 0
