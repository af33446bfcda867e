"""Routes for the process provider (harness.md 5.6): a forwarder on a free loopback port per Unix-socket upstream
of a `network: none` sandbox, so such a sandbox reaches the gateway the way an isolated one does.

The forwarder carries `PLATOON_INFRA=route` (so `kill_processes` spares it and the health check can tell it from
a process that reused its pid) and the sandbox's `PLATOON_SANDBOX_ROOT` (so stop and reap kill it like the rest).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from platoon_sandbox import procs
from platoon_sandbox.contract import SandboxError

__all__ = ["Forwarder", "find_python"]

START_WAIT_S = 30.0
SCRIPT = Path(__file__).with_name("forwarder.py")


async def _python_ok(path: str) -> bool:
    try:
        proc = await asyncio.create_subprocess_exec(
            path, "-c", "import sys; sys.exit(sys.version_info < (3, 6))", stdin=asyncio.subprocess.DEVNULL
        )
    except OSError:
        return False
    return await proc.wait() == 0


async def find_python(read_only_sources: Sequence[str]) -> str:
    """The first Python >= 3.6 among `bin/python3` of each read-only mount, then `python3`, `python`."""
    candidates = [os.path.join(source, "bin", "python3") for source in read_only_sources]
    candidates += [found for name in ("python3", "python") if (found := shutil.which(name))]
    for candidate in candidates:
        if os.access(candidate, os.X_OK) and await _python_ok(candidate):
            return candidate
    raise SandboxError(
        "no Python 3.6 or newer to run the route forwarder (none in the read-only mounts or on PATH)"
    )


class Forwarder:
    """One upstream's forwarder; its state files are `<state>/<name>.pid`, `.port` and `.log`."""

    def __init__(
        self, name: str, socket_path: Path, state: Path, python: str, env: Mapping[str, str]
    ) -> None:
        self.name = name
        self.socket_path = socket_path
        self.state = state
        self.python = python
        self.env = {**env, "PLATOON_INFRA": "route"}
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._started: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        """Start listening on `port` (0: a free one) and wait up to 30 s for its port file."""
        self.state.mkdir(parents=True, exist_ok=True)
        script = self.state / "forwarder.py"
        if not script.exists():
            shutil.copyfile(SCRIPT, script)
        port_file = self.state / f"{self.name}.port"
        port_file.unlink(missing_ok=True)
        with open(self.state / f"{self.name}.log", "ab") as log:
            self._proc = await asyncio.create_subprocess_exec(
                self.python,
                str(script),
                str(self.socket_path.parent),
                self.socket_path.name,
                str(port_file),
                str(port),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
                start_new_session=True,  # no terminal or caller's group signal reaches it
            )
        self._started = procs.start_time(self._proc.pid)
        (self.state / f"{self.name}.pid").write_text(str(self._proc.pid))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_WAIT_S
        while not port_file.exists():
            if self._proc.returncode is not None or loop.time() > deadline:
                await self.stop()
                raise SandboxError(
                    f"the route forwarder for {self.name!r} did not start (see {self.state / (self.name + '.log')})"
                )
            await asyncio.sleep(0.005)
        self.port = int(port_file.read_text())

    def healthy(self) -> bool:
        """Alive, and still the forwarder: its environment holds PLATOON_INFRA=route (a pid-reuse guard)."""
        if self._proc is None or not procs.alive(self._proc.pid, self._started):
            return False
        return self._proc.pid in procs.pids_with_marker([b"PLATOON_INFRA=route"])

    async def ensure(self) -> None:
        """Restart a dead forwarder on its port, or on a new free one when another process took it."""
        if self.healthy():
            return
        await self.stop()
        try:
            await self.start(self.port)
        except SandboxError:
            await self.start(0)

    async def stop(self) -> None:
        if self._proc is not None:
            procs.kill_group(self._proc.pid, self._started)
            await self._proc.wait()
            self._proc = None
