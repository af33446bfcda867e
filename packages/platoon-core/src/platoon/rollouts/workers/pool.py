"""The supervisor's side of rollout workers (parent): `RolloutWorkers` launches one worker process
per member, follows it to its response or its end, and turns what it left into a `MemberOutcome`.

Classification is response-first: a readable response of this request wins over any exit status or kill. A
member's failure is a missing group member, never a trainer failure: `run` never raises but for cancellation,
which still ends the worker's process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import select
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon import rollout_progress
from platoon.errors import PlatoonError
from platoon.rollouts.one_rollout import MemberOutcome
from platoon.rollouts.workers import ipc
from platoon.rollouts.workers.binding import publish_binding
from platoon.rollouts.workers.forkserver import ForkFailed, ForkServer, ForkServerUnavailable
from platoon.rollouts.workers.startup import ExecFailed, exec_child, worker_environment
from platoon.rollouts.workers.worker import EXIT_RSS

if TYPE_CHECKING:
    from platoon.config.training import WorkflowConfig
    from platoon.config_defs import RolloutConfig
    from platoon.rollouts.one_rollout import MemberRequest

__all__ = ["MAX_FORK_SERVERS", "WORKER_MODULE", "RolloutWorkers", "classify_exit", "rollout_budget_seconds"]

log = logging.getLogger(__name__)

WORKER_MODULE = "platoon.rollouts.workers.worker"
#: fork servers one supervisor starts over its life; after that, workers start by exec
MAX_FORK_SERVERS = 4
#: how long a killed worker may take to go after SIGKILL
KILL_WAIT_SECONDS = 30.0
#: how often the parent reads a running worker's progress count (its diag) for the training watchdog
PROGRESS_POLL_SECONDS = 2.0
#: environment variables whose change makes a new fork server (they change what the server imported)
_IMPORT_VARIABLES = ("PATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD")
TELEMETRY_KEYS = (
    "wall_seconds",
    "launch_seconds",
    "killed",
    "launch_retried",
    "hard_timeout",
    "crashed",
    "oom",
    "launch_failed",
    "startup_seconds",
    "peak_rss_bytes",
    "routing_id_coverage",
)


def rollout_budget_seconds(
    rollout_config: RolloutConfig,
    workflow: WorkflowConfig,
    *,
    harness_limit_seconds: float | None = None,
    environment_overhead_seconds: float | None = None,
) -> float:
    """The seconds a worker's rollout may take; 0 means no limit.

    `rollout_config.timeout` + the environment's overhead + `worker_finalize_grace_seconds`; without a timeout,
    the harness's own limit + overhead + grace, but only when the environment says what it needs beyond the
    harness; otherwise `worker_unbounded_rollout_budget_seconds`.
    """
    grace = workflow.worker_finalize_grace_seconds
    timeout = getattr(rollout_config, "timeout", None)
    if timeout is not None:
        return float(timeout) + (environment_overhead_seconds or 0.0) + grace
    if harness_limit_seconds is not None and environment_overhead_seconds is not None:
        return harness_limit_seconds + environment_overhead_seconds + grace
    return float(workflow.worker_unbounded_rollout_budget_seconds)


def classify_exit(*, returncode: int | None, phase: str | None, deadline_fired: bool) -> str:
    """The disposition of a worker that left no readable response."""
    if returncode == EXIT_RSS or phase == "rss":
        return "rollout_worker_oom"
    if phase in ("startup", "rollout"):
        return "hard_timeout"
    if phase == "terminated":
        return "hard_timeout" if deadline_fired else "worker_crashed"
    if phase == "launch":  # the worker could not load its request
        return "worker_launch_failed"
    if deadline_fired:
        log.warning("a rollout worker passed its deadline without leaving a marker")
        return "hard_timeout"
    if returncode != 0:
        return "worker_crashed"
    return "worker_launch_failed"


class _LaunchFailed(Exception):
    """A failure before the worker process existed: retried once with a fresh request id."""


@dataclass
class _Live:
    """A worker process: its identity captured at launch, so signals never reach a recycled pid."""

    request_id: str
    pid: int
    pidfd: int
    start_time: int | None
    method: str
    files: dict[str, Path]
    exited: asyncio.Future[int | None]
    popen: subprocess.Popen[bytes] | None = None
    server: ForkServer | None = None
    record: Path | None = None
    killed: bool = False

    @property
    def pgid(self) -> int:
        return self.pid  # a worker leads its own session and group

    def signal(self, sig: int) -> None:
        """`sig` to the worker and its group while it runs; once it exited, the exit handling (ours for exec,
        the fork server's for forked workers) kills what is left of its group before the reap."""
        if self.exited.done() or pidfd_exited(self.pidfd):
            return
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, sig)
        ipc.signal_group(self.pgid, sig)


@dataclass
class _Telemetry:
    values: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TELEMETRY_KEYS[:-1], 0.0))

    def set(self, key: str, value: float) -> None:
        self.values[key] = float(value)

    def scalars(self) -> dict[str, float]:
        return {f"rollout_worker_{key}": value for key, value in self.values.items()}


class RolloutWorkers:
    """One OS process per rollout (`rollout_isolation: process`), forked from a fork server or started by exec.

    `start()` before anything; `publish(sampler, version)` before the first `run`, and again after each sampler
    refresh; `close()` at the end. Call them from the thread that runs the trainer's event loop for its whole
    life: a worker's parent-death signal follows the thread that started it.
    """

    def __init__(
        self,
        *,
        run_dir: Path,
        workflow: WorkflowConfig,
        model_name: str,
        renderer_name: str,
        renderer_kwargs: Mapping[str, Any],
        context_window_length: int | None,
        sample_timeout_seconds: float,
        environment_packages: Sequence[str],
        labels: Mapping[str, str],
        sampling_defaults: Mapping[str, Any] | None = None,
        services: Sequence[str] = (),
        monitor_interval_seconds: float = 2.0,
    ) -> None:
        if workflow.worker_python_env_isolation:
            raise ipc.WorkerSetupError(
                "workflow_config.worker_python_env_isolation is not available in this build: set it to false"
            )
        self.run_dir = Path(run_dir)
        self.workflow = workflow
        self.model_name = model_name
        self.renderer_name = renderer_name
        self.renderer_kwargs = dict(renderer_kwargs)
        self.context_window_length = context_window_length
        self.sample_timeout_seconds = float(sample_timeout_seconds)
        self.environment_packages = tuple(dict.fromkeys(p for p in environment_packages if p))
        self.labels = dict(labels)
        self.sampling_defaults = dict(sampling_defaults or {})
        #: the entries' services (names or URIs), resolved once in the fork server
        self.services = tuple(dict.fromkeys(s for s in services if s))
        self.monitor_interval_seconds = monitor_interval_seconds
        self.scratch: Path | None = None
        self.session: Path | None = None
        self.fork_servers_started = 0
        self._server: ForkServer | None = None
        self._server_key: tuple[Any, ...] | None = None
        self._retired: list[ForkServer] = []
        self._server_lock: asyncio.Lock | None = None
        self._live: dict[str, _Live] = {}
        self._blob: bytes | None = None
        self._version = 0
        self._trainer = (os.getpid(), ipc.start_time_of(os.getpid()))
        self._host = socket.gethostname()
        self._warned: set[str] = set()
        #: whether any worker's samples carried routing ids (the service sends them)
        self._routing_ids_seen = False
        self._closed = False
        #: what fork servers import before forking: the run's packages and services, and those of entries seen since
        self._prepared_packages: dict[str, None] = dict.fromkeys(self.environment_packages)
        self._prepared_services: dict[str, None] = dict.fromkeys(self.services)

    # ---- life cycle --------------------------------------------------------------------------------------

    @property
    def binding_path(self) -> Path:
        if self.session is None:
            raise RuntimeError("RolloutWorkers.start() has not run")
        return self.session / ipc.BINDING_FILE

    @property
    def fork_server(self) -> ForkServer | None:
        """The fork server new workers are forked from (None: they start by exec)."""
        return self._server

    async def start(self) -> None:
        """Set up the scratch dir, sweep orphans of dead trainers and stale files, start the fork server."""
        self.scratch = ipc.scratch_dir()
        swept = await asyncio.to_thread(ipc.sweep_orphans, self.scratch)
        if swept:
            log.warning("stopped %d orphaned rollout worker(s) of trainers that are gone", swept)
        await asyncio.to_thread(ipc.sweep_stale_files, self.scratch)
        self.session = ipc.new_session_dir(self.scratch)
        self._server_lock = asyncio.Lock()
        if self.workflow.worker_start_method == "forkserver":
            async with self._server_lock:
                await self._start_server()

    def publish(
        self, sampler: Any, version: int, *, newest: int | None = None, inflight: bool = False
    ) -> None:
        """Publish the sampling client workers sample from; the first publication failing is fatal. `inflight`:
        an in-flight client, which running rollouts keep; `newest` the newest version that may be live under it."""
        try:
            self._blob = publish_binding(
                self.binding_path, sampler, version, newest=newest, inflight=inflight
            )
        except RuntimeError:
            raise
        except Exception as exc:
            if self._blob is None:  # workers could never sample: the run cannot go on (exit 1)
                raise PlatoonError(
                    f"the sampling client cannot be handed to rollout workers: {type(exc).__name__}: {exc}"
                ) from None
            log.warning(
                "publishing policy version %d to the rollout workers failed (%s: %s); they keep version %d",
                version,
                type(exc).__name__,
                exc,
                self._version,
            )
            return
        self._version = int(version)

    async def close(self) -> None:
        """Stop every live worker (SIGTERM, grace, SIGKILL), then the fork servers; remove this session's files.

        Members still running get the outcome of their killed worker; no member starts a worker afterwards.
        """
        self._closed = True
        await asyncio.gather(
            *(self._stop(live) for live in list(self._live.values())), return_exceptions=True
        )
        servers = [s for s in (self._server, *self._retired) if s is not None]
        self._server, self._retired = None, []
        for server in servers:
            await server.stop()
        if self.scratch is not None:
            for path in (self.scratch / ipc.REGISTRY_DIR).glob(f"forkserver-*-{self._session_token()}.json"):
                ipc.unregister(path)
        if self.session is not None:
            shutil.rmtree(self.session, ignore_errors=True)

    def terminate_all(self) -> None:
        """SIGTERM every live worker and fork server now (sync: the watchdog and hard exits call it)."""
        for live in _snapshot(self._live):
            live.killed = True
            live.signal(signal.SIGTERM)
        for server in (self._server, *self._retired):
            if server is not None:
                server.terminate()

    # ---- fork servers ------------------------------------------------------------------------------------

    def _session_token(self) -> str:
        return self.session.name if self.session is not None else ""

    def _server_environment(self) -> tuple[dict[str, str], tuple[Any, ...]]:
        env = worker_environment(os.environ)
        cwd = os.getcwd()
        key = (
            cwd,
            tuple(sorted((k, v) for k, v in env.items() if k.startswith("PYTHON") or k in _IMPORT_VARIABLES)),
        )
        return env, key

    async def _start_server(self) -> ForkServer | None:
        if self.fork_servers_started >= MAX_FORK_SERVERS or self.session is None or self.scratch is None:
            return None
        self.fork_servers_started += 1
        env, key = self._server_environment()
        log_path = self.session / f"forkserver-{self.fork_servers_started}.log"
        config = {
            "model_name": self.model_name,
            "renderer_name": self.renderer_name,
            "renderer_kwargs": self.renderer_kwargs,
            "environment_packages": list(self._prepared_packages),
            "services": list(self._prepared_services),
        }
        budget = self.workflow.worker_startup_budget_seconds
        try:
            server = await ForkServer.start(
                config=config, env=env, cwd=key[0], log_path=log_path, timeout=budget if budget > 0 else 300.0
            )
        except ForkServerUnavailable as exc:
            log.warning("%s; rollout workers start by exec", exc)
            return None
        for problem in server.prepare_errors:
            log.warning("fork server: %s", problem)
        ipc.register(
            self.scratch,
            ipc.RegistryRecord(
                kind="forkserver",
                pid=server.pid,
                pgid=server.pid,
                start_time=ipc.start_time_of(server.pid),
                trainer_pid=self._trainer[0],
                trainer_start_time=self._trainer[1],
                request_id=self._session_token(),
                host=self._host,
            ),
        )
        log.info("fork server pid %d ready in %.2fs", server.pid, server.seconds)
        self._server, self._server_key = server, key
        return server

    async def _warm(self, server: ForkServer, request: MemberRequest) -> None:
        """Before the first fork of a service or package the server did not prepare, have it import them: one
        import in the server instead of one in every worker (an ORS SDK takes seconds)."""
        entry = request.entry
        services = [s for s in (entry.service,) if s and s not in self._prepared_services]
        packages = [p for p in (entry.package,) if p and p not in self._prepared_packages]
        if services or packages:
            self._prepared_services.update(
                dict.fromkeys(services)
            )  # later fork servers start with them prepared
            self._prepared_packages.update(dict.fromkeys(packages))
            await server.warm(services=services, packages=packages)

    async def _server_for_launch(self) -> ForkServer | None:
        if self.workflow.worker_start_method != "forkserver" or self._server_lock is None:
            return None
        async with self._server_lock:
            server = self._server
            if server is not None and server.alive and self._server_environment()[1] == self._server_key:
                return server
            if server is not None:
                self._server = None
                if server.alive:  # the environment or cwd changed: it finishes its workers, forks no more
                    await server.retire()
                    self._retired.append(server)
                else:
                    log.warning("the fork server (pid %d) is gone; see %s", server.pid, server.log_path)
            return await self._start_server()

    # ---- one member --------------------------------------------------------------------------------------

    async def run(
        self,
        request: MemberRequest,
        *,
        scope: str,
        on_ready: Callable[[], None] | None = None,
        budget_seconds: float | None = None,
    ) -> MemberOutcome:
        """Run `request` in a worker process; never raises but for cancellation (which kills the worker's group).

        `on_ready` is called once, when the worker is ready or gone. `budget_seconds` overrides the rollout
        budget (`rollout_budget_seconds`) of this member.
        """
        started = time.monotonic()
        version = self._version
        telemetry = _Telemetry()
        notified = False

        def ready() -> None:
            nonlocal notified
            if not notified:
                notified = True
                if on_ready is not None:
                    try:
                        on_ready()
                    except Exception as exc:
                        log.warning("on_ready failed: %s: %s", type(exc).__name__, exc)

        try:
            outcome = await self._run(request, scope, version, budget_seconds, telemetry, ready, started)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug on this side must not fail the trainer either
            log.exception("running a rollout worker for %s failed", request.task_id)
            telemetry.set("crashed", 1)
            outcome = MemberOutcome.missing(
                "worker_crashed", version=version, error=f"{type(exc).__name__}: {exc}"
            )
        finally:
            ready()
        telemetry.set("wall_seconds", time.monotonic() - started)
        outcome.seconds = outcome.seconds or time.monotonic() - started
        outcome.telemetry.update(telemetry.scalars())
        return outcome

    async def _run(
        self,
        request: MemberRequest,
        scope: str,
        version: int,
        budget_seconds: float | None,
        telemetry: _Telemetry,
        ready: Callable[[], None],
        started: float,
    ) -> MemberOutcome:
        if self._blob is None or self.session is None:
            raise RuntimeError("RolloutWorkers.start() and publish() come before run()")
        if self._closed:
            return MemberOutcome.missing(
                "worker_launch_failed", version=version, error="the rollout workers are closed"
            )
        budget = (
            budget_seconds
            if budget_seconds is not None
            else rollout_budget_seconds(request.rollout_config, self.workflow)
        )
        worker_dir = self.run_dir / "rollouts" / scope / str(version) / "workers"
        worker_dir.mkdir(parents=True, exist_ok=True)
        live: _Live | None = None
        for attempt in (1, 2):
            request_id = ipc.new_request_id(request.task_id, request.rollout_number)
            launch = asyncio.ensure_future(self._launch(request, request_id, budget, worker_dir))
            try:
                live = await asyncio.shield(launch)
                break
            except asyncio.CancelledError:
                # Cancelled while launching: whatever started must still end.
                with contextlib.suppress(BaseException):
                    started_live = await launch
                    try:
                        await self._stop(started_live)
                    finally:
                        self._finish(started_live)
                raise
            except _LaunchFailed as exc:
                self._remove_files(request_id)
                if attempt == 1 and not self._closed:
                    log.warning(
                        "launching a rollout worker for %s failed (%s); retrying once", request.task_id, exc
                    )
                    telemetry.set("launch_retried", 1)
                    await asyncio.sleep(1.0)
                    continue
                again = " again" if attempt == 2 else ""
                log.warning("launching a rollout worker for %s failed%s: %s", request.task_id, again, exc)
                telemetry.set("launch_failed", 1)
                return MemberOutcome.missing(
                    "worker_launch_failed",
                    version=version,
                    seconds=time.monotonic() - started,
                    error=f"the worker could not be launched: {exc}",
                )
        assert live is not None
        telemetry.set("launch_seconds", time.monotonic() - started)
        if self._closed:  # closed while this one launched: it must not outlive the close
            await self._stop(live)
        try:
            return await self._follow(live, request, version, budget, telemetry, ready)
        except asyncio.CancelledError:
            await self._stop_shielded(live)
            telemetry.set("killed", 1)
            raise
        finally:
            self._finish(live)

    def _memory_refusal(self) -> str | None:
        floor = self.workflow.worker_mem_available_floor_bytes
        if floor <= 0:
            return None
        available = _mem_available_bytes()
        if available is not None and available < floor:
            return (
                f"MemAvailable is {available} bytes, below workflow_config.worker_mem_available_floor_bytes "
                f"({floor})"
            )
        return None

    async def _launch(
        self, request: MemberRequest, request_id: str, budget: float, worker_dir: Path
    ) -> _Live:
        assert self.session is not None and self.scratch is not None and self._blob is not None
        if self._closed:
            raise _LaunchFailed("the rollout workers are closed")
        refusal = self._memory_refusal()
        if refusal is not None:
            raise _LaunchFailed(refusal)
        files = {
            "request": self.session / f"{request_id}.req",
            "response": self.session / f"{request_id}.res",
            "ready": self.session / f"{request_id}.ready",
            "diag": self.session / f"{request_id}.res.diag",
            "log": worker_dir / f"{request_id}.log",
        }
        workflow = self.workflow
        worker_request = ipc.WorkerRequest(
            protocol=ipc.PROTOCOL_VERSION,
            request_id=request_id,
            member=request,
            binding=ipc.BindingSpec(
                path=str(self.binding_path),
                bootstrap=self._blob,
                poll_seconds=workflow.worker_binding_poll_seconds,
                model_name=self.model_name,
                renderer_name=self.renderer_name,
                renderer_kwargs=self.renderer_kwargs,
                context_window_length=self.context_window_length,
                sample_timeout_seconds=self.sample_timeout_seconds,
                sampling_defaults=self.sampling_defaults,
                version=self._version,
            ),
            paths=ipc.WorkerPaths(
                response=str(files["response"]),
                ready=str(files["ready"]),
                diag=str(files["diag"]),
                log=str(files["log"]),
            ),
            startup_budget_seconds=workflow.worker_startup_budget_seconds,
            rollout_budget_seconds=budget,
            rss_soft_limit_bytes=workflow.worker_rss_soft_limit_bytes,
            monitor_interval_seconds=self.monitor_interval_seconds,
            environment_packages=self.environment_packages,
            sandbox_labels={**self.labels, "platoon.worker": request_id},
            trainer_pid=self._trainer[0],
            trainer_start_time=self._trainer[1],
        )
        try:
            ipc.write_private(files["request"], pickle.dumps(worker_request))
        except Exception as exc:
            raise _LaunchFailed(f"writing the request failed: {type(exc).__name__}: {exc}") from None
        env = worker_environment(
            os.environ, startup_budget=workflow.worker_startup_budget_seconds, diag_path=str(files["diag"])
        )
        cwd = os.getcwd()
        loop = asyncio.get_running_loop()
        server = await self._server_for_launch()
        if server is not None:
            await self._warm(server, request)
            try:
                pid, pidfd = await server.fork(
                    request_id, request=str(files["request"]), log=str(files["log"]), cwd=cwd, env=env
                )
            except ForkFailed as exc:
                if "fork_failed" not in self._warned:
                    self._warned.add("fork_failed")
                    log.warning("the fork server could not fork a worker (%s); starting it by exec", exc)
                else:
                    log.info("the fork server could not fork %s (%s); starting it by exec", request_id, exc)
                server.forget(request_id)
                server = None
            else:
                exited: asyncio.Future[int | None] = loop.create_future()
                live = _Live(
                    request_id, pid, pidfd, ipc.start_time_of(pid), "forkserver", files, exited, server=server
                )
                loop.add_reader(pidfd, self._on_forked_exit, live)
                return self._registered(live)
        try:
            # From the event loop's thread, like the fork server: see the class docstring.
            popen = exec_child(
                WORKER_MODULE, str(files["request"]), log=files["log"], env=env, cwd=cwd, what="worker"
            )
        except ExecFailed as exc:
            raise _LaunchFailed(str(exc)) from None
        pidfd = os.pidfd_open(popen.pid)
        exited = loop.create_future()
        live = _Live(
            request_id, popen.pid, pidfd, ipc.start_time_of(popen.pid), "exec", files, exited, popen=popen
        )
        loop.add_reader(pidfd, exec_child_exited, live)
        return self._registered(live)

    def _registered(self, live: _Live) -> _Live:
        assert self.scratch is not None
        self._live[live.request_id] = live
        with contextlib.suppress(OSError):
            live.record = ipc.register(
                self.scratch,
                ipc.RegistryRecord(
                    kind="worker",
                    pid=live.pid,
                    pgid=live.pgid,
                    start_time=live.start_time,
                    trainer_pid=self._trainer[0],
                    trainer_start_time=self._trainer[1],
                    request_id=live.request_id,
                    host=self._host,
                ),
            )
        return live

    def _on_forked_exit(self, live: _Live) -> None:
        live_status = asyncio.get_running_loop().create_task(forked_child_exited(live, live.request_id))
        live_status.add_done_callback(lambda _t: None)

    async def _follow(
        self,
        live: _Live,
        request: MemberRequest,
        version: int,
        budget: float,
        telemetry: _Telemetry,
        ready: Callable[[], None],
    ) -> MemberOutcome:
        """Wait for the worker's ready file and its exit under the parent deadline, then classify."""
        workflow = self.workflow
        launched = time.monotonic()
        startup = workflow.worker_startup_budget_seconds
        grace = workflow.worker_parent_grace_seconds
        deadline = launched + startup + grace if startup > 0 else float("inf")
        ready_at: float | None = None
        deadline_fired = False
        seen_progress: str | None = None
        while not live.exited.done():
            now = time.monotonic()
            if ready_at is None and live.files["ready"].exists():
                ready_at = now
                telemetry.set("startup_seconds", now - launched)
                rollout_progress.note()
                ready()
                deadline = now + budget + grace if budget > 0 else float("inf")
            if now >= deadline:
                deadline_fired = True
                log.warning(
                    "the rollout worker of %s passed its deadline (%s budget + %gs grace): stopping it",
                    request.task_id,
                    "rollout" if ready_at is not None else "startup",
                    grace,
                )
                telemetry.set("killed", 1)
                await self._stop(live)
                break
            if ready_at is not None:
                # The worker's progress (its diag's count of answered model and tool calls) is the trainer's
                # too: the training watchdog beats only while some rollout moves.
                progress = ipc.read_diag(live.files["diag"]).get("progress")
                if progress is not None and progress != seen_progress:
                    seen_progress = progress
                    rollout_progress.note()
            # The ready file is polled, fast at first (most forked workers are ready within milliseconds).
            wait = (
                PROGRESS_POLL_SECONDS if ready_at is not None else (0.005 if now - launched < 1.0 else 0.05)
            )
            await asyncio.wait({live.exited}, timeout=min(wait, max(0.0, deadline - now)))
        if ready_at is None:
            telemetry.set("startup_seconds", time.monotonic() - launched)
        returncode = live.exited.result() if live.exited.done() else None
        response = ipc.read_response(live.files["response"], live.request_id)
        if response is not None:
            outcome = response.outcome
            if response.startup_seconds:
                telemetry.set("startup_seconds", response.startup_seconds)
            telemetry.set("peak_rss_bytes", response.peak_rss_bytes)
            outcome.telemetry.update(response.counters)
            self._warn_once_from(response)
            coverage = _routing_id_coverage(outcome)
            if coverage is not None:
                telemetry.set("routing_id_coverage", coverage)
                self._check_routing_ids(coverage)
            return outcome
        diag = ipc.read_diag(live.files["diag"])
        phase = diag.get("phase")
        disposition = classify_exit(returncode=returncode, phase=phase, deadline_fired=deadline_fired)
        with contextlib.suppress(ValueError):
            telemetry.set("peak_rss_bytes", float(diag.get("peak_rss", 0)))
        counters = {}
        for key, value in diag.items():
            if key.startswith("count."):
                with contextlib.suppress(ValueError):
                    counters[key[len("count.") :]] = float(value)
        flag = {"hard_timeout": "hard_timeout", "worker_crashed": "crashed", "rollout_worker_oom": "oom"}
        if disposition in flag:
            telemetry.set(flag[disposition], 1)
        if disposition == "worker_launch_failed":
            telemetry.set("launch_failed", 1)
        what = f"phase {phase}" if phase else "no marker"
        error = f"the worker ended with status {returncode} ({what}) and no response; its log: {live.files['log']}"
        log.warning("rollout of %s: %s: %s", request.task_id, disposition, error)
        outcome = MemberOutcome.missing(disposition, version=version, error=error)
        outcome.telemetry.update(counters)
        return outcome

    def _check_routing_ids(self, coverage: float) -> None:
        """Warn once when routing ids get lost: some of a worker's samples have one and others not, or a service
        seen sending them sent a worker none. A service that sends none at all (the local server, which has no
        expert routing to replay) is not warned about; `rollout_worker_routing_id_coverage` records it."""
        if coverage > 0:
            self._routing_ids_seen = True
        if coverage < 1 and self._routing_ids_seen and "routing" not in self._warned:
            self._warned.add("routing")
            log.warning(
                "platoon: routing ids are missing from %.0f%% of a rollout worker's samples though the service "
                "sends them; the response-model patch may not be in effect in that worker",
                100 * (1 - coverage),
            )

    def _warn_once_from(self, response: ipc.WorkerResponse) -> None:
        notes = response.notes
        if notes.get("response_patch") == "unverified" and "patch" not in self._warned:
            self._warned.add("patch")
            log.warning("a rollout worker could not verify the response-model patch: routing ids may be lost")
        if notes.get("telemetry", "0") not in ("0", "") and "telemetry" not in self._warned:
            self._warned.add("telemetry")
            log.warning(
                "Tinker telemetry was not disabled in a rollout worker (TINKER_TELEMETRY=%s)",
                notes["telemetry"],
            )

    # ---- stopping and cleaning up ------------------------------------------------------------------------

    async def _stop(self, live: _Live) -> None:
        """SIGTERM the worker's group, wait the termination grace, SIGKILL it, wait for it to go."""
        if live.exited.done():
            return
        live.killed = True
        live.signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.shield(live.exited), self.workflow.worker_termination_grace_seconds
            )
            return
        live.signal(signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(live.exited), KILL_WAIT_SECONDS)
            return
        log.error("the rollout worker pid %d did not go after SIGKILL", live.pid)

    async def _stop_shielded(self, live: _Live) -> None:
        """`_stop` that a second cancellation cannot cut short of its SIGKILL."""
        stopping = asyncio.ensure_future(self._stop(live))
        try:
            await asyncio.shield(stopping)
        except asyncio.CancelledError:
            live.signal(signal.SIGKILL)
            raise

    def _finish(self, live: _Live) -> None:
        self._live.pop(live.request_id, None)
        ipc.unregister(live.record)
        if live.exited.done():
            with contextlib.suppress(OSError):
                os.close(live.pidfd)
        else:
            # still running (only after a failed SIGKILL): keep watching it so the fd closes with its exit
            live.exited.add_done_callback(lambda _f: _close_quietly(live.pidfd))
        if live.server is not None:
            live.server.forget(live.request_id)
        self._remove_files(live.request_id)

    def _remove_files(self, request_id: str) -> None:
        if self.session is None:
            return
        for suffix in (".req", ".res", ".ready", ".res.diag"):
            with contextlib.suppress(OSError):
                (self.session / f"{request_id}{suffix}").unlink()


def exec_child_exited(child: Any) -> None:
    """The pidfd of a child started by exec (a worker or an eval slot) became readable: kill what is left of its
    group, reap it and resolve its `exited` future with the exit status."""
    asyncio.get_running_loop().remove_reader(child.pidfd)
    # Leftovers of its group die before the reap, while its zombie keeps the group id from reuse.
    ipc.signal_group(child.pgid, signal.SIGKILL)
    code = child.popen.wait()
    if not child.exited.done():
        child.exited.set_result(code)


async def forked_child_exited(child: Any, fork_id: str) -> None:
    """The pidfd of a child of the fork server became readable: its exit status comes from the fork server (its
    parent, which reaped it), or None if the server does not say within 5 s. Run as a task."""
    asyncio.get_running_loop().remove_reader(child.pidfd)
    try:
        code = await asyncio.wait_for(asyncio.shield(child.server.exit_status(fork_id)), 5.0)
    except TimeoutError:
        code = None
    if not child.exited.done():
        child.exited.set_result(code)


def _snapshot(live: dict[str, _Live]) -> list[_Live]:
    # terminate_all may run on another thread (the watchdog's) while the loop's thread changes the dict
    for _ in range(10):
        try:
            return list(live.values())
        except RuntimeError:
            continue
    return []


def pidfd_exited(fd: int) -> bool:
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _routing_id_coverage(outcome: MemberOutcome) -> float | None:
    interactions = outcome.interactions or {}
    if not interactions:
        return None
    return sum(1 for i in interactions.values() if getattr(i, "routing_id", None)) / len(interactions)


def _mem_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return None
