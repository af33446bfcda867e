"""The local Tinker server for the life of one command: in a child process on a free loopback port.

`start_local_server_process` is what `TINKER_BASE_URL=local` starts; `serve_foreground` is
`platoon tinker serve`. The child prints its base URL as its first stdout line and exits when its stdin closes.
It runs in a session of its own, so a Ctrl-C at the terminal reaches the command (which stops at its own pace and
then stops the server) and never the server first.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from platoon.errors import PlatoonError
from platoon.local_server import DEFAULT_MODEL, LocalTinkerServer, require_torch

#: seconds the parent waits for the child's base URL (importing torch and transformers takes a while)
START_TIMEOUT = 180.0
#: how often a start looks whether its caller asked to stop
_STOP_POLL_SECONDS = 0.2


def default_state_dir() -> Path:
    """`<site cache>/local-tinker`: the site profile's cache root, else platoon's default cache root."""
    from platoon.config.site import default_cache_root, load_site

    profile = load_site()
    root = profile.cache_root if profile is not None else default_cache_root()
    return root / "local-tinker"


class StartAbandoned(PlatoonError):
    """The caller asked to stop while the local server was still starting; the child is stopped."""


def start_local_server_process(
    *,
    model: str = DEFAULT_MODEL,
    state_dir: str | os.PathLike[str] | None = None,
    timeout: float = START_TIMEOUT,
    on_exit: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[str, Callable[[], None]]:
    """Start the server in a child process; returns its base URL and a `stop()` that ends it and waits.

    `on_exit(returncode)` is called (from a watcher thread) as soon as the child exits without `stop()` having
    asked it to (killed, crashed). `should_stop()` is polled while the child starts: when it says so, the child is
    stopped and `StartAbandoned` raised.
    """
    require_torch()  # the one-line error here, not a child's traceback
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
    ]
    # Its own session: the terminal's SIGINT (Ctrl-C) goes to the foreground process group, and the server must
    # outlive the command's stop at the next step boundary, which still saves through it.
    child = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    lines: queue.Queue[str] = queue.Queue()
    assert child.stdout is not None
    stdout = child.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    stopping = threading.Event()

    def stop() -> None:
        stopping.set()
        if child.poll() is None:
            # closing stdin asks for a clean stop; SIGTERM and SIGKILL follow if it does not come
            if child.stdin is not None:
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
        stdout.close()

    deadline = time.monotonic() + timeout
    line: str | None = None
    while line is None:
        if should_stop is not None and should_stop():
            child.terminate()  # still importing: it would notice its stdin closing only once it serves
            stop()
            raise StartAbandoned("stopped while the local Tinker server was starting")
        left = deadline - time.monotonic()
        if left <= 0:
            stop()
            raise PlatoonError(f"the local Tinker server did not start within {timeout:.0f} s")
        try:
            line = lines.get(timeout=min(left, _STOP_POLL_SECONDS)).strip()
        except queue.Empty:
            continue
    if not line.startswith("http://"):
        code = child.wait()
        stop()
        raise PlatoonError(f"the local Tinker server failed to start (exit {code}; its error is above)")

    def watch() -> None:
        code = child.wait()
        if not stopping.is_set() and on_exit is not None:
            on_exit(code)

    if on_exit is not None:
        threading.Thread(target=watch, name="platoon-local-server-watch", daemon=True).start()
    return line, stop


def serve_foreground(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    state_dir: str | os.PathLike[str] | None = None,
    model: str = DEFAULT_MODEL,
    exit_on_stdin_eof: bool = False,
) -> int:
    """Serve until interrupted (Ctrl-C, SIGTERM, or stdin closing when asked); the base URL goes to stdout."""
    from platoon.cli.output import err

    directory = Path(state_dir) if state_dir is not None else default_state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    server = LocalTinkerServer(model=model, host=host, port=port, state_dir=directory)
    server.start()
    done = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: done.set())
    if exit_on_stdin_eof:
        # The parent holds our stdin open; EOF means it is gone, so an orphaned server never lingers.
        def watch_stdin() -> None:
            sys.stdin.read()
            done.set()

        threading.Thread(target=watch_stdin, daemon=True).start()
    try:
        print(server.base_url, flush=True)
        err(
            f"local Tinker server for {model} at {server.base_url} (checkpoints in {directory}); "
            f"use TINKER_BASE_URL={server.base_url} and any TINKER_API_KEY starting with tml-; Ctrl-C stops it"
        )
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m platoon.local_server.process")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--exit-on-stdin-eof", action="store_true")
    args = parser.parse_args(argv)
    try:
        return serve_foreground(
            host=args.host,
            port=args.port,
            state_dir=args.dir,
            model=args.model,
            exit_on_stdin_eof=args.exit_on_stdin_eof,
        )
    except PlatoonError as exc:
        print(f"platoon: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
