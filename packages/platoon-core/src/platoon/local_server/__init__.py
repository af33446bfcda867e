"""The local Tinker-compatible server: a CPU training service the unmodified Tinker SDK talks to.

`local_tinker_server()` runs it in a thread of this process; `process.start_local_server_process` runs it in a
child process; `platoon tinker serve` runs it in the foreground. torch and uvicorn are imported when it starts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.errors import PlatoonError

if TYPE_CHECKING:
    from platoon.local_server.app import BackendFactory, ServerState

__all__ = [
    "DEFAULT_API_KEY",
    "DEFAULT_MODEL",
    "LocalServerUnavailable",
    "LocalTinkerServer",
    "local_tinker_server",
]

DEFAULT_MODEL = "platoon/toy"
#: the key platoon hands the SDK for the local server; any key starting with `tml-` is accepted
DEFAULT_API_KEY = "tml-platoon-local"
#: the largest request line and headers uvicorn's h11 reads (a larger head is answered 400)
MAX_HEADER_BYTES = 16 << 10
MISSING_TORCH = (
    "the local Tinker-compatible server needs torch, which is not installed: pip install 'platoon[local]'"
)


class LocalServerUnavailable(PlatoonError, ImportError):
    """The local server's dependencies are missing; the message is one line naming the extra to install."""


def require_torch() -> None:
    """Raise the one-line `LocalServerUnavailable` when torch is not installed.

    Only the module is looked up: importing torch takes seconds, and the backend imports it on the first model.
    """
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # `sys.modules["torch"] = None` and broken installs land here
        found = False
    if not found:
        raise LocalServerUnavailable(MISSING_TORCH)


def default_backend_factory() -> BackendFactory:
    require_torch()
    from platoon.local_server.backend import ModelBackend

    return ModelBackend.create


class LocalTinkerServer:
    """A local Tinker server on a loopback port, served by uvicorn in a background thread.

    `base_url` and `api_key` are what `tinker.ServiceClient(base_url=..., api_key=...)` takes. `state_dir` holds
    the checkpoints (a temporary directory, removed on stop, when not given). `max_body_bytes` (64 MiB) and
    `body_idle_seconds` (30 s) bound what one request body may take (413 and 408 past them).
    """

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        host: str = "127.0.0.1",
        port: int = 0,
        state_dir: str | os.PathLike[str] | None = None,
        api_key: str = DEFAULT_API_KEY,
        backend_factory: BackendFactory | None = None,
        long_poll_seconds: float | None = None,
        max_body_bytes: int | None = None,
        body_idle_seconds: float | None = None,
    ) -> None:
        self.model = model
        self.host = host
        self.port = port
        self.api_key = api_key
        self._state_dir = Path(state_dir) if state_dir is not None else None
        self._backend_factory = backend_factory
        self._long_poll_seconds = long_poll_seconds
        self._max_body_bytes = max_body_bytes
        self._body_idle_seconds = body_idle_seconds
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.state: ServerState | None = None

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the local Tinker server is not started")
        return f"http://{_url_host(self.host)}:{self.port}"

    @property
    def state_dir(self) -> Path:
        if self._state_dir is None:
            raise RuntimeError("the local Tinker server is not started")
        return self._state_dir

    def start(self) -> LocalTinkerServer:
        """Bind the port, start serving, and return once the server answers."""
        if self._server is not None:
            return self
        factory = self._backend_factory or default_backend_factory()
        import uvicorn

        from platoon.local_server.app import ServerState, build_app
        from platoon.local_server.futures import FutureStore

        if self._state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="platoon-local-tinker-")
            self._state_dir = Path(self._tmp.name)
        futures = (
            FutureStore()
            if self._long_poll_seconds is None
            else FutureStore(long_poll_seconds=self._long_poll_seconds)
        )
        limits: dict[str, Any] = {}
        if self._max_body_bytes is not None:
            limits["max_body_bytes"] = self._max_body_bytes
        if self._body_idle_seconds is not None:
            limits["body_idle_seconds"] = self._body_idle_seconds
        self.state = ServerState(
            model=self.model, state_dir=self._state_dir, backend_factory=factory, futures=futures, **limits
        )
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            build_app(self.state),
            log_level="warning",
            access_log=False,
            lifespan="off",
            # h11 whatever else is installed: its limits are the ones documented and tested
            http="h11",
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            # long-polls end at once on stop instead of holding shutdown for their 20 s
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)  # it captures signals only on the main thread
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="local-tinker-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the local Tinker server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving, fail what is still queued, and remove a temporary state directory."""
        server, thread, state = self._server, self._thread, self.state
        if state is not None:
            state.close()
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(timeout=10)
        self._server = self._thread = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self._state_dir = None

    def __enter__(self) -> LocalTinkerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def local_tinker_server(
    *,
    model: str = DEFAULT_MODEL,
    port: int = 0,
    state_dir: str | os.PathLike[str] | None = None,
    backend_factory: Callable[..., Any] | None = None,
) -> Iterator[LocalTinkerServer]:
    """Run a local Tinker server in a thread of this process for the `with` block."""
    server = LocalTinkerServer(model=model, port=port, state_dir=state_dir, backend_factory=backend_factory)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets it can tell are TCP, and without it
    # Nagle's algorithm against the client's delayed ACK adds ~40 ms to every reply on a kept-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PlatoonError(
            f"the local Tinker server cannot listen on {host}:{port}: {exc.strerror}"
        ) from None
    sock.set_inheritable(False)
    return sock


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
