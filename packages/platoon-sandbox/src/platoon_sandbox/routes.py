"""Routes: a forwarder per Unix-socket upstream of a sandbox off the host's network (`none`,
`public`, `allowlist`): the only way such a sandbox reaches the gateway.

`Forwarder` runs `forwarder.py` on the host for the process provider, with the sandbox's `PLATOON_SANDBOX_ROOT` (so
stop and reap kill it like the rest): on a free host loopback port, or, given an `nsenter` prefix, inside the
sandbox's own network namespace on 18080, 18081, ... `ContainerForwarders` runs the same script *inside*
a container that has its own network namespace (docker), on the fixed ports 18080, 18081, ... in upstream name
order, through a shell the provider lends it. Either way the forwarder carries `PLATOON_INFRA=route`, so
`kill_processes` spares it and the health check can tell it from a process that reused its pid.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from platoon.sandbox import SandboxError, SandboxSpec
from platoon_sandbox import procs

__all__ = ["ContainerForwarders", "Forwarder", "find_python", "python_candidates"]

START_WAIT_S = 30.0
SCRIPT = Path(__file__).with_name("forwarder.py")
INFRA_ENV = "PLATOON_INFRA=route"
#: Inside a sandbox with its own network namespace: the first forwarded upstream's port, then one more per upstream.
FIRST_PORT = 18080
#: Where the socket directories are bound and the forwarder is uploaded inside a container.
MOUNT_ROOT = "/run/platoon"
STATE_DIR = "/tmp/platoon-route"


def python_candidates(read_only_dirs: Sequence[str]) -> list[str]:
    """Where to look for the forwarder's Python, in order: `bin/python3` of each read-only mount, then the names
    `python3` and `python` (looked up on PATH)."""
    return [os.path.join(d, "bin", "python3") for d in read_only_dirs] + ["python3", "python"]


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
    candidates = [
        found
        for candidate in python_candidates(read_only_sources)
        if (found := candidate if os.sep in candidate else shutil.which(candidate))
    ]
    for candidate in candidates:
        if os.access(candidate, os.X_OK) and await _python_ok(candidate):
            return candidate
    raise SandboxError(
        "no Python 3.6 or newer to run the route forwarder (none in the read-only mounts or on PATH)"
    )


class Forwarder:
    """One upstream's forwarder; its state files are `<state>/<name>.pid`, `.port` and `.log`."""

    def __init__(
        self,
        name: str,
        socket_path: Path,
        state: Path,
        python: str,
        env: Mapping[str, str],
        prefix: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.socket_path = socket_path
        self.state = state
        self.python = python
        self.prefix = list(prefix)  # runs it elsewhere: `nsenter ... --` into a sandbox's network namespace
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
                *self.prefix,
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


# The scripts below run inside the container under POSIX sh (busybox or Debian); "$0" is a placeholder name.

# Prints the first candidate that runs and is Python >= 3.6; exit 3 when none is.
_FIND_PYTHON = r"""
for c in "$@"; do
  if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 6))' >/dev/null 2>&1; then echo "$c"; exit 0; fi
done
exit 3
"""

# Starts the forwarder in the background (its environment holds PLATOON_INFRA=route, given to this exec), records
# its pid, waits up to 30 s for its port file and prints `pid:starttime:port`; exit 2 when it died, 3 on timeout.
_START = r"""
py=$1; script=$2; dir=$3; sock=$4; state=$5; name=$6; port=$7
mkdir -p "$state" || exit 1
rm -f "$state/$name.port"
"$py" "$script" "$dir" "$sock" "$state/$name.port" "$port" </dev/null >>"$state/$name.log" 2>&1 &
pid=$!
echo "$pid" > "$state/$name.pid"
i=0
while [ ! -f "$state/$name.port" ]; do
  read -r s 2>/dev/null < "/proc/$pid/stat" || exit 2
  s=${s##*) }; set -- $s
  [ "$1" = Z ] && exit 2
  i=$((i + 1))
  if [ $i -gt 600 ]; then kill -9 "$pid"; exit 3; fi
  sleep 0.05
done
read -r s < "/proc/$pid/stat"; s=${s##*) }; set -- $s
echo "$pid:${20}:$(cat "$state/$name.port")"
"""

# For each `name=pid` argument, prints the name unless that pid is alive (not a zombie) and its environment holds
# PLATOON_INFRA=route (a pid-reuse guard).
_UNHEALTHY = r"""
for a in "$@"; do
  n=${a%%=*}; p=${a#*=}
  ok=0
  if read -r s 2>/dev/null < "/proc/$p/stat"; then
    s=${s##*) }; set -- $s
    if [ "$1" != Z ] && tr '\0' '\n' 2>/dev/null < "/proc/$p/environ" | grep -qxF PLATOON_INFRA=route; then ok=1; fi
  fi
  [ $ok = 1 ] || echo "$n"
done
"""

#: Runs `sh -c SCRIPT platoon ARGS...` in the sandbox with extra env; returns (exit code, stdout, stderr).
Shell = Callable[[str, Sequence[str], Mapping[str, str]], Awaitable[tuple[int, str, str]]]
#: Copies a host file into the sandbox.
Upload = Callable[[Path, str], Awaitable[None]]


class ContainerForwarders:
    """The forwarders inside one container (its own network namespace): each Unix-socket upstream's directory is
    expected bound read-only at `/run/platoon/<name>` (see `binds`); state files live in `/tmp/platoon-route`."""

    @classmethod
    def for_spec(cls, spec: SandboxSpec, shell: Shell) -> ContainerForwarders:
        """A container sandbox's forwarders: one per Unix-socket upstream when it has a network namespace of its own
        (none, public, allowlist: 5.6, 5.7); a host-network sandbox reaches the gateway on loopback and gets none."""
        return cls(
            spec.upstreams if spec.network != "host" else {},
            [m.target for m in spec.mounts if m.read_only],
            shell,
        )

    def __init__(self, upstreams: Mapping[str, str], read_only_targets: Sequence[str], shell: Shell) -> None:
        unix = sorted((n, u[len("unix://") :]) for n, u in upstreams.items() if u.startswith("unix://"))
        self._sockets = dict(unix)
        self._ports = {name: FIRST_PORT + i for i, (name, _) in enumerate(unix)}
        self._read_only = list(read_only_targets)
        self._shell = shell
        self._python = ""
        self._pids: dict[str, str] = {}  # name -> "pid:starttime" (kept alive by kill_processes)

    @staticmethod
    def binds(upstreams: Mapping[str, str]) -> list[tuple[str, str]]:
        """(host directory, container directory) to bind read-only: each Unix socket's directory, so the socket may
        appear later and the sandbox cannot write the host directory."""
        return sorted(
            (os.path.dirname(u[len("unix://") :]), f"{MOUNT_ROOT}/{n}")
            for n, u in upstreams.items()
            if u.startswith("unix://")
        )

    @property
    def routes(self) -> dict[str, str]:
        return {name: f"http://127.0.0.1:{port}" for name, port in self._ports.items()}

    @property
    def keep(self) -> list[str]:
        """The forwarders' `pid:starttime`, for a container-wide kill to spare."""
        return list(self._pids.values())

    async def start(self, upload: Upload) -> None:
        if not self._sockets:
            return
        rc, out, _ = await self._shell(_FIND_PYTHON, python_candidates(self._read_only), {})
        if rc != 0 or not out.strip():
            raise SandboxError(
                "no Python 3.6 or newer to run the route forwarder in the sandbox (none of "
                f"{', '.join(python_candidates(self._read_only))})"
            )
        self._python = out.strip()
        await upload(SCRIPT, f"{STATE_DIR}/forwarder.py")
        for name in self._sockets:
            await self._start_one(name)

    async def _start_one(self, name: str) -> None:
        socket_name = os.path.basename(self._sockets[name])
        args = [
            self._python,
            f"{STATE_DIR}/forwarder.py",
            f"{MOUNT_ROOT}/{name}",
            socket_name,
            STATE_DIR,
            name,
            str(self._ports[name]),
        ]
        self._pids.pop(name, None)
        rc, out, err = await self._shell(_START, args, {"PLATOON_INFRA": "route"})
        if rc != 0:
            raise SandboxError(
                f"the route forwarder for {name!r} did not start (exit {rc}; see {STATE_DIR}/{name}.log in the "
                f"sandbox){': ' + err.strip() if err.strip() else ''}"
            )
        pid, started, _port = out.strip().rsplit(":", 2)
        self._pids[name] = f"{pid}:{started}"

    async def ensure(self) -> None:
        """Restart every dead forwarder on its port (the namespace is the sandbox's own: nobody else takes it)."""
        if not self._sockets:
            return
        pairs = [f"{name}={self._pids.get(name, '0:0').split(':')[0]}" for name in self._sockets]
        rc, out, err = await self._shell(_UNHEALTHY, pairs, {})
        if rc != 0:
            raise SandboxError(f"cannot check the route forwarders (exit {rc}): {err.strip()}")
        for name in out.split():
            await self._start_one(name)
