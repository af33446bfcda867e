"""The fork server: a process that imports the worker stack once, builds the run's tokenizer and
renderer, freezes the GC, and then forks one rollout worker per request, so a worker starts in milliseconds.

Control is a `SOCK_SEQPACKET` pair carrying one JSON message per packet. Server to supervisor: `hello` (pid,
seconds, error, prepare_errors), `forked` (id, pid, with a pidfd passed as SCM_RIGHTS), `fork_failed` (id,
error), `exited` (id, pid, status). Supervisor to server: `fork` (id, request, log, cwd, env, and optionally
`main`: the module whose `main(argv, forked=True)` the child runs instead of the rollout worker's), `warm`
(services, packages: import them now, for the forks that follow), `retire` (fork no more, exit once the last
worker exited), `stop`. The server dies with its supervisor (parent-death signal) and
when the socket closes; its workers die with it in turn.

`ForkServer` is the supervisor's side; `python -m platoon.rollouts.workers.forkserver FD PARENT CONFIG`
runs the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import json
import logging
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from platoon import plugins
from platoon.envs.ors.inprocess import load_env_class
from platoon.envs.ors.remote import warm_sdk
from platoon.rollouts.workers.ipc import PROTOCOL_VERSION
from platoon.rollouts.workers.response_patch import patch_response_models
from platoon.rollouts.workers.startup import ExecFailed, exec_child, set_parent_death_signal
from platoon.rollouts.workers.worker import exit_now, prepared_renderer

__all__ = ["STACK_MODULES", "ForkFailed", "ForkServer", "ForkServerUnavailable", "serve"]

SERVER_MODULE = "platoon.rollouts.workers.forkserver"
# Named after the module, not `__name__`: the fork server runs this module as `__main__`.
log = logging.getLogger(SERVER_MODULE)
#: what every worker imports: imported once here, shared copy-on-write by the forked workers
STACK_MODULES = (
    "tinker",
    "platoon.hooks",
    "platoon.gateway.core",
    "platoon.episode.rollout",
    "platoon.harness.registry",
    "platoon.programs.registry",
    "platoon.envs.table",
    "platoon.envs.resolve",
    "platoon.rollouts.one_rollout",
    "platoon.renderers",
    "platoon.rollouts.records",
    "platoon.rollouts.workers.binding",
    "platoon.rollouts.workers.response_patch",
    "platoon.rollouts.workers.worker",
)
PACKET_BYTES = 1 << 20
#: what a forked child runs unless the fork message names another module (`platoon eval`'s slots do)
DEFAULT_CHILD_MODULE = "platoon.rollouts.workers.worker"


class ForkServerUnavailable(RuntimeError):
    """The fork server did not start (its log says why); the supervisor starts workers by exec instead."""


class ForkFailed(RuntimeError):
    """The fork server could not fork this request (the supervisor starts it by exec instead)."""


# --------------------------------------------------------------------------------------------------------------
# The server process


def _send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def prepare_stack(config: Mapping[str, Any]) -> tuple[str | None, list[str]]:
    """Import the stack and the run's environment packages, build the renderer; (fatal error, other problems).

    The fork server does this once for all its children; a process started by exec (an eval slot) does it itself
    before it says it is ready."""
    for name in STACK_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:
            return f"importing {name} failed: {type(exc).__name__}: {exc}", []

    problems: list[str] = []
    if not patch_response_models():
        problems.append("the response-model patch could not be verified")
    with contextlib.suppress(Exception):  # the entry-point scan and the services, once for every worker
        plugins.plugin_manager()
        plugins.entry_points()
    for service in config.get("services") or ():
        try:
            _warm_service(service)
        except Exception as exc:
            problems.append(f"preparing the service {service} failed: {type(exc).__name__}: {exc}")
    for package in (*(config.get("environment_packages") or ()), *(config.get("modules") or ())):
        try:
            importlib.import_module(package)
        except Exception as exc:
            problems.append(f"importing {package} failed: {type(exc).__name__}: {exc}")
    model, renderer = config.get("model_name"), config.get("renderer_name")
    if model and renderer:
        try:
            prepared_renderer(model, renderer, config.get("renderer_kwargs") or {})
        except Exception as exc:
            problems.append(f"building the renderer {renderer} failed: {type(exc).__name__}: {exc}")
    return None, problems


def _warm_service(service: str) -> None:
    """Import what building `service` imports (its factory, and an ORS class with its SDK), but build nothing:
    an instance could start threads, which would stop the server from forking."""
    scheme = plugins.service_scheme(service)
    if scheme != service:  # a URI
        plugins.get_service(scheme)
        if scheme == "python":
            load_env_class(service)
        elif scheme in ("ors+http", "ors+https"):
            warm_sdk()  # the SDK's client (seconds of imports), once here rather than in every worker
    elif ":" in service:  # module:Class
        plugins.resolve_target(service)
    else:
        plugins.get_service(service)


def _warm(message: Mapping[str, Any]) -> None:
    """Import what workers of services and packages named after the start need, before forking them."""
    for package in message.get("packages") or ():
        try:
            importlib.import_module(package)
        except Exception as exc:
            log.warning("importing %s failed: %s: %s", package, type(exc).__name__, exc)
    for service in message.get("services") or ():
        try:
            _warm_service(service)
        except Exception as exc:
            log.warning("preparing the service %s failed: %s: %s", service, type(exc).__name__, exc)
    gc.freeze()


def _foreign_threads(allowed: Sequence[str]) -> list[str]:
    """Threads other than the main one: forking under them could copy a held lock into the worker."""
    names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    busy = [name for name in names if name not in allowed]
    try:
        native = len(os.listdir("/proc/self/task")) - 1 - (len(names) - len(busy))
    except OSError:
        native = 0
    if native > len(busy):
        busy.append(f"{native - len(busy)} native thread(s)")
    return busy


def _reseed() -> None:
    # A forked worker would otherwise draw the same "random" numbers as its siblings.
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):
            numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            torch.seed()


def _become_worker(
    message: Mapping[str, Any],
    server_pid: int,
    sock: socket.socket,
    selector: selectors.BaseSelector,
    child_fds: Sequence[int],
) -> None:
    """In the forked child: a session of its own, dead with the server, its stdio, cwd and env; then the worker."""
    code = 70
    try:
        os.setsid()
        if not set_parent_death_signal(signal.SIGTERM, expected_parent=server_pid):
            os._exit(143)
        sock.close()
        selector.close()
        for fd in child_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        out = os.open(message["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.chdir(message["cwd"])
        os.environ.clear()
        os.environ.update(message["env"])
        _reseed()
        child = importlib.import_module(str(message.get("main") or DEFAULT_CHILD_MODULE))
        sys.argv = [child.__file__ or "child", message["request"]]
        code = child.main([message["request"]], forked=True)
    except BaseException:
        traceback.print_exc()
    finally:
        exit_now(code)


def serve(control_fd: int, parent_pid: int, config: Mapping[str, Any]) -> int:
    """The server's life: prepare, say hello, then fork on request and report exits until told to stop."""
    if not set_parent_death_signal(signal.SIGTERM, expected_parent=parent_pid):
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s fork server: %(message)s")
    started = time.monotonic()
    sock = socket.socket(fileno=control_fd)
    error, problems = prepare_stack(config)
    for problem in problems:
        log.warning("%s", problem)
    gc.collect()
    gc.freeze()  # what the stack allocated stays untouched by the GC, so forked pages stay shared
    hello = {
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "pid": os.getpid(),
        "seconds": round(time.monotonic() - started, 4),
        "error": error,
        "prepare_errors": problems,
    }
    try:
        _send(sock, hello)
    except OSError:
        return 0
    if error is not None:
        return 1
    allowed = tuple(config.get("allowed_threads") or ())
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, None)
    children: dict[int, tuple[int, str]] = {}  # pidfd -> (pid, request id)
    retiring = False
    server_pid = os.getpid()
    try:
        while not (retiring and not children):
            for key, _events in selector.select():
                if key.data is None:
                    try:
                        data = sock.recv(PACKET_BYTES)
                    except (BlockingIOError, InterruptedError):
                        continue
                    if not data:
                        return 0  # the supervisor is gone
                    message = json.loads(data)
                    kind = message.get("type")
                    if kind == "stop":
                        return 0
                    if kind == "retire":
                        retiring = True
                    elif kind == "warm":
                        _warm(message)
                    elif kind == "fork":
                        _fork(message, sock, selector, children, server_pid, allowed, retiring)
                    continue
                pidfd = key.fd
                pid, request_id = children.pop(pidfd)
                selector.unregister(pidfd)
                # Leftovers of its group die while its zombie still holds the group id (no reuse possible).
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                os.close(pidfd)
                _send(
                    sock,
                    {
                        "type": "exited",
                        "id": request_id,
                        "pid": pid,
                        "status": os.waitstatus_to_exitcode(status),
                    },
                )
    except (BrokenPipeError, ConnectionResetError):
        return 0
    return 0


def _fork(
    message: Mapping[str, Any],
    sock: socket.socket,
    selector: selectors.BaseSelector,
    children: dict[int, tuple[int, str]],
    server_pid: int,
    allowed: Sequence[str],
    retiring: bool,
) -> None:
    request_id = str(message.get("id"))
    busy = _foreign_threads(allowed)
    refusal = (
        "the fork server is retiring"
        if retiring
        else (f"threads are running in the fork server: {', '.join(busy)}" if busy else None)
    )
    if refusal is not None:
        _send(sock, {"type": "fork_failed", "id": request_id, "error": refusal})
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        _send(sock, {"type": "fork_failed", "id": request_id, "error": f"fork failed: {exc.strerror}"})
        return
    if pid == 0:
        _become_worker(message, server_pid, sock, selector, list(children))
    pidfd = os.pidfd_open(pid)
    children[pidfd] = (pid, request_id)
    selector.register(pidfd, selectors.EVENT_READ, pid)
    _send(sock, {"type": "forked", "id": request_id, "pid": pid}, [pidfd])


def _main(argv: Sequence[str]) -> int:
    if len(argv) != 3:
        print(
            "usage: python -m platoon.rollouts.workers.forkserver FD PARENT_PID CONFIG_JSON",
            file=sys.stderr,
        )
        return 64
    return serve(int(argv[0]), int(argv[1]), json.loads(argv[2]))


# --------------------------------------------------------------------------------------------------------------
# The supervisor's side


def _kill_unwanted(pidfd: int, pid: int) -> None:
    # The server reaps a worker only after its own group kill, so while the pidfd shows it running the pid and
    # its group id still name it.
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


class ForkServer:
    """A running fork server, as the supervisor sees it: fork requests and their exits over the control socket."""

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path
        self.pid = process.pid
        self.seconds = 0.0
        self.prepare_errors: list[str] = []
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._hello: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._pending: dict[str, asyncio.Future[tuple[int, int]]] = {}
        self._exits: dict[str, asyncio.Future[int | None]] = {}
        self._lost = False
        self._loop.add_reader(sock.fileno(), self._on_readable)

    @classmethod
    async def start(
        cls,
        *,
        config: Mapping[str, Any],
        env: Mapping[str, str],
        cwd: str,
        log_path: Path,
        timeout: float,
    ) -> ForkServer:
        """Start a server and wait for its hello; `ForkServerUnavailable` when it fails or takes too long."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Started from this (the event loop's) thread: the server's parent-death signal follows the thread
            # that started it, so it must be one that lives as long as the supervisor.
            process = exec_child(
                SERVER_MODULE,
                str(theirs.fileno()),
                str(os.getpid()),
                json.dumps(config),
                log=log_path,
                env=env,
                cwd=cwd,
                what="fork server",
                pass_fds=(theirs.fileno(),),
            )
        except ExecFailed as exc:
            ours.close()
            raise ForkServerUnavailable(f"the fork server did not start: {exc}") from None
        finally:
            theirs.close()
        ours.setblocking(False)
        server = cls(process, ours, log_path)
        try:
            hello = await asyncio.wait_for(asyncio.shield(server._hello), timeout)
        except (TimeoutError, ForkServerUnavailable) as exc:
            await server.stop()
            raise ForkServerUnavailable(
                f"the fork server did not start ({exc or 'timed out'}); see {log_path}"
            ) from None
        if hello.get("protocol") != PROTOCOL_VERSION or hello.get("error"):
            await server.stop()
            reason = hello.get("error") or f"protocol {hello.get('protocol')}"
            raise ForkServerUnavailable(f"the fork server did not start: {reason}; see {log_path}")
        server.seconds = float(hello.get("seconds") or 0.0)
        server.prepare_errors = [str(p) for p in hello.get("prepare_errors") or ()]
        return server

    @property
    def alive(self) -> bool:
        return not self._lost and self.process.poll() is None

    def _on_readable(self) -> None:
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(
                    self._sock, PACKET_BYTES, 4, socket.MSG_CMSG_CLOEXEC
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._on_lost()
                return
            if not data and not fds:
                self._on_lost()
                return
            try:
                message = json.loads(data)
            except ValueError:
                message = {}
            self._dispatch(message, fds)

    def _dispatch(self, message: Mapping[str, Any], fds: list[int]) -> None:
        kind, request_id = message.get("type"), str(message.get("id"))
        if kind == "hello":
            if not self._hello.done():
                self._hello.set_result(dict(message))
        elif kind == "forked" and fds:
            pending = self._pending.pop(request_id, None)
            if pending is not None and not pending.done():
                pending.set_result((int(message["pid"]), fds[0]))
                fds = fds[1:]
            else:  # the launch was given up on (cancelled): nothing may run for it
                _kill_unwanted(fds[0], int(message["pid"]))
        elif kind == "fork_failed":
            pending = self._pending.pop(request_id, None)
            if pending is not None and not pending.done():
                pending.set_exception(ForkFailed(str(message.get("error"))))
        elif kind == "exited":
            future = self._exits.get(request_id)
            if future is not None and not future.done():
                status = message.get("status")
                future.set_result(int(status) if isinstance(status, int) else None)
        for fd in fds:  # an fd nobody waits for (a reply to a request given up on)
            with contextlib.suppress(OSError):
                os.close(fd)

    def _on_lost(self) -> None:
        if self._lost:
            return
        self._lost = True
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._sock.fileno())
        if not self._hello.done():
            self._hello.set_exception(ForkServerUnavailable("it exited before its hello"))
            self._hello.exception()  # retrieved: nobody may be waiting any more
        for pending in self._pending.values():
            if not pending.done():
                pending.set_exception(ForkFailed("the fork server is gone"))
        self._pending.clear()
        for future in self._exits.values():
            if not future.done():
                future.set_result(None)  # its status went with the server

    async def fork(
        self,
        request_id: str,
        *,
        request: str,
        log: str,
        cwd: str,
        env: Mapping[str, str],
        main: str | None = None,
    ) -> tuple[int, int]:
        """Fork a worker for `request` (or a child running `main`'s `main`); (pid, pidfd). `ForkFailed` when the
        server cannot."""
        if not self.alive:
            raise ForkFailed("the fork server is gone")
        pending: asyncio.Future[tuple[int, int]] = self._loop.create_future()
        self._pending[request_id] = pending
        self._exits.setdefault(request_id, self._loop.create_future())
        message = {
            "type": "fork",
            "id": request_id,
            "request": request,
            "log": log,
            "cwd": cwd,
            "env": dict(env),
        }
        if main is not None:
            message["main"] = main
        try:
            await self._loop.sock_sendall(self._sock, json.dumps(message).encode())
        except OSError as exc:
            self._pending.pop(request_id, None)
            self._on_lost()
            raise ForkFailed(f"the fork server is gone: {exc}") from None
        return await pending

    def exit_status(self, request_id: str) -> asyncio.Future[int | None]:
        """The exit status of a worker this server forked (None when the server went first)."""
        return self._exits.setdefault(request_id, self._loop.create_future())

    def forget(self, request_id: str) -> None:
        self._exits.pop(request_id, None)

    async def warm(self, *, services: Sequence[str] = (), packages: Sequence[str] = ()) -> None:
        """Have the server import what these services and packages need; forks sent later wait for it."""
        if self.alive:
            message = {"type": "warm", "services": list(services), "packages": list(packages)}
            with contextlib.suppress(OSError):
                await self._loop.sock_sendall(self._sock, json.dumps(message).encode())

    async def retire(self) -> None:
        """No more forks; the server exits by itself once its last worker exited."""
        if self.alive:
            with contextlib.suppress(OSError):
                await self._loop.sock_sendall(self._sock, json.dumps({"type": "retire"}).encode())

    async def stop(self, timeout: float = 5.0) -> None:
        if self.alive:
            with contextlib.suppress(OSError):
                self._sock.send(json.dumps({"type": "stop"}).encode())
        self._on_lost()
        with contextlib.suppress(OSError):
            self._sock.close()
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def terminate(self) -> None:
        """SIGTERM the server (sync, for a hard exit); its workers receive their parent-death signal."""
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.send_signal(signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
