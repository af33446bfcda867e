"""The local Tinker-compatible server: a CPU training service the unmodified Tinker SDK talks to.

`local_tinker_server()` runs it in a thread of this process; `process.start_local_server_process` runs it in a
child process; `platoon tinker serve` runs it in the foreground. Each server takes one API key, issued when it is
made (`issue_api_key`) unless one is given, and refuses every other. Its model runs on an engine chosen by name
(`engines`: `numpy`, the default, or `torch`); the engine and uvicorn are imported when it starts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.errors import ConfigError, PlatoonError
from platoon.local_server.engines import DEFAULT_ENGINE, ENGINE_NAMES, require_engine
from platoon.local_server.limits import DEFAULT_MAX_BODY_BYTES
from platoon.request_limits import BodyCap

if TYPE_CHECKING:
    from platoon.local_server.app import BackendFactory, ServerState

__all__ = [
    "DEFAULT_ENGINE",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MODEL",
    "ENGINE_NAMES",
    "LocalTinkerServer",
    "check_api_key",
    "is_loopback",
    "issue_api_key",
    "local_tinker_server",
]

DEFAULT_MODEL = "platoon/toy"
#: what every key starts with: the Tinker SDK refuses, on the client side, a key that does not
KEY_PREFIX = "tml-"
#: the fewest characters a given key holds after its prefix: a short key can be guessed by whoever reaches the port
MIN_KEY_CHARS = 16
_KEY_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")
#: the largest request line and headers uvicorn's h11 reads (a larger head is answered 400)
MAX_HEADER_BYTES = 16 << 10


def issue_api_key() -> str:
    """A fresh random key for one server (`tml-local-` and 256 random bits)."""
    return f"{KEY_PREFIX}local-{secrets.token_urlsafe(32)}"


def check_api_key(key: str, *, where: str = "the API key") -> str:
    """`key` when a server may take it: `tml-` and at least 16 more characters of letters, digits or `._~+/=-`;
    else a ConfigError (exit 78) naming `where` (the option or argument that gave it)."""
    rest = key[len(KEY_PREFIX) :] if key.startswith(KEY_PREFIX) else None
    if rest is None:
        raise ConfigError(f"{where} must start with {KEY_PREFIX}, as the Tinker client requires")
    if len(rest) < MIN_KEY_CHARS or not _KEY_CHARS.fullmatch(rest):
        raise ConfigError(
            f"{where} must hold at least {MIN_KEY_CHARS} letters, digits or ._~+/=- after {KEY_PREFIX} "
            "(a short key can be guessed by anyone who reaches the port)"
        )
    return key


def is_loopback(host: str) -> bool:
    """Whether listening on `host` keeps the server to this machine (`localhost`, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any address
        return False


def default_backend_factory(engine: str = DEFAULT_ENGINE) -> BackendFactory:
    """`ModelBackend.create` on the engine named `engine`; an engine that cannot start is a ConfigError (exit 78)
    naming the extra to install."""
    import functools

    require_engine(engine, where="the local server's engine")
    from platoon.local_server.backend import ModelBackend

    return functools.partial(ModelBackend.create, engine=engine)


class LocalTinkerServer:
    """A local Tinker server on a port of this machine (loopback unless `host` says otherwise), served by uvicorn in a
    background thread.

    `base_url` and `api_key` are what `tinker.ServiceClient(base_url=..., api_key=...)` takes: the key is the one
    given, else a fresh one (`issue_api_key`), and the server refuses every other (401). `state_dir` holds the
    checkpoints (a temporary directory, removed on stop, when not given). `engine` names what runs the model
    (`numpy`, the default, or `torch`). `max_body_bytes` (64 MiB) and
    `body_idle_seconds` (30 s) bound what one request body may take (413 and 408 past them), `max_json_depth`
    (64) how deeply its JSON may nest (400 past it).
    """

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        host: str = "127.0.0.1",
        port: int = 0,
        state_dir: str | os.PathLike[str] | None = None,
        api_key: str | None = None,
        backend_factory: BackendFactory | None = None,
        long_poll_seconds: float | None = None,
        max_body_bytes: int | None = None,
        body_idle_seconds: float | None = None,
        max_json_depth: int | None = None,
        engine: str = DEFAULT_ENGINE,
    ) -> None:
        self.model = model
        self.engine = engine
        self.host = host
        self.port = port
        self.api_key = issue_api_key() if api_key is None else check_api_key(api_key)
        self._max_json_depth = max_json_depth
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
        """The URL a client uses: for a server on every address (`0.0.0.0`, `::`), this machine's own address."""
        if self._server is None:
            raise RuntimeError("the local Tinker server is not started")
        return f"http://{_url_host(self.host)}:{self.port}"

    @property
    def listening_on(self) -> str:
        """`host:port` as bound (`0.0.0.0:8000` for every IPv4 address)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def state_dir(self) -> Path:
        if self._state_dir is None:
            raise RuntimeError("the local Tinker server is not started")
        return self._state_dir

    def start(self) -> LocalTinkerServer:
        """Bind the port, start serving, and return once the server answers."""
        if self._server is not None:
            return self
        factory = self._backend_factory or default_backend_factory(self.engine)
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
        if self._max_json_depth is not None:
            limits["max_json_depth"] = self._max_json_depth
        self.state = ServerState(
            model=self.model,
            state_dir=self._state_dir,
            backend_factory=factory,
            api_key=self.api_key,
            futures=futures,
            **limits,
        )
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            # BodyCap without a limit (the server's reader holds bodies to theirs): a refusal sent before the body
            # was read (413, 401) still reaches the SDK, which sends its whole body before it reads the answer
            BodyCap(build_app(self.state)),
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
    engine: str = DEFAULT_ENGINE,
) -> Iterator[LocalTinkerServer]:
    """Run a local Tinker server in a thread of this process for the `with` block, its model on `engine`."""
    server = LocalTinkerServer(
        model=model, port=port, state_dir=state_dir, backend_factory=backend_factory, engine=engine
    )
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
    if host in ("0.0.0.0", "", "::"):
        host = _own_address(socket.AF_INET6 if host == "::" else socket.AF_INET)
    return f"[{host}]" if ":" in host else host


def _own_address(family: socket.AddressFamily) -> str:
    """The address other machines reach this one by: the source address of the default route (a UDP `connect`
    sends nothing), else the host name, else loopback on a machine with no network at all."""
    probe = ("2001:db8::1", 9) if family == socket.AF_INET6 else ("192.0.2.1", 9)  # documentation addresses
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect(probe)
            return str(sock.getsockname()[0])
    except OSError:
        name = socket.gethostname()
        return name or ("::1" if family == socket.AF_INET6 else "127.0.0.1")
