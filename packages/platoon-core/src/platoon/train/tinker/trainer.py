"""`platoon train`'s entry into training: the preflight of a start — every component
resolved, the key checked, the run dir held, the tasks listed and ordered, the identity settled, the records
written, the local server started when asked for — then one `loop.Trainer` start from the resume point.

Nothing is written into the run dir before every refusal had its chance. Heavy imports (tinker, the
renderers) happen inside functions.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.errors import ConfigError
from platoon.startup.training import run_dir_of

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig
    from platoon.config.training import PlatoonTinkerRLTrainerConfig
    from platoon.local_server.process import LocalServerChild
    from platoon.train.tinker.checkpoints import ResumePoint
    from platoon.train.tinker.task_order import Pool, TaskOrder

__all__ = [
    "Preflight",
    "call_service",
    "preflight",
    "resume_problems",
    "run_dir_of",
    "total_steps",
    "train",
    "training_client",
]

log = logging.getLogger("platoon.train")

#: the row field of `checkpoints.jsonl` holding the task order's position (TaskOrder.state)
ORDER_STATE_KEY = "task_order"


def say(message: str) -> None:
    """One progress line on stderr, prefixed like every diagnostic."""
    from platoon.console import write_stderr

    global _last_said
    write_stderr(f"platoon: {message}\n")  # one write: the heartbeat thread says lines too; never raises
    _last_said = time.monotonic()


#: when `say` last printed (the heartbeat speaks only after this long a silence)
_last_said = 0.0
#: the longest a start stays silent: the heartbeat says what it waits for after this long
HEARTBEAT_SECONDS = 4.0


class _Heartbeat:
    """While a start prepares, a line whenever nothing was said for `HEARTBEAT_SECONDS`: what it is doing and for
    how long (`listing tasks (5 s)...`). A thread, not a task: imports and listings block the event loop."""

    def __init__(self) -> None:
        self._doing = "preparing the run"
        self._since = time.monotonic()
        self._started = self._since
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def doing(self, what: str) -> None:
        self._doing, self._since = what, time.monotonic()

    def start(self) -> None:
        self._done.clear()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="platoon-start-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def _run(self) -> None:
        while not self._done.wait(0.25):
            if time.monotonic() - max(_last_said, self._started) >= HEARTBEAT_SECONDS:
                say(f"{self._doing} ({time.monotonic() - self._since:.0f} s)...")


_heartbeat = _Heartbeat()


def doing(what: str) -> None:
    """Name what the start does now, for the heartbeat's next line."""
    _heartbeat.doing(what)


def started_training() -> None:
    """The first step began: the heartbeat stops (steps say their own lines)."""
    _heartbeat.stop()


async def call_service[T](what: str, base_url: str | None, make: Callable[[], Awaitable[T]]) -> T:
    """Await `make()`; a 401/403 from the service becomes the one-line key refusal."""
    from platoon.gateway.tinker_service import refused_key_error

    try:
        return await make()
    except Exception as exc:
        refused = refused_key_error(exc, base_url=base_url, what=what)
        if refused is not None:
            raise refused from None
        raise


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


def _write_records(run_dir: Path, config: PlatoonTinkerRLTrainerConfig, loaded: LoadedConfig | None) -> None:
    """`config.resolved.yaml` and `lock.json`; a config built in Python gets its dump."""
    from platoon.rollouts import records

    if loaded is not None:
        records.write_resolved_config(run_dir, loaded)
        records.write_lock(run_dir, loaded, [])
        return
    import yaml

    data = {**config.model_dump(mode="json", exclude_defaults=True), "log_path": str(run_dir.parents[1])}
    text = "# Written by platoon: the config this run trains from (built in Python)\n"
    (run_dir / records.RESOLVED_CONFIG_FILE).write_text(text + yaml.safe_dump(data, sort_keys=False))


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


def _settle_identity(
    run_dir: Path,
    config: PlatoonTinkerRLTrainerConfig,
    pools: Sequence[Pool],
    held_out: Mapping[str, Mapping[str, Any]],
    resuming: bool,
) -> None:
    """Write identity.json on a fresh start; on a resume refuse (78) a changed model, renderer or hold-out, one
    line each."""
    from platoon.rollouts.records import settle_identity

    training = {pool.label: list(pool.task_ids) for pool in pools}
    try:
        settle_identity(
            run_dir,
            config.train.model_name,
            config.train.renderer_name,
            held_out,
            resuming=resuming,
            training=training,
        )
    except ConfigError as exc:
        # settle_identity recorded lock.json.resume_refused; the user gets each problem on its own line.
        raise ConfigError(exc.problems) from None


@dataclass
class Preflight:
    """What a start settled before writing anything: the listed tasks, their order, services and hold-outs."""

    run_dir: Path
    pools: list[Pool]
    resume: ResumePoint | None
    order: TaskOrder
    service_kwargs: dict[str, dict[str, Any]]
    services: Mapping[str, Any]  # built on first lookup (`LazyServices`)
    held_out: dict[str, dict[str, Any]]
    #: the eval split's `(label, task)`s when the config evaluates during training (`eval.every` >= 1), else None
    eval_tasks: list[tuple[str, Any]] | None


async def preflight(config: PlatoonTinkerRLTrainerConfig, *, base_dir: Path) -> Preflight:
    """A start's checks before it holds the run dir, writing nothing: `platoon.startup.training`'s, then (unless the config
    itself is wrong) the tasks listed and what the listing lets a start refuse (a batch larger than the tasks, a
    `label_by` column without values, a hold-out no service records), then the eval split's tasks when the run
    evaluates (an unknown split is refused). Raises ConfigError with every problem;
    `platoon config validate` runs this and `resume_problems`."""
    from platoon.envs.resolve import LazyServices, entry_service_kwargs
    from platoon.startup.training import config_problems, machine_problems
    from platoon.train.tinker.checkpoints import CheckpointLog
    from platoon.train.tinker.task_order import list_training_tasks, training_problems_after_listing

    refused_config = config_problems(config)
    problems = refused_config + machine_problems(config)
    pools: list[Pool] = []
    if not refused_config:
        # Listed even when a key is missing, so one look reports every problem a start would meet.
        try:
            pools = await list_training_tasks(config, base_dir=base_dir)
        except ConfigError as exc:
            problems += exc.problems
        else:
            problems += training_problems_after_listing(config, pools)
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
        from platoon.train.tinker.evaluation import list_eval_tasks

        eval_tasks = await list_eval_tasks(config, base_dir=base_dir, services=services)
    return Preflight(run_dir, pools, resume, order, service_kwargs, services, held_out, eval_tasks)


async def relist_if_stale(
    config: PlatoonTinkerRLTrainerConfig, checked: Preflight, *, base_dir: Path
) -> Preflight:
    """`checked`, or a fresh preflight when a listing answered from the task listing cache no longer matches its
    service (the stale entry removed first, so the tasks are listed through the service). Only a start that will
    train checks: it builds the services anyway, while one with nothing to train never imports an SDK."""
    from platoon.envs import listing_cache
    from platoon.train.tinker.task_order import stale_listing

    cached = [pool for pool in checked.pools if pool.cached is not None]
    if not cached or _finished(config, checked):
        return checked
    stale: list[str] = []
    for pool in cached:
        reason = await stale_listing(pool, checked.services[pool.label])
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


def _finished(config: PlatoonTinkerRLTrainerConfig, checked: Preflight) -> bool:
    """Whether the run already reached its last step (a start that says "nothing to train")."""
    if checked.resume is None:
        return False
    return checked.resume.start_batch >= total_steps(config, checked.order.total_tasks)[0]


def resume_problems(config: PlatoonTinkerRLTrainerConfig, checked: Preflight) -> list[str]:
    """What a resume of `checked.run_dir` would refuse (a changed model, renderer or hold-out), writing nothing.

    A start checks this once it holds the run dir (and records the refusal in lock.json); `config validate` asks
    here, so it refuses what the start would.
    """
    from platoon.rollouts.records import check_identity

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


async def train(config: PlatoonTinkerRLTrainerConfig, *, loaded: LoadedConfig | None = None) -> int:
    """Train `config` to the end; returns the exit status. User errors raise ConfigError (78).

    A run dir whose `checkpoints.jsonl` has a resumable row resumes from it: its identity is checked (a changed
    model, renderer or hold-out is refused before any service opens), then training goes on at the next step.

    With the local server, its child starts first, once the start's own checks pass (`_early_local_server`), so
    its start-up (importing torch, building the model) overlaps the listing, the records and the SDK's import.
    """
    began = time.monotonic()
    server = _early_local_server(config)
    _heartbeat.start()
    try:
        return await _train(config, loaded=loaded, server=server, began=began)
    finally:
        _heartbeat.stop()
        if server is not None:
            await asyncio.to_thread(server.stop)


def _early_local_server(config: PlatoonTinkerRLTrainerConfig) -> LocalServerChild | None:
    """The local server's child, started now when this start will use it: no refusal of the config or the
    machine, no resume that changes model or renderer, no run that looks finished (its last row is `final`: it
    would say "nothing to train"). Otherwise None, and the start starts it where it needs it, if it gets there."""
    from platoon.gateway.tinker_service import uses_local_server
    from platoon.rollouts.records import read_identity
    from platoon.startup.training import start_problems
    from platoon.train.tinker.checkpoints import CheckpointLog

    if not uses_local_server(config.tinker_base_url) or start_problems(config):
        return None
    run_dir = run_dir_of(config)
    identity = read_identity(run_dir)
    if identity is not None and (
        identity.model != config.train.model_name or identity.renderer != config.train.renderer_name
    ):
        return None
    latest = CheckpointLog(run_dir).latest_resumable()
    if latest is not None and latest.kind == "final":
        return None
    return _start_local_server(config)


def _start_local_server(config: PlatoonTinkerRLTrainerConfig) -> LocalServerChild:
    from platoon.local_server.process import LocalServerChild

    say(f"starting the local Tinker-compatible server for {config.train.model_name}")
    return LocalServerChild(model=config.train.model_name)


async def _train(
    config: PlatoonTinkerRLTrainerConfig,
    *,
    loaded: LoadedConfig | None,
    server: LocalServerChild | None,
    began: float,
) -> int:
    from platoon.gateway.core import sample_timeout_with_source
    from platoon.gateway.tinker_service import (
        KEY_VARIABLE,
        check_tinker_key,
        uses_local_server,
        withheld_from_environment,
    )
    from platoon.rollouts import records
    from platoon.sandbox_runs import set_run_label
    from platoon.train.tinker.loop import Trainer, stopped_before_training
    from platoon.train.tinker.supervisor import hold_for_trainer, stop_requested
    from platoon.train.tinker.watchdog import ServiceMonitor

    base_dir = loaded.path.parent if loaded is not None else Path.cwd()
    doing("listing tasks")
    checked = await preflight(config, base_dir=base_dir)
    checked = await relist_if_stale(config, checked, base_dir=base_dir)
    api_key = check_tinker_key(config.tinker_base_url)
    timeout, source = sample_timeout_with_source(
        config.train.sample_timeout_seconds, "train.sample_timeout_seconds"
    )
    say(f"sample timeout {timeout:g} s ({source})")
    run_dir, pools, resume, order = checked.run_dir, checked.pools, checked.resume, checked.order
    services, service_kwargs, held_out = checked.services, checked.service_kwargs, checked.held_out

    # Under `watchdog.max_restarts` the supervisor holds the run dir; this start records itself beneath it.
    supervised = hold_for_trainer(run_dir)
    if not supervised:
        records.hold_run_dir(run_dir)
    set_run_label(run_dir)  # every sandbox of this run, in workers too, carries its run label
    stop_server: Callable[[], None] | None = None
    base_url = config.tinker_base_url or os.environ.get("TINKER_BASE_URL") or None
    try:
        # Identity first: a refused resume leaves the run's records as they were (but for resume_refused).
        _settle_identity(run_dir, config, pools, held_out, resuming=resume is not None)
        # Known from the listing and the checkpoint log alone: a finished run says so before anything is loaded,
        # built or started (renderer, services, the local server), and its records stay as its last start left them.
        end_batch, per_epoch = total_steps(config, order.total_tasks)
        if resume is not None and resume.start_batch >= end_batch:
            say(f"nothing to train: {run_dir} already reached step {resume.start_batch} of {end_batch}")
            say(_how_to_go_on(config, end_batch, per_epoch))
            return 0
        _write_records(run_dir, config, loaded)
        doing("loading the renderer")
        renderer = await _renderer(config)
        records.update_lock(
            run_dir,
            tool_call_parsing=records.tool_call_parsing_record(
                config.train.model_name, config.train.renderer_name, renderer
            ),
            excluded_tasks={pool.label: dict(pool.excluded) for pool in pools if pool.excluded},
        )
        reap_orphans(run_dir)  # what a killed start left behind, before this start adds its own
        reap_sandboxes(run_dir, loaded)
        start_step = resume.start_batch if resume is not None else 0
        if stop_requested():  # a SIGINT/SIGTERM while preparing: nothing opens, nothing trains
            return stopped_before_training(start_step)
        monitor = ServiceMonitor(
            f"the Tinker service at {base_url or 'the SDK default URL'}",
            unreachable_seconds=config.train.service_unreachable_seconds,
        )
        if uses_local_server(config.tinker_base_url):
            from platoon.local_server.process import StartAbandoned

            if server is None:  # not started early: a run that looked finished and was not
                server = _start_local_server(config)
                stop_server = server.stop
            server.on_exit = lambda code: monitor.lose(f"the local Tinker server {_how_it_ended(code)}")
            doing("waiting for the local Tinker server")
            try:
                base_url = await asyncio.to_thread(server.url, should_stop=stop_requested)
            except StartAbandoned:
                return stopped_before_training(start_step)
            api_key = server.api_key  # issued for this run; the server takes no other
            monitor.name = f"the local Tinker server at {base_url}"
        assert api_key is not None  # checked above, or the local server's own
        doing("building the environments' services")  # an in-process ORS service imports its SDK
        trainer = Trainer(
            config,
            order,
            run_dir=run_dir,
            base_url=base_url,
            api_key=api_key,
            resume=resume,
            services=services,
            service_kwargs=service_kwargs,
            eval_tasks=checked.eval_tasks,
            end_batch=end_batch,
            batches_per_epoch=per_epoch,
            sample_timeout_seconds=timeout,
            renderer=renderer,
            service_monitor=monitor,
            started_at=began,
        )
        # In-process rollouts run harness code here: the key, read once above, is not in their environment.
        with withheld_from_environment((KEY_VARIABLE,)):
            return await trainer.run()
    finally:
        if stop_server is not None:
            await asyncio.to_thread(stop_server)
        reap_orphans(run_dir)
        reap_sandboxes(run_dir, loaded)
        if not supervised:
            (run_dir / records.PROCESS_FILE).unlink(missing_ok=True)


def _how_to_go_on(config: PlatoonTinkerRLTrainerConfig, end_batch: int, per_epoch: int) -> str:
    """What a finished run can do next: train on (raise the limit that ended it) or start afresh elsewhere
    (`platoon train` has no flag that discards a run: its checkpoints are the user's to delete)."""
    train = config.train
    limit = (
        "train.max_training_steps"
        if train.max_training_steps is not None
        and (train.num_epochs is None or train.max_training_steps <= train.num_epochs * per_epoch)
        else "train.num_epochs"
    )
    return (
        f"to go on, raise {limit} (the run resumes after step {end_batch}); to start afresh, add "
        "stats.trial_name=NEW (another run directory) or delete this one"
    )


def _how_it_ended(returncode: int) -> str:
    """`died (killed by SIGKILL)`, `died (exit 3)`, `stopped on its own (exit 0)`: how a child ended."""
    import signal

    if returncode == 0:
        return "stopped on its own (exit 0)"
    if returncode < 0:
        try:
            return f"died (killed by {signal.Signals(-returncode).name})"
        except ValueError:
            return f"died (killed by signal {-returncode})"
    return f"died (exit {returncode})"


async def _renderer(config: PlatoonTinkerRLTrainerConfig) -> Any:
    """The run's renderer over its model's tokenizer (loaded once; workers rebuild theirs from name + kwargs)."""
    from platoon.renderers import get_renderer, get_tokenizer

    train = config.train
    try:
        tokenizer = await asyncio.to_thread(get_tokenizer, train.model_name)
    except OSError as exc:  # transformers' word for a name the hub does not have, or a hub out of reach
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"train.model_name: cannot load the tokenizer of {train.model_name!r}: {first}"
        ) from None
    return get_renderer(train.renderer_name, tokenizer, renderer_kwargs=train.renderer_kwargs)


def reap_orphans(run_dir: Path) -> int:
    """Stop the rollout workers dead trainers left; returns how many, and says so.

    Only where a rollout-worker scratch dir exists: a run that never used process isolation has none to look at.
    """
    from platoon.rollouts.workers import ipc

    where = ipc.scratch_base() / f"platoon-rollout-ipc-{os.getuid()}"
    if not where.is_dir():
        return 0
    try:
        killed = ipc.sweep_orphans(ipc.scratch_dir())
    except ipc.WorkerSetupError as exc:  # a scratch dir we may not use: nothing of ours can be in it
        log.warning("not sweeping orphaned rollout workers: %s", exc)
        return 0
    if killed:
        say(f"stopped {killed} orphaned rollout worker(s) of trainers that are gone")
    return killed


def reap_sandboxes(run_dir: Path, loaded: LoadedConfig | None) -> int:
    """Stop the sandboxes this run's label still has (at start, before each supervised restart
    and at exit), through the providers the run could have used; says how many, never raises."""
    from platoon.sandbox_runs import reap_run

    # without a loaded config (a library call), the resolved config the start wrote is in the run dir
    reaped = reap_run(run_dir, loaded.data, loaded.site) if loaded is not None else reap_run(run_dir)
    if reaped:
        say(f"reaped {reaped} sandbox(es) of {run_dir}")
    return reaped


async def training_client(
    service: Any, config: PlatoonTinkerRLTrainerConfig, resume: ResumePoint | None, base_url: str | None
) -> Any:
    """Resume: from the state with its optimizer; else `checkpoint.load_checkpoint_path` (weights only, a fresh
    optimizer); else a new LoRA client."""
    train_cfg = config.train
    if resume is not None:
        path = resume.row.state_path
        assert path is not None  # a resume point is a row with a state_path
        say(f"resuming at step {resume.start_batch + 1} from {resume.row.name} ({path})")
        return await call_service(
            "a training client",
            base_url,
            lambda: service.create_training_client_from_state_with_optimizer_async(path),
        )
    load = config.checkpoint.load_checkpoint_path
    if load is not None:
        return await call_service(
            "a training client", base_url, lambda: service.create_training_client_from_state_async(load)
        )
    return await call_service(
        "a training client",
        base_url,
        lambda: service.create_lora_training_client_async(
            base_model=train_cfg.model_name, rank=train_cfg.lora_rank
        ),
    )
