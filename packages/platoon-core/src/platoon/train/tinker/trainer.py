"""The Tinker training loop behind `platoon train` (train.md 2): groups of in-process rollouts per task, advantages
centered within each group, datums from the exact sampled tokens, `forward_backward` + `optim_step`, a fresh
sampler every step, checkpoints and per-step metrics in the run directory.

A first loop: on-policy (no prefetch, no staleness), one minibatch and one microbatch per step, in-process
rollouts only. Heavy imports (tinker, the renderers) happen inside functions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.errors import ConfigError

if TYPE_CHECKING:
    from platoon.config.environments import EnvironmentConfig
    from platoon.config.loader import LoadedConfig
    from platoon.train.tinker.config_defs import PlatoonTinkerRLTrainerConfig
    from platoon.trajectory import TrajectoryCollection

__all__ = ["LOCAL_KEY", "KeyError_", "resolve_key", "run_dir_of", "train"]

log = logging.getLogger("platoon.train")

#: the key the SDK is handed for the local server when TINKER_API_KEY is unusable (core.md 8.7)
LOCAL_KEY = "tml-platoon-local"
_UNTRAINABLE = ("trajectory_invalid", "trajectory_timed_out", "trajectory_cancelled")
#: losses whose objective is exactly zero when every advantage is (train.md 2.11)
_ZERO_OBJECTIVE_LOSSES = ("cispo", "ppo", "importance_sampling")


class KeyError_(ConfigError):  # noqa: N801  (a ConfigError, not the builtin KeyError)
    """A missing, malformed or refused TINKER_API_KEY: one line, exit 78, no `invalid config:` header."""

    def __init__(self, message: str) -> None:
        super().__init__([message])


def say(message: str) -> None:
    """One progress line on stderr, prefixed like every diagnostic."""
    print(f"platoon: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Preflight


def resolve_key(base_url: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The key to hand the SDK (train.md 2.1, core.md 8.7); refuses a missing or malformed key unless local."""
    env = os.environ if environ is None else environ
    key = env.get("TINKER_API_KEY", "")
    local = base_url == "local" or (base_url is None and env.get("TINKER_BASE_URL") == "local")
    if local:
        return key if key.startswith("tml-") else LOCAL_KEY
    if not key:
        raise KeyError_("TINKER_API_KEY is not set: the policy is sampled through Tinker, which needs it")
    if not key.startswith("tml-"):
        raise KeyError_("TINKER_API_KEY must start with tml-, as the Tinker client requires")
    return key


def run_dir_of(config: PlatoonTinkerRLTrainerConfig) -> Path:
    """`log_path/<experiment_name>/<trial_name>`, absolute (log_path is relative to the working directory)."""
    return Path(os.path.abspath(config.log_path)) / config.stats.experiment_name / config.stats.trial_name


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def check_run_dir_free(run_dir: Path) -> None:
    """Refuse a run directory whose `process.json` names a live process on this host (train.md 2.1 step 3)."""
    try:
        record = json.loads((run_dir / "process.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(record, dict):
        return
    pid = record.get("pid")
    if record.get("host") == socket.gethostname() and isinstance(pid, int) and pid != os.getpid():
        if _pid_alive(pid):
            raise ConfigError(f"{run_dir} is in use: process {pid} on this host is training there")


def _write_json(path: Path, value: Any) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)


def _append_jsonl(path: Path, row: Mapping[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")


def write_records(run_dir: Path, config: PlatoonTinkerRLTrainerConfig, loaded: LoadedConfig | None) -> None:
    """`config.resolved.yaml`, `lock.json` and `process.json` (a first version of core.md 9.2-9.5)."""
    import platform

    import yaml

    run_dir.mkdir(parents=True, exist_ok=True)
    data = loaded.data if loaded is not None else config.model_dump(mode="json", exclude_defaults=True)
    data = {**data, "log_path": os.path.abspath(config.log_path)}
    header = ["# Written by platoon: the config this run trains from."]
    if loaded is not None:
        header += [f"# source: {source}" for source in loaded.sources]
        header += [f"# override: {item}" for item in loaded.overrides]
    text = "\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    (run_dir / "config.resolved.yaml").write_text(text, encoding="utf-8")
    from importlib.metadata import PackageNotFoundError, version

    def _version(dist: str) -> str | None:
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    _write_json(
        run_dir / "lock.json",
        {
            "versions": {
                "platoon": _version("platoon-core"),
                "tinker": _version("tinker"),
                "tinker_cookbook": _version("tinker-cookbook"),
                "openreward": _version("openreward"),
                "hpc_sandbox": _version("hpc-sandbox"),
            },
            "python": platform.python_version(),
            "hostname": socket.gethostname(),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "argv": list(sys.argv),
        },
    )
    _write_json(
        run_dir / "process.json",
        {
            "command": "train",
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start_time": time.time(),
            "label": config.stats.trial_name,
            "trainer_pid": os.getpid(),
            "trainer_start_time": time.time(),
        },
    )


# ---------------------------------------------------------------------------------------------------------------
# Tasks


@dataclass
class Pool:
    """One environment entry's training tasks."""

    label: str | None
    entry: EnvironmentConfig
    service: Any
    task_ids: list[str]


class _TaskOrder:
    """Seeded shuffled passes over every training task, continuing from one epoch to the next (train.md 2.2)."""

    def __init__(self, pools: Sequence[Pool], *, seed: int, batch_size: int) -> None:
        self._rows = [(pool.label, task_id) for pool in pools for task_id in pool.task_ids]
        self._rng = random.Random(seed)
        self._pending: list[tuple[str | None, str]] = []
        self.batch_size = batch_size

    def next_batch(self) -> list[tuple[str | None, str]]:
        batch: list[tuple[str | None, str]] = []
        while len(batch) < self.batch_size:
            if not self._pending:
                self._pending = list(self._rows)
                self._rng.shuffle(self._pending)
            batch.append(self._pending.pop())
        return batch


async def list_pools(config: PlatoonTinkerRLTrainerConfig) -> list[Pool]:
    """Every entry's service and training task ids (its `dataset_kwargs.split_name`, default `train`)."""
    from platoon.testing.episode import resolve_service

    pools = []
    mixture = len(config.environments) > 1
    for index, entry in enumerate(config.environments):
        where = f"environments[{index}]"
        if entry.service is None:
            raise ConfigError(f"{where}: no service: this build trains only service environments")
        try:
            service = resolve_service(entry.service, entry.service_kwargs)
        except ConfigError:
            raise
        except Exception as exc:  # the user's service reference: reported by name, never a traceback
            raise ConfigError(f"{where}.service: {entry.service} cannot be built: {type(exc).__name__}: {exc}") from None
        split = str(entry.dataset_kwargs.get("split_name", "train"))
        try:
            ids = [str(task_id) for task_id in await service.list_tasks(split)]
        except Exception as exc:
            raise ConfigError(f"{where}: listing the {split!r} tasks failed: {type(exc).__name__}: {exc}") from None
        excluded = set(entry.exclude_tasks)
        ids = [task_id for task_id in ids if task_id not in excluded]
        if not ids:
            raise ConfigError(f"{where}: the {split!r} split has no tasks to train on")
        label = (entry.name or entry.env or f"environment{index}") if mixture else None
        pools.append(Pool(label=label, entry=entry, service=service, task_ids=ids))
    if not pools:
        raise ConfigError("environments: no environment entries: nothing to train on")
    return pools


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
                "target_tokens": types.TensorData(data=d.tokens[1:], dtype="int64", shape=[len(d.tokens) - 1]),
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


def _refused(exc: BaseException, base_url: str | None, what: str) -> KeyError_ | None:
    """A 401/403 from the service (directly or as a cause) as the one-line key refusal of train.md 2.1."""
    seen: BaseException | None = exc
    while seen is not None:
        code = getattr(seen, "status_code", None)
        if code in (401, 403):
            detail = str(getattr(seen, "message", "") or seen)[:300]
            origin = base_url or os.environ.get("TINKER_BASE_URL") or "hosted Tinker"
            return KeyError_(
                f"the Tinker service at {origin} refused TINKER_API_KEY when asked for {what} (HTTP {code}: "
                f"{detail}): set TINKER_API_KEY to a key that service accepts"
            )
        seen = seen.__cause__ or seen.__context__
    return None


async def _call[T](what: str, base_url: str | None, make: Callable[[], Awaitable[T]]) -> T:
    try:
        return await make()
    except Exception as exc:
        refused = _refused(exc, base_url, what)
        if refused is not None:
            raise refused from None
        raise


class Checkpoints:
    """Full checkpoints (state + sampler weights under one name) recorded in `checkpoints.jsonl`."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "checkpoints.jsonl"

    async def save(self, client: Any, name: str, *, batch: int, version: int, optimizer_steps: int) -> Any:
        """Save `name`; returns a sampling client of the saved sampler weights."""
        state = await (await client.save_state_async(name)).result_async()
        sampler = await (await client.save_weights_for_sampler_async(name)).result_async()
        _append_jsonl(
            self.path,
            {
                "name": name,
                "batch": batch,
                "wandb_run_id": None,
                "policy_version": version,
                "optimizer_steps": optimizer_steps,
                "state_path": state.path,
                "sampler_path": sampler.path,
            },
        )
        return await client.create_sampling_client_async(sampler.path)


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


async def train(config: PlatoonTinkerRLTrainerConfig, *, loaded: LoadedConfig | None = None) -> int:
    """Train `config` to the end (train.md 2); returns the exit status. User errors raise ConfigError (78)."""
    from platoon.train.tinker.config_defs import training_problems

    problems = training_problems(config)
    if problems:
        raise ConfigError(problems)
    api_key = resolve_key(config.tinker_base_url)
    run_dir = run_dir_of(config)
    check_run_dir_free(run_dir)
    pools = await list_pools(config)
    n_tasks = sum(len(pool.task_ids) for pool in pools)
    train_cfg = config.train
    if len(pools) == 1 and train_cfg.batch_size > n_tasks and train_cfg.task_order == "auto":
        raise ConfigError(
            f"train.batch_size ({train_cfg.batch_size}) is larger than the {n_tasks} training tasks: lower it"
        )
    write_records(run_dir, config, loaded)
    stop_server: Callable[[], None] | None = None
    base_url = config.tinker_base_url or os.environ.get("TINKER_BASE_URL") or None
    try:
        if base_url == "local":
            from platoon.testing.local_server.process import start_local_server_process

            say(f"starting the local Tinker-compatible server for {train_cfg.model_name}")
            base_url, stop_server = await asyncio.to_thread(
                start_local_server_process, model=train_cfg.model_name
            )
        return await _train(config, pools, run_dir=run_dir, base_url=base_url, api_key=api_key)
    finally:
        if stop_server is not None:
            await asyncio.to_thread(stop_server)
        (run_dir / "process.json").unlink(missing_ok=True)


async def _train(
    config: PlatoonTinkerRLTrainerConfig,
    pools: list[Pool],
    *,
    run_dir: Path,
    base_url: str | None,
    api_key: str,
) -> int:
    import tinker

    from platoon.episode.rollout import Route, recorded_rollout
    from platoon.gateway.core import ModelGateway
    from platoon.train.tinker.renderers import get_renderer, get_tokenizer

    train_cfg = config.train
    workflow = train_cfg.workflow_config
    if workflow.rollout_isolation != "inprocess":
        raise ConfigError(
            "train.workflow_config.rollout_isolation: process: this build runs rollouts in process only; "
            "use inprocess"
        )
    group_size = workflow.group_size
    concurrency = train_cfg.max_concurrent_rollouts or train_cfg.batch_size * group_size
    steps, per_epoch = total_steps(config, sum(len(p.task_ids) for p in pools))
    order = _TaskOrder(pools, seed=pools[0].entry.seed, batch_size=train_cfg.batch_size)
    by_label = {pool.label: pool for pool in pools}

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
    checkpoints = Checkpoints(run_dir)
    version = 0
    optimizer_steps = 0
    # Launch checkpoint: the first sampler is the saved starting weights (train.md 2.12).
    sampler = await checkpoints.save(
        client, "recovery-000000", batch=0, version=version, optimizer_steps=optimizer_steps
    )
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
        pool = by_label[label]
        key = (label, task_id)
        if key not in tasks_cache:
            tasks_cache[key] = await pool.service.get_task(task_id)
        task = tasks_cache[key]
        route = Route.from_entry(pool.entry, task_id=task_id)
        rollout_config = workflow.rollout_config.model_copy(
            update={"model_name": train_cfg.model_name, "return_dict": True, "train": True}
        )
        async with semaphore:
            t0 = time.monotonic()
            try:
                collection, recorder = await recorded_rollout(
                    task, service=pool.service, route=route, config=rollout_config, gateway=gateway
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
                    if label is not None:
                        label_rewards.setdefault(label, []).append(member.reward)
        metrics["train/batch/groups"] = float(len(groups))
        _family(metrics, "train/batch/task_reward", rewards)
        for status in ("scored", "failed", "error", "interrupted", "timeout", "cancelled"):
            metrics[f"train/batch/outcome/{status}"] = float(statuses.get(status, 0))
        for label, values in sorted(label_rewards.items()):
            metrics[f"train/batch/{_label_prefix(label)}/groups"] = float(sum(1 for lb, _ in batch if lb == label))
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
            metrics.update({f"train/{k}": v for k, v in _optim_metrics(kept, fb_result.loss_fn_outputs).items()})
            optim_result = await asyncio.wait_for(optim.result_async(), train_cfg.optim_step_timeout_seconds)
            for key, value in (getattr(optim_result, "metrics", None) or {}).items():
                metrics[f"train/optim/{key}"] = float(value)
            applied = True
            optimizer_steps += 1
        t_update = time.monotonic()
        if applied:
            version += 1
            done = step + 1
            every = config.checkpoint.every
            recovery = config.checkpoint.recovery_every
            if every > 0 and done % every == 0:
                gateway.sampler = await checkpoints.save(
                    client, f"{done:06d}", batch=done, version=version, optimizer_steps=optimizer_steps
                )
            elif recovery and done % recovery == 0:
                gateway.sampler = await checkpoints.save(
                    client, f"recovery-{done:06d}", batch=done, version=version, optimizer_steps=optimizer_steps
                )
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
        _append_jsonl(metrics_path, {"step": step + 1, **metrics})
        say(
            f"step {step + 1}/{steps}: reward {_mean(rewards):.3f} over {len(rewards)} rollouts"
            f"{'' if applied else ' (no update)'}; {metrics['timing/batch_total']:.1f} s"
        )
    await checkpoints.save(client, "final", batch=steps, version=version, optimizer_steps=optimizer_steps)
    say(f"done: {steps} steps in {time.monotonic() - started:.1f} s; checkpoints in {checkpoints.path}")
    return 0
