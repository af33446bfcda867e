"""A rollout worker process (child side): `python -m platoon.rollouts.workers.worker <request>`,
or the same `main` in a child forked by the fork server.

It loads and unlinks its request, builds a gateway over the followed sampling client, writes the ready file, runs
`run_member` — the body the trainer runs in process — under the rollout alarm and an RSS/parent monitor, writes
the response atomically and ends the process groups the rollout started. Exit codes: 0 (response written), 87
(RSS limit), 88 (an alarm fired but the group kill did not end this process), 143 (stopped without a response),
2 (the request could not be loaded).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import pickle
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from platoon import rollout_progress
from platoon.envs.resolve import resolve_service
from platoon.gateway.core import ModelGateway
from platoon.hooks import hooks
from platoon.renderers.base import get_renderer
from platoon.renderers.tokenizers import get_tokenizer
from platoon.rollouts.one_rollout import MemberOutcome, run_member
from platoon.rollouts.workers import ipc
from platoon.rollouts.workers.binding import FollowingSampler, binding_newest, load_binding
from platoon.rollouts.workers.ipc import WorkerRequest
from platoon.rollouts.workers.response_patch import patch_response_models, response_patch_verified
from platoon.rollouts.workers.startup import (
    DIAG_ENV,
    STARTUP_BUDGET_ENV,
    process_start_wall_time,
    set_child_subreaper,
    set_parent_death_signal,
)
from platoon.sandbox_runs import carry_labels

__all__ = [
    "EXIT_ALARM_FALLBACK",
    "EXIT_BAD_REQUEST",
    "EXIT_RSS",
    "EXIT_TERMINATED",
    "exit_now",
    "main",
    "prepared_renderer",
]

# Named after the module, not `__name__`: an exec'd worker runs this module as `__main__`.
log = logging.getLogger("platoon.rollouts.workers.worker")

EXIT_RSS = 87
EXIT_ALARM_FALLBACK = 88
EXIT_TERMINATED = 143
EXIT_BAD_REQUEST = 2
#: the stop of a SIGTERM or a dead parent takes at most this long before the group is killed
TERMINATION_SECONDS = 8.0
#: how long the processes a rollout started get between SIGTERM and SIGKILL when it ends
GROUP_GRACE_SECONDS = 0.5

#: renderers the fork server built before forking, by (model, renderer, kwargs as JSON)
_PREPARED: dict[tuple[str, str, str], Any] = {}


def renderer_key(
    model_name: str, renderer_name: str, renderer_kwargs: Mapping[str, Any]
) -> tuple[str, str, str]:
    return (model_name, renderer_name, json.dumps(dict(renderer_kwargs), sort_keys=True, default=str))


def prepared_renderer(model_name: str, renderer_name: str, renderer_kwargs: Mapping[str, Any]) -> Any:
    """The renderer for this model and renderer, built once per process (the fork server builds it before forking,
    so forked workers share its tokenizer copy-on-write)."""
    key = renderer_key(model_name, renderer_name, renderer_kwargs)
    if key not in _PREPARED:
        tokenizer = get_tokenizer(model_name)
        _PREPARED[key] = get_renderer(renderer_name, tokenizer, renderer_kwargs=dict(renderer_kwargs) or None)
    return _PREPARED[key]


# --------------------------------------------------------------------------------------------------------------
# Memory


def _resident_bytes(pid: int | str) -> int:
    """A process's proportional share of resident memory (Pss), or its plain RSS where the kernel has no
    smaps_rollup.

    The share, because a child forked from the worker holds the worker's pages copy-on-write until it execs:
    summing plain RSS over the tree would count those pages twice and kill a worker for starting a subprocess.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_bytes() -> int:
    """The resident memory of this worker and every process below it, each shared page counted once."""
    return _resident_bytes("self") + sum(_resident_bytes(pid) for pid, _ in ipc.descendants(os.getpid()))


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --------------------------------------------------------------------------------------------------------------
# Processes the rollout started


def _below() -> tuple[set[int], set[int]]:
    """(process groups of our descendants other than ours, pids of descendants in our own group).

    The rollout's processes that started sessions of their own are ended by group; the ones left in ours one by
    one (a group kill would end this worker too). As the subreaper, we keep even orphaned descendants below us.
    """
    own = os.getpgrp()
    groups: set[int] = set()
    members: set[int] = set()
    for pid, pgid in ipc.descendants(os.getpid()):
        if pgid == own:
            members.add(pid)
        else:
            groups.add(pgid)
    return groups, members


def _signal_below(groups: set[int], members: set[int], sig: int) -> None:
    for pgid in groups:
        ipc.signal_group(pgid, sig)
    for pid in members:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def end_started_processes(*, grace: float) -> None:
    """SIGTERM every process below this worker, give them `grace`, then SIGKILL them (grace 0: SIGKILL at once)."""
    groups, members = _below()
    if not groups and not members:
        return
    if grace > 0:
        _signal_below(groups, members, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_below()):
            time.sleep(0.05)
    later_groups, later_members = _below()
    _signal_below(groups | later_groups, members | later_members, signal.SIGKILL)


# --------------------------------------------------------------------------------------------------------------
# The diag marker


class Diag:
    """The worker's `<req>.res.diag`: refreshed by the monitor, then a final `phase=` when the worker is stopped.

    Once a final phase is written, refreshes stop, so the parent reads why the worker ended.
    """

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self._lock = (
            threading.RLock()
        )  # re-entrant: a signal handler may interrupt a refresh on the main thread
        self.fields: dict[str, Any] = {"pid": os.getpid(), "stage": "startup"}
        self.final = False

    def _write(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))

    def update(self, **fields: Any) -> None:
        with self._lock:
            self.fields.update(fields)
            if not self.final:
                self._write(ipc.format_diag(self.fields))

    def preformat(self, phase: str, **fields: Any) -> bytes:
        """The final marker of `phase`, formatted now so a signal handler only has to write it."""
        return ipc.format_diag({"phase": phase, **self.fields, **fields})

    def finish(self, phase: str, data: bytes | None = None, **fields: Any) -> None:
        with self._lock:
            self._write(data if data is not None else self.preformat(phase, **fields))
            self.final = True


# --------------------------------------------------------------------------------------------------------------
# Hooks: plugin counters and diagnostic strings


def _hook_values(name: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for fn in hooks(name):
        try:
            got = fn()
        except Exception as exc:  # a broken plugin never fails a rollout
            log.warning(
                "the %s hook %r failed: %s: %s", name, getattr(fn, "__name__", fn), type(exc).__name__, exc
            )
            continue
        if isinstance(got, Mapping):
            values.update(got)
    return values


def hook_counters() -> dict[str, float]:
    counters: dict[str, float] = {}
    for key, value in _hook_values("rollout_worker.telemetry").items():
        with contextlib.suppress(TypeError, ValueError):
            counters[str(key)] = float(value)
    return counters


def hook_diagnostics() -> dict[str, str]:
    return {str(k): str(v) for k, v in _hook_values("rollout_worker.diagnostics").items()}


# --------------------------------------------------------------------------------------------------------------
# The worker


class Worker:
    """One worker's run: the request, its diag, its alarms and its monitor thread."""

    def __init__(self, request: WorkerRequest, diag: Diag, started_at: float) -> None:
        self.request = request
        self.diag = diag
        self.started_at = started_at  # time.time() of the real process start
        self.sampler: FollowingSampler | None = None
        self.gateway: Any = None
        self.task: asyncio.Task[Any] | None = None
        self.terminating = False
        self.response_written = False
        self.startup_seconds = 0.0
        self._alarm_deadline: float | None = None
        self._alarm_phase, self._alarm_budget = "", 0.0
        #: the marker the alarm writes, formatted ahead (a signal handler should only write), refreshed by the monitor
        self._alarm_marker = b""
        self._monitor_stop = threading.Event()

    # ---- alarms ------------------------------------------------------------------------------------------

    def arm_alarm(self, seconds: float, phase: str) -> None:
        """SIGALRM in `seconds`: write the `phase` marker, SIGKILL the rollout's groups and our own."""
        if seconds <= 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._alarm_deadline, self._alarm_phase = None, ""
            return
        self._alarm_phase, self._alarm_budget = phase, seconds
        self._alarm_marker = self.diag.preformat(phase, budget=f"{seconds:g}")
        self._alarm_deadline = time.monotonic() + seconds
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)

    def _on_alarm(self, signum: int, frame: object) -> None:
        self.die_by_alarm()

    def die_by_alarm(self) -> None:
        self.diag.finish("alarm", self._alarm_marker)
        with contextlib.suppress(Exception):
            end_started_processes(grace=0)
        with contextlib.suppress(OSError):
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(EXIT_ALARM_FALLBACK)

    # ---- the monitor -------------------------------------------------------------------------------------

    def start_monitor(self) -> None:
        threading.Thread(target=self._monitor, name="platoon-worker-monitor", daemon=True).start()

    def _parent_alive(self) -> bool:
        return ipc.is_running(self.request.trainer_pid, self.request.trainer_start_time)

    def _monitor(self) -> None:
        interval = max(0.05, self.request.monitor_interval_seconds)
        limit = self.request.rss_soft_limit_bytes
        while True:
            rss = tree_rss_bytes()
            fields: dict[str, Any] = {"rss": rss, "peak_rss": peak_rss_bytes(), "t": f"{time.time():.3f}"}
            if self.sampler is not None:
                fields["version"] = self.sampler.version
            fields["progress"] = rollout_progress.count()  # the trainer's watchdog follows it
            with contextlib.suppress(Exception):
                fields.update({f"count.{k}": v for k, v in hook_counters().items()})
                fields.update({f"note.{k}": v for k, v in hook_diagnostics().items()})
            self.diag.update(**fields)
            if self._alarm_phase:
                self._alarm_marker = self.diag.preformat(self._alarm_phase, budget=f"{self._alarm_budget:g}")
            if limit > 0 and rss > limit:
                log.error(
                    "the worker's resident memory %d bytes is above the soft limit %d: stopping", rss, limit
                )
                self.diag.finish("rss", limit=limit)
                with contextlib.suppress(Exception):
                    end_started_processes(grace=0)
                os._exit(EXIT_RSS)
            if not self.terminating and not self._parent_alive():
                log.warning("the trainer (pid %d) is gone: stopping", self.request.trainer_pid)
                os.kill(os.getpid(), signal.SIGTERM)
            # Backstop of the alarm: a main thread stuck in C code cannot run the SIGALRM handler.
            deadline = self._alarm_deadline
            if deadline is not None and time.monotonic() > deadline + 2 * interval:
                self.die_by_alarm()
            if self._monitor_stop.wait(interval):
                return

    # ---- termination -------------------------------------------------------------------------------------

    def on_terminate(self) -> None:
        """SIGTERM or a dead parent: refuse further calls, cancel the rollout, and die within 8 s whatever happens."""
        if self.terminating:
            return
        self.terminating = True
        log.warning("stopping on request")
        self.arm_alarm(TERMINATION_SECONDS, "terminated")
        if self.gateway is not None:
            self.gateway.shut_down()
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            asyncio.get_running_loop().create_task(self._recancel(task))

    async def _recancel(self, task: asyncio.Task[Any]) -> None:
        # A rollout that swallows one cancellation gets more, every 0.25 s after the first second.
        await asyncio.sleep(1.0)
        while not task.done():
            task.cancel()
            await asyncio.sleep(0.25)

    # ---- the response ------------------------------------------------------------------------------------

    def write_response(self, outcome: Any) -> None:
        sampler = self.sampler
        if sampler is not None and sampler.calls:  # in-flight: what each sample may have run on
            outcome.sampled = tuple(sampler.calls)
        response = ipc.WorkerResponse(
            protocol=ipc.PROTOCOL_VERSION,
            request_id=self.request.request_id,
            outcome=outcome,
            versions_sampled=sampler.versions_sampled if sampler is not None else (),
            startup_seconds=self.startup_seconds,
            peak_rss_bytes=peak_rss_bytes(),
            counters=hook_counters(),
            notes={
                "response_patch": "verified" if response_patch_verified() else "unverified",
                "telemetry": os.environ.get("TINKER_TELEMETRY", ""),
            },
        )
        try:
            data = pickle.dumps(response)
        except (
            Exception
        ) as exc:  # something in the result does not pickle: the member fails, the reason travels
            log.error("the rollout's result cannot be sent back: %s: %s", type(exc).__name__, exc)
            response.outcome = MemberOutcome.missing(
                "error",
                version=outcome.version,
                seconds=outcome.seconds,
                error=f"the rollout's result cannot be sent back: {type(exc).__name__}: {exc}",
            )
            data = pickle.dumps(response)
        ipc.write_private(Path(self.request.paths.response), data)
        self.response_written = True

    # ---- the run -----------------------------------------------------------------------------------------

    def build(self) -> tuple[Any, Any]:
        """Import the stack, build the gateway over the followed client and the entry's service."""
        marks = [("start", time.perf_counter())]
        import tinker  # noqa: F401  (the SDK, before the patch that rebinds its response models)

        if not patch_response_models():
            log.warning("the response-model patch could not be verified: routing ids may be lost")
        if (
            "torch" in sys.modules
        ):  # only where something already brought it in: importing torch costs seconds
            with contextlib.suppress(Exception):
                sys.modules["torch"].set_num_threads(1)
        request = self.request
        member = request.member
        marks.append(("stack", time.perf_counter()))
        for package in (*request.environment_packages, member.entry.package):
            if package:
                importlib.import_module(package)
        marks.append(("packages", time.perf_counter()))
        spec = request.binding
        renderer = prepared_renderer(spec.model_name, spec.renderer_name, spec.renderer_kwargs)
        marks.append(("renderer", time.perf_counter()))
        client, version = load_binding(spec.bootstrap)
        marks.append(("client", time.perf_counter()))
        self.sampler = FollowingSampler(
            spec.path, client=client, version=version, poll_seconds=spec.poll_seconds
        )
        # in-flight: the rollout keeps this client; new weights come to it
        self.sampler.follow_inflight(binding_newest(spec.bootstrap))
        self.gateway = ModelGateway(
            self.sampler,
            renderer,
            model_name=spec.model_name,
            context_window_length=spec.context_window_length,
            sample_timeout_seconds=spec.sample_timeout_seconds,
            **dict(spec.sampling_defaults),
        )
        # The kwargs the trainer built the service with; a request without them gets the entry's own.
        marks.append(("gateway", time.perf_counter()))
        service = resolve_service(
            member.entry.service, dict(member.service_kwargs or member.entry.service_kwargs)
        )
        marks.append(("service", time.perf_counter()))
        log.info(
            "started in %s",
            ", ".join(f"{name} {1000 * (t - marks[i][1]):.1f} ms" for i, (name, t) in enumerate(marks[1:])),
        )
        return self.gateway, service

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        request = self.request
        member = request.member
        try:
            gateway, service = self.build()
        except Exception as exc:  # the member fails with the reason; the worker itself worked
            log.error("the rollout could not start: %s: %s", type(exc).__name__, exc)
            self.write_response(
                MemberOutcome.missing(
                    "error", version=request.binding.version, error=f"{type(exc).__name__}: {exc}"
                )
            )
            return 0
        # Until here a SIGTERM ended the process at once; from now on it stops the rollout gracefully.
        loop.add_signal_handler(signal.SIGTERM, self.on_terminate)
        self.startup_seconds = max(0.0, time.time() - self.started_at)
        ready = ipc.format_diag({"startup_seconds": f"{self.startup_seconds:.4f}", "pid": os.getpid()})
        ipc.write_private(Path(request.paths.ready), ready)
        self.diag.update(stage="rollout", startup_seconds=f"{self.startup_seconds:.3f}")
        if not self.terminating:
            self.arm_alarm(request.rollout_budget_seconds, "rollout")
        self.start_monitor()
        sampler = self.sampler
        assert sampler is not None
        self.task = loop.create_task(
            run_member(member, service=service, gateway=gateway, version=sampler.oldest_version)
        )
        if self.terminating:  # a SIGTERM during startup
            self.task.cancel()
        outcome: Any = None
        try:
            outcome = await self.task
        except asyncio.CancelledError:
            outcome = None
        self.diag.update(stage="finalize")
        if outcome is not None:
            self.write_response(outcome)
        self._monitor_stop.set()
        end_started_processes(grace=GROUP_GRACE_SECONDS)
        if self.response_written:
            signal.setitimer(signal.ITIMER_REAL, 0)
            return 0
        self.diag.finish("terminated")
        return EXIT_TERMINATED


def _load_request(path: str) -> WorkerRequest:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    finally:
        # unlinked at once: it carries the key inside the pickled sampling client
        with contextlib.suppress(OSError):
            os.unlink(path)
    request = pickle.loads(data)
    if not isinstance(request, WorkerRequest):
        raise ValueError(f"{path} is not a rollout-worker request")
    if request.protocol != ipc.PROTOCOL_VERSION:
        raise ValueError(
            f"the request speaks worker protocol {request.protocol}, this worker {ipc.PROTOCOL_VERSION}"
        )
    return request


def _startup_terminate(diag: Diag) -> Callable[[int, object], None]:
    def handler(signum: int, frame: object) -> None:
        diag.finish("terminated")
        os._exit(EXIT_TERMINATED)

    return handler


def main(argv: list[str] | None = None, *, forked: bool = False) -> int:
    """Run the worker of the request file `argv[0]`; returns the exit status (the caller `os._exit`s with it)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m platoon.rollouts.workers.worker REQUEST_FILE", file=sys.stderr)
        return EXIT_BAD_REQUEST
    # force: a forked worker replaces the fork server's handlers with its own (on its own log file)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    started_at = process_start_wall_time() or time.time()
    os.environ.pop(STARTUP_BUDGET_ENV, None)  # descendants must not re-arm our startup alarm
    diag_path = os.environ.get(DIAG_ENV)
    try:
        request = _load_request(args[0])
    except Exception as exc:
        print(
            f"platoon: the rollout-worker request cannot be loaded: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        if diag_path:
            with contextlib.suppress(OSError):
                ipc.write_private(Path(diag_path), ipc.format_diag({"phase": "launch", "pid": os.getpid()}))
        return EXIT_BAD_REQUEST
    diag = Diag(request.paths.diag)
    # the run's label and this worker's: every sandbox the rollout starts carries them
    carry_labels(request.sandbox_labels)
    signal.signal(signal.SIGTERM, _startup_terminate(diag))
    if os.getsid(0) != os.getpid():
        with contextlib.suppress(OSError):
            os.setsid()
    set_child_subreaper()
    if not forked and not set_parent_death_signal(signal.SIGTERM, expected_parent=request.trainer_pid):
        diag.finish("terminated")
        return EXIT_TERMINATED
    worker = Worker(request, diag, started_at)
    if request.startup_budget_seconds > 0:
        # measured from the real process start, which an exec start reaches long before this line
        remaining = request.startup_budget_seconds - (time.time() - started_at)
        worker.arm_alarm(max(0.01, remaining), "startup")
    log.info("rollout worker %s for %s (pid %d)", request.request_id, request.member.task_id, os.getpid())
    # A loop of our own rather than asyncio.run: the process exits right after, so tasks the rollout left
    # behind are abandoned instead of awaited (one that ignores cancellation would hold the exit forever).
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    code = loop.run_until_complete(worker.run())
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # past the point where a stop could change anything
    return code


def exit_now(code: int) -> None:
    """Flush the logs and streams and leave at once (no atexit handlers, no interpreter teardown)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
