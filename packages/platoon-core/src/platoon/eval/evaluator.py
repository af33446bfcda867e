"""`platoon eval` once its start was checked (`platoon.startup.evaluation_start`): the output directory made
and its records written, the policy opened (local server, hosted probe), every task of the split rolled out as
training rolls out (the trainer's member body on one gateway), each rollout classified, and the report built.

Where the output goes is chosen here (`choose_output_dir`: fresh per start, or `inference.output_dir`) and checked
by the start before anything is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime as _dt
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.errors import ConfigError, PlatoonError
from platoon.eval.components import component_records
from platoon.eval.policy import HOSTED, open_policy
from platoon.eval.report import build_report, write_report
from platoon.eval.tasks import entries_by_label, service_kwargs
from platoon.heap import freeze_loaded_heap
from platoon.rollouts import records
from platoon.rollouts.eval_records import (
    COLLECTION_FILE,
    ERRORED,
    METADATA_FILE,
    iter_records,
    rollout_dir,
    rollout_record,
    run_and_record,
    write_json,
)
from platoon.rollouts.one_rollout import MemberRequest
from platoon.rollouts.slot_process import SlotPolicy
from platoon.rollouts.slots import SlotJob, SubprocessSlots, rollout_deadlines
from platoon.rollouts.workers.binding import binding_blob
from platoon.sandbox_runs import reap_run, set_run_label
from platoon.trajectory_events import write_events

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig
    from platoon.eval.config_defs import PlatoonEvalConfig
    from platoon.eval.policy import CallWatch, OpenPolicy, PolicySpec
    from platoon.eval.tasks import EvalTask, Listing

__all__ = [
    "OutputChoice",
    "choose_output_dir",
    "evaluate",
    "fresh_dir",
    "judges_lock",
    "rebuild_report",
]

log = logging.getLogger("platoon.eval")

STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
EVAL_LABEL = "eval"

Say = Callable[[str], None]


# ---------------------------------------------------------------------------------------------------------------
# The output directory


@dataclasses.dataclass(frozen=True)
class OutputChoice:
    """The evaluation's directory, whether this start made it up, and the line saying where it writes."""

    path: Path
    fresh: bool
    line: str


def _stamp(now: _dt.datetime | None) -> str:
    return (now or _dt.datetime.now(_dt.UTC)).strftime(STAMP_FORMAT)


def fresh_dir(base: Path, stamp: str) -> Path:
    """`<base>/<stamp>`, else `<stamp>-2`, `<stamp>-3`, ... : the first name not taken."""
    candidate, n = base / stamp, 2
    while candidate.exists():
        candidate, n = base / f"{stamp}-{n}", n + 1
    return candidate


def choose_output_dir(
    config: PlatoonEvalConfig, loaded: LoadedConfig, spec: PolicySpec, *, now: _dt.datetime | None = None
) -> OutputChoice:
    """`inference.output_dir` if set, else a fresh `<runs>/eval/<policy>/<UTC time>`; writes
    nothing. `<runs>` is the site profile's runs, else `./runs`."""
    explicit = config.inference.output_dir
    if explicit:
        path = Path(os.path.abspath(os.path.expanduser(explicit)))
        return OutputChoice(path, False, f"evaluating {spec.model} into {path}")
    site_runs = loaded.site.runs if loaded.site is not None else None
    runs = Path(site_runs) if site_runs is not None else Path(os.path.abspath("runs"))
    path = fresh_dir(runs / "eval" / spec.slug, _stamp(now))
    where = ", under the site profile's runs" if site_runs is not None else ""
    return OutputChoice(
        path, True, f"inference.output_dir is not set, so this evaluation writes to {path}{where}"
    )


def _claim(choice: OutputChoice) -> Path:
    """Create the directory; a fresh name another start took in the meantime moves on to the next suffix."""
    if not choice.fresh:
        choice.path.mkdir(parents=True, exist_ok=True)
        return choice.path
    path = choice.path
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir()
            return path
        except FileExistsError:
            stamp = path.name.rsplit("-", 1)[0] if path.name.count("-") else path.name
            path = fresh_dir(path.parent, stamp)


# ---------------------------------------------------------------------------------------------------------------
# Judges


def judges_lock(config: Any) -> dict[str, Any]:
    """`lock.json.judges`: enabled, and with judges off each verifier-grading entry's applied grading."""
    if config.inference.judges:
        return {"enabled": True}
    grading = {
        label: {"configured": "verifier", "applied": "none", "reason": "judges_off"}
        for label, (_, entry) in entries_by_label(config).items()
        if entry.agents.child_grading == "verifier"
    }
    record: dict[str, Any] = {"enabled": False}
    if grading:
        record["child_grading"] = grading
    return record


def _snapshot(loaded: LoadedConfig, output_dir: Path) -> LoadedConfig:
    """The loaded config with the chosen directory written in (the snapshot names it)."""
    data = copy.deepcopy(loaded.data)
    inference = data.setdefault("inference", {})
    inference["output_dir"] = str(output_dir)
    return dataclasses.replace(loaded, data=data)


# ---------------------------------------------------------------------------------------------------------------
# The evaluation


@dataclasses.dataclass
class _Stage:
    """What the rollout stage did, for the report's workflow metrics and the run-wide refusals."""

    reused: int = 0
    run: int = 0
    not_started: int = 0
    run_wide: str | None = None
    #: the subprocess slots' counts (`use_subprocesses`), for the workflow metrics
    slots: dict[str, int] | None = None


def _reusable(where: Path, *, resume: bool, retry_errored: bool) -> dict[str, Any] | None:
    """The earlier record of this rollout when the evaluation keeps it (`resume`; errored ones only without
    `retry_errored`)."""
    if not resume:
        return None
    record = records.read_json(where / METADATA_FILE)
    if record is None or record.get("status") not in ("completed", ERRORED):
        return None
    if record.get("status") == ERRORED and retry_errored:
        return None
    return record


def _write_rollout(where: Path, collection: Any, record: Mapping[str, Any], task_id: str) -> None:
    if collection is not None:
        write_json(where / COLLECTION_FILE, collection.to_dict())
        try:
            write_events(collection, where, task_id=task_id)
        except OSError as exc:  # the viewer's copy: the trajectory itself is written
            log.warning("writing the event file of %s failed: %s", task_id, exc)
    # Last: a metadata file means the rollout's files are whole (a resume reuses it).
    write_json(where / METADATA_FILE, record)


def _slot_policy(config: PlatoonEvalConfig, policy: OpenPolicy) -> SlotPolicy:
    """What each slot process needs to sample the opened policy itself (never a policy served in
    this process)."""
    spec = policy.spec
    workflow = config.inference.workflow
    if spec.backend == HOSTED:
        rollout = workflow.rollout_config
        return SlotPolicy(
            backend=HOSTED,
            model=spec.model,
            hosted=spec.hosted,
            inference_params=rollout.inference_params.model_dump(),
            sampling_precedence=rollout.sampling_precedence,
            workers=workflow.slot_count,
            api_key=policy.hosted_key,  # over the slots' socket: never in their environment
        )

    try:
        blob = binding_blob(policy.sampler, 0)
    except Exception as exc:
        raise PlatoonError(
            f"the sampling client cannot be handed to subprocess slots: {type(exc).__name__}: {exc}; set "
            "inference.workflow.use_subprocesses: false"
        ) from None
    return SlotPolicy(
        backend=str(spec.backend),
        model=spec.model,
        binding=blob,
        renderer_name=spec.renderer,
        renderer_kwargs=dict(spec.renderer_kwargs),
        context_window_length=spec.context_window_length,
        sample_timeout_seconds=spec.sample_timeout_seconds,
        base_url=policy.base_url,
    )


@contextlib.asynccontextmanager
async def _slots(config: PlatoonEvalConfig, policy: OpenPolicy, output_dir: Path) -> AsyncIterator[Any]:
    """The evaluation's subprocess slots for the block (`use_subprocesses`), else None."""
    workflow = config.inference.workflow
    if not workflow.use_subprocesses:
        yield None
        return

    entries = list(config.environments or [])
    slots = SubprocessSlots(
        output_dir=output_dir,
        max_slots=workflow.slot_count,
        policy=_slot_policy(config, policy),
        environment_packages=[entry.package for entry in entries if entry.package],
        services=[str(entry.service) for entry in entries if entry.service],
    )
    try:
        await slots.start()
        yield slots
    finally:
        await slots.close()


async def _rollout_stage(
    config: PlatoonEvalConfig,
    tasks: list[EvalTask],
    services: Mapping[str, Any],
    policy: OpenPolicy,
    output_dir: Path,
    say: Say,
    *,
    base_dir: Path,
    slots: SubprocessSlots | None = None,
) -> tuple[dict[str, list[dict[str, Any]]], _Stage]:
    inference = config.inference
    workflow = inference.workflow
    entries = entries_by_label(config)
    rollout_config = workflow.rollout_config.model_copy(
        update={
            "model_name": policy.spec.model,
            "return_dict": True,
            "train": False,
            "judges": inference.judges,
            "output_dir": str(output_dir / "rollouts"),
        }
    )
    provenance = policy.spec.provenance()
    kwargs_by_label = {label: service_kwargs(entry, base_dir) for label, (_, entry) in entries.items()}
    gate = asyncio.Semaphore(workflow.num_concurrent_workers)
    stage = _Stage()
    watch = policy.watch

    async def one(item: EvalTask, index: int) -> dict[str, Any] | None:
        where = rollout_dir(output_dir, item.task_id, index)
        kept = _reusable(where, resume=inference.resume, retry_errored=inference.retry_errored)
        if kept is not None:
            stage.reused += 1
            return kept
        entry = entries[item.label][1]
        async with gate:
            if watch.stopped or stage.run_wide is not None:
                stage.not_started += 1
                return None
            stage.run += 1
            await asyncio.to_thread(
                shutil.rmtree, where, True
            )  # an errored earlier try leaves nothing behind
            request = MemberRequest(
                task=item.task,
                task_id=item.task_id,
                label=item.label,
                entry=entry,
                split=config.split,
                rollout_number=index,
                rollout_config=rollout_config,
                service_kwargs=kwargs_by_label[item.label],
            )
            settings = {
                "task_id": item.task_id,
                "label": item.label,
                "split": config.split,
                "index": index,
                "reward_processor": entry.reward_processor,
                "threshold": workflow.success_threshold,
                "count_timeout_as_failure": workflow.count_timeout_as_failure,
                "provenance": provenance,
                "judges": inference.judges,
            }
            service = services[item.label]
            if slots is None:
                outcome, record = await run_and_record(
                    request, service=service, gateway=policy.gateway, watch=watch, record_settings=settings
                )
            else:
                outcome, record = await _in_slot(slots, request, service, settings, watch)
        if not inference.judges and record["judges"]["refused"] and stage.run_wide is None:
            stage.run_wide = (
                f"environments[{item.label}]: a judge call was refused while judges are off (inference.judges: "
                "false) in a rollout of task " + item.task_id + "; set inference.judges: true to evaluate it"
            )
        await asyncio.to_thread(_write_rollout, where, outcome.collection, record, item.task_id)
        return record

    n = workflow.num_rollouts_per_task
    in_slots = f", in up to {slots.max_slots} subprocess slots" if slots is not None else ""
    say(
        f"rolling out {len(tasks)} tasks x {n} on split {config.split} "
        f"({workflow.num_concurrent_workers} at once{in_slots})"
    )
    results = await asyncio.gather(*(one(item, i) for item in tasks for i in range(n)))
    if slots is not None:
        stage.slots = {"started": slots.counts.started, "replaced": slots.counts.replaced}
    by_task: dict[str, list[dict[str, Any]]] = {item.task_id: [] for item in tasks}
    for record in results:
        if record is not None:
            by_task.setdefault(str(record["task_id"]), []).append(record)
    for rows in by_task.values():
        rows.sort(key=lambda r: int(r.get("rollout_index", 0)))
    return by_task, stage


async def _in_slot(
    slots: SubprocessSlots,
    request: Any,
    service: Any,
    settings: Mapping[str, Any],
    watch: CallWatch,
) -> tuple[Any, dict[str, Any]]:
    """One rollout in a subprocess slot; the run-wide refusals it saw join this evaluation's watch. A slot that
    hung or died gives no record: the rollout is recorded as errored here."""
    result = await slots.run(SlotJob(request, settings, await rollout_deadlines(request, service)))
    if result.key_refusal and watch.key_refusal is None:
        watch.key_refusal = ConfigError(result.key_refusal)
    if result.hosted_refusal and watch.hosted_refusal is None:
        watch.hosted_refusal = result.hosted_refusal
    record = result.record
    if record is None:
        record = rollout_record(outcome=result.outcome, recorder=None, **settings)
    return result.outcome, record


def _stage_refusals(policy: OpenPolicy, stage: _Stage) -> None:
    """A refused Tinker key ends the stage with its own line; other run-wide problems say what did not start."""
    watch = policy.watch
    if watch.key_refusal is not None:
        raise watch.key_refusal
    problem = watch.hosted_refusal or stage.run_wide
    if problem is not None:
        raise ConfigError(f"{problem}; the evaluation stopped: {stage.not_started} rollout(s) did not start")


def _records_from_disk(output_dir: Path) -> dict[str, list[dict[str, Any]]]:
    by_task: dict[str, list[dict[str, Any]]] = {}
    for _, record in iter_records(output_dir):
        by_task.setdefault(str(record.get("task_id")), []).append(record)
    for rows in by_task.values():
        rows.sort(key=lambda r: int(r.get("rollout_index", 0)))
    return by_task


def _report(
    config: PlatoonEvalConfig,
    spec: PolicySpec,
    by_task: Mapping[str, list[dict[str, Any]]],
    *,
    output_dir: Path,
    elapsed: float,
    metrics: Mapping[str, Any],
) -> dict[str, Any]:
    report = build_report(
        by_task,
        success_threshold=config.inference.workflow.success_threshold,
        model=spec.model_record(),
        workflow_config=config.inference.workflow.model_dump(mode="json"),
        elapsed_seconds=elapsed,
        judges=config.inference.judges,
        workflow_specific_metrics=metrics,
    )
    write_report(output_dir, report)
    return report


def rebuild_report(config: PlatoonEvalConfig, spec: PolicySpec, output_dir: Path, say: Say) -> dict[str, Any]:
    """`stage: report`: rebuild the report of `output_dir`, a checked evaluation of `spec`, from its rollout records
    (no policy, no components, no sandboxes)."""
    started = time.monotonic()
    by_task = _records_from_disk(output_dir)
    report = _report(
        config, spec, by_task, output_dir=output_dir, elapsed=time.monotonic() - started, metrics={}
    )
    say(f"rebuilt the report of {sum(len(r) for r in by_task.values())} rollouts in {output_dir / 'reports'}")
    return report


async def evaluate(
    config: PlatoonEvalConfig,
    loaded: LoadedConfig,
    *,
    spec: PolicySpec,
    choice: OutputChoice,
    listing: Listing,
    say: Say,
    started: float,
) -> dict[str, Any]:
    """Run the checked evaluation `config` names (stage `full` or `rollouts`) into `choice`'s directory, on the
    tasks of `listing`; returns what the command prints: the report's summary, or for `stage: rollouts` the stage's
    counts. Raises ConfigError (78) for refusals met while rolling out and PlatoonError (1) for a `fail_fast`
    stop. `started`: when the start began (the report's elapsed time counts from there)."""
    in_process = not config.inference.workflow.use_subprocesses
    output_dir = _claim(choice)
    say(choice.line if output_dir == choice.path else choice.line.replace(str(choice.path), str(output_dir)))
    snapshot = _snapshot(loaded, output_dir)
    records.hold_run_dir(output_dir, label=EVAL_LABEL)
    set_run_label(output_dir)  # every sandbox of this evaluation, in workers too, carries its run label
    try:
        records.write_resolved_config(output_dir, snapshot)
        records.write_lock(output_dir, snapshot, component_records(config, split=config.split))
        records.update_lock(output_dir, judges=judges_lock(config))
        records.update_lock(output_dir, excluded_tasks=listing.excluded)
        rollout_config = config.inference.workflow.rollout_config
        async with open_policy(
            spec, rollout_config=rollout_config, entries=config.environments, say=say, in_process=in_process
        ) as policy:
            fields: dict[str, Any] = {"policy": spec.lock_record(probe=policy.probe)}
            parsing = policy.tool_call_parsing()
            if parsing is not None:
                fields["tool_call_parsing"] = parsing
            records.update_lock(output_dir, **fields)
            # The policy and services are loaded: full garbage collections from here on walk only what rollouts make.
            freeze_loaded_heap("the evaluation's policy opened")
            async with _slots(config, policy, output_dir) as slots:
                by_task, stage = await _rollout_stage(
                    config,
                    listing.tasks,
                    listing.services,
                    policy,
                    output_dir,
                    say,
                    base_dir=loaded.path.parent,
                    slots=slots,
                )
            _stage_refusals(policy, stage)
        errored = sum(1 for rs in by_task.values() for r in rs if r.get("status") != "completed")
        total = sum(len(rs) for rs in by_task.values())
        if config.inference.workflow.fail_fast and errored:
            raise PlatoonError(
                f"{errored} of {total} rollouts errored and inference.workflow.fail_fast is set; their records "
                f"are under {output_dir / 'rollouts'}"
            )
        metrics: dict[str, Any] = {"rollouts_run": stage.run, "rollouts_reused": stage.reused}
        if stage.slots is not None:
            metrics["subprocess_slots_started"] = stage.slots["started"]
            metrics["subprocess_slots_replaced"] = stage.slots["replaced"]
        if config.stage == "rollouts":
            say(f"rolled out {total} rollouts ({errored} errored) into {output_dir / 'rollouts'}")
            return {
                "stage": "rollouts",
                "output_dir": str(output_dir),
                "total_rollouts": total,
                "errored_rollouts": errored,
                **metrics,
            }
        report = _report(
            config, spec, by_task, output_dir=output_dir, elapsed=time.monotonic() - started, metrics=metrics
        )
        summary = report["summary"]
        say(
            f"{summary['total_rollouts']} rollouts of {summary['total_tasks']} tasks: "
            f"{summary['successful_rollouts']} successful, {summary['failed_rollouts']} failed, "
            f"{summary['errored_rollouts']} errored; report in {output_dir / 'reports'}"
        )
        return dict(summary)
    except BaseException:
        _release(output_dir)
        _after_failure(output_dir, made_here=choice.fresh, say=say)
        raise
    finally:
        _reap_sandboxes(output_dir, snapshot, say)
        _release(output_dir)


def _reap_sandboxes(output_dir: Path, snapshot: LoadedConfig, say: Say) -> None:
    """At exit: stop what this evaluation's label still has; never raises."""
    reaped = reap_run(output_dir, snapshot.data, snapshot.site)
    if reaped:
        say(f"reaped {reaped} sandbox(es) of {output_dir}")


def _release(output_dir: Path) -> None:
    """Remove `process.json` when this process holds the directory."""
    held = records.read_process(output_dir)
    if held is not None and held.pid == os.getpid():
        (output_dir / records.PROCESS_FILE).unlink(missing_ok=True)


def _after_failure(output_dir: Path, *, made_here: bool, say: Say) -> None:
    """A start that failed leaves no report: a directory it made that holds no rollout is removed, and any other
    says what it keeps, so no output directory is left looking like a finished evaluation."""
    rollouts = output_dir / "rollouts"
    recorded = rollouts.is_dir() and any(path.is_file() for path in rollouts.rglob("*"))
    if made_here and not recorded:
        shutil.rmtree(output_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            output_dir.parent.rmdir()  # the policy's folder, when this start made it and it holds nothing else
        say(f"the evaluation stopped before any rollout was recorded: removed {output_dir}")
        return
    kept = "the rollouts recorded so far" if recorded else "its records"
    say(
        f"the evaluation stopped without a report: {output_dir} keeps {kept}; run again with "
        f"inference.output_dir={output_dir} to go on from them"
    )
