"""The local Tinker server for the life of one command: in a child process on a free loopback port.

`start_local_server_process` is what `TINKER_BASE_URL=local` starts; `serve_foreground` is
`platoon tinker serve`. The parent issues the child's API key and writes it as the first line of the child's stdin
(never on its command line, which every user of the machine can read); the child prints its base URL as its first
stdout line and exits when its stdin closes. It runs in a session of its own, so a Ctrl-C at the terminal reaches
the command (which stops at its own pace and then stops the server) and never the server first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from platoon.config.site import default_cache_root, load_site
from platoon.console import write_stderr
from platoon.errors import ConfigError, PlatoonError
from platoon.local_server import (
    DEFAULT_ENGINE,
    DEFAULT_MODEL,
    ENGINE_NAMES,
    LocalTinkerServer,
    check_api_key,
    is_loopback,
    issue_api_key,
)
from platoon.local_server.engines import require_engine, warm_up

#: seconds the parent waits for the child's base URL (importing torch and transformers, on that engine, takes a
#: while)
START_TIMEOUT = 180.0
#: how often a start looks whether its caller asked to stop
_STOP_POLL_SECONDS = 0.2


def default_state_dir() -> Path:
    """`<site cache>/local-tinker`: the site profile's cache root, else platoon's default cache root."""
    profile = load_site()
    root = profile.cache_root if profile is not None else default_cache_root()
    return root / "local-tinker"


class StartAbandoned(PlatoonError):
    """The caller asked to stop while the local server was still starting; the child is stopped."""


class LocalServerChild:
    """The local server in a child process, started at once and waited for later, so the caller's own start-up
    (listing tasks, importing the SDK) overlaps the child's (importing torch, building the model).

    The child takes only `api_key`, issued here, and runs its model on `engine`. It prints its base URL as soon as
    it listens, then imports the engine (torch and the model's classes, for `torch`) in the background (`--warm`),
    so the first `create_model` does not pay for them.
    `url()` waits for the base URL;
    `stop()` ends the child and waits. `on_exit(returncode)` (settable until `url()` is called) is called from a
    watcher thread as soon as the child exits after it gave its URL and without `stop()` having asked it to
    (killed, crashed).
    """

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        state_dir: str | os.PathLike[str] | None = None,
        on_exit: Callable[[int], None] | None = None,
        warm: bool = True,
        engine: str = DEFAULT_ENGINE,
    ) -> None:
        require_engine(engine)  # the one-line error here, not a child's traceback
        directory = Path(state_dir) if state_dir is not None else default_state_dir()
        command = [
            sys.executable,
            "-m",
            "platoon.local_server.process",
            "--model",
            model,
            "--dir",
            str(directory),
            "--exit-on-stdin-eof",
            "--key-from-stdin",
            "--engine",
            engine,
        ]
        if warm:
            command.append("--warm")
        self.started_at = time.monotonic()
        # Its own session: the terminal's SIGINT (Ctrl-C) goes to the foreground process group, and the server
        # must outlive the command's stop at the next step boundary, which still saves through it.
        self._child = child = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        self.pid = child.pid
        #: the one key the child takes (handed to the SDK client of this command, and to nothing else)
        self.api_key = issue_api_key()
        assert child.stdin is not None
        with contextlib.suppress(OSError):  # a child that died at once is reported by `url()`
            child.stdin.write(self.api_key + "\n")
            child.stdin.flush()
        self.on_exit = on_exit
        self._lines: queue.Queue[str] = queue.Queue()
        assert child.stdout is not None
        self._stdout = stdout = child.stdout
        threading.Thread(target=lambda: self._lines.put(stdout.readline()), daemon=True).start()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._url: str | None = None
        self._exit_code: int | None = None
        threading.Thread(target=self._watch, name="platoon-local-server-watch", daemon=True).start()

    def _watch(self) -> None:
        code = self._child.wait()
        with self._lock:
            self._exit_code = code
            served = self._url is not None
        # Before it gave its URL, `url()` reports the failed start itself.
        if served and not self._stopping.is_set() and self.on_exit is not None:
            self.on_exit(code)

    def url(
        self,
        *,
        timeout: float = START_TIMEOUT,
        should_stop: Callable[[], bool] | None = None,
    ) -> str:
        """The child's base URL, once it listens. `should_stop()` is polled meanwhile: when it says so, the child
        is stopped and `StartAbandoned` raised."""
        if self._url is not None:
            return self._url
        deadline = time.monotonic() + timeout
        line: str | None = None
        while line is None:
            if should_stop is not None and should_stop():
                self.stop()
                raise StartAbandoned("stopped while the local Tinker server was starting")
            now = time.monotonic()
            if now >= deadline:
                self.stop()
                raise PlatoonError(f"the local Tinker server did not start within {timeout:.0f} s")
            try:
                line = self._lines.get(timeout=min(deadline - now, _STOP_POLL_SECONDS)).strip()
            except queue.Empty:
                continue
        if not line.startswith("http://"):
            code = self._child.wait()
            self.stop()
            raise PlatoonError(f"the local Tinker server failed to start (exit {code}; its error is above)")
        with self._lock:
            self._url = line
            died = self._exit_code
        if died is not None and not self._stopping.is_set() and self.on_exit is not None:
            self.on_exit(died)  # it died between printing its URL and this call: said as any later death
        return line

    def stop(self) -> None:
        """End the child and wait: closing its stdin asks a server that was used for a clean stop; SIGTERM and
        SIGKILL follow if it does not come. A child never used is sent SIGTERM at once: it may still be importing,
        and it notices its stdin closing only once it serves."""
        self._stopping.set()
        child = self._child
        if child.poll() is None:
            if self._url is None:
                child.terminate()
            if child.stdin is not None:
                with contextlib.suppress(OSError):
                    child.stdin.close()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.terminate()
                try:
                    child.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        self._stdout.close()


def start_local_server_process(
    *,
    model: str = DEFAULT_MODEL,
    state_dir: str | os.PathLike[str] | None = None,
    timeout: float = START_TIMEOUT,
    on_exit: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    engine: str = DEFAULT_ENGINE,
) -> tuple[str, str, Callable[[], None]]:
    """Start the server in a child process and wait for it; returns its base URL, the API key it issued for this
    command, and a `stop()` that ends it and waits (`LocalServerChild` starts it without waiting).

    `on_exit(returncode)` is called (from a watcher thread) as soon as the child exits without `stop()` having
    asked it to (killed, crashed). `should_stop()` is polled while the child starts: when it says so, the child is
    stopped and `StartAbandoned` raised. `engine` names what runs the model.
    """
    child = LocalServerChild(model=model, state_dir=state_dir, on_exit=on_exit, engine=engine)
    return child.url(timeout=timeout, should_stop=should_stop), child.api_key, child.stop


def check_listening(host: str, api_key: str | None) -> None:
    """Refuse (ConfigError, exit 78) a given key a server may not take, and a `host` beyond loopback without one:
    anyone who can reach the port and holds the key can train, save and delete weights, so a key for other machines
    is handed out on purpose, never made up for every address of this one."""
    if api_key is not None:
        check_api_key(api_key, where="--api-key")
    elif not is_loopback(host):
        raise ConfigError(
            f"--host {host} listens beyond this machine, where anyone who can reach the port could train, save "
            "and delete weights: pass --api-key with a key (tml- and 16 or more characters) for your clients, or "
            "keep the default --host 127.0.0.1"
        )


def banner(
    *,
    model: str,
    base_url: str,
    listening_on: str | None,
    directory: Path,
    issued_key: str | None,
    for_a_command: bool,
) -> list[str]:
    """What a started server says on stderr, line by line (without the `platoon: ` prefix): short lines that fit
    100 columns with a usual model name and state directory.

    `listening_on` is the bound `host:port` of a server beyond loopback (None on loopback); `issued_key` the key
    it issued (None when it was given one). A server `for_a_command` (`tinker_base_url: local`) says only where it
    is: that command named the model, holds the key and stops the server itself.
    """
    home = Path.home()
    where = f"~/{directory.relative_to(home)}" if directory.is_relative_to(home) else str(directory)
    if for_a_command:
        return [f"local Tinker server at {base_url}, checkpoints in {where}"]
    if listening_on is None:
        lines = [f"local Tinker server for {model} at {base_url}"]
        url_line = f"TINKER_BASE_URL={base_url}"
    else:
        lines = [f"local Tinker server for {model}, listening on {listening_on}"]
        url_line = f"TINKER_BASE_URL={base_url} (reachable by other machines)"
    key_line = (
        f"TINKER_API_KEY={issued_key} (no other key works)"
        if issued_key is not None
        else "TINKER_API_KEY: the key given with --api-key (no other key works)"
    )
    return [*lines, f"checkpoints in {where}; Ctrl-C stops the server", url_line, key_line]


#: the BLAS thread count the numpy engine's server runs with, unless the environment sets one: the toy model's
#: matrices are too small for several threads to pay, and OpenBLAS's default (a thread per core, spinning) made a
#: training step several times slower on a busy 2-core machine (benchmarks/qwen3_numpy.py, docs/local-server.md)
NUMPY_ENGINE_BLAS_THREADS = "1"


def limit_blas_threads() -> None:
    """Give numpy's OpenBLAS `NUMPY_ENGINE_BLAS_THREADS` threads, where the user set no count and numpy is not yet
    imported (OpenBLAS reads the variable once, when numpy loads it)."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", NUMPY_ENGINE_BLAS_THREADS)


def serve_foreground(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    state_dir: str | os.PathLike[str] | None = None,
    model: str = DEFAULT_MODEL,
    api_key: str | None = None,
    max_body_bytes: int | None = None,
    max_json_depth: int | None = None,
    exit_on_stdin_eof: bool = False,
    warm: bool = True,
    engine: str = DEFAULT_ENGINE,
) -> int:
    """Serve until interrupted (Ctrl-C, SIGTERM, or stdin closing when asked); the base URL goes to stdout, then
    the key the server issued (a key given as `api_key` is not repeated).

    A `host` other than loopback needs an `api_key` (`check_listening`); the model runs on `engine`. `warm`: once
    it listens, import the engine and build `model`'s tokenizer in the background, so the first `create_model` finds
    them ready (a request that needs them meanwhile waits for the warm-up).
    """
    check_listening(host, api_key)
    if engine == "numpy":
        limit_blas_threads()
    directory = Path(state_dir) if state_dir is not None else default_state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    server = LocalTinkerServer(
        model=model,
        host=host,
        port=port,
        state_dir=directory,
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        max_json_depth=max_json_depth,
        engine=engine,
    )
    server.start()
    done = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: done.set())
    if exit_on_stdin_eof:
        # The parent holds our stdin open; EOF means it is gone, so an orphaned server never lingers.
        def watch_stdin() -> None:
            sys.stdin.read()
            done.set()

        threading.Thread(target=watch_stdin, daemon=True).start()
    if warm:
        threading.Thread(
            target=warm_up, args=(model, engine), name="local-tinker-warm-up", daemon=True
        ).start()
    try:
        print(server.base_url, flush=True)
        if api_key is None:
            print(server.api_key, flush=True)
        lines = banner(
            model=model,
            base_url=server.base_url,
            listening_on=None if is_loopback(host) else server.listening_on,
            directory=directory,
            issued_key=server.api_key if api_key is None else None,
            for_a_command=exit_on_stdin_eof,
        )
        write_stderr("".join(f"platoon: {line}\n" for line in lines))  # one write: the banner is never split
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
    return 0


def exit_process(status: int) -> NoReturn:
    """End this server process with `status` once what it wrote is flushed, skipping the interpreter's teardown
    and the C++ exit handlers.

    By the time a server stops, torch may be loaded, or half loaded by the warm-up thread. The teardown would walk
    and free all of it (a second or more), triton's nanobind bindings would print "leaked" reports, and libtorch's
    static destructors deregister every operator from its dispatcher: after a Ctrl-C that landed while the warm-up
    was still importing torch, they took 57 and 80 s on 2 cores busy with six other processes (gdb: the main
    thread in `TorchLibraryInit::~TorchLibraryInit` under `exit()`), so a Ctrl-C did not stop the server. Nothing
    of the server is left to run at this point (`serve_foreground` stopped and joined it)."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone, a stream closed: nothing more to say
            stream.flush()
    os._exit(status)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m platoon.local_server.process")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--exit-on-stdin-eof", action="store_true")
    parser.add_argument("--key-from-stdin", action="store_true", help="the API key is stdin's first line")
    parser.add_argument("--warm", action="store_true", help="import the engine and the tokenizer at once")
    parser.add_argument("--engine", choices=ENGINE_NAMES, default=DEFAULT_ENGINE)
    args = parser.parse_args(argv)
    try:
        api_key = None
        if args.key_from_stdin:
            api_key = sys.stdin.readline().strip()
            if not api_key:
                raise ConfigError("--key-from-stdin: stdin closed before it gave a key")
        return serve_foreground(
            host=args.host,
            port=args.port,
            state_dir=args.dir,
            model=args.model,
            api_key=api_key,
            exit_on_stdin_eof=args.exit_on_stdin_eof,
            warm=args.warm,
            engine=args.engine,
        )
    except PlatoonError as exc:
        print(f"platoon: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code


if __name__ == "__main__":
    # Everything the server writes is written (stop() joined it); the trainer waits for this exit.
    exit_process(main())
