"""The `docker` sandbox provider: one long-lived container per sandbox, driven by the docker CLI
for its life cycle and by the Engine API for the commands run in it.

The life cycle (run, cp, commit, rm, reap) goes through the docker CLI, whose behaviour it relies on
(`docker cp` semantics, label filters), and the binary is swappable through `PLATOON_DOCKER` (podman speaks the same
CLI). Commands (`exec` and the provider's own scripts) go through the `docker` SDK's Engine API client
(`platoon_sandbox.engine`), which saves the CLI's process start on the hot path; with another CLI than `docker`,
or an engine the SDK cannot reach, they fall back to `docker exec`.

Each sandbox is a detached container named `platoon-<12hex>` whose own processes are an init and a keep-alive: a
shell that no command can signal (`INIT`), so a command cannot end its own sandbox, and that reaps orphaned
children (the old flags: `sleep infinity` under `--init`). Commands carry `PLATOON_EXEC=<uuid>`:
abandoning an exec (its API connection or its `docker exec` client) does not stop the command inside, so a timeout
or a cancellation runs a kill script in the container that SIGKILLs every process whose environment holds the
marker.

Networks: `host` is the host's own namespace; every other policy starts the container with
`--network none`; `public` and `allowlist` then get filtered egress attached to its namespace (`egress`: one
slirp4netns per sandbox and nftables rules inside). Under `runtime: runsc` those two run under the engine runtime
`egress_runtime` (`runsc-hostinet`: gVisor with `--network=host`, whose kernel opens real sockets in the container's
own namespace, where the rules apply); gVisor's own network stack (`runsc`, `--network=none`) cannot be given one.

Routes: a container with a namespace of its own reaches each Unix-socket upstream through a
forwarder inside it (`routes.ContainerForwarders`): the socket's directory is bound read-only at `/run/platoon/<name>` and the forwarder
listens on 127.0.0.1:18080 (18081, ... in name order). It is started by its own `docker exec` (so no exec marker
reaches it) and `kill_processes` spares it by pid and start time, like the container's own processes.

Least privilege: every container drops all capabilities but `KEPT_CAPABILITIES`, runs with
`no-new-privileges` and a pids limit, takes CPU and memory limits from the spec, and its disk limit from
`storage_mb`: the storage driver's quota where the engine has one (`--storage-opt size=`, overlay2 on xfs with
pquota), else a watchdog that ends the sandbox (`SandboxDiskLimit`) once its writable layer passes the limit. A spec
with a `user` gets a container that runs as root and commands that run as that user; the provider's own commands
(kill scripts, routes, uploads) stay root, since docker gives an exec as root in a non-root container no
capabilities. The `runtime` option (`runsc`: gVisor) picks the engine's OCI runtime.

Registration: the process labels are merged into the spec's, the sandbox is registered (and
mirrored) before its container is created, and unregistered once the container is gone; a container that could not
be removed stays registered, so a reap by label finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import posixpath
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, cast

from platoon.sandbox import (
    ExecResult,
    Sandbox,
    SandboxDiskLimit,
    SandboxError,
    SandboxGone,
    SandboxProvider,
    SandboxSpec,
    unenforced_field,
)
from platoon_sandbox import egress
from platoon_sandbox.engine import POOL, engine_client, run_in_container, written_bytes
from platoon_sandbox.inside import KILL_ALL, LIST_OWN, OwnProcesses
from platoon_sandbox.output import CappedOutput, drain
from platoon_sandbox.registry import Registration, class_path, merge_labels, registry
from platoon_sandbox.routes import SCRIPT as FORWARDER_SCRIPT
from platoon_sandbox.routes import ContainerForwarders

__all__ = [
    "DEFAULT_EGRESS_RUNTIME",
    "DEFAULT_PIDS_LIMIT",
    "KEPT_CAPABILITIES",
    "DockerProvider",
    "DockerSandbox",
    "DockerSnapshot",
]

log = logging.getLogger(__name__)

#: Every CLI call except `exec` (which has the caller's timeout) may take this long: pulls, copies, commits.
CLI_TIMEOUT_S = 600.0
#: How often a running exec asks the engine whether its container still runs (one inspect call per exec and period).
ALIVE_CHECK_S = 5.0
SNAPSHOT_REPO = "platoon-snapshot"
#: How long a start waits for the container's init to have started its keep-alive (milliseconds, longer when loaded).
OWN_PROCESSES_WAIT_S = 10.0

#: The capabilities a sandbox keeps; docs/sandboxes.md says what needs each. They are what root needs in an ordinary
#: task image to install packages (apt-get, dpkg, pip) and manage users (useradd, chown, su), and to signal the
#: processes of a task's user. Docker's other defaults (AUDIT_WRITE, MKNOD, NET_BIND_SERVICE, NET_RAW, SETFCAP,
#: SETPCAP, SYS_CHROOT) are dropped: none of those steps needed them when tried in Debian bookworm.
KEPT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
#: Processes (threads included) a sandbox may hold at once when its spec names no `pids_limit`: podman's default,
#: ample for builds and test runners, far below what starves a node.
DEFAULT_PIDS_LIMIT = 2048
#: Processes added to a sandbox's pids limit for the moment its kill script needs to start (see `_run_with_room`).
PIDS_HEADROOM = 16
#: Under gVisor the guest's processes live in the sandbox's own kernel and the host's pids limit counts the
#: runtime's tasks, and reaching it kills the whole sandbox. With the ptrace platform a guest process costs five to
#: eight host tasks, which the runtime keeps after the process exits (1,500 sleeping processes held 11,768 host
#: tasks here; each later round of 1,500 added about 4,500). So the guest is limited by RLIMIT_NPROC (a fork over it
#: fails with EAGAIN) and the host limit is a backstop: this many host tasks per guest process, plus a base. At 8 a
#: fork bomb up to the 2,048 default sometimes crossed it and the sandbox died.
RUNSC_HOST_PIDS_PER_PROCESS = 16
RUNSC_HOST_PIDS_BASE = 256
#: The engine runtime that public and allowlist sandboxes run under when the provider's runtime is `runsc` (the
#: `egress_runtime` option names another): gVisor with `--network=host`, whose sentry opens real sockets in the
#: container's own `--network none` namespace, where slirp4netns and the nftables rules are attached as under runc.
DEFAULT_EGRESS_RUNTIME = "runsc-hostinet"
#: How often the disk watchdog measures a sandbox's writable layer (the engine walks the layer to answer).
DISK_POLL_S = 2.0
MB = 1024 * 1024

# The container's PID 1 under the hardened defaults, so that no command can end its own sandbox
# (which would turn its episode into the untrainable `sandbox_gone` instead of its score). The kernel delivers no
# signal to a PID namespace's init from inside it unless the init handles it, never SIGKILL or SIGSTOP: this shell
# ignores the rest. It waits on a keep-alive (`wait` reaps orphaned processes meanwhile); if a command kills the
# keep-alive, it blocks reading its stdin (kept open by the engine, `--interactive`) instead of exiting, and bash
# (used where the image has it) still reaps orphans there. Started by `sh -c INIT_LAUNCH platoon-init INIT`. gVisor
# does deliver a SIGKILL from inside to its init: docs/sandboxes.md says so.
INIT = 'trap "" HUP INT QUIT TERM USR1 USR2 PIPE ALRM; sleep 2147483647 & wait; while read -r _; do :; done'
INIT_LAUNCH = 'command -v bash >/dev/null 2>&1 && exec bash -c "$1"; eval "$1"'

# Whether an engine (binary, DOCKER_HOST) applies `--storage-opt size=`: learnt from its first refusal.
_DISK_QUOTA: dict[tuple[str, str | None], bool] = {}

# Runs inside the container (POSIX sh: busybox and Debian both have it): SIGKILL every process whose environment
# holds the marker, in passes until none is left (a pass can race a fork). The script runs without the marker, and
# as the command's user: reading another user's environ needs CAP_SYS_PTRACE, which no sandbox keeps. Builtins only
# (`read` drops the NULs between variables; the marker, a fixed-length token, is matched within the joined text): a
# command at the sandbox's pids limit leaves no process for a `tr | grep`; the pause between late passes is `sleep`,
# which, where no process can start, fails and the passes go on without it.
_KILL_MARKER = r"""
m="$1"; me=$$
pass=0
while [ $pass -lt 50 ]; do
  pass=$((pass + 1)); found=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$me" ] && continue
    hit=0
    while IFS= read -r line || [ -n "$line" ]; do
      case "$line" in *"$m"*) hit=1; break ;; esac
    done 2>/dev/null < "$d/environ"
    if [ $hit = 1 ]; then kill -9 "$p" 2>/dev/null && found=1; fi
  done
  [ $found = 0 ] && exit 0
  # A SIGKILLed process is gone only once it is scheduled again: on a loaded machine that takes a moment, and until
  # then it is found (and "killed") again in every pass.
  [ $pass -gt 2 ] && { sleep 0.1 2>/dev/null || sleep 1; }
done
exit 1
"""

# Enters the working directory (exit 126 with one line when it cannot), then runs the command.
_ENTER = 'cd -- "$1" 2>/dev/null || { echo "platoon-sandbox: cannot enter the working directory $1" >&2; exit 126; }; shift; exec "$@"'


def docker_binary() -> str:
    """The CLI to drive: `PLATOON_DOCKER` (podman works), else `docker`."""
    return os.environ.get("PLATOON_DOCKER") or "docker"


def _network_args(spec: SandboxSpec, egress_plan: egress.EgressPlan | None) -> list[str]:
    """`--network host` for host; `--network none` for every other policy (public and allowlist get their egress
    from slirp4netns once the container runs), with slirp's resolver and the names an allowlist pinned."""
    if spec.network == "host":
        return ["--network", "host"]
    args = ["--network", "none"]
    if egress_plan is not None:
        args += ["--dns", egress.SANDBOX_DNS]
        for host, addresses in egress_plan.pinned.items():
            args += [a for address in addresses for a in ("--add-host", f"{host}:{address}")]
    return args


def _image_ref(image: str) -> str:
    if image.startswith("docker://"):
        return image.removeprefix("docker://")
    if image == "local" or image.endswith((".sif", ".sqsh")) or "://" in image:
        raise SandboxError(f"the docker provider runs docker://repo:tag images; got {image!r}")
    return image


async def _cli(
    docker: str, *args: str, timeout_s: float = CLI_TIMEOUT_S, stdin: bytes | None = None, check: bool = True
) -> tuple[int, str, str]:
    """Run one docker CLI command; `check` turns a non-zero exit into a SandboxError naming the command."""
    proc = await asyncio.create_subprocess_exec(
        docker,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.shield(proc.wait())
        raise
    rc = proc.returncode if proc.returncode is not None else -1
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    if check and rc != 0:
        raise SandboxError(
            f"{docker} {' '.join(args[:2])} failed (exit {rc}): {stderr.strip() or stdout.strip()}"
        )
    return rc, stdout, stderr


def _privilege_args(spec: SandboxSpec) -> list[str]:
    """No capabilities beyond `KEPT_CAPABILITIES`, no new privileges (a setuid binary gains nothing), and root as the
    container's user when the spec names one (its commands then run as that user, see the module docstring)."""
    args = ["--cap-drop", "ALL"]
    for capability in KEPT_CAPABILITIES:
        args += ["--cap-add", capability]
    args += ["--security-opt", "no-new-privileges"]
    if spec.user is not None:
        args += ["--user", "0:0"]
    return args


def _limit_args(spec: SandboxSpec, runtime: str | None, *, disk_quota: bool) -> list[str]:
    """CPU, memory (swap included, so the limit is the memory a sandbox has), processes, and the disk quota when the
    engine's storage driver takes one."""
    args: list[str] = []
    if spec.cpus is not None:
        args += ["--cpus", f"{spec.cpus:g}"]
    if spec.memory_mb is not None:
        args += ["--memory", f"{int(spec.memory_mb)}m", "--memory-swap", f"{int(spec.memory_mb)}m"]
    pids = spec.pids_limit or DEFAULT_PIDS_LIMIT
    if runtime == "runsc":
        backstop = RUNSC_HOST_PIDS_BASE + pids * RUNSC_HOST_PIDS_PER_PROCESS
        args += ["--ulimit", f"nproc={pids}:{pids}", "--pids-limit", str(backstop)]
        # gVisor hides an empty /tmp under a tmpfs of its own, which `docker cp` cannot reach (uploads, the route
        # forwarder) and which holds writes in memory: a file bound in it keeps /tmp the image's, as under runc.
        args += ["--volume", f"{FORWARDER_SCRIPT}:/tmp/.platoon-runsc:ro"]
    else:
        args += ["--pids-limit", str(pids)]
    if spec.storage_mb is not None and disk_quota:
        args += ["--storage-opt", f"size={int(spec.storage_mb)}m"]
    return args


def _refuses_quota(error: SandboxError) -> bool:
    """Whether a failed `docker run` is the engine refusing `--storage-opt` (a storage driver without quotas)."""
    text = str(error).lower()
    return "storage-opt" in text or "storage opt" in text


def _old_limit_args(spec: SandboxSpec) -> list[str]:
    """The flags before least privilege (CPU and memory only): what `benchmarks/sandbox.py` compares against."""
    args: list[str] = []
    if spec.cpus is not None:
        args += ["--cpus", f"{spec.cpus:g}"]
    if spec.memory_mb is not None:
        args += ["--memory", f"{int(spec.memory_mb)}m"]
    return args


@functools.cache
def _runtimes(binary: str, docker_host: str | None) -> tuple[str, ...] | str:
    """The OCI runtimes the engine lists, or why it could not be asked (cached per engine)."""
    del docker_host  # the cache key: the CLI reads it from the environment
    try:
        done = subprocess.run(
            [binary, "info", "--format", "{{range $name, $_ := .Runtimes}}{{$name}} {{end}}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{binary} info failed: {error}"
    if done.returncode != 0:
        return f"{binary} info failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
    return tuple(done.stdout.split())


@dataclass(frozen=True)
class DockerSnapshot:
    """A committed image of a sandbox's filesystem; removed when that sandbox stops."""

    image: str


class DockerSandbox(Sandbox):
    """One container; see the module docstring. Build it with `DockerProvider.start`."""

    def __init__(
        self,
        provider: DockerProvider,
        name: str,
        spec: SandboxSpec,
        entry: Registration,
    ) -> None:
        self._provider = provider
        self._docker = provider.docker
        self._api: Any | None = None  # the Engine API client for commands (set by start), else the CLI
        self.name = name
        self.spec = spec
        self._entry = entry
        self._own = OwnProcesses()
        self._snapshots: list[str] = []
        self._stopped = False
        # The provider's own commands run as root when commands run as the spec's user (None: the container's user).
        self._own_user = "0" if spec.user is not None else None
        self._disk_watch: asyncio.Task[None] | None = None
        self._over_disk: str | None = None  # why the disk watchdog ended the sandbox
        self._removal: asyncio.Future[None] | None = None
        self._egress: egress.Slirp | None = None  # public and allowlist: the slirp4netns giving it egress
        # TCP upstreams are their own route; Unix-socket ones get a forwarder unless the sandbox shares the host's
        # network: a host-network sandbox reaches the gateway on loopback, so no route.
        self._routes = {k: v for k, v in spec.upstreams.items() if not v.startswith("unix://")}
        self._forwarders = ContainerForwarders.for_spec(spec, self._route_shell)

    @property
    def routes(self) -> Mapping[str, str]:
        return {**self._routes, **self._forwarders.routes}

    async def ensure_routes(self) -> None:
        """Restart a dead forwarder on its port (the runner calls this before every harness launch)."""
        self._check_live()
        await self._forwarders.ensure()

    async def _route_shell(
        self, script: str, args: Sequence[str], env: Mapping[str, str]
    ) -> tuple[int, str, str]:
        # A plain command, never `exec()`: the forwarder must not carry an exec marker.
        return await self._run(["sh", "-c", script, "platoon-route", *args], env)

    async def _run(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, *, user: str | None = None
    ) -> tuple[int, str, str]:
        """Run one of the provider's own commands (no marker, no timeout of the caller's) to completion, as root when
        commands run as the spec's user, else as `user` (None: the container's)."""
        user = user or self._own_user
        if self._api is None:
            extra = [a for key, value in (env or {}).items() for a in ("--env", f"{key}={value}")]
            if user is not None:
                extra += ["--user", user]
            return await _cli(self._docker, "exec", "--workdir", "/", *extra, self.name, *argv, check=False)
        out, err = CappedOutput(), CappedOutput()
        code = await asyncio.get_running_loop().run_in_executor(
            POOL, run_in_container, self._api, self.name, argv, env or {}, None, out, err, [], user
        )
        return (code if code is not None else -1), out.text(), err.text()

    async def _check_user(self) -> None:
        """A spec's user must exist in the image (a name) before any command runs as it."""
        assert self.spec.user is not None
        rc, out, err = await self._run(["true"], user=self.spec.user)
        if rc != 0:
            raise SandboxError(
                f"cannot run commands as user {self.spec.user!r} in {self.spec.image} (exit {rc}): "
                f"{(err or out).strip() or 'the engine gave no reason'}"
            )

    async def _attach_egress(self, plan: egress.EgressPlan) -> None:
        """Filtered egress for a public or allowlist container: slirp4netns on its namespace (by its init's pid),
        then the rules loaded there."""
        _, out, _ = await _cli(self._docker, "inspect", "--format", "{{.State.Pid}}", self.name)
        pid = out.strip()
        if not pid.isdigit() or pid == "0":
            raise SandboxError(f"cannot find the process of container {self.name} (the engine said {pid!r})")
        self._egress = await egress.start(
            plan, marker=self.name, pid=int(pid), enter=["nsenter", f"--target={pid}", "--net", "--"]
        )

    async def _stop_egress(self) -> None:
        if self._egress is not None:
            await asyncio.to_thread(self._egress.stop)
            self._egress = None

    async def _record_own_processes(self) -> None:
        """Record the container's own processes: its init and the keep-alive the init starts. `docker run -d` may
        return before the init has forked the keep-alive; a keep-alive left out of the record would be killed by
        the first `kill_processes`, and the container with it, so the listing is repeated until both are there."""
        deadline = time.monotonic() + OWN_PROCESSES_WAIT_S
        while True:
            rc, out, err = await self._run(["sh", "-c", LIST_OWN, "platoon-list"])
            if rc != 0:
                raise SandboxError(f"cannot list the processes of {self.name} (exit {rc}): {err.strip()}")
            own = OwnProcesses.parse(out)
            if len(own.listed) >= 2 or time.monotonic() >= deadline:
                self._own = own
                return
            await asyncio.sleep(0.05)

    def _check_live(self) -> None:
        if self._over_disk is not None:
            raise SandboxDiskLimit(self._over_disk)
        if self._stopped:
            raise SandboxError(f"sandbox {self.name} has stopped")

    # -- the disk watchdog (engines whose storage driver takes no quota) --------------------------------------------

    def _watch_disk(self) -> None:
        self._disk_watch = asyncio.ensure_future(self._disk_watchdog())

    async def _disk_watchdog(self) -> None:
        while not self._stopped:
            await asyncio.sleep(DISK_POLL_S)
            try:
                await self._check_disk()
            except SandboxDiskLimit:
                return
            except Exception as error:  # a measurement that failed is tried again at the next poll
                log.debug("measuring the writable layer of %s failed: %s", self.name, error)

    async def _written(self) -> int | None:
        if self._api is not None:
            return await asyncio.get_running_loop().run_in_executor(POOL, written_bytes, self._api, self.name)
        rc, out, _err = await _cli(
            self._docker, "container", "inspect", "--size", "--format", "{{.SizeRw}}", self.name, check=False
        )
        return int(out.strip()) if rc == 0 and out.strip().isdigit() else None

    async def _raise_if_over_disk(self) -> None:
        """`_check_disk`, where a measurement that fails (a container already gone) raises nothing."""
        try:
            await self._check_disk()
        except SandboxDiskLimit:
            raise
        except Exception as error:
            log.debug("measuring the writable layer of %s failed: %s", self.name, error)

    async def _check_disk(self) -> None:
        """End the sandbox and raise `SandboxDiskLimit` when its writable layer is over `storage_mb`."""
        if self._over_disk is not None:
            raise SandboxDiskLimit(self._over_disk)
        limit = self.spec.storage_mb
        if self._disk_watch is None or limit is None or self._stopped:
            return
        written = await self._written()
        if written is None or written <= limit * MB:
            return
        self._over_disk = (
            f"sandbox {self.name} wrote {written / MB:.0f} MB, over its storage_mb = {limit}; it was ended"
        )
        try:
            await asyncio.shield(self.stop())  # removing the container frees what it wrote
        except Exception as error:
            log.warning("removing %s after it passed its disk limit failed: %s", self.name, error)
        raise SandboxDiskLimit(self._over_disk)

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """See `Sandbox.exec`; `user` runs this one command as another user than the spec's (root: "0")."""
        self._check_live()
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("exec needs a command")
        try:
            result = await self._exec(argv, timeout_s, env, cwd, stdin, user or self.spec.user)
        except SandboxError:
            await self._raise_if_over_disk()  # ended for its disk: it says so, not just that it is gone
            raise
        if self._over_disk is not None:  # ended under the command: its result is not the sandbox's last word
            raise SandboxDiskLimit(self._over_disk)
        return result

    async def _exec(
        self,
        argv: list[str],
        timeout_s: float | None,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bytes | str | None,
        user: str | None,
    ) -> ExecResult:
        token = uuid.uuid4().hex
        marker = f"PLATOON_EXEC={token}"
        command = ["sh", "-c", _ENTER, "platoon-exec", cwd or self.spec.workdir, *argv]
        data = stdin.encode() if isinstance(stdin, str) else stdin
        if self._api is not None:
            return await self._exec_api(
                command, {**(env or {}), "PLATOON_EXEC": token}, data, timeout_s, marker, user
            )
        args = ["exec", "--workdir", "/", "--env", marker]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        if user is not None:
            args += ["--user", user]
        if stdin is not None:
            args.append("--interactive")
        args += [self.name, *command]
        proc = await asyncio.create_subprocess_exec(
            self._docker,
            *args,
            stdin=asyncio.subprocess.PIPE if data is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = CappedOutput(), CappedOutput()
        readers = [
            asyncio.ensure_future(out.read_from(proc.stdout)),
            asyncio.ensure_future(err.read_from(proc.stderr)),
        ]
        feeder = asyncio.ensure_future(self._feed(proc, data))
        timed_out = False
        try:
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError:
                timed_out = True
                await self._kill_marker(marker, user)
                await self._reap_client(proc)
        except BaseException:
            # Cancelled (or failed) while the command runs: it must not outlive the caller. The original
            # exception is what the caller sees, whatever the cleanup meets.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._kill_marker(marker, user))
            with contextlib.suppress(Exception):
                await asyncio.shield(self._reap_client(proc))
            for task in (*readers, feeder):
                task.cancel()
            raise
        # The pipes drain to their end, or until DRAIN_S pass with nothing read (a background child holding them).
        await drain([*readers, feeder], [out, err])
        code = proc.returncode if proc.returncode is not None else -9
        if code != 0 and not timed_out:
            await self._raise_if_gone()
        return ExecResult(code, out.text(), err.text(), timed_out=timed_out)

    async def _raise_if_gone(self) -> None:
        """Raise `SandboxGone` when the container no longer runs. `docker exec` on a stopped container fails like a
        command would, so the CLI path asks the engine (a command's output cannot fake the answer)."""
        rc, out, err = await _cli(
            self._docker, "inspect", "--format", "{{.State.Running}}", self.name, check=False
        )
        if rc != 0 or out.strip() != "true":
            said = out.strip() if rc == 0 else err.strip()
            raise SandboxGone(
                f"sandbox {self.name} is gone (killed, or its main process exited); the engine answered: "
                f"{'not running' if said == 'false' else said}"
            )

    async def _exec_api(
        self,
        command: list[str],
        env: dict[str, str],
        data: bytes | None,
        timeout_s: float | None,
        marker: str,
        user: str | None,
    ) -> ExecResult:
        """`exec` through the Engine API: the same marker, timeout and cancellation rules as the CLI path."""
        out, err, opened = CappedOutput(), CappedOutput(), list[socket.socket]()
        run = asyncio.get_running_loop().run_in_executor(
            POOL, run_in_container, self._api, self.name, command, env, data, out, err, opened, user
        )
        timed_out = False
        try:
            try:
                code = await self._wait_while_running(run, timeout_s)
            except TimeoutError:
                timed_out = True
                await self._kill_marker(marker, user)
                code = await self._abandon(run, opened)
        except BaseException:
            # Cancelled (or failed) while the command runs: it must not outlive the caller.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._kill_marker(marker, user))
            with contextlib.suppress(Exception):
                await asyncio.shield(self._abandon(run, opened))
            raise
        return ExecResult(code if code is not None else -9, out.text(), err.text(), timed_out=timed_out)

    async def _wait_while_running(
        self, run: asyncio.Future[int | None], timeout_s: float | None
    ) -> int | None:
        """The exec's exit code; TimeoutError at `timeout_s`; `SandboxGone` when the container stops meanwhile.

        An engine does not always end an exec's stream when its container dies under it (a gVisor sandbox that
        crashed left the read waiting for good), so every `ALIVE_CHECK_S` the engine is asked whether the container
        still runs."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise TimeoutError
            wait = ALIVE_CHECK_S if left is None else min(ALIVE_CHECK_S, left)
            done, _ = await asyncio.wait([run], timeout=wait)
            if done:
                return run.result()
            if not await self._still_running():
                raise SandboxGone(
                    f"sandbox {self.name} is gone (killed, or its main process exited) while a command ran"
                )

    async def _still_running(self) -> bool:
        """Whether the engine says the container runs; True when it cannot say (a slow engine is not a dead one)."""

        api = self._api
        if api is None:
            return True  # the CLI path: its `docker exec` ends with its container

        def running() -> bool:
            try:
                return bool(api.inspect_container(self.name)["State"]["Running"])
            except Exception as error:
                return getattr(error, "status_code", None) != 404  # removed: gone; anything else: unknown

        return await asyncio.to_thread(running)

    @staticmethod
    async def _abandon(run: asyncio.Future[int | None], opened: list[socket.socket]) -> int | None:
        # The command is dead, so the engine closes its streams; give it a moment, then close the connection.
        try:
            return await asyncio.wait_for(asyncio.shield(run), 5.0)
        except TimeoutError:
            for raw in opened:
                with contextlib.suppress(OSError):
                    raw.shutdown(socket.SHUT_RDWR)
            return await run

    @staticmethod
    async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
        if data is None or proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(data)
            await proc.stdin.drain()
        proc.stdin.close()

    async def _kill_marker(self, marker: str, user: str | None) -> None:
        # As the command's user: only that user (or CAP_SYS_PTRACE) reads its processes' environments.
        rc, out, err = await self._run_with_room(
            ["sh", "-c", _KILL_MARKER, "platoon-kill", marker], user=user
        )
        if rc != 0 and not self._stopped:
            raise SandboxError(
                f"could not kill the processes of {marker} in {self.name}: {(err or out).strip()}"
            )

    async def _run_with_room(self, argv: Sequence[str], *, user: str | None = None) -> tuple[int, str, str]:
        """`_run` for the kill scripts: a sandbox at its pids limit (a fork bomb) can leave the runtime no process to
        start the script with, so it is run once more with the limit raised by `PIDS_HEADROOM`, then restored. The
        scripts fork nothing before they kill, so the room is theirs. (Under gVisor the guest's own process limit
        does not stop an exec: no retry.)"""
        rc, out, err = await self._run(argv, user=user)
        started = not (rc == 126 and "exec failed" in (out + err).lower())
        if started or not self._provider.hardening or self._provider.runtime == "runsc":
            return rc, out, err
        limit = self.spec.pids_limit or DEFAULT_PIDS_LIMIT
        await _cli(self._docker, "update", "--pids-limit", str(limit + PIDS_HEADROOM), self.name, check=False)
        try:
            return await self._run(argv, user=user)
        finally:
            await _cli(self._docker, "update", "--pids-limit", str(limit), self.name, check=False)

    @staticmethod
    async def _reap_client(proc: asyncio.subprocess.Process) -> None:
        # The command inside is dead, so the client ends on its own; give it a moment, then kill it.
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def _sh(self, script: str, *args: str) -> int:
        rc, _out, _err = await self._run(["sh", "-c", script, "platoon", *args])
        return rc

    async def upload(self, src: str | Path, dst: str) -> None:
        await self._copy_in(src, dst, give=True)

    async def _upload_own(self, src: str | Path, dst: str) -> None:
        """An upload of the provider's own (the route forwarder): it stays root's, out of the commands' reach."""
        await self._copy_in(src, dst, give=False)

    async def _copy_in(self, src: str | Path, dst: str, *, give: bool) -> None:
        self._check_live()
        source = Path(src)
        if not source.exists() and not source.is_symlink():
            raise FileNotFoundError(f"upload source {source} does not exist")
        if source.is_dir() and not source.is_symlink():
            made = await self._mkdir(dst)
            await _cli(self._docker, "cp", f"{source}/.", f"{self.name}:{dst}")
            if give:
                copied = [posixpath.join(dst, name) for name in sorted(os.listdir(source))]
                await self._give_to_user([dst, *copied] if made else copied)
        else:
            await self._mkdir(posixpath.dirname(dst.rstrip("/")) or "/")
            await _cli(self._docker, "cp", str(source), f"{self.name}:{dst}")
            if give:
                await self._give_to_user([dst])

    async def _mkdir(self, path: str) -> bool:
        """`mkdir -p`; whether `path` was made (it did not exist)."""
        rc, out, err = await self._run(
            [
                "sh",
                "-c",
                '[ -e "$1" ]; had=$?; mkdir -p -- "$1" || exit 1; exit $((had ? 10 : 0))',
                "mkdir",
                path,
            ]
        )
        if rc not in (0, 10):
            raise SandboxError(
                f"cannot create {path} in sandbox {self.name} (exit {rc}): {(err or out).strip()}"
            )
        return rc == 10

    async def _give_to_user(self, paths: Sequence[str]) -> None:
        """Uploads belong to the spec's user, so commands running as that user can change them (`docker cp` leaves
        them root's). `-h` and no `-L`: a symlink a command planted meanwhile is changed, never what it names."""
        if self.spec.user is None or not paths:
            return
        rc, out, err = await self._run(["chown", "-R", "-h", "--", self.spec.user, *paths])
        if rc != 0:
            raise SandboxError(
                f"cannot give {', '.join(paths[:3])} to user {self.spec.user} in sandbox {self.name} "
                f"(exit {rc}): {(err or out).strip()}"
            )

    async def download(self, src: str, dst: str | Path) -> None:
        self._check_live()
        kind = await self._sh(
            'if [ -d "$1" ]; then exit 10; elif [ -e "$1" ] || [ -L "$1" ]; then exit 0; fi; exit 1', src
        )
        if kind == 1:
            raise FileNotFoundError(f"{src} does not exist in sandbox {self.name}")
        target = Path(dst)
        if kind == 10:
            target.mkdir(parents=True, exist_ok=True)
            await _cli(self._docker, "cp", f"{self.name}:{src.rstrip('/')}/.", str(target))
        elif kind == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            await _cli(self._docker, "cp", f"{self.name}:{src}", str(target))
        else:
            raise SandboxError(f"cannot inspect {src} in sandbox {self.name} (exit {kind})")

    async def snapshot(self) -> DockerSnapshot:
        self._check_live()
        await self._check_disk()  # a copy of a sandbox over its limit would start over it
        image = f"{SNAPSHOT_REPO}:{uuid.uuid4().hex[:12]}"
        self._snapshots.append(image)  # before commit: a commit that half-succeeded is still removed at stop
        await _cli(self._docker, "commit", self.name, image)
        return DockerSnapshot(image)

    async def kill_processes(self) -> None:
        self._check_live()
        await self._check_disk()  # grading starts here: what the agent wrote is measured before it is judged
        if (why := self._own.kill_refusal(self.name)) is not None:
            raise SandboxError(why)
        rc, out, err = await self._run_with_room(
            ["sh", "-c", KILL_ALL, "platoon", self._own.keep(*self._forwarders.keep)]
        )
        if rc != 0:
            said = (err or out).strip()
            raise SandboxError(
                f"processes survived SIGKILL in sandbox {self.name}{': ' + said if said else ''}"
            )

    async def stop(self) -> None:
        if self._stopped:
            # A removal under way (the disk watchdog's) is waited for: once stop returns, the container is gone.
            removal = self._removal
            if (
                removal is not None
                and not removal.done()
                and removal.get_loop() is asyncio.get_running_loop()
            ):
                with contextlib.suppress(Exception):
                    await asyncio.shield(removal)
            return
        self._stopped = True
        if self._disk_watch is not None and self._disk_watch is not asyncio.current_task():
            self._disk_watch.cancel()
        self._removal = asyncio.ensure_future(self._remove())
        await asyncio.shield(self._removal)

    async def _remove(self) -> None:
        await self._stop_egress()
        rc, _out, err = await _cli(self._docker, "rm", "--force", self.name, check=False)
        if self._snapshots:
            await _cli(self._docker, "rmi", "--force", *self._snapshots, check=False)
        gone = rc == 0 or "no such container" in err.lower()
        if not gone:
            # Still there: it stays registered so a reap by label removes it later.
            raise SandboxError(f"could not remove container {self.name}: {err.strip()}")
        registry().unregister(self._entry)


def _egress_runtime_refusal(options: Mapping[str, Any]) -> str | None:
    """Why public and allowlist sandboxes cannot run under runsc with these options: the engine does not list the
    egress runtime (or cannot be asked), or None."""
    runtime = options.get("egress_runtime") or DEFAULT_EGRESS_RUNTIME
    binary = options.get("binary") or docker_binary()
    listed = _runtimes(binary, os.environ.get("DOCKER_HOST"))
    if isinstance(listed, str):
        return f"cannot check the docker runtime {runtime!r} for public and allowlist sandboxes: {listed}"
    if runtime in listed:
        return None
    runsc = shutil.which("runsc") or "/usr/bin/runsc"
    return (
        f"runtime: runsc runs public and allowlist sandboxes under the engine runtime {runtime!r}, which it does "
        f'not list: add "{runtime}": {{"path": "{runsc}", "runtimeArgs": ["--network=host", '
        '"--fsgofer-host-uds"]} to "runtimes" in the engine\'s daemon.json and restart it'
    )


#: What every docker sandbox enforces, whatever its runtime.
BASE_CAPABILITIES = frozenset(
    {
        "snapshot",
        "network_none",
        "network_public",
        "network_allowlist",
        "isolation",
        "routes",
        "host_loopback",
        "clean_env",
        "least_privilege",
        "limit_cpu_memory",
        "limit_pids",
        "limit_disk",
        "run_as_user",
    }
)


class _Capabilities:
    """`DockerProvider.capabilities`: `BASE_CAPABILITIES`, plus `lifetime` unless the provider's runtime is gVisor's
    (which delivers a SIGKILL sent from inside the sandbox to its init, so a command can end a runsc sandbox)."""

    def __get__(self, instance: object, owner: type | None = None) -> frozenset[str]:
        if getattr(instance, "runtime", None) == "runsc":
            return BASE_CAPABILITIES
        return BASE_CAPABILITIES | {"lifetime"}


class DockerProvider(SandboxProvider):
    """Starts `DockerSandbox`es. Options: `binary` (else `PLATOON_DOCKER`, else `docker`), `runtime` (the engine's
    OCI runtime for every sandbox, e.g. `runsc` for gVisor; else the engine's default), `egress_runtime` (with
    `runtime: runsc`, the engine runtime of public and allowlist sandboxes: `DEFAULT_EGRESS_RUNTIME` unless named),
    `egress_allow` (host or host:port destinations that public and allowlist sandboxes may reach even when private
    or the host's own)."""

    name: ClassVar[str] = "docker"
    # clean_env: a container starts from its image's environment and the variables it is given with values
    # (`--env KEY=VALUE`, the Engine API's `KEY=VALUE`), never a bare `--env KEY`, which would copy the host's.
    # lifetime: the init no command can signal (`INIT`), except under gVisor (`_Capabilities`).
    capabilities: frozenset[str] = cast("frozenset[str]", _Capabilities())
    isolates: ClassVar[bool] = True
    #: The least-privilege flags and the default pids limit; only `benchmarks/sandbox.py` turns them off (on a
    #: subclass), to measure what they cost. Not an option: no configuration can reach it.
    hardening: ClassVar[bool] = True

    def __init__(
        self,
        *,
        binary: str | None = None,
        runtime: str | None = None,
        egress_runtime: str | None = None,
        egress_allow: Sequence[str] | None = None,
    ) -> None:
        for option, value in (("runtime", runtime), ("egress_runtime", egress_runtime)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise SandboxError(
                    f"the docker provider's {option} option names an OCI runtime (e.g. runsc); got {value!r}"
                )
        if egress_runtime is not None and runtime != "runsc":
            raise SandboxError(
                "the docker provider's egress_runtime option applies with runtime: runsc only; drop it or set "
                "runtime: runsc"
            )
        self.options: dict[str, Any] = {
            key: value
            for key, value in (("binary", binary), ("runtime", runtime), ("egress_runtime", egress_runtime))
            if value
        }
        self.docker = binary or docker_binary()
        self.runtime = runtime
        self.egress_runtime = egress_runtime or DEFAULT_EGRESS_RUNTIME
        self.egress_allow = egress.parse_egress_allow(egress_allow)
        if self.egress_allow:
            self.options["egress_allow"] = list(self.egress_allow)

    async def engine(self) -> Any | None:
        """The Engine API client commands go through, or None for the CLI (resolved once per process)."""
        return await asyncio.get_running_loop().run_in_executor(
            POOL, engine_client, self.docker, os.environ.get("DOCKER_HOST")
        )

    @classmethod
    def unavailable(cls, options: Mapping[str, Any] | None = None) -> str | None:
        binary = (options or {}).get("binary") or docker_binary()
        if shutil.which(binary) is None:
            return f"the docker provider needs the {binary!r} CLI on PATH (or PLATOON_DOCKER naming one)"
        runtime = (options or {}).get("runtime")
        if runtime:
            listed = _runtimes(binary, os.environ.get("DOCKER_HOST"))
            if isinstance(listed, str):
                return f"cannot check the docker runtime {runtime!r}: {listed}"
            if runtime not in listed:
                return (
                    f"the docker engine has no runtime {runtime!r} (it lists {', '.join(listed) or 'none'}): "
                    "register it in the engine's daemon.json (gVisor: runsc install), or drop the runtime option"
                )
        return None

    @classmethod
    def refusal(cls, spec: SandboxSpec, options: Mapping[str, Any] | None = None) -> str | None:
        """Why a sandbox of `spec` would be refused at start (a field the provider does not enforce), or None."""
        return unenforced_field(spec, cls.capabilities, cls.name)

    @classmethod
    def network_none_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        return None

    @classmethod
    def network_public_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why public sandboxes cannot have filtered egress with these options on this host, or None."""
        options = options or {}
        if options.get("runtime") == "runsc" and (why := _egress_runtime_refusal(options)) is not None:
            return why
        try:
            egress.parse_egress_allow(options.get("egress_allow"))
        except SandboxError as exc:
            return str(exc)
        if (why := egress.missing_tools()) is not None:
            return f"public and allowlist docker sandboxes need filtered egress: {why}"
        return None

    @classmethod
    def network_allowlist_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why allowlist sandboxes cannot be filtered here, or None (the same mechanism as public's)."""
        return cls.network_public_refusal(options)

    def _run_args(
        self,
        name: str,
        spec: SandboxSpec,
        image: str,
        egress_plan: egress.EgressPlan | None = None,
        *,
        disk_quota: bool = False,
    ) -> list[str]:
        args = [
            "run",
            "--detach",
            # the hardened init takes no signal from a command (INIT); the old flags' docker-init ends with its child
            *(("--interactive",) if self.hardening else ("--init",)),
            "--name",
            name,
            "--workdir",
            spec.workdir,
            *_network_args(spec, egress_plan),
        ]
        runtime = self._runtime_for(spec)
        if runtime is not None:
            args += ["--runtime", runtime]
        if self.hardening:
            args += _privilege_args(spec)
            args += _limit_args(spec, self.runtime, disk_quota=disk_quota)
        else:
            args += _old_limit_args(spec)
        for key, value in spec.env.items():
            args += ["--env", f"{key}={value}"]
        for key, value in spec.labels.items():
            args += ["--label", f"{key}={value}"]
        for mount in spec.mounts:
            args += ["--volume", f"{mount.source}:{mount.target}{':ro' if mount.read_only else ''}"]
        if spec.network != "host":
            for source, target in ContainerForwarders.binds(spec.upstreams):
                args += ["--volume", f"{source}:{target}:ro"]
        if self.hardening:
            return [*args, "--entrypoint", "sh", image, "-c", INIT_LAUNCH, "platoon-init", INIT]
        return [*args, "--entrypoint", "sleep", image, "infinity"]

    def _runtime_for(self, spec: SandboxSpec) -> str | None:
        """The engine runtime of a sandbox: `egress_runtime` for public and allowlist ones under runsc (gVisor's
        own netstack cannot be given a network here), else `runtime`."""
        if self.runtime == "runsc" and spec.network in egress.EGRESS_NETWORKS:
            return self.egress_runtime
        return self.runtime

    def _engine_key(self) -> tuple[str, str | None]:
        return self.docker, os.environ.get("DOCKER_HOST")

    async def _create(
        self, name: str, spec: SandboxSpec, image: str, egress_plan: egress.EgressPlan | None
    ) -> bool:
        """`docker run` the container; whether the storage driver limits its disk. An engine that refuses
        `--storage-opt` is remembered (one refused run per engine and process) and the run made again without."""
        key = self._engine_key()
        quota = self.hardening and spec.storage_mb is not None and _DISK_QUOTA.get(key, True)
        try:
            await _cli(self.docker, *self._run_args(name, spec, image, egress_plan, disk_quota=quota))
        except SandboxError as error:
            if not quota or not _refuses_quota(error):
                raise
            _DISK_QUOTA[key] = False
            await _cli(self.docker, *self._run_args(name, spec, image, egress_plan, disk_quota=False))
            return False
        if quota:
            _DISK_QUOTA[key] = True
        return quota

    async def start(self, spec: SandboxSpec) -> DockerSandbox:
        return await self._start(spec, _image_ref(spec.image))

    async def restore(self, snapshot: Any, spec: SandboxSpec) -> DockerSandbox:
        image = snapshot.image if isinstance(snapshot, DockerSnapshot) else str(snapshot)
        return await self._start(spec, _image_ref(image))

    async def _start(self, spec: SandboxSpec, image: str) -> DockerSandbox:
        name = f"platoon-{uuid.uuid4().hex[:12]}"
        api = await self.engine()  # before registering: nothing to clean up if this is cancelled
        egress_plan = await self._egress_plan(spec)  # names resolved before anything exists
        spec = replace(spec, labels=merge_labels(spec.labels))
        entry = registry().register(
            class_path(self), self.options, spec.labels
        )  # before the container exists
        sandbox = DockerSandbox(self, name, spec, entry)
        sandbox._api = api
        # The run call is shielded: killing its client would not stop the engine from creating the container
        # after the removal below had already found nothing.
        run = asyncio.ensure_future(self._create(name, spec, image, egress_plan))
        try:
            quota = await asyncio.shield(run)
            if egress_plan is not None:
                await sandbox._attach_egress(egress_plan)
            if spec.user is not None:
                await sandbox._check_user()
            await sandbox._record_own_processes()
            await sandbox._forwarders.start(sandbox._upload_own)
            if spec.storage_mb is not None and self.hardening and not quota:
                sandbox._watch_disk()
        except BaseException:
            # Failed or cancelled: let the run call finish, then remove the container by name; if even that fails
            # it stays registered, so a later reap by label finds it.
            if not run.done():
                with contextlib.suppress(BaseException):
                    await asyncio.shield(run)
            with contextlib.suppress(Exception):
                await asyncio.shield(sandbox.stop())
            raise
        registry().attach(entry, sandbox)
        return sandbox

    async def _egress_plan(self, spec: SandboxSpec) -> egress.EgressPlan | None:
        """A public or allowlist sandbox's egress, resolved on the host now; None for host and none."""
        if spec.network not in egress.EGRESS_NETWORKS:
            return None
        refusal = (
            self.network_public_refusal(self.options)
            if spec.network == "public"
            else self.network_allowlist_refusal(self.options)
        )
        if refusal is not None:
            raise SandboxError(refusal)
        return await asyncio.to_thread(egress.plan, spec.network, spec.allowed_hosts, self.egress_allow)

    async def labelled(self, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """The containers carrying all of `labels` (`platoon sandbox list`), running or stopped: id (the container's
        name), state (docker's, with its status), where (the image). Docker records no owner process, so the owner
        pid is None. An empty label set is refused, as for `reap`."""
        if not labels:
            raise SandboxError("listing with an empty label set is refused: give the run's label")
        filters = [arg for key, value in labels.items() for arg in ("--filter", f"label={key}={value}")]
        _, out, _ = await _cli(
            self.docker,
            "ps",
            "--all",
            *filters,
            "--format",
            "{{.Names}}\t{{.State}} ({{.Status}})\t{{.Image}}",
        )
        found: list[dict[str, Any]] = []
        for line in out.splitlines():
            name, state, image = [*line.split("\t"), "", ""][:3]
            found.append({"id": name, "owner_pid": None, "state": state, "path": f"docker://{image}"})
        return found

    async def reap(self, labels: Mapping[str, str]) -> int:
        """Remove every container (and snapshot image) carrying all `labels`: docker cannot tell which process
        owns a container, so all of them go. An empty label set is refused."""
        if not labels:
            raise ValueError("reaping with an empty label set is refused: it would match every container")
        filters = [arg for key, value in labels.items() for arg in ("--filter", f"label={key}={value}")]
        _, out, _ = await _cli(
            self.docker, "ps", "--all", "--no-trunc", *filters, "--format", "{{.ID}}\t{{.Names}}"
        )
        rows = [line.split("\t") for line in out.splitlines() if line.strip()]
        ids = [row[0] for row in rows]
        if ids:
            await _cli(self.docker, "rm", "--force", *ids)
        # a public or allowlist container's slirp4netns, should its owner have lost it
        await asyncio.to_thread(egress.kill_strays, [row[-1] for row in rows])
        _, out, _ = await _cli(
            self.docker, "images", "--quiet", "--no-trunc", "--filter", f"reference={SNAPSHOT_REPO}", *filters
        )
        images = sorted(set(out.split()))
        if images:
            await _cli(self.docker, "rmi", "--force", *images, check=False)
        return len(ids)
