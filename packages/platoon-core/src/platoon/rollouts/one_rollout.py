"""One member of a rollout group: the request a group builds for each rollout, the body
that runs it — the same in process and in a rollout worker — and the member outcome the group decision reads.

The body runs the entry's route through `recorded_rollout` on the gateway it is given (the trainer's, or a worker's
over the followed sampling client), writes the rollout's trajectory and event file when the request names an
output directory, and classifies the result. Conversion to datums and credit happen in the trainer process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon import rollout_progress
from platoon.episode.rollout import Route, recorded_rollout
from platoon.rollouts.records import NO_SPACE_ERRNOS, RunDirWriteError, write_bytes_atomic
from platoon.trajectory_events import append_events, write_events

if TYPE_CHECKING:
    from platoon.config.environments import EnvironmentConfig
    from platoon.config_defs import RolloutConfig
    from platoon.gateway.records import Interaction
    from platoon.rollouts.inflight import SampledCall
    from platoon.task import Task
    from platoon.trajectory import TrajectoryCollection

__all__ = ["FileWriter", "MemberOutcome", "MemberRequest", "outcome_status", "run_member"]

log = logging.getLogger(__name__)

#: dispositions of a member that produced no result
NO_RESULT = (
    "error",
    "no_trajectories",
    "straggler_killed",
    "hard_timeout",
    "worker_crashed",
    "rollout_worker_oom",
    "worker_launch_failed",
    "cancelled",
)


@dataclass(frozen=True)
class MemberRequest:
    """What one rollout needs; picklable, so a rollout worker can run it.

    `task_id` is the run's id (`<entry>::<raw id>` in a mixture) and `task` the task the service resolved for its
    raw id. `rollout_config` already carries `model_name`, `return_dict` and `train`. `output_dir`, when set, gets
    `trajectory_collection.json`, `metadata.json` and the event file of this rollout.
    """

    task: Task
    task_id: str
    label: str
    entry: EnvironmentConfig
    split: str
    rollout_number: int
    rollout_config: RolloutConfig
    #: the kwargs the trainer built the entry's service with (relative paths already resolved)
    service_kwargs: Mapping[str, Any] = field(default_factory=dict)
    output_dir: str | None = None
    #: also write `trajectory_collection.json` and `metadata.json` into `output_dir` (one directory per rollout);
    #: False writes only the rollout's event file into `<output_dir>/events/` (training and its evaluations leave
    #: `output_dir` unset and append every rollout's events to their step's one file themselves)
    record: bool = True

    @property
    def raw_task_id(self) -> str:
        """The id the entry's service knows the task by (the run's id without its `<entry>::` prefix)."""
        return str(self.task.id) if self.task.id is not None else self.task_id.rsplit("::", 1)[-1]


@dataclass
class MemberOutcome:
    """A member's result: its trajectories and the exact tokens of its calls (None when it produced none).

    `disposition`: `completed` or `no_trajectories` / `error` from the body, or one of the worker and straggler
    dispositions (`straggler_killed`, `hard_timeout`, `worker_crashed`, `rollout_worker_oom`,
    `worker_launch_failed`). `status` is the root's outcome status (`none` without a root). `version` is the policy
    version its samples came from: the datums' `checkpoint_version` (with in-flight sampling the oldest of
    `versions`, every version its samples ran on, or may have: `sampled` holds each sample's range).
    """

    collection: TrajectoryCollection | None
    interactions: Mapping[str, Interaction] | None
    disposition: str
    status: str
    version: int
    seconds: float = 0.0
    reward_key: str | None = None
    error: str | None = None
    #: per-member scalars recorded into the step's metrics (e.g. `rollout_worker_*` in process mode)
    telemetry: dict[str, float] = field(default_factory=dict)
    #: in-flight sampling: every policy version its samples ran on (or may have), oldest first
    versions: tuple[int, ...] = ()
    #: in-flight sampling: each sample's range of versions and sequence ids, as the rollout recorded them
    sampled: tuple[SampledCall, ...] = ()

    @property
    def observed(self) -> bool:
        """Whether the member produced trajectories the group can read."""
        return self.collection is not None and self.disposition not in NO_RESULT

    @classmethod
    def missing(
        cls, disposition: str, *, version: int, seconds: float = 0.0, error: str | None = None
    ) -> MemberOutcome:
        """A member without a result (it simply counts as missing)."""
        return cls(None, None, disposition, "none", version, seconds, None, error)


def outcome_status(collection: TrajectoryCollection | None) -> str:
    """The root's outcome status (`scored`, `invalid`, `error`, `timeout`, `cancelled`), `none` without one."""
    root = collection.root if collection is not None else None
    if root is None:
        return "none"
    outcome = root.misc.get("outcome")
    return str(outcome.get("status") or "none") if isinstance(outcome, Mapping) else "none"


def _reward_key(collection: TrajectoryCollection) -> str | None:
    root = collection.root
    outcome = root.misc.get("outcome") if root is not None else None
    key = outcome.get("reward_key") if isinstance(outcome, Mapping) else None
    return str(key) if key else None


def _write_json(path: Path, data: Any) -> None:
    # Atomic: a full disk leaves no half record that a resumed evaluation would stumble on.
    write_bytes_atomic(path, (json.dumps(data, indent=2, default=str) + "\n").encode("utf-8"))


def write_member_files(request: MemberRequest, outcome: MemberOutcome) -> None:
    """The event file of one rollout under its output dir, and with `record` its `trajectory_collection.json` and
    `metadata.json`."""
    if request.output_dir is None:
        return

    where = Path(request.output_dir)
    if outcome.collection is not None:
        if request.record:
            _write_json(where / "trajectory_collection.json", outcome.collection.to_dict())
        try:
            write_events(outcome.collection, where, task_id=request.task_id)
        except OSError as exc:  # the viewer's copy: a failure to write it only warns
            if exc.errno in NO_SPACE_ERRNOS:
                raise  # a full disk is the trainer's to report, once (FileWriter)
            log.warning("writing the event file of %s failed: %s", request.task_id, exc)
    if not request.record:
        return
    _write_json(
        where / "metadata.json",
        {
            "task_id": request.task_id,
            "label": request.label,
            "split": request.split,
            "rollout_index": request.rollout_number,
            "policy_version": outcome.version,
            "wall_time_seconds": round(outcome.seconds, 3),
            "disposition": outcome.disposition,
            "outcome_status": outcome.status,
            "reward_key": outcome.reward_key,
            "error": outcome.error,
            "status": "completed" if outcome.observed else "errored",
        },
    )


class FileWriter:
    """Writes rollout files on one background thread, so a group need not wait for its viewer files; `drain()`
    waits until everything handed to it is on disk (a trainer drains before it ends). `append_events` adds a
    rollout's events to its step's shared event file (training: one file per scope and step)."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="platoon-rollout-files")
        #: the first write a full disk refused; the trainer stops at the step boundary on it, with one line
        self.out_of_space: OSError | None = None

    def submit(self, request: MemberRequest, outcome: MemberOutcome) -> None:
        self._pool.submit(self._write, request, outcome)

    def append_events(
        self, path: str | Path, task_id: str, outcome: MemberOutcome, context: Mapping[str, Any] | None = None
    ) -> None:
        """Append the events of `outcome` (when it has a collection), each carrying `context`, to the shared event
        file `path`."""
        if outcome.collection is not None:
            self._pool.submit(self._append, Path(path), task_id, outcome.collection, context)

    def _write(self, request: MemberRequest, outcome: MemberOutcome) -> None:
        try:
            write_member_files(request, outcome)
        except OSError as exc:
            self._failed(exc, request.task_id, request.output_dir)

    def _append(
        self, path: Path, task_id: str, collection: TrajectoryCollection, context: Mapping[str, Any] | None
    ) -> None:
        try:
            append_events(collection, path, context=context)
        except OSError as exc:
            self._failed(exc, task_id, str(path))

    def _failed(self, exc: OSError, task_id: str, where: str | None) -> None:
        if exc.errno not in NO_SPACE_ERRNOS:
            log.warning("writing the rollout files of %s failed: %s", task_id, exc)
        elif self.out_of_space is None:
            if exc.filename is None:
                exc.filename = where  # a failed write() names no file: name where it went
            self.out_of_space = exc

    def raise_if_out_of_space(self) -> None:
        """Raise the one-line RunDirWriteError of the first write a full disk refused, if one did."""
        exc = self.out_of_space
        if exc is not None:
            raise RunDirWriteError(exc.filename or "a rollout file", exc)

    async def drain(self) -> None:
        await asyncio.to_thread(self._pool.shutdown, wait=True)


def _write_quietly(request: MemberRequest, outcome: MemberOutcome) -> None:
    try:
        write_member_files(request, outcome)
    except OSError as exc:
        log.warning("writing the rollout files of %s failed: %s", request.task_id, exc)


async def run_member(
    request: MemberRequest,
    *,
    service: Any,
    gateway: Any,
    version: Callable[[], int],
    writer: FileWriter | None = None,
) -> MemberOutcome:
    """Run one rollout of `request` on `gateway`; never raises but for cancellation.

    `version()` gives the policy version the member's samples come from, read when the rollout ends (in process
    the version when the request was built; a worker's following sampler reports the oldest version it sampled).
    The rollout's files (with an `output_dir`) are written before it returns, or by `writer` in the background.
    """
    started = time.monotonic()
    try:
        route = Route.from_entry(request.entry, split=request.split, task_id=request.raw_task_id)
        collection, recorder = await recorded_rollout(
            request.task,
            service=service,
            route=route,
            config=request.rollout_config,
            gateway=gateway,
            output_dir=request.output_dir,
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # one failed rollout is a missing member, never a trainer failure
        log.warning("rollout of %s failed: %s: %s", request.task_id, type(exc).__name__, exc)
        outcome = MemberOutcome.missing(
            "error",
            version=version(),
            seconds=time.monotonic() - started,
            error=f"{type(exc).__name__}: {exc}",
        )
    else:
        seconds = time.monotonic() - started
        if not collection.trajectories:
            outcome = MemberOutcome.missing("no_trajectories", version=version(), seconds=seconds)
        else:
            outcome = MemberOutcome(
                collection,
                dict(recorder.interactions),
                "completed",
                outcome_status(collection),
                version(),
                seconds,
                _reward_key(collection),
            )
    if request.output_dir is None:
        pass  # nothing to write here (training appends the events to its step's file itself)
    elif writer is not None:
        writer.submit(request, outcome)
    else:
        await asyncio.to_thread(_write_quietly, request, outcome)
    rollout_progress.note()
    return outcome
