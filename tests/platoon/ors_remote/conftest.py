"""Real openreward servers (`ors_server.py`, the SDK's `Server([...]).run`) started on 127.0.0.1 for the tests.

Each server runs in its own process; `OrsServer.open_sessions()` counts the environment instances it holds (each
marks itself live with a file from construction to teardown), so a test sees what a run left open.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

# a test loads `ors_server.py`'s environments in process too (`python://ors_server:GuessEnv`)
sys.path.insert(0, str(Path(__file__).parent))

SERVER_SCRIPT = Path(__file__).with_name("ors_server.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OrsServer:
    """One `ors_server.py` process; with `tls` (certificate, key, the CA that signed them: PEM files) over https."""

    def __init__(self, marks: Path, log_dir: Path, tls: tuple[Path, Path, Path] | None = None) -> None:
        self.port = free_port()
        self.marks = marks
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"{'https' if tls else 'http'}://{self.host}"
        self.log = log_dir / f"server-{self.port}.log"
        self._ready_context = ssl.create_default_context(cafile=str(tls[2])) if tls else None
        env = {**os.environ, "OPENREWARD_DISABLE_UPDATE_CHECK": "1"}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(SERVER_SCRIPT),
                    str(self.port),
                    str(marks),
                    *map(str, tls[:2] if tls else ()),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        # A guard against a server that never comes up (importing the SDK takes seconds of CPU), not a timing test.
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the ORS server exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(
                    f"{self.url}/health", timeout=2, context=self._ready_context
                ) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the ORS server on {self.url} did not start:\n{self.log.read_text()[-3000:]}"
                )
            time.sleep(0.1)

    def open_sessions(self) -> int:
        return sum(1 for _ in self.marks.glob(f"{self.port}-*"))

    def kill(self) -> None:
        """SIGKILL, and wait until the process is gone."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """`server_factory(tls=None)` -> a new `OrsServer`; every one is stopped at the end of the module."""
    marks = tmp_path_factory.mktemp("ors-marks")
    logs = tmp_path_factory.mktemp("ors-logs")
    started: list[OrsServer] = []

    def start(tls: tuple[Path, Path, Path] | None = None) -> OrsServer:
        server = OrsServer(marks, logs, tls)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def servers(server_factory) -> tuple[OrsServer, OrsServer]:  # type: ignore[no-untyped-def]
    """Two servers shared by the module's tests (tests that kill one start their own)."""
    return server_factory(), server_factory()


@pytest.fixture(autouse=True)
def session_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own registry of open sessions."""
    path = tmp_path / "ors-sessions"
    monkeypatch.setenv("PLATOON_ORS_SESSION_DIR", str(path))
    monkeypatch.setenv("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
    for name in [n for n in os.environ if n.startswith("OPENREWARD_SESSION_URL")]:
        monkeypatch.delenv(name)
    return path
