"""Subprocess slots of `platoon eval`, the evaluation's side: up to `max_slots`
slot processes, each reused for one rollout at a time until a rollout hangs past its hard timeout or the slot
dies; then it is replaced.

Slots are forked from the rollout workers' fork server, which imports the stack, the environment
packages and the renderer once, or started by exec when it cannot fork. They live in the rollout workers'
private scratch dir (`ipc.scratch_dir`), are recorded in its registry, so the orphan sweep stops the slots of an
evaluation that died, and talk to the evaluation over a Unix socket in their session dir. The hard timeout of a
rollout: `hard_timeout_seconds`; what happens at it: `platoon.rollouts.slot_process`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.episode.rollout import Route
from platoon.harness.registry import get_harness
from platoon.rollouts.one_rollout import MemberOutcome
from platoon.rollouts.slot_process import (
    SLOT_ENV,
    SLOT_MODULE,
    SlotDeadlines,
    SlotPolicy,
    read_message,
    send_message,
    socket_address,
)
from platoon.rollouts.workers import ipc
from platoon.rollouts.workers.forkserver import ForkFailed, ForkServer, ForkServerUnavailable
from platoon.rollouts.workers.pool import exec_child_exited, forked_child_exited, pidfd_exited
from platoon.rollouts.workers.startup import ExecFailed, exec_child, worker_environment

if TYPE_CHECKING:
    from platoon.rollouts.one_rollout import MemberRequest

__all__ = [
    "SlotJob",
    "SlotResult",
    "SubprocessSlots",
    "hard_timeout_seconds",
    "rollout_deadlines",
]

log = logging.getLogger(__name__)

#: a rollout without any time limit
UNBOUNDED_ROLLOUT_SECONDS = 900.0
#: added to every hard timeout: finalizing, grading and writing the rollout
FINALIZE_GRACE_SECONDS = 180.0
#: at the hard timeout, the rollout's cleanups get this long to stop its sandboxes before the kills
SANDBOX_STOP_SECONDS = 30.0
#: the slot's own SIGALRM backstop, after the hard timeout
BACKSTOP_SECONDS = 35.0
#: how much longer the evaluation waits than the slot's backstop before it kills the slot itself
PARENT_WAIT_SECONDS = 60.0
#: from a slot's launch to its "ready" (the fork server's imports count when it starts with the first slot)
STARTUP_BUDGET_SECONDS = 300.0
#: an idle slot told to stop, or a busy one SIGTERMed, gets this long before SIGKILL
STOP_WAIT_SECONDS = 10.0
#: a killed slot may take this long to go
KILL_WAIT_SECONDS = 30.0


def hard_timeout_seconds(
    *, rollout_timeout: float | None, harness_limit: float | None, overhead: float | None
) -> float:
    """A slot's hard timeout: (the rollout timeout, else the harness's own limit — or max(it, 900) when the
    environment states no overhead — else 900) + the environment's overhead + 180 s."""
    if rollout_timeout is not None:
        base = float(rollout_timeout)
    elif harness_limit is not None:
        base = harness_limit if overhead is not None else max(harness_limit, UNBOUNDED_ROLLOUT_SECONDS)
    else:
        base = UNBOUNDED_ROLLOUT_SECONDS
    return base + (overhead or 0.0) + FINALIZE_GRACE_SECONDS


async def _seconds(owner: Any, method: str, task_id: str) -> float | None:
    """`owner.method(task_id)` as seconds, when the owner has it and answers a positive number."""
    ask = getattr(owner, method, None)
    if not callable(ask):
        return None
    try:
        value = ask(task_id)
        if asyncio.iscoroutine(value):
            value = await value
    except Exception as exc:  # the service's own limit is advice: without it the rollout gets the default
        log.warning("%s(%r) failed: %s: %s", method, task_id, type(exc).__name__, exc)
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def _harness_timeout(harness: Any) -> float | None:
    """A harness's own wall-clock cap (a TOML spec's `timeout_s`); function harnesses have none."""
    if isinstance(harness, str):
        try:
            harness = get_harness(harness)
        except Exception:
            return None
    value = getattr(harness, "timeout_s", None)
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        else None
    )


async def rollout_deadlines(request: MemberRequest, service: Any) -> SlotDeadlines:
    """The deadlines of one rollout in a slot. The harness's own limit is the earliest of its cap and the task's
    agent timeout (`agent_timeout_s`); the overhead is the service's `rollout_overhead_s`."""
    raw_id = request.raw_task_id
    limits = [await _seconds(service, "agent_timeout_s", raw_id)]
    with contextlib.suppress(Exception):
        route = Route.from_entry(request.entry, split=request.split, task_id=raw_id)
        limits.append(_harness_timeout(route.harness))
    known = [limit for limit in limits if limit is not None]
    hard = hard_timeout_seconds(
        rollout_timeout=request.rollout_config.timeout,
        harness_limit=min(known) if known else None,
        overhead=await _seconds(service, "rollout_overhead_s", raw_id),
    )
    return SlotDeadlines(hard, SANDBOX_STOP_SECONDS, BACKSTOP_SECONDS, PARENT_WAIT_SECONDS)


@dataclass(frozen=True)
class SlotJob:
    """One rollout for a slot: the member request, `rollout_record`'s settings, its deadlines."""

    request: MemberRequest
    record_settings: Mapping[str, Any]
    deadlines: SlotDeadlines


@dataclass
class SlotResult:
    """What came back: the outcome, the slot's record (None: the slot gave none, the evaluation writes an errored
    one), the run-wide refusals the slot saw, and which slot process ran it."""

    outcome: MemberOutcome
    record: dict[str, Any] | None
    slot: int
    pid: int | None
    key_refusal: list[str] | None = None
    hosted_refusal: str | None = None


class _SlotFailed(Exception):
    """A slot that could not start (or set up): its rollout is retried once on a fresh slot."""


@dataclass
class _Slot:
    """A slot process: its identity captured at launch (signals never reach a recycled pid), its conversation."""

    number: int
    token: str
    pid: int
    pidfd: int
    start_time: int | None
    method: str
    log_path: Path
    diag_path: Path
    exited: asyncio.Future[int | None]
    connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
    popen: subprocess.Popen[bytes] | None = None
    server: ForkServer | None = None
    fork_id: str = ""
    record: Path | None = None
    jobs: int = 0

    @property
    def pgid(self) -> int:
        return self.pid  # a slot leads its own session and group

    @property
    def streams(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return self.connected.result()

    def running(self) -> bool:
        return not self.exited.done() and not pidfd_exited(self.pidfd)

    def signal(self, sig: int) -> None:
        if not self.running():
            return
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, sig)
        ipc.signal_group(self.pgid, sig)

    def kill_tree(self) -> None:
        """SIGKILL what runs below the slot (as their subreaper it keeps them all below it) and then the slot's
        group, while the slot is still alive to find them by."""
        if not self.running():
            return
        for pid, pgid in ipc.descendants(self.pid):
            if pgid != self.pgid:
                ipc.signal_group(pgid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.signal(signal.SIGKILL)


@dataclass
class SlotCounts:
    """For the report's workflow metrics: slots started, and slots replaced after a hang or a death."""

    started: int = 0
    replaced: int = 0
    launch_failures: int = 0
    by_pid: dict[int, int] = field(default_factory=dict)


class SubprocessSlots:
    """Up to `max_slots` slot processes for one evaluation. `start()`, `run(job)` from any number of tasks (each
    gets a slot of its own for its rollout), `close()`; call them from the evaluation's event loop thread, whose
    life the slots' parent-death signal follows."""

    def __init__(
        self,
        *,
        output_dir: Path,
        max_slots: int,
        policy: SlotPolicy,
        environment_packages: Sequence[str] = (),
        services: Sequence[str] = (),
    ) -> None:
        self.output_dir = Path(output_dir)
        self.max_slots = max(1, int(max_slots))
        self.policy = policy
        self.environment_packages = tuple(dict.fromkeys(p for p in environment_packages if p))
        self.services = tuple(dict.fromkeys(s for s in services if s))
        self.counts = SlotCounts()
        self.scratch: Path | None = None
        self.session: Path | None = None
        self.log_dir = self.output_dir / "slots"
        self._dir_fd: int | None = None
        self._listener: asyncio.Server | None = None
        self._server: ForkServer | None = None
        self._server_tried = False
        self._server_lock = asyncio.Lock()
        self._idle: list[_Slot] = []
        self._live: dict[int, _Slot] = {}
        self._starting = 0
        self._changed = asyncio.Condition()
        self._numbers = 0
        self._jobs = 0
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._evaluator = (os.getpid(), _start_time(os.getpid()))
        self._host = socket.gethostname()

    # ---- life cycle --------------------------------------------------------------------------------------

    async def start(self) -> None:
        """The scratch dir (refused, exit 78, when unsafe), the sweeps of orphans and stale files, this
        evaluation's session dir and its socket."""
        self.scratch = ipc.scratch_dir()
        swept = await asyncio.to_thread(ipc.sweep_orphans, self.scratch)
        if swept:
            log.warning("stopped %d orphaned rollout worker(s) or slot(s) of runs that are gone", swept)
        await asyncio.to_thread(ipc.sweep_stale_files, self.scratch)
        self.session = ipc.new_session_dir(self.scratch)
        self._dir_fd = os.open(self.session, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self._listener = await asyncio.start_unix_server(self._on_connect, path=socket_address(self._dir_fd))
        self.log_dir.mkdir(parents=True, exist_ok=True)

    async def close(self) -> None:
        """Idle slots are told to stop, busy ones SIGTERMed; SIGKILL for what is left; then the fork server, the
        socket and this evaluation's files in the scratch dir."""
        self._closed = True
        async with self._changed:
            self._changed.notify_all()
        idle = set(id(slot) for slot in self._idle)
        for slot in list(self._live.values()):
            if id(slot) in idle:
                with contextlib.suppress(Exception):
                    await send_message(slot.streams[1], {"type": "stop"})
            else:
                slot.signal(signal.SIGTERM)
        await asyncio.gather(*(self._wait_gone(slot) for slot in list(self._live.values())))
        for slot in list(self._live.values()):
            self._forget(slot)
        if self._server is not None:
            await self._server.stop()
            self._server = None
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(Exception):
                await self._listener.wait_closed()
        if self.scratch is not None and self.session is not None:
            for path in (self.scratch / ipc.REGISTRY_DIR).glob(f"forkserver-*-{self.session.name}.json"):
                ipc.unregister(path)
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None
        if self.session is not None:
            shutil.rmtree(self.session, ignore_errors=True)

    async def _wait_gone(self, slot: _Slot) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(slot.exited), STOP_WAIT_SECONDS)
            return
        slot.kill_tree()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(slot.exited), KILL_WAIT_SECONDS)
            return
        log.error("the slot process pid %d did not go after SIGKILL", slot.pid)

    # ---- one rollout -------------------------------------------------------------------------------------

    async def run(self, job: SlotJob) -> SlotResult:
        """Run `job` in a slot; never raises but for cancellation (which stops that slot)."""
        started = time.monotonic()
        slot: _Slot | None = None
        for attempt in (1, 2):
            try:
                slot = await self._acquire()
                break
            except _SlotFailed as exc:
                self.counts.launch_failures += 1
                if attempt == 1 and not self._closed:
                    log.warning("a slot for %s did not start (%s); retrying once", job.request.task_id, exc)
                    continue
                outcome = MemberOutcome.missing(
                    "worker_launch_failed",
                    version=0,
                    seconds=time.monotonic() - started,
                    error=f"worker_launch_failed: no slot process could be started for it: {exc}",
                )
                return SlotResult(outcome, None, 0, None)
        assert slot is not None
        try:
            return await self._run_in(slot, job, started)
        except asyncio.CancelledError:
            # The evaluation stops: this slot stops with its rollout and is forgotten once gone.
            self._retire(slot)
            slot.signal(signal.SIGTERM)
            slot.exited.add_done_callback(lambda _f: self._forget(slot))
            raise

    async def _run_in(self, slot: _Slot, job: SlotJob, started: float) -> SlotResult:
        self._jobs += 1
        slot.jobs += 1
        reader, writer = slot.streams
        message = {
            "type": "job",
            "id": self._jobs,
            "request": job.request,
            "record": dict(job.record_settings),
            "deadlines": job.deadlines,
        }
        answer: dict[str, Any] | None = None
        deadline_fired = False
        try:
            await send_message(writer, message)
            answer = await asyncio.wait_for(read_message(reader), job.deadlines.parent_deadline)
        except TimeoutError:
            deadline_fired = True
            log.warning(
                "the slot (pid %d) running %s passed the evaluation's deadline (%g s): killing it",
                slot.pid,
                job.request.task_id,
                job.deadlines.parent_deadline,
            )
            slot.kill_tree()
        except (ConnectionError, OSError):
            answer = None
        if answer is not None and answer.get("type") == "result" and answer.get("id") == message["id"]:
            self._release(slot)
            return SlotResult(
                answer["outcome"],
                answer.get("record"),
                slot.number,
                slot.pid,
                key_refusal=answer.get("key_refusal"),
                hosted_refusal=answer.get("hosted_refusal"),
            )
        # No result: the slot hung past its hard timeout or died. It is replaced by the next rollout's.
        self._retire(slot)
        self.counts.replaced += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(slot.exited), KILL_WAIT_SECONDS)
        if not slot.exited.done():
            slot.kill_tree()

        phase = ipc.read_diag(slot.diag_path).get("phase")
        code = slot.exited.result() if slot.exited.done() else None
        self._forget(slot)
        hard = job.deadlines.hard_timeout
        if deadline_fired or phase in ("hard_timeout", "backstop"):
            disposition = "hard_timeout"
            error = (
                f"hard_timeout: the rollout passed its hard timeout of {hard:g} s; its slot (pid {slot.pid}) "
                "was stopped and replaced"
            )
        else:
            disposition = "worker_crashed"
            error = (
                f"worker_crashed: the slot process (pid {slot.pid}) ended with status {code} during the rollout "
                f"and was replaced; its log: {slot.log_path}"
            )
        log.warning("rollout %d of %s: %s", job.request.rollout_number, job.request.task_id, error)
        outcome = MemberOutcome.missing(
            disposition, version=0, seconds=time.monotonic() - started, error=error
        )
        return SlotResult(outcome, None, slot.number, slot.pid)

    # ---- the pool ----------------------------------------------------------------------------------------

    async def _acquire(self) -> _Slot:
        async with self._changed:
            while True:
                if self._closed:
                    raise _SlotFailed("the evaluation's slots are closed")
                while self._idle:
                    slot = self._idle.pop()
                    if slot.running():
                        return slot
                    self._forget(slot)  # died while idle
                    self.counts.replaced += 1
                if len(self._live) + self._starting < self.max_slots:
                    self._starting += 1
                    break
                await self._changed.wait()
        try:
            return await self._start_slot()
        finally:
            self._starting -= 1

    def _release(self, slot: _Slot) -> None:
        self._idle.append(slot)
        self._notify()

    def _retire(self, slot: _Slot) -> None:
        with contextlib.suppress(ValueError):
            self._idle.remove(slot)

    def _notify(self) -> None:
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        self._background(notify())

    def _background(self, work: Any) -> None:
        # A reference until done: the loop keeps only weak ones to its tasks.
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _forget(self, slot: _Slot) -> None:
        self._retire(slot)
        if self._live.pop(slot.number, None) is not None:
            self._notify()
        ipc.unregister(slot.record)
        slot.record = None
        if slot.connected.done() and not slot.connected.cancelled() and slot.connected.exception() is None:
            slot.streams[1].close()
        if slot.exited.done():
            _close_quietly(slot.pidfd)
        else:
            slot.exited.add_done_callback(lambda _f: _close_quietly(slot.pidfd))
        if slot.server is not None:
            slot.server.forget(slot.fork_id)
        with contextlib.suppress(OSError):
            slot.diag_path.unlink()

    # ---- starting a slot ---------------------------------------------------------------------------------

    def _stack_config(self) -> dict[str, Any]:
        """What a slot imports and builds before its first rollout: once in the fork server for all the slots it
        forks, else in each slot started by exec (so that no rollout's deadline pays for it)."""
        policy = self.policy
        return {
            "model_name": policy.model if policy.renderer_name else None,
            "renderer_name": policy.renderer_name,
            "renderer_kwargs": dict(policy.renderer_kwargs),
            "environment_packages": list(self.environment_packages),
            "services": list(self.services),
            "modules": [SLOT_MODULE, "platoon.rollouts.eval_records", "platoon.gateway.hosted"],
        }

    def _environment(self) -> dict[str, str]:
        """A slot's (and the fork server's) environment: the worker environment without the hosted key's
        variable, which the slots receive as a value over their socket (harness code reads the environment)."""
        env = worker_environment(os.environ)
        hosted = self.policy.hosted
        if hosted is not None and hosted.api_key_env:
            env.pop(hosted.api_key_env, None)
        return env

    async def _fork_server(self) -> ForkServer | None:
        """The fork server slots are forked from, started with the first slot; None: slots start by exec."""
        async with self._server_lock:
            if self._server is not None and self._server.alive:
                return self._server
            if self._server_tried or self.session is None:
                return None
            self._server_tried = True
            try:
                server = await ForkServer.start(
                    config=self._stack_config(),
                    env=self._environment(),
                    cwd=os.getcwd(),
                    log_path=self.session / "forkserver.log",
                    timeout=STARTUP_BUDGET_SECONDS,
                )
            except ForkServerUnavailable as exc:
                log.warning("%s; slots start by exec", exc)
                return None
            for problem in server.prepare_errors:
                log.warning("fork server: %s", problem)
            self._register("forkserver", server.pid, self.session.name)
            self._server = server
            return server

    def _register(self, kind: str, pid: int, name: str) -> Path | None:
        assert self.scratch is not None
        record = ipc.RegistryRecord(
            kind=kind,
            pid=pid,
            pgid=pid,
            start_time=_start_time(pid),
            trainer_pid=self._evaluator[0],
            trainer_start_time=self._evaluator[1],
            request_id=name,
            host=self._host,
        )
        try:
            return ipc.register(self.scratch, record)
        except OSError:
            return None

    async def _start_slot(self) -> _Slot:
        assert self.session is not None
        self._numbers += 1
        number = self._numbers
        token = secrets.token_hex(16)
        env = self._environment()
        env[SLOT_ENV] = f"{number}:{token}:{self._evaluator[0]}:{self._evaluator[1] or ''}"
        log_path = self.log_dir / f"slot-{number}.log"
        diag_path = self.session / f"slot-{number}.diag"
        loop = asyncio.get_running_loop()
        launched = time.monotonic()
        fork_id = f"slot-{number}-{token[:8]}"
        slot: _Slot | None = None
        server = await self._fork_server()
        if server is not None:
            try:
                pid, pidfd = await server.fork(
                    fork_id,
                    request=str(self.session),
                    log=str(log_path),
                    cwd=os.getcwd(),
                    env=env,
                    main=SLOT_MODULE,
                )
            except ForkFailed as exc:
                log.warning("the fork server could not fork a slot (%s); starting it by exec", exc)
                server.forget(fork_id)
            else:
                slot = _Slot(
                    number, token, pid, pidfd, _start_time(pid), "forkserver", log_path, diag_path,
                    loop.create_future(), loop.create_future(), server=server, fork_id=fork_id,
                )  # fmt: skip
                loop.add_reader(pidfd, self._on_forked_exit, slot)
        if slot is None:
            slot = self._exec(number, token, env, log_path, diag_path)
        self._live[number] = slot
        slot.record = self._register("slot", slot.pid, f"{self.session.name}-{number}")
        self.counts.started += 1
        try:
            await self._handshake(slot, launched)
        except BaseException:
            slot.kill_tree()
            self._forget(slot)
            raise
        self.counts.by_pid[slot.pid] = number
        log.info(
            "slot %d (pid %d, %s) ready in %.2fs", number, slot.pid, slot.method, time.monotonic() - launched
        )
        return slot

    def _exec(
        self, number: int, token: str, env: Mapping[str, str], log_path: Path, diag_path: Path
    ) -> _Slot:
        loop = asyncio.get_running_loop()
        try:
            # From the event loop's thread: the slot's parent-death signal follows the thread that started it.
            popen = exec_child(
                SLOT_MODULE, str(self.session), log=log_path, env=env, cwd=os.getcwd(), what="slot"
            )
        except ExecFailed as exc:
            raise _SlotFailed(str(exc)) from None
        pidfd = os.pidfd_open(popen.pid)
        slot = _Slot(
            number, token, popen.pid, pidfd, _start_time(popen.pid), "exec", log_path, diag_path,
            loop.create_future(), loop.create_future(), popen=popen,
        )  # fmt: skip
        loop.add_reader(pidfd, exec_child_exited, slot)
        return slot

    async def _handshake(self, slot: _Slot, launched: float) -> None:
        """Wait for the slot's hello, send it the policy, wait for its ready: all within the startup budget."""
        remaining = STARTUP_BUDGET_SECONDS - (time.monotonic() - launched)
        waits: list[asyncio.Future[Any]] = [slot.connected, slot.exited]
        await asyncio.wait(waits, timeout=max(0.0, remaining), return_when=asyncio.FIRST_COMPLETED)
        if not slot.connected.done():
            what = f"exited with status {slot.exited.result()}" if slot.exited.done() else "did not connect"
            raise _SlotFailed(f"the slot process {what}; its log: {slot.log_path}")
        reader, writer = slot.streams
        setup = {
            "type": "setup",
            "policy": self.policy,
            "environment_packages": list(self.environment_packages),
            "diag": str(slot.diag_path),
            "prepare": self._stack_config() if slot.method == "exec" else None,
        }
        await send_message(writer, setup)
        remaining = STARTUP_BUDGET_SECONDS - (time.monotonic() - launched)
        try:
            answer = await asyncio.wait_for(read_message(reader), max(0.01, remaining))
        except TimeoutError:
            answer = None
        if answer is None or answer.get("type") != "ready":
            reason = answer.get("error") if answer else "it ended or timed out before it was ready"
            raise _SlotFailed(f"the slot could not set up: {reason}; its log: {slot.log_path}")

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A slot says hello: its number and token must be those of a slot this evaluation launched."""
        try:
            hello = await asyncio.wait_for(read_message(reader), 30.0)
        except TimeoutError:
            hello = None
        slot = self._live.get(hello.get("slot")) if isinstance(hello, dict) else None  # type: ignore[arg-type]
        if (
            slot is None
            or hello is None
            or not secrets.compare_digest(str(hello.get("token")), slot.token)
            or slot.connected.done()
        ):
            writer.close()
            return
        slot.connected.set_result((reader, writer))

    def _on_forked_exit(self, slot: _Slot) -> None:
        self._background(forked_child_exited(slot, slot.fork_id))


def _start_time(pid: int) -> int | None:
    return ipc.start_time_of(pid)


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
