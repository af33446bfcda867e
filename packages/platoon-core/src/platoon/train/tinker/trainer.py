"""One training start once its checks passed (`platoon.startup` makes them and hands over a `Preflight`): the run
dir held, the identity settled, the records written, the renderer loaded, the local server started when asked for,
then one `loop.Trainer` run from the resume point; what a killed start left is reaped on the way in and out.

Heavy imports (tinker, the renderers' tokenizers) happen inside functions.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from platoon.errors import ConfigError
from platoon.gateway.tinker_service import KEY_VARIABLE, uses_local_server, withheld_from_environment
from platoon.local_server import process
from platoon.renderers import get_renderer, get_tokenizer
from platoon.rollouts import records
from platoon.rollouts.workers import ipc
from platoon.sandbox_runs import reap_run, set_run_label
from platoon.train.tinker.evaluation import final_evaluation_due
from platoon.train.tinker.heartbeat import doing, say
from platoon.train.tinker.loop import Trainer, stopped_before_training
from platoon.train.tinker.supervisor import hold_for_trainer, stop_requested
from platoon.train.tinker.watchdog import ServiceMonitor

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig
    from platoon.config.training import PlatoonTinkerRLTrainerConfig
    from platoon.local_server.process import LocalServerChild
    from platoon.train.tinker.checkpoints import ResumePoint
    from platoon.train.tinker.task_order import Pool, TaskOrder

__all__ = [
    "Preflight",
    "reap_orphans",
    "reap_sandboxes",
    "run_training",
    "start_local_server",
    "total_steps",
]

log = logging.getLogger("platoon.train")


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


@dataclass
class Preflight:
    """What a start's checks settled before writing anything (`platoon.startup.training_preflight` builds it): the
    listed tasks, their order, the resume point, the services and hold-outs."""

    run_dir: Path
    pools: list[Pool]
    resume: ResumePoint | None
    order: TaskOrder
    service_kwargs: dict[str, dict[str, Any]]
    services: Mapping[str, Any]  # built on first lookup (`LazyServices`)
    held_out: dict[str, dict[str, Any]]
    #: the eval split's `(label, task)`s when the config evaluates during training (`eval.every` >= 1), else None
    eval_tasks: list[tuple[str, Any]] | None

    def finished(self, config: PlatoonTinkerRLTrainerConfig) -> bool:
        """Whether the run already reached its last step and evaluated it where that was due (a start that says
        "nothing to train")."""
        if self.resume is None:
            return False
        end_step = total_steps(config, self.order.total_tasks)[0]
        if self.resume.start_batch < end_step:
            return False
        return not final_evaluation_due(config, self.run_dir, end_step, has_tasks=bool(self.eval_tasks))


def start_local_server(config: PlatoonTinkerRLTrainerConfig) -> LocalServerChild:
    """The local Tinker-compatible server's child for the run's model, started now."""
    say(f"starting the local Tinker-compatible server for {config.train.model_name}")
    return process.LocalServerChild(model=config.train.model_name, engine=config.local_server.engine)


def _write_records(run_dir: Path, config: PlatoonTinkerRLTrainerConfig, loaded: LoadedConfig | None) -> None:
    """`config.resolved.yaml` and `lock.json`; a config built in Python gets its dump."""
    if loaded is not None:
        records.write_resolved_config(run_dir, loaded)
        records.write_lock(run_dir, loaded, [])
        return
    data = {**config.model_dump(mode="json", exclude_defaults=True), "log_path": str(run_dir.parents[1])}
    text = "# Written by platoon: the config this run trains from (built in Python)\n"
    (run_dir / records.RESOLVED_CONFIG_FILE).write_text(text + yaml.safe_dump(data, sort_keys=False))


def _settle_identity(
    run_dir: Path,
    config: PlatoonTinkerRLTrainerConfig,
    pools: Sequence[Pool],
    held_out: Mapping[str, Mapping[str, Any]],
    resuming: bool,
) -> None:
    """Write identity.json on a fresh start; on a resume refuse (78) a changed model, renderer or hold-out, one
    line each."""
    training = {pool.label: list(pool.task_ids) for pool in pools}
    try:
        records.settle_identity(
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


async def run_training(
    config: PlatoonTinkerRLTrainerConfig,
    checked: Preflight,
    *,
    loaded: LoadedConfig | None,
    api_key: str | None,
    sample_timeout_seconds: float,
    server: LocalServerChild | None,
    began: float,
    service_check: Any = None,
) -> int:
    """Train from a checked start to the end; returns the exit status. A refused resume raises ConfigError (78).

    `api_key` is the Tinker key the checks read (None only with the local server, which issues its own);
    `server` the local server's child when the start began it early, else None (it is started here when needed);
    `service_check` the start's capability check, which the trainer makes as its session opens.
    """
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
        if checked.finished(config):
            assert resume is not None  # a finished run has a resume point
            say(f"nothing to train: {run_dir} already reached step {resume.start_batch} of {end_batch}")
            say(_how_to_go_on(config, end_batch, per_epoch))
            return 0
        if resume is not None and resume.start_batch >= end_batch:  # only the last step's evaluation is owed
            say(
                f"{run_dir} already reached step {end_batch} of {end_batch}; evaluating it, which the start that "
                "trained it did not finish"
            )
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
            if server is None:  # not started early: a run that looked finished and was not
                server = start_local_server(config)
                stop_server = server.stop
            server.on_exit = lambda code: monitor.lose(f"the local Tinker server {_how_it_ended(code)}")
            doing("waiting for the local Tinker server")
            try:
                base_url = await asyncio.to_thread(server.url, should_stop=stop_requested)
            except process.StartAbandoned:
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
            sample_timeout_seconds=sample_timeout_seconds,
            renderer=renderer,
            service_monitor=monitor,
            started_at=began,
            service_check=service_check,
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
    # without a loaded config (a library call), the resolved config the start wrote is in the run dir
    reaped = reap_run(run_dir, loaded.data, loaded.site) if loaded is not None else reap_run(run_dir)
    if reaped:
        say(f"reaped {reaped} sandbox(es) of {run_dir}")
    return reaped
