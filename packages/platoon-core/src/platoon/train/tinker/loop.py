"""The training loop of one start, as a pipeline:

    feeder ── rows ──> admission queue ──> group workers ── groups ──> result queue ──> step loop
                                              (rollouts in process            (microbatch by microbatch:
                                               or in rollout workers)          forward_backward, optim_step)

The feeder puts each batch's tasks on a bounded queue and runs ahead of training (bounded by `train.max_staleness`);
each group worker takes a row and runs its whole group; the step loop consumes `batch_size` groups per step,
submitting each microbatch as soon as its groups arrived, drops groups staler than `max_staleness`, then saves the
next sampler (a checkpoint when due) and logs the step. An evaluation loop beside it evaluates the steps that are
due. The loop stops at a step boundary when asked (SIGINT/SIGTERM, SIGUSR2), with an `_interrupted` checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon import rollout_progress
from platoon.config.training import DEFAULT_LABEL_COLUMN
from platoon.errors import PlatoonError
from platoon.gateway import tinker_sdk
from platoon.gateway.core import ModelGateway
from platoon.gateway.default import default_policy
from platoon.gateway.tinker_service import close_session
from platoon.heap import collect_at_step_end, freeze_loaded_heap, use_training_thresholds
from platoon.rollouts.inflight import InflightSampler, recording_samples
from platoon.rollouts.one_rollout import FileWriter, MemberOutcome, MemberRequest, run_member
from platoon.rollouts.workers import RolloutWorkers
from platoon.train.tinker import evaluation
from platoon.train.tinker.admission import AdmissionQueue, Row
from platoon.train.tinker.attempt_log import AttemptLog, ResumePlan, datum_digest
from platoon.train.tinker.batch_stats import BatchStats, infra_counts, infra_reason
from platoon.train.tinker.checkpoints import CheckpointLog, checkpoint_due, checkpoint_name
from platoon.train.tinker.heartbeat import doing, say, started_training
from platoon.train.tinker.inflight import settle_versions
from platoon.train.tinker.metrics_log import MetricsLog
from platoon.train.tinker.microbatches import action_tokens, optim_metrics, prepare_microbatch
from platoon.train.tinker.policy import PolicyHandle
from platoon.train.tinker.progress import (
    FAILED,
    STALE,
    StepReport,
    TrainingProgress,
    group_fate,
    no_update_reason,
    open_progress,
)
from platoon.train.tinker.pruning import Pruner
from platoon.train.tinker.supervisor import stop_requested
from platoon.train.tinker.task_order import ORDER_STATE_KEY, split_task_id
from platoon.train.tinker.tinker_client import call_service, training_client
from platoon.train.tinker.watchdog import ServiceMonitor, Watchdog, at_hard_exit, quiet_sdk_connection_noise
from platoon.train.tinker.workflows import GroupOutput, GroupRolloutWorkflow, get_workflow
from platoon.trajectory_events import scope_event_file

if TYPE_CHECKING:
    from platoon.config.training import PlatoonTinkerRLTrainerConfig
    from platoon.task import Task
    from platoon.train.tinker.checkpoints import ResumePoint
    from platoon.train.tinker.task_order import TaskOrder

__all__ = [
    "EXIT_GROUPS_FAILED",
    "EXIT_INFRA_FAILING",
    "EXIT_SERVICE_LOST",
    "EXIT_STOPPED",
    "INFRA_WINDOW_STEPS",
    "Trainer",
    "stopped_before_training",
]

log = logging.getLogger("platoon.train")

#: the exit status of a start stopped at a step boundary on request
EXIT_STOPPED = 130
#: the exit status of a start whose training service died or stopped answering (a runtime failure; resumable)
EXIT_SERVICE_LOST = 1
#: the exit status of a start stopped because its groups keep failing for one cause (a runtime failure)
EXIT_GROUPS_FAILED = 1
#: the exit status of a start stopped because too many rollouts failed in the infrastructure (a runtime failure, as a
#: lost service is: the cause may pass, so a supervised run starts again, within its restart budget)
EXIT_INFRA_FAILING = 1
#: the exit status of a start whose evaluation during training raised (a runtime failure)
EXIT_EVALUATION_FAILED = 1
#: the steps over which `train.max_infra_failure_rate` is measured: one bad step does not stop a run, a failing
#: environment does within a few steps
INFRA_WINDOW_STEPS = 5
#: consecutive steps in which every group failed for the same cause before a start stops: the policy does not
#: move while nothing trains, so a cause that held for this many steps would hold for the rest of the run
FAILED_STEPS_LIMIT = 3
#: how often a step waiting for groups looks whether a stop was requested
_STOP_POLL_SECONDS = 0.5
#: how long the end of a run waits for an in-flight pruning pass
_PRUNE_DRAIN_SECONDS = 30.0


def _unreachable(exc: BaseException, name: str) -> str | None:
    """Why `exc` says the service could not be reached (the SDK's connection or timeout error, raised once its own
    retries gave up), else None."""
    import tinker

    seen: BaseException | None = exc
    for _ in range(10):  # the error, its cause, its cause's cause...
        if seen is None:
            break
        if isinstance(seen, tinker.APIConnectionError):  # APITimeoutError is one too
            return f"{name} could not be reached ({type(seen).__name__}: {seen})"
        seen = seen.__cause__ or seen.__context__
    return None


class _Stopped(Exception):
    """A stop was requested before the current batch applied an update: the batch is abandoned."""


class _EvaluationFailed(Exception):
    """An evaluation raised and ended the eval loop: a step waiting for an evaluation would wait forever."""

    def __init__(self, step: int, cause: BaseException) -> None:
        super().__init__(f"the evaluation of step {step} failed: {type(cause).__name__}: {cause}")


class _InfraWindow:
    """The infrastructure failures and rollouts of the last `INFRA_WINDOW_STEPS` steps of this start."""

    def __init__(self) -> None:
        self.steps: deque[tuple[int, Counter[str], int]] = deque(maxlen=INFRA_WINDOW_STEPS)

    def record(self, step: int, kinds: Counter[str], rollouts: int) -> None:
        self.steps.append((step, kinds, rollouts))

    def over(self, limit: float, planned: int) -> str | None:
        """Why the window's failure rate exceeds `limit` (one line), once it holds `INFRA_WINDOW_STEPS` steps, or
        every step of a start that plans fewer (`planned`); else None."""
        if len(self.steps) < min(INFRA_WINDOW_STEPS, planned):
            return None
        kinds = sum((found for _, found, _ in self.steps), Counter[str]())
        rollouts = sum(count for _, _, count in self.steps)
        failed = sum(kinds.values())
        if not rollouts or failed / rollouts <= limit:
            return None
        first, last = self.steps[0][0], self.steps[-1][0]
        steps = f"step {first}" if first == last else f"steps {first}..{last}"
        # most frequent first; ties by name, so the line is the same from run to run
        kind, count = sorted(kinds.items(), key=lambda item: (-item[1], item[0]))[0]
        return (
            f"{failed} of the {rollouts} rollouts of {steps} failed in the infrastructure "
            f"({failed / rollouts:.0%}, over train.max_infra_failure_rate {limit:g}); the most frequent kind: "
            f"{kind} ({count} of {failed})"
        )


class _FailingSteps:
    """The run of consecutive steps (ending at the last one) in which every group failed for one same cause."""

    def __init__(self) -> None:
        self.cause: str | None = None
        self.first = self.last = 0

    @property
    def steps(self) -> int:
        return 0 if self.cause is None else self.last - self.first + 1

    def record(self, step: int, cause: str | None) -> None:
        """Step `step` (1-based) ended; `cause` is the one cause its every group failed for, else None."""
        if cause is None:
            self.cause = None
        elif cause == self.cause and step == self.last + 1:
            self.last = step
        else:
            self.cause, self.first, self.last = cause, step, step


def _group_attempts(groups: list[GroupOutput], sent: list[Any]) -> list[dict[str, Any]]:
    """What became of each group of one microbatch whose `sent` datums went to the service: `trained` with the
    digests of its datums among them, else `dropped` with why nothing of it was sent."""

    unclaimed = Counter(datum_digest(datum) for datum in sent)
    attempts: list[dict[str, Any]] = []
    for group in groups:
        mine: list[str] = []
        for datum in group.datums:
            digest = datum_digest(datum)
            if unclaimed[digest] > 0:
                unclaimed[digest] -= 1
                mine.append(digest)
        rollouts = [
            m.collection.root.id for m in group.members if m.collection is not None and m.collection.root
        ]
        if mine:
            attempts.append({"row": group.row, "state": "trained", "datums": mine, "rollouts": rollouts})
        else:
            reason = (
                group.result.rejection
                or group.failure
                or ("no datums" if not group.datums else "no datum sent (every advantage 0)")
            )
            attempts.append({"row": group.row, "state": "dropped", "reason": reason, "rollouts": rollouts})
    return attempts


def stopped_before_training(step: int) -> int:
    """A stop requested before this start trained anything (nothing to save): its line and exit status."""
    say(f"stopped at step {step} as asked; resume with the same command")
    return EXIT_STOPPED


class Trainer:
    """One start of a training run: open the service, run the pipeline from `start_batch` to `end_batch`."""

    def __init__(
        self,
        config: PlatoonTinkerRLTrainerConfig,
        order: TaskOrder,
        *,
        run_dir: Path,
        base_url: str | None,
        api_key: str,
        resume: ResumePoint | None,
        services: Mapping[str, Any],
        service_kwargs: Mapping[str, Mapping[str, Any]],
        end_batch: int,
        batches_per_epoch: int,
        sample_timeout_seconds: float,
        renderer: Any,
        service_monitor: ServiceMonitor | None = None,
        eval_tasks: list[Any] | None = None,
        started_at: float | None = None,
        service_check: Any = None,
    ) -> None:

        self.config = config
        #: the start's capability check (`platoon.startup.capabilities.TrainingServiceCheck`), made as the session
        #: opens: before the training client, and with it, before any rollout
        self.service_check = service_check
        self.order = order
        self.run_dir = run_dir
        self.base_url = base_url
        self.api_key = api_key
        self.resume = resume
        self.services = dict(services)
        #: the eval split as the start's preflight listed it (None: list it when the trainer opens)
        self._listed_eval_tasks = eval_tasks
        self.service_kwargs = {label: dict(kwargs) for label, kwargs in service_kwargs.items()}
        train = config.train
        self.workflow_config = train.workflow_config
        self.group_size = self.workflow_config.group_size
        self.start_batch = resume.start_batch if resume is not None else 0
        self.end_batch = end_batch
        self.batches_per_epoch = batches_per_epoch
        #: resolved once (config, else $TINKER_SAMPLE_TIMEOUT_SECONDS, else 600) and shipped to workers as a number
        self.sample_timeout_seconds = sample_timeout_seconds
        self.renderer = renderer
        self.entries = {pool.label: config.environments[pool.entry] for pool in order.pools}
        self.mixture = len(order.pools) > 1
        # Labels (train.label_by) key group limits, straggler policies and per-label metrics; a single entry's
        # rows have none under the default column.
        self.labelled = self.mixture or train.label_column != DEFAULT_LABEL_COLUMN
        self.workflows: dict[str, GroupRolloutWorkflow] = {
            label: get_workflow(entry.workflow)(self.workflow_config, reward_processor=entry.reward_processor)
            for label, entry in self.entries.items()
        }
        # Training rollouts write no files of their own (their events go to the step's file), but a command-line
        # agent's log does: under the run, never under the config's relative default in the working directory.
        self.rollout_config = self.workflow_config.rollout_config.model_copy(
            update={
                "model_name": train.model_name,
                "return_dict": True,
                "train": True,
                "output_dir": str(run_dir / "rollouts" / "train"),
            }
        )
        self.checkpoints = CheckpointLog(run_dir)
        #: in-flight sampling: rollouts keep their client while each step publishes new weights under it
        self.inflight = train.sampling_client_kind == "inflight"
        #: the policy version of each in-flight publication of this start, in order (the service's 1st, 2nd, ...)
        self._inflight_versions: list[int] = []
        self.version = resume.policy_version if resume is not None else 0
        self.optimizer_steps = resume.optimizer_steps if resume is not None else 0
        self.train_step = self.start_batch
        self.stats = BatchStats(label_column=train.label_column, default_column=DEFAULT_LABEL_COLUMN)
        #: whether the service still answers: the local server's death, else health probes
        self.service_monitor = service_monitor or ServiceMonitor(
            f"the Tinker service at {base_url or 'the SDK default URL'}",
            unreachable_seconds=train.service_unreachable_seconds,
        )
        self.watchdog = Watchdog(
            timeout_seconds=config.watchdog.timeout_seconds,
            exit_code=config.watchdog.exit_code,
            enabled=config.watchdog.enabled,
            answering=self.service_monitor.answering,
        )
        self._tasks: dict[tuple[str, str], Task] = {}
        self._progress = asyncio.Condition()  # notified at every step boundary (feeder, eval waits)
        # The eval loop's wake-up, set at start so that the start step is considered at once.
        self._updated = asyncio.Event()
        self._updated.set()
        self._eval_handled = -1  # the last step the eval loop looked at
        # what ended the eval loop, when an evaluation raised
        self._eval_failed: _EvaluationFailed | None = None
        self._eval_done: set[int] = set()
        self._eval_tasks: list[Any] = []
        self._prune_task: asyncio.Task[None] | None = None
        self._workers: Any = None
        self._launch_permits = asyncio.Semaphore(self.workflow_config.worker_launch_concurrent_groups)
        #: finished groups: (row, its output or None, why it raised or None)
        self._results: asyncio.Queue[tuple[Row, GroupOutput | None, str | None]] = asyncio.Queue()
        self._failing = _FailingSteps()
        self._infra = _InfraWindow()
        #: the run of steps in which every rollout failed in the infrastructure with one kind (the "cause"), and
        #: what the last such rollout said of it
        self._all_infra = _FailingSteps()
        self._infra_said: str | None = None
        #: the optimizer steps the run had when this start began (whether this start trained anything)
        self._started_with_updates = self.optimizer_steps
        self._background: list[asyncio.Future[None]] = []
        self._queue = AdmissionQueue(train.batch_size, train.rollout_group_limits)
        # Training rollouts' event files are written off the groups' path (workers write their own)
        self._files = FileWriter()
        #: what the start shows while it trains; the live display replaces it when training begins at a terminal
        self.progress = TrainingProgress(
            first_step=self.start_batch,
            end_step=end_batch,
            started_at=time.monotonic() if started_at is None else started_at,
        )

    # ----------------------------------------------------------------------------------------------- open

    async def run(self) -> int:
        """Train to `end_batch`; returns 0, 130 when stopped at a step boundary on request, or 1 when the service
        died or stopped answering (said in one line; the step in progress is redone on resume)."""

        if stop_requested():  # asked before any service opened: nothing to save, nothing to train
            return stopped_before_training(self.start_batch)
        quiet_sdk_connection_noise()  # the monitor says it in one line when the service does not answer
        monitor = asyncio.ensure_future(self.service_monitor.run(self._probe))
        training = asyncio.ensure_future(self._train())
        try:
            await asyncio.wait({training, monitor}, return_when=asyncio.FIRST_COMPLETED)
            if not training.done():
                training.cancel()
                # whatever the cancelled step awaited may fail on its way out: the lost service says why
                await asyncio.gather(training, return_exceptions=True)
                return self._service_lost(self.service_monitor.lost or monitor.result())
            try:
                return training.result()
            except Exception as exc:
                reason = self.service_monitor.lost or _unreachable(exc, self.service_monitor.name)
                if reason is None:
                    raise
                return self._service_lost(reason)
        finally:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
            probe = getattr(self, "_probe_client", None)
            if probe is not None:
                with contextlib.suppress(Exception):
                    await probe.close()

    def _service_lost(self, reason: str) -> int:
        """The one line of a start that stops because its service is gone; its checkpoints and metrics stay."""
        say(
            f"{reason}: stopped at step {self.train_step}; the step in progress is redone when the same command "
            "starts again"
        )
        return EXIT_SERVICE_LOST

    async def _probe(self) -> None:
        """One health probe of the service (its unauthenticated health route), no retries of its own."""
        # The SDK's own HTTP client (what its ServiceClient builds): the same default URL, headers and proxies.
        from tinker._client import AsyncTinker

        client = getattr(self, "_probe_client", None)
        if client is None:
            # The probe's deadline is the client's: 0.38's health_check takes no `timeout` of its own.
            kwargs: dict[str, Any] = {"api_key": self.api_key, "max_retries": 0, "timeout": 10}
            if self.base_url is not None:
                kwargs["base_url"] = self.base_url
            client = self._probe_client = AsyncTinker(**kwargs)
        await client.service.health_check()

    async def _train(self) -> int:

        forget: list[Callable[[], None]] = []
        try:
            await self._open()
            forget.append(at_hard_exit(self.metrics.finish))
            if self._workers is not None:
                forget.append(at_hard_exit(self._workers.terminate_all))
            self.watchdog.start()
            return await self._pipeline()
        finally:
            self.watchdog.stop()
            for undo in forget:
                undo()
            await self._close()

    async def _open(self) -> None:
        doing("opening the Tinker session")
        # Imported here first: a first import of the SDK in the thread below, racing another thread's, can fail
        # half-way ("partially initialized module").
        import tinker  # noqa: F401

        train = self.config.train

        def open_service() -> Any:
            # The key goes in explicitly: TINKER_API_KEY is withheld from this process while harnesses run in it.
            return tinker_sdk.service_client(api_key=self.api_key, base_url=self.base_url)

        service = await call_service("a session", self.base_url, lambda: asyncio.to_thread(open_service))
        self.service = service
        check = self.service_check
        if check is not None:
            doing("asking the Tinker service what it can do")
            await check.before_training_client(self.base_url, self.api_key)
        doing("creating the training client")  # the local server builds its model now (if not warm yet)
        self.client = await training_client(service, self.config, self.resume, self.base_url)
        if check is not None:
            await check.with_training_client(self.client, self.base_url)
        self.pruner = Pruner(
            self.checkpoints,
            self.config.checkpoint.keep_recovery,
            train.max_staleness,
            tinker_sdk.checkpoint_deleter(service, api_key=self.api_key, base_url=self.base_url),
        )
        resume_run_id = self.resume.row.wandb_run_id if self.resume is not None else None
        self._open_attempts()
        self.metrics = MetricsLog(
            self.run_dir, self.config, resume_run_id=resume_run_id, start_step=self.start_batch
        )
        if self.workflow_config.rollout_isolation == "process":
            doing("starting rollout workers")
            self._workers = await self._start_workers()
        doing("saving the launch checkpoint")
        # Launch checkpoint: the first sampler samples the saved starting (or resumed) weights.
        sampler = await self._save("launch", self.start_batch)
        if self.inflight:  # rollouts sample the in-flight weights instead, which each step moves
            sampler = await self._publish_inflight()
        publish = self._workers.publish if self._workers is not None else None
        self.policy = PolicyHandle(sampler, self.version, publish=publish, inflight=self.inflight)
        served = default_policy()
        if served is not None:
            # platoon.testing.serve_policy: in-process rollouts sample the served (scripted) policy; training
            # still runs on the service.
            self.gateway = served.gateway(
                model_name=train.model_name,
                renderer=train.renderer_name,
                renderer_kwargs=train.renderer_kwargs,
                sample_timeout_seconds=self.sample_timeout_seconds,
            )
            self._served = True
        else:
            policy = self.policy
            self.gateway = ModelGateway(
                InflightSampler(lambda: (policy.sampler, policy.version), lambda: policy.newest)
                if self.inflight
                else sampler,
                self.renderer,
                model_name=train.model_name,
                context_window_length=train.context_window_length,
                sample_timeout_seconds=self.sample_timeout_seconds,
            )
            self._served = False
        self.eval_every = self.config.eval.every or 0  # no eval section: never
        self._eval_done = evaluation.evaluated_steps(self.run_dir)
        if self.eval_every >= 1:
            listed = self._listed_eval_tasks
            self._eval_tasks = (
                listed
                if listed is not None
                else await evaluation.list_eval_tasks(
                    self.config, base_dir=self.run_dir, services=self.services
                )
            )
            self._warn_overlap()
        # The stack is loaded: full garbage collections from here on walk only what training makes, and come rarely
        # (the rollouts in flight are most of the heap), with one at each step's end.
        freeze_loaded_heap("training opened")
        use_training_thresholds()

    def _open_attempts(self) -> None:
        """Settle the attempt log for this start and plan which groups it feeds besides its own batches."""

        self.attempts = AttemptLog(self.run_dir, start_step=self.start_batch)
        plan = self.attempts.resume_plan(
            (batch, self.config.train.batch_size) for batch in self.attempts.unfinished_batches
        )
        if len(plan.carried) != len(plan.finished):
            # Every step consumes batch_size groups, so the groups a start owes its earlier batches equal those it
            # finished ahead; a log that says otherwise was written under another batch size (or by hand): the
            # batches from the start step are fed whole, as they were before the log existed.
            say(
                f"{self.attempts.path.name} does not match this run's batches ({len(plan.carried)} group(s) owed, "
                f"{len(plan.finished)} finished ahead): this start feeds the batches from step "
                f"{self.start_batch + 1} whole"
            )
            plan = ResumePlan()
        self._plan = plan

    def _warn_overlap(self) -> None:
        """Say so, per entry, when the evaluation lists tasks that training draws from."""

        for pool in self.order.pools:
            trained = {split_task_id(task_id)[1] if self.mixture else task_id for task_id in pool.task_ids}
            evaluated = {str(task.id) for label, task in self._eval_tasks if label == pool.label}
            shared = sorted(trained & evaluated)
            if shared:
                say(
                    f"environments[{pool.label}]: the evaluation lists {len(shared)} task(s) that training draws "
                    f"from ({', '.join(shared[:3])}{', ...' if len(shared) > 3 else ''})"
                )

    async def _start_workers(self) -> Any:

        train = self.config.train
        packages = [entry.package for entry in self.entries.values() if entry.package]
        workers = RolloutWorkers(
            run_dir=self.run_dir,
            workflow=self.workflow_config,
            model_name=train.model_name,
            renderer_name=train.renderer_name,
            renderer_kwargs=train.renderer_kwargs,
            context_window_length=train.context_window_length,
            sample_timeout_seconds=self.sample_timeout_seconds,
            environment_packages=packages,
            labels={"platoon.run": str(self.run_dir)},
            services=[str(entry.service) for entry in self.entries.values() if entry.service],
        )
        await workers.start()
        return workers

    async def _close(self) -> None:
        """Whatever `_open` got to: a start that failed half-way leaves no worker and no session behind."""
        if self._prune_task is not None and not self._prune_task.done():
            if self.service_monitor.lost is not None:
                self._prune_task.cancel()  # its deletes would only wait on a service that is gone
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._prune_task, _PRUNE_DRAIN_SECONDS)
        if self._workers is not None:
            await self._workers.close()
        await self._files.drain()  # every rollout's event file is on disk before the start ends
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.finish()
        close_session(getattr(self, "service", None))

    # ------------------------------------------------------------------------------------------ checkpoints

    def _sampler_options(self) -> dict[str, Any]:
        """What every sampling client of the policy is made with: stable_reinforce trains on what the service
        recorded when it sampled, so its samplers record (`record_stability_info`, SDKs from 0.38)."""
        if self.config.train.loss_fn == "stable_reinforce":
            return {"record_stability_info": True}
        return {}

    async def _publish_inflight(self) -> Any:
        """Put the trained weights on the in-flight target (rollouts' clients follow) and get a client of it for
        the rollouts that start from now on."""
        async with self.watchdog.keep_alive():
            sampler = await tinker_sdk.call(
                self.client,
                "save_weights_and_get_sampling_client",
                kind="inflight",
                **self._sampler_options(),
            )
        self._inflight_versions.append(self.version)
        return sampler

    async def _save(self, kind: str, batch: int, *, before_record: Callable[[], None] | None = None) -> Any:
        """A full checkpoint (state, then sampler weights, then its `checkpoints.jsonl` row with the task order's
        position); returns a sampler of the saved weights. Recovery saves (the launch one too) start a pruning
        pass in the background.

        `before_record` runs between the saves and the row: a step logs its metrics there, so a checkpoint a resume
        can start from never stands without its step's metrics (a start killed in between redoes the step).
        """

        name = checkpoint_name(kind, batch)
        async with self.watchdog.keep_alive():
            state = await self.client.save_state(name).result_async()
            weights = await self.client.save_weights_for_sampler(name).result_async()
            sampler = await tinker_sdk.call(
                self.client, "create_sampling_client", weights.path, **self._sampler_options()
            )
        if before_record is not None:
            before_record()
        self.checkpoints.record(
            name,
            kind=kind,
            batch=batch,
            state_path=state.path,
            sampler_path=weights.path,
            policy_version=self.version,
            optimizer_steps=self.optimizer_steps,
            wandb_run_id=self.metrics.wandb_run_id,
            **{ORDER_STATE_KEY: self.order.state(next_batch=batch)},
        )
        if kind in ("recovery", "launch") and (self._prune_task is None or self._prune_task.done()):
            in_use = self.policy.versions_in_use() if hasattr(self, "policy") else [self.version]
            self._prune_task = asyncio.ensure_future(self.pruner.prune(self.version, in_use))
        return sampler

    # ------------------------------------------------------------------------------------ feeder and groups

    def _rows(self, batch: int, slots: Iterable[int], drawn: list[tuple[str | None, str]]) -> list[Row]:
        """The rows of `slots` of batch `batch`, whose tasks are `drawn` (`order.batch(batch)`, drawn once: drawing an
        earlier batch again starts the order's stream over)."""

        rows = []
        for slot in slots:
            label, task_id = drawn[slot]
            # A mixture's ids name their entry; the order's labels may be `label_by` values instead.
            pool = (split_task_id(task_id)[0] or "") if self.mixture else self.order.pools[0].label
            rows.append(
                Row(
                    batch=batch, task_id=task_id, pool=pool, label=label if self.labelled else None, slot=slot
                )
            )
        return rows

    async def _hand_over(self, rows: list[Row]) -> None:
        """Record the rows' attempts as started, then queue them."""
        self.attempts.started(rows)
        for row in rows:
            await self._queue.put(row)

    async def _feed(self) -> None:
        """Put every batch's rows on the admission queue, running ahead of training; with `max_staleness = k`,
        batch `i` waits until `i - train_step <= k`."""
        staleness = self.config.train.max_staleness
        try:
            # the groups of earlier batches that the weights do not contain yet (in flight when a start ended)
            for owed in sorted({batch for batch, _ in self._plan.carried}):
                slots = (slot for batch, slot in self._plan.carried if batch == owed)
                await self._hand_over(self._rows(owed, slots, self.order.batch(owed)))
            for batch in range(self.start_batch, self.end_batch):
                if staleness is not None:

                    def fresh_enough(batch: int = batch, staleness: int = staleness) -> bool:
                        return batch - self.train_step <= staleness

                    async with self._progress:
                        await self._progress.wait_for(fresh_enough)
                drawn = self.order.batch(batch)
                slots = (slot for slot in range(len(drawn)) if (batch, slot) not in self._plan.finished)
                await self._hand_over(self._rows(batch, slots, drawn))
        finally:
            await self._queue.close()

    async def _group_worker(self) -> None:
        """Take a row, run its whole group, push the result; a group that raises is a None result."""

        while (row := await self._queue.take()) is not None:
            output: GroupOutput | None = None
            raised: str | None = None
            try:
                output = await self._run_group(row)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # counted (rollout_completion/failed_rollouts), never a trainer failure
                # platoon's own errors say what failed in their message; anything else is named by its type
                raised = str(exc) if isinstance(exc, PlatoonError) else f"{type(exc).__name__}: {exc}"
                log.warning("the group of %s failed: %s", row.task_id, raised)
            finally:
                await self._queue.release(row)
            self.watchdog.beat()
            await self._results.put((row, output, raised))

    async def _task(self, row: Row) -> Task:

        raw_id = split_task_id(row.task_id)[1] if self.mixture else row.task_id
        key = (row.pool, raw_id)
        if key not in self._tasks:
            self._tasks[key] = await self.services[row.pool].get_task(raw_id)
        return self._tasks[key]

    async def _run_group(self, row: Row) -> GroupOutput:
        task = await self._task(row)
        workflow = self.workflows[row.pool]
        if self._workers is None:
            return await workflow.run_group(row, lambda index: self._member(row, task, index, None))
        # Process isolation: one startup permit for the whole group, released when every member is ready (or
        # exited), or after the startup budget.
        await self._launch_permits.acquire()
        loop = asyncio.get_running_loop()
        ready = 0
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._launch_permits.release()

        def member_ready() -> None:
            nonlocal ready
            ready += 1
            if ready >= self.group_size:
                loop.call_soon_threadsafe(release)

        timer = loop.call_later(self.workflow_config.worker_startup_budget_seconds + 60.0, release)
        try:
            return await workflow.run_group(row, lambda index: self._member(row, task, index, member_ready))
        finally:
            timer.cancel()
            release()

    async def _member(self, row: Row, task: Task, index: int, on_ready: Any) -> MemberOutcome:

        with self.policy.sampling() as version, recording_samples() as samples:
            # No files of its own: its events join the version's one event file, written here (from a worker's
            # outcome too), so a step writes one file however many rollouts it runs.
            request = MemberRequest(
                task=task,
                task_id=row.task_id,
                label=row.pool,
                entry=self.entries[row.pool],
                split="train",
                rollout_number=index,
                rollout_config=self.rollout_config,
                service_kwargs=self.service_kwargs.get(row.pool, {}),
                output_dir=None,
                record=False,
            )
            outcome: MemberOutcome
            if self._workers is not None:
                outcome = await self._workers.run(request, scope="train", on_ready=on_ready)
            else:
                outcome = await run_member(
                    request, service=self.services[row.pool], gateway=self.gateway, version=lambda: version
                )
        if self.inflight:
            # what the rollout actually sampled decides its version (staleness, checkpoint_version)
            await settle_versions(
                outcome,
                outcome.sampled or tuple(samples.calls),
                self._inflight_versions,
                base_url=self.base_url,
                api_key=self.api_key,
            )
        events = scope_event_file(self.run_dir / "rollouts" / "train" / str(version), "train", version)
        context: dict[str, Any] = {
            "scope": "train",
            "training_step": row.batch + 1,
            "policy_version": outcome.version,
            "label": row.label,
        }
        if self.inflight:
            context["policy_versions"] = list(outcome.versions)
        self._files.append_events(events, row.task_id, outcome, context)
        return outcome

    # --------------------------------------------------------------------------------------------- evaluation

    async def _eval_loop(self) -> None:
        """Evaluate the step training reached whenever it is due; never a step an earlier start
        evaluated. An evaluation slower than `every` steps of training skips the steps it slept through."""

        while True:
            await self._updated.wait()
            self._updated.clear()
            step = self.train_step
            if evaluation.eval_due(
                step, every=self.eval_every, at_start=self.config.eval.at_start, done=self._eval_done
            ):
                self.policy.republish()
                self.progress.evaluating(step)
                try:
                    metrics = await evaluation.evaluate(
                        self.config,
                        step=step,
                        sampler=self.policy.sampler,
                        renderer=self.renderer,
                        run_dir=self.run_dir,
                        tasks=self._eval_tasks,
                        services=self.services,
                        logged_at=self.train_step,
                        gateway=self.gateway if self._served else None,
                        workers=self._workers,
                        service_kwargs=self.service_kwargs,
                    )
                except Exception as exc:
                    # the step that waits for this evaluation (the first update, the run's end) hears of it at once
                    log.debug("the evaluation of step %d raised", step, exc_info=True)
                    async with self._progress:
                        self._eval_failed = _EvaluationFailed(step, exc)
                        self._progress.notify_all()
                    return
                self._eval_done.add(step)
                self.metrics.log(self.train_step, metrics, timing=False)
                self.progress.evaluated(step, metrics)
            async with self._progress:
                self._eval_handled = step
                self._progress.notify_all()
            if step >= self.end_batch:
                return

    async def _wait_for_evaluation(self, step: int) -> None:
        """Until the eval loop has looked at `step` (beating only while its rollouts move); raises
        `_EvaluationFailed` when an evaluation raised, which ended the loop."""

        async with self.watchdog.keep_alive(progress=rollout_progress.count), self._progress:
            await self._progress.wait_for(lambda: self._eval_handled >= step or self._eval_failed is not None)
        if self._eval_failed is not None:
            raise self._eval_failed

    # ------------------------------------------------------------------------------------------------ steps

    async def _pipeline(self) -> int:

        train = self.config.train
        concurrency = train.max_concurrent_rollouts or train.batch_size * self.group_size
        progress = self.progress = open_progress(
            first_step=self.start_batch, end_step=self.end_batch, started_at=self.progress.started_at
        )
        background = self._background
        background.append(asyncio.ensure_future(self._feed()))
        background += [
            asyncio.ensure_future(self._group_worker()) for _ in range(max(1, concurrency // self.group_size))
        ]
        evaluating = bool(self._eval_tasks) and self.eval_every >= 1
        if evaluating:
            background.append(asyncio.ensure_future(self._eval_loop()))
        started_training()
        try:
            progress.begin(
                f"training {train.model_name} for steps {self.start_batch + 1}..{self.end_batch} in {self.run_dir}"
                if self.start_batch < self.end_batch
                else f"evaluating {train.model_name} at step {self.end_batch} in {self.run_dir}"
            )
            for step in range(self.start_batch, self.end_batch):
                if stop_requested():  # asked between two steps (or while the service opened): no new step
                    return await self._stop(step)
                try:
                    await self._step(step)
                except _Stopped:
                    return await self._stop(step)
                except _EvaluationFailed as failed:  # step 0's evaluation, which the first update waits for
                    return await self._evaluation_failed(step, failed)
                collect_at_step_end()
                if self._eval_failed is not None:  # the next step boundary after an evaluation raised
                    return await self._evaluation_failed(step + 1, self._eval_failed)
                if self._failing.steps >= FAILED_STEPS_LIMIT:
                    return await self._groups_failed(step + 1)
                limit = train.max_infra_failed_steps
                if limit and self._all_infra.steps >= min(limit, self.end_batch - self.start_batch):
                    return await self._nothing_trains(step + 1)
                infra = self._infra.over(train.max_infra_failure_rate, self.end_batch - self.start_batch)
                if infra is not None:
                    return await self._infra_failing(step + 1, infra)
            if self._failing.cause is not None and self.optimizer_steps == self._started_with_updates:
                # A start that trained nothing and ended on failing groups did not succeed: no final checkpoint
                # marks the run done, so the same command trains these steps again once the cause is fixed.
                return await self._groups_failed(self.end_batch)
            if self.start_batch < self.end_batch:  # else the resumed checkpoint is the final one
                await self._save("final", self.end_batch)
            if evaluating:
                try:
                    await self._wait_for_evaluation(self.end_batch)
                except _EvaluationFailed as failed:
                    return await self._evaluation_failed(self.end_batch, failed)
            progress.close()
            progress.say(progress.summary(str(self.checkpoints.path)))
            return 0
        finally:
            progress.close()  # a stop's or a failure's line was said above the status line, which goes now
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def _stop(self, reached: int) -> int:
        """A requested stop at a step boundary: an `_interrupted` checkpoint when this start trained anything."""
        if reached > self.start_batch:
            await self._save("interrupted", reached)
        say(f"stopped at step {reached} as asked; resume with the same command")
        return EXIT_STOPPED

    async def _groups_failed(self, reached: int) -> int:
        """Stop because every group of the last steps failed for one cause (said in one line), keeping what was
        trained before them in an `_interrupted` checkpoint when no checkpoint holds it yet."""
        failing = self._failing
        latest = self.checkpoints.latest_resumable()
        if latest is None or latest.batch < failing.first - 1:
            # The failing steps trained nothing, so the weights are those after the step before them: saved as of
            # that step, nothing trained is lost and a resume redoes the failing steps.
            await self._save("interrupted", failing.first - 1)
        steps = f"step {failing.first}" if failing.steps == 1 else f"steps {failing.first}..{failing.last}"
        say(
            f"training stopped at step {reached}: every group of {steps} failed, so nothing trained: "
            f"{failing.cause}; fix that, then the same command resumes"
        )
        return EXIT_GROUPS_FAILED

    async def _evaluation_failed(self, reached: int, failed: _EvaluationFailed) -> int:
        """Stop because an evaluation during training raised (said in one line; the traceback goes to the debug
        log), keeping what trained, instead of waiting for that evaluation until the watchdog ends the process."""
        await self._keep_what_trained(reached)
        say(f"training stopped at step {reached}: {failed}; what it trained is kept")
        return EXIT_EVALUATION_FAILED

    async def _keep_what_trained(self, reached: int) -> None:
        """An `_interrupted` checkpoint at `reached` when this start trained up to it and no checkpoint holds it."""
        latest = self.checkpoints.latest_resumable()
        if reached > self.start_batch and (latest is None or latest.batch < reached):
            await self._save("interrupted", reached)

    async def _infra_failing(self, reached: int, why: str) -> int:
        """Stop because too many rollouts failed in the infrastructure (said in one line), instead of training on
        the few left; what trained is kept in an `_interrupted` checkpoint, so the same command resumes."""
        await self._keep_what_trained(reached)
        say(f"training stopped at step {reached}: {why}; fix that, then the same command resumes")
        return EXIT_INFRA_FAILING

    async def _nothing_trains(self, reached: int) -> int:
        """Stop because every rollout of the last `train.max_infra_failed_steps` steps failed in the
        infrastructure with one kind (said in one line, naming it), instead of stepping on with no update. The
        weights are those before those steps, kept as of the step before them: a resume redoes them."""
        failing = self._all_infra
        latest = self.checkpoints.latest_resumable()
        if failing.first - 1 > self.start_batch and (latest is None or latest.batch < failing.first - 1):
            await self._save("interrupted", failing.first - 1)
        steps = f"step {failing.first}" if failing.steps == 1 else f"steps {failing.first}..{failing.last}"
        said = f" (the last: {self._infra_said})" if self._infra_said else ""
        say(
            f"training stopped at step {reached}: every rollout of {steps} failed in the infrastructure with "
            f"{failing.cause}{said}, so nothing trained (train.max_infra_failed_steps "
            f"{self.config.train.max_infra_failed_steps}); fix that, then the same command resumes"
        )
        return EXIT_INFRA_FAILING

    async def _next_group(self, can_abandon: bool) -> tuple[Row, GroupOutput | None, str | None]:
        """The next finished group; a stop request while nothing of this batch was applied abandons the batch."""

        # Beats only while some rollout moves: groups that all hang let the watchdog fire.
        async with self.watchdog.keep_alive(progress=rollout_progress.count):
            while True:
                try:
                    return await asyncio.wait_for(self._results.get(), _STOP_POLL_SECONDS)
                except TimeoutError:
                    self._raise_background_failure()
                    if can_abandon and stop_requested():
                        raise _Stopped from None

    def _raise_background_failure(self) -> None:
        """A feeder, group worker or eval loop that died of a bug would leave the step waiting forever."""
        for task in self._background:
            if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
                raise exc

    async def _step(self, step: int) -> None:
        """Consume `batch_size` groups microbatch by microbatch, one optimizer step per minibatch, then the
        sampler refresh, the checkpoint when due, and the step's metrics."""
        import tinker

        train = self.config.train
        started = time.monotonic()
        minibatches, microbatches = train.num_minibatches, train.num_microbatches
        per_microbatch = train.batch_size // (minibatches * microbatches)
        staleness = train.max_staleness
        consumed: list[GroupOutput] = []
        counts = {"groups_dequeued": 0, "stale_groups": 0, "stale_rollouts": 0, "failed": 0}
        # why each group of the step trained nothing (None: it trained, or failed for no one cause)
        failures: list[str | None] = []
        # what became of each group the step consumed, for the attempt log
        attempts: list[dict[str, Any]] = []
        transform_metrics: dict[str, float] = {}
        optim_values: dict[str, list[float]] = {}
        applied = submitted = attention = 0
        first_group_at: float | None = None
        # Where the step's wall time went: waiting for groups (rollouts), waiting for the service.
        waited = {"groups": 0.0, "service": 0.0}
        # what became of each group that never reached the step's datums (raised, stale), for a step without update
        fates: list[str] = []
        self.progress.groups(0, train.batch_size)
        for _minibatch in range(minibatches):
            pending: list[tuple[Any, Any]] = []
            for _microbatch in range(microbatches):
                groups: list[GroupOutput] = []
                for _ in range(per_microbatch):
                    t_wait = time.monotonic()
                    row, output, raised = await self._next_group(can_abandon=applied == 0)
                    first_group_at = first_group_at or time.monotonic()
                    waited["groups"] += time.monotonic() - t_wait
                    counts["groups_dequeued"] += 1
                    self.progress.groups(counts["groups_dequeued"], train.batch_size)
                    failures.append(raised if output is None else output.failure)
                    if output is None:
                        fates.append(FAILED)
                        counts["failed"] += 1
                        attempts.append({"row": row, "state": "dropped", "reason": raised})
                        continue
                    oldest = output.oldest_version
                    if (
                        staleness is not None
                        and oldest is not None
                        and self.policy.version - oldest > staleness
                    ):
                        counts["stale_groups"] += 1  # dropped whole, never requeued
                        fates.append(STALE)
                        counts["stale_rollouts"] += len(output.members)
                        attempts.append({"row": row, "state": "dropped", "reason": "stale"})
                        continue
                    groups.append(output)
                consumed += groups
                ready = prepare_microbatch(
                    [d for g in groups for d in g.datums], self.config, transform_metrics
                )
                attempts += _group_attempts(groups, ready.kept if ready is not None else [])
                if ready is None:
                    continue
                submitted += len(ready.sent)
                attention += sum(d.model_input.length for d in ready.sent)
                t_wait = time.monotonic()
                # submitted here, awaited after the optimizer step is queued behind it (the SDK keeps the order)
                future = self.client.forward_backward(
                    ready.sent, loss_fn=train.loss_fn, loss_fn_config=train.loss_fn_config
                )
                waited["service"] += time.monotonic() - t_wait
                pending.append((ready, future))
            if not pending:
                continue  # nothing sent: no optimizer step for this minibatch
            if step == 0 and self.optimizer_steps == 0 and self._eval_tasks and self.config.eval.at_start:
                await self._wait_for_evaluation(
                    0
                )  # the starting-policy number samples only the starting policy
            adam = train.optimizer
            t_wait = time.monotonic()
            optim = self.client.optim_step(
                tinker.AdamParams(
                    learning_rate=adam.learning_rate,
                    beta1=adam.beta1,
                    beta2=adam.beta2,
                    eps=adam.eps,
                    weight_decay=adam.weight_decay,
                    grad_clip_norm=adam.grad_clip_norm,
                )
            )
            async with self.watchdog.keep_alive():
                for ready, future in pending:
                    # One deadline for the whole accumulated window: the service runs them in order.
                    result = await asyncio.wait_for(
                        future.result_async(), train.forward_backward_timeout_seconds
                    )
                    for key, value in optim_metrics(ready.kept, result.loss_fn_outputs, train).items():
                        optim_values.setdefault(key, []).append(value)
                optim_result = await asyncio.wait_for(optim.result_async(), train.optim_step_timeout_seconds)
            waited["service"] += time.monotonic() - t_wait
            for key, value in (getattr(optim_result, "metrics", None) or {}).items():
                optim_values.setdefault(f"optim/{key}", []).append(float(value))
            applied += 1
            self.optimizer_steps += 1
        rollouts_seconds = (first_group_at or started) - started
        all_datums = [d for g in consumed for d in g.datums]

        done = step + 1
        # Before the step's checkpoint row: a checkpoint a resume starts from never stands without them.
        self.attempts.consumed(done, attempts)
        metrics = self.stats.metrics(consumed)
        metrics.update({f"train/{key}": value for key, value in transform_metrics.items()})
        metrics.update({f"train/{key}": statistics.fmean(values) for key, values in optim_values.items()})
        metrics.update(
            {
                "train/batch/groups_dequeued": float(counts["groups_dequeued"]),
                "train/batch/stale_groups": float(counts["stale_groups"]),
                "train/batch/groups_without_stats": float(counts["failed"]),
                "train/rollout_completion/failed_rollouts": float(counts["failed"]),
                "train/stale_rollouts": float(counts["stale_rollouts"]),
                "train/batch/optimizer_updates": float(applied),
                "train/batch/skipped_optimizer": 0.0 if applied else 1.0,
                "train/optim/updates_total": float(self.optimizer_steps),
                "train/total_datums_per_batch": float(len(all_datums)),
                "train/rollout_completion/rollout_time": rollouts_seconds,
                "train/workload/training_batch/total_submitted_datums": float(submitted),
                "train/workload/training_batch/total_attention_tokens": float(attention),
                "train/workload/training_batch/total_action_tokens": float(action_tokens(all_datums)),
                "train/workload/training_batch/total_non_submitted_datums": float(
                    len(all_datums) - submitted
                ),
                "train/step": float(done),
                "train/epoch": float(done // self.batches_per_epoch),
                "progress/done_frac": done / self.end_batch,
                "optim/lr": train.optimizer.learning_rate,
            }
        )
        metrics.setdefault("train/straggler_cancelled", 0.0)
        t_update = time.monotonic()
        logged = False

        def log_step() -> None:
            nonlocal logged
            update_seconds = time.monotonic() - t_update
            metrics["train/update_weights_time"] = update_seconds
            metrics["train/policy/version"] = float(self.version)
            metrics["timing/batch_total"] = time.monotonic() - started
            metrics["timing/groups_wait"] = waited["groups"]
            metrics["timing/service_wait"] = waited["service"] + update_seconds
            metrics.update(self.pruner.metrics())
            self._files.raise_if_out_of_space()  # a full disk stops the run here, at the step boundary
            self.metrics.log(done, metrics)
            logged = True

        # Cadences count the steps completed since this start began.
        kind = checkpoint_due(
            done - self.start_batch, self.config.checkpoint.every, self.config.checkpoint.recovery_every
        )
        if applied:
            self.version += 1
            if self.inflight:
                self.policy.announce(self.version)  # before the weights go live under running rollouts
                if kind is not None:
                    await self._save(kind, done, before_record=log_step)
                sampler = await self._publish_inflight()
            elif kind is not None:
                sampler = await self._save(kind, done, before_record=log_step)
            else:
                async with self.watchdog.keep_alive():
                    sampler = await tinker_sdk.call(
                        self.client, "save_weights_and_get_sampling_client", **self._sampler_options()
                    )
            self.policy.update(sampler, advanced=True)
            if not self._served and not self.inflight:  # the in-flight sampler reads the policy itself
                self.gateway.sampler = sampler
        causes = set(failures)
        cause = causes.pop() if not applied and len(causes) == 1 else None
        no_update = None
        if not applied:
            no_update = (
                f"every group failed: {cause}"
                if cause is not None
                else no_update_reason(fates + [group_fate(group) for group in consumed])
            )
            log.info("step %d took no optimizer step: %s", done, no_update)
            if kind is not None:
                # Saved anyway (the weights are the last step's, the policy stays as it is): skipping a due
                # checkpoint would leave the resume point behind and widen what a crash loses.
                await self._save(kind, done, before_record=log_step)
        if not logged:
            log_step()
        async with self._progress:
            self.train_step = done
            self._progress.notify_all()
        self._updated.set()  # wakes the eval loop, skipped steps too
        self.watchdog.beat()
        rewards_avg = metrics.get("train/batch/task_reward/avg")
        self._failing.record(done, cause)
        infra_kinds, rollouts = infra_counts(consumed)
        self._infra.record(done, infra_kinds, rollouts)
        only_kind = next(iter(infra_kinds)) if len(infra_kinds) == 1 else None
        self._all_infra.record(done, only_kind if not applied and infra_kinds.total() == rollouts else None)
        if self._all_infra.cause is not None:
            self._infra_said = infra_reason(consumed)
        infra_text = ""
        if infra_kinds:
            ranked = sorted(infra_kinds.items(), key=lambda item: (-item[1], item[0]))  # ties by name: stable
            listed = ", ".join(f"{kind} {count}" for kind, count in ranked[:3])
            more = ", ..." if len(infra_kinds) > 3 else ""
            infra_text = f"; {infra_kinds.total()} of {rollouts} rollouts failed in the infrastructure ({listed}{more})"
        self.progress.step(
            StepReport(
                step=done,
                reward=rewards_avg,
                rollouts=int(metrics.get("train/batch/task_reward/count", 0)),
                seconds=metrics["timing/batch_total"],
                updated=bool(applied),
                no_update=no_update,
                infra=infra_text,
            )
        )
