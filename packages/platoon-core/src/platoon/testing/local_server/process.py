"""The local Tinker server for the life of one command: in a child process on a free loopback port.

`start_local_server_process` is what `TINKER_BASE_URL=local` starts (core.md 8.7); `serve_foreground` is
`platoon tinker serve`. The child prints its base URL as its first stdout line and exits when its stdin closes.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from platoon.errors import PlatoonError
from platoon.testing.local_server import DEFAULT_MODEL, LocalTinkerServer, require_torch

#: seconds the parent waits for the child's base URL (importing torch and transformers takes a while)
START_TIMEOUT = 180.0


def default_state_dir() -> Path:
    """`<site cache>/local-tinker`: the site profile's cache root, else platoon's default cache root."""
    from platoon.config.site import default_cache_root, load_site

    profile = load_site()
    root = profile.cache_root if profile is not None else default_cache_root()
    return root / "local-tinker"


def start_local_server_process(
    *,
    model: str = DEFAULT_MODEL,
    state_dir: str | os.PathLike[str] | None = None,
    timeout: float = START_TIMEOUT,
) -> tuple[str, Callable[[], None]]:
    """Start the server in a child process; returns its base URL and a `stop()` that ends it and waits."""
    require_torch()  # the one-line error here, not a child's traceback
    directory = Path(state_dir) if state_dir is not None else default_state_dir()
    command = [
        sys.executable,
        "-m",
        "platoon.testing.local_server.process",
        "--model",
        model,
        "--dir",
        str(directory),
        "--exit-on-stdin-eof",
    ]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    assert child.stdout is not None
    stdout = child.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()

    def stop() -> None:
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

    try:
        line = lines.get(timeout=timeout).strip()
    except queue.Empty:
        stop()
        raise PlatoonError(f"the local Tinker server did not start within {timeout:.0f} s") from None
    if not line.startswith("http://"):
        code = child.wait()
        stop()
        raise PlatoonError(f"the local Tinker server failed to start (exit {code}; its error is above)")
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
    parser = argparse.ArgumentParser(prog="python -m platoon.testing.local_server.process")
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
