"""A subprocess slot of `platoon eval`, the child side: a long-lived process that
runs one rollout at a time, as many as the evaluation hands it, each under its hard timeout.

`python -m platoon.rollouts.slot_process SESSION_DIR` (or the same `main` in a child of the rollout workers' fork server)
connects to the evaluation's socket in SESSION_DIR, says who it is, receives the policy (a pickled Tinker
sampling client, or a hosted model and its key: neither key is in a slot's environment), imports the environment
packages, then runs the rollouts it is sent and answers each with its outcome and record. Messages are
length-prefixed pickles over that socket, so nothing that carries a key is ever written to a file.

At a rollout's hard timeout the slot cancels it (its cleanups stop its sandboxes) for up to `stop_grace` seconds,
SIGKILLs the process groups it started and then its own; a SIGALRM backstop does the same `backstop` seconds after
the deadline. A slot that timed out is never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import pickle
import signal
import struct
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from platoon.envs.resolve import resolve_service
from platoon.gateway.core import ModelGateway
from platoon.gateway.hosted import hosted_gateway
from platoon.gateway.watch import CallWatch, WatchedHosted, WatchedSampler
from platoon.rollouts.eval_records import rollout_record, run_and_record
from platoon.rollouts.one_rollout import MemberOutcome
from platoon.rollouts.workers import ipc
from platoon.rollouts.workers.binding import load_binding
from platoon.rollouts.workers.forkserver import prepare_stack
from platoon.rollouts.workers.startup import set_child_subreaper, set_parent_death_signal
from platoon.rollouts.workers.worker import Diag, end_started_processes, prepared_renderer

if TYPE_CHECKING:
    from platoon.eval.config_defs import HostedConfig

__all__ = [
    "SLOT_ENV",
    "SLOT_MODULE",
    "SOCKET_NAME",
    "SlotDeadlines",
    "SlotPolicy",
    "main",
    "read_message",
    "send_message",
    "socket_address",
]

SLOT_MODULE = "platoon.rollouts.slot_process"
# Named after the module, not `__name__`: an exec'd slot runs this module as `__main__`.
log = logging.getLogger(SLOT_MODULE)
#: `<slot number>:<token>:<evaluator pid>:<evaluator start time>`, consumed by the slot at start
SLOT_ENV = "PLATOON_EVAL_SLOT"
SOCKET_NAME = "slots.sock"
EXIT_TERMINATED = 143
EXIT_BAD_START = 2
EXIT_HARD_TIMEOUT = 89
#: a slot stopped by SIGTERM (or a gone evaluator) is gone within this many seconds, whatever its rollout does
TERMINATION_SECONDS = 8.0
#: how often a slot checks that its evaluator is alive
PARENT_CHECK_SECONDS = 2.0
#: processes a finished rollout left get this long between SIGTERM and SIGKILL
LEFTOVER_GRACE_SECONDS = 0.5
_HEADER = struct.Struct("!Q")


@dataclass(frozen=True)
class SlotDeadlines:
    """One rollout's deadlines: the hard timeout, then `stop_grace` to stop its sandboxes, the child's backstop
    `backstop` after the hard timeout, and the parent's wait `parent_wait` after that."""

    hard_timeout: float
    stop_grace: float
    backstop: float
    parent_wait: float

    @property
    def parent_deadline(self) -> float:
        return self.hard_timeout + self.backstop + self.parent_wait


@dataclass(frozen=True)
class SlotPolicy:
    """What a slot samples: a Tinker sampling client (pickled, as rollout workers receive it) with the renderer to
    rebuild, or a hosted model with the key the evaluation read (sent over the socket, never through the slot's
    environment, where harness code would see it)."""

    backend: str
    model: str
    #: Tinker: the pickled binding of the evaluation's sampling client
    binding: bytes | None = None
    renderer_name: str | None = None
    renderer_kwargs: Mapping[str, Any] = field(default_factory=dict)
    context_window_length: int | None = None
    sample_timeout_seconds: float | None = None
    base_url: str | None = None
    #: hosted: the config, the rollout's sampling and how many slots share `max_concurrent_requests`
    hosted: HostedConfig | None = None
    inference_params: Mapping[str, Any] = field(default_factory=dict)
    sampling_precedence: str = "request"
    workers: int = 1
    #: hosted: the key itself (None: no auth)
    api_key: str | None = field(default=None, repr=False)


# --------------------------------------------------------------------------------------------------------------
# The wire: length-prefixed pickles


def socket_address(dir_fd: int) -> str:
    """The socket's path through an open descriptor of its directory: short whatever the scratch dir's length
    (a Unix socket path may not pass 107 bytes)."""
    return f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}"


async def send_message(writer: asyncio.StreamWriter, message: Mapping[str, Any]) -> None:
    data = pickle.dumps(dict(message))
    writer.write(_HEADER.pack(len(data)) + data)
    await writer.drain()


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message; None when the other side is gone (or sent something that is not a message)."""
    try:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        data = await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        return None
    try:
        message = pickle.loads(data)
    except Exception as exc:  # a torn or foreign message ends the conversation
        log.warning("an unreadable slot message: %s: %s", type(exc).__name__, exc)
        return None
    return message if isinstance(message, dict) else None


# --------------------------------------------------------------------------------------------------------------
# The slot


def build_gateway(policy: SlotPolicy, watch: Any) -> Any:
    """The slot's gateway: over the unpickled Tinker sampling client (never a ServiceClient of its own), or to the
    hosted server with the key the policy carries."""
    if policy.backend == "hosted":  # eval.policy.HOSTED
        assert policy.hosted is not None
        gateway = hosted_gateway(
            policy.hosted,
            model=policy.model,
            inference_params=dict(policy.inference_params),
            sampling_precedence=policy.sampling_precedence,
            workers=policy.workers,
            api_key=policy.api_key,
        )
        gateway.backend = WatchedHosted(gateway.backend, watch)
        return gateway
    import tinker  # noqa: F401  (the SDK the pickled client needs)

    assert policy.binding is not None and policy.renderer_name is not None
    client, _version = load_binding(policy.binding)
    renderer = prepared_renderer(policy.model, policy.renderer_name, policy.renderer_kwargs)
    return ModelGateway(
        WatchedSampler(client, watch, policy.base_url),
        renderer,
        model_name=policy.model,
        context_window_length=policy.context_window_length,
        sample_timeout_seconds=policy.sample_timeout_seconds,
    )


class Slot:
    """One slot process's life: connect, set up, then rollouts one at a time under their deadlines."""

    def __init__(self, number: int, token: str, session_dir: str, parent: tuple[int, int | None]) -> None:
        self.number = number
        self.token = token
        self.session_dir = session_dir
        self.parent = parent
        self.watch = CallWatch()
        self.gateway: Any = None
        self.diag: Diag | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.current: asyncio.Task[Any] | None = None
        self.timed_out = False
        self.terminating = False
        self._services: dict[str, Any] = {}
        self._deadline: float | None = None
        self._deadlines: SlotDeadlines | None = None
        self._wake = threading.Event()
        self._finished = threading.Event()

    # ---- deadlines ---------------------------------------------------------------------------------------

    def arm(self, deadlines: SlotDeadlines) -> None:
        """The monitor's deadline, and the SIGALRM backstop behind it (a monitor thread can be starved)."""
        self._deadlines = deadlines
        self._deadline = time.monotonic() + deadlines.hard_timeout
        signal.signal(signal.SIGALRM, lambda _signum, _frame: self.die("backstop"))
        signal.setitimer(signal.ITIMER_REAL, deadlines.hard_timeout + deadlines.backstop)
        self._wake.set()

    def disarm(self) -> None:
        self._deadline = None
        signal.setitimer(signal.ITIMER_REAL, 0)
        self._wake.set()

    def die(self, phase: str) -> None:
        """SIGKILL every process group the rollout started, then this slot's own group (this process too)."""
        if self.diag is not None and not self.diag.final:
            self.diag.finish(phase)

        with contextlib.suppress(Exception):
            end_started_processes(grace=0)
        with contextlib.suppress(OSError):
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(EXIT_HARD_TIMEOUT)

    def _monitor(self) -> None:
        next_parent_check = time.monotonic() + PARENT_CHECK_SECONDS
        while True:
            now = time.monotonic()
            deadline = self._deadline
            if deadline is not None and now >= deadline:
                self._hard_timeout()
                return
            if now >= next_parent_check:
                next_parent_check = now + PARENT_CHECK_SECONDS
                if not self.terminating and not ipc.is_running(*self.parent):
                    log.warning("the evaluation (pid %d) is gone: stopping", self.parent[0])
                    os.kill(os.getpid(), signal.SIGTERM)
            wait = next_parent_check - now if deadline is None else min(deadline, next_parent_check) - now
            self._wake.wait(max(0.0, wait))
            self._wake.clear()

    def _hard_timeout(self) -> None:
        """On the monitor thread: the marker first (the parent reads why this slot ended), then cancel the rollout
        and give its cleanups `stop_grace`, then the kills."""
        deadlines = self._deadlines
        assert deadlines is not None and self.loop is not None
        self.timed_out = True
        if self.diag is not None:
            self.diag.finish("hard_timeout", budget=f"{deadlines.hard_timeout:g}")
        log.error("the rollout passed its hard timeout of %g s: stopping it", deadlines.hard_timeout)
        self.loop.call_soon_threadsafe(self._cancel_current)
        self._finished.wait(deadlines.stop_grace)
        self.die("hard_timeout")

    def _cancel_current(self) -> None:
        if self.gateway is not None:
            self.gateway.shut_down()  # further model calls are refused
        task = self.current
        if task is not None and not task.done():
            task.cancel()
            assert self.loop is not None
            self.loop.create_task(self._recancel(task))

    async def _recancel(self, task: asyncio.Task[Any]) -> None:
        # A rollout that swallows one cancellation gets more, every 0.25 s after the first second.
        await asyncio.sleep(1.0)
        while not task.done():
            task.cancel()
            await asyncio.sleep(0.25)

    def on_terminate(self) -> None:
        """SIGTERM or a gone evaluator: cancel the rollout, and be gone within 8 s whatever it does."""
        if self.terminating:
            return
        self.terminating = True
        signal.signal(signal.SIGALRM, lambda _signum, _frame: self.die("terminated"))
        signal.setitimer(signal.ITIMER_REAL, TERMINATION_SECONDS)
        self._cancel_current()
        if self.writer is not None:
            self.writer.close()  # the request loop reads the end of the conversation

    # ---- set up and rollouts ------------------------------------------------------------------------------

    def setup(self, message: Mapping[str, Any]) -> None:
        self.diag = Diag(str(message["diag"]))
        self.diag.update(slot=self.number)
        if message.get("prepare"):  # started by exec: nothing is imported yet
            fatal, problems = prepare_stack(message["prepare"])
            if fatal is not None:
                raise RuntimeError(fatal)
            for problem in problems:
                log.warning("%s", problem)
        # Environment packages are imported in each slot, whatever the fork server imported.
        for package in message.get("environment_packages") or ():
            try:
                importlib.import_module(package)
            except Exception as exc:  # its rollouts fail with the reason; the others still run
                log.error("importing %s failed: %s: %s", package, type(exc).__name__, exc)
        self.gateway = build_gateway(message["policy"], self.watch)

    def _service(self, request: Any) -> Any:
        entry = request.entry
        kwargs = dict(request.service_kwargs or entry.service_kwargs)
        key = json.dumps([request.label, entry.service, kwargs], sort_keys=True, default=str)
        if key not in self._services:
            if entry.package:
                importlib.import_module(entry.package)
            self._services[key] = resolve_service(entry.service, kwargs)
        return self._services[key]

    async def run_job(self, job: Mapping[str, Any]) -> dict[str, Any] | None:
        """One rollout and its record; None when it was stopped (by its hard timeout or a SIGTERM)."""
        assert self.loop is not None and self.diag is not None
        request = job["request"]
        settings = job["record"]
        self.diag.update(stage="rollout", task=request.task_id, rollout=request.rollout_number)
        log.info(
            "slot %d (pid %d) runs rollout %d of %s",
            self.number,
            os.getpid(),
            request.rollout_number,
            request.task_id,
        )
        self._finished.clear()
        self.arm(job["deadlines"])
        try:
            try:
                service = self._service(request)
            except Exception as exc:  # the entry's package or service: this rollout fails with the reason
                outcome = MemberOutcome.missing("error", version=0, error=f"{type(exc).__name__}: {exc}")
                record = rollout_record(outcome=outcome, recorder=None, **settings)
            else:
                self.current = self.loop.create_task(
                    run_and_record(
                        request,
                        service=service,
                        gateway=self.gateway,
                        watch=self.watch,
                        record_settings=settings,
                    )
                )
                self.current.add_done_callback(lambda _task: self._finished.set())
                try:
                    outcome, record = await self.current
                except asyncio.CancelledError:
                    if self.timed_out:
                        await asyncio.Event().wait()  # the monitor ends this process
                    return None
        finally:
            self.current = None
            self._finished.set()
            if not self.timed_out:
                self.disarm()
        self.diag.update(stage="idle")
        outcome.interactions = None  # the exact tokens: an evaluation trains on nothing, so they stay here
        return {
            "type": "result",
            "id": job["id"],
            "outcome": outcome,
            "record": record,
            "key_refusal": self.watch.key_refusal.problems if self.watch.key_refusal is not None else None,
            "hosted_refusal": self.watch.hosted_refusal,
        }

    async def _answer(self, writer: asyncio.StreamWriter, result: dict[str, Any]) -> None:
        try:
            await send_message(writer, result)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            # Something in the result does not pickle: the rollout fails, the reason travels.
            log.error("the rollout's result cannot be sent back: %s: %s", type(exc).__name__, exc)
            outcome = result["outcome"]
            result["outcome"] = MemberOutcome.missing(
                "error",
                version=0,
                seconds=outcome.seconds,
                error=f"the rollout's result cannot be sent back: {type(exc).__name__}: {exc}",
            )
            result["record"] = None
            await send_message(writer, result)

    async def run(self) -> int:
        self.loop = asyncio.get_running_loop()
        dir_fd = os.open(self.session_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            reader, writer = await asyncio.open_unix_connection(socket_address(dir_fd))
        except OSError as exc:
            log.error("cannot reach the evaluation's socket: %s", exc)
            return EXIT_BAD_START
        finally:
            os.close(dir_fd)
        self.writer = writer
        await send_message(
            writer, {"type": "hello", "slot": self.number, "token": self.token, "pid": os.getpid()}
        )
        message = await read_message(reader)
        if message is None or message.get("type") != "setup":
            return EXIT_TERMINATED
        try:
            self.setup(message)
        except Exception as exc:
            log.error("the slot could not set up: %s: %s", type(exc).__name__, exc)
            await send_message(writer, {"type": "failed", "error": f"{type(exc).__name__}: {exc}"})
            return EXIT_BAD_START
        # Until here a SIGTERM ended the process at once; from now on it stops the rollout first.
        self.loop.add_signal_handler(signal.SIGTERM, self.on_terminate)
        threading.Thread(target=self._monitor, name="platoon-slot-monitor", daemon=True).start()
        await send_message(writer, {"type": "ready"})
        while not self.terminating:
            job = await read_message(reader)
            if job is None or job.get("type") != "job":
                break
            result = await self.run_job(job)
            # Whatever the rollout left running ends with it: the next rollout starts clean.
            await asyncio.to_thread(end_started_processes, grace=LEFTOVER_GRACE_SECONDS)
            if result is None:
                break
            try:
                await self._answer(writer, result)
            except (ConnectionError, OSError):
                break
        end_started_processes(grace=LEFTOVER_GRACE_SECONDS)
        return EXIT_TERMINATED if self.terminating else 0


def _identity(raw: str) -> tuple[int, str, int, int | None] | None:
    parts = raw.split(":")
    if len(parts) != 4:
        return None
    try:
        return int(parts[0]), parts[1], int(parts[2]), int(parts[3]) if parts[3] else None
    except ValueError:
        return None


def main(argv: list[str] | None = None, *, forked: bool = False) -> int:
    """Run the slot of the session dir `argv[0]`; returns the exit status (the caller `os._exit`s with it)."""
    args = sys.argv[1:] if argv is None else argv
    identity = _identity(os.environ.pop(SLOT_ENV, ""))  # the token is this slot's alone, not its rollouts'
    if len(args) != 1 or identity is None:
        print(
            "platoon: python -m platoon.rollouts.slot_process SESSION_DIR is started by platoon eval only",
            file=sys.stderr,
        )
        return EXIT_BAD_START
    number, token, parent_pid, parent_start = identity
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    signal.signal(signal.SIGTERM, lambda _signum, _frame: os._exit(EXIT_TERMINATED))
    if os.getsid(0) != os.getpid():
        with contextlib.suppress(OSError):
            os.setsid()
    set_child_subreaper()  # what a rollout starts stays below this process, where its kills find it
    if not forked and not set_parent_death_signal(signal.SIGTERM, expected_parent=parent_pid):
        return EXIT_TERMINATED
    slot = Slot(number, token, args[0], (parent_pid, parent_start))
    # A loop of our own rather than asyncio.run: tasks a rollout left behind are abandoned at exit, not awaited.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    code = loop.run_until_complete(slot.run())
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    from platoon.rollouts.workers.worker import exit_now

    exit_now(main())
