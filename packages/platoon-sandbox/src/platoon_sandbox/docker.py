"""The `docker` sandbox provider (harness.md 5.3): one long-lived container per sandbox, driven by the docker CLI
for its life cycle and by the Engine API for the commands run in it.

The life cycle (run, cp, commit, rm, reap) goes through the CLI the spec names: its behaviour is the spec's
(`docker cp` semantics, label filters) and the binary is swappable through `PLATOON_DOCKER` (podman speaks the same
CLI). Commands (`exec` and the provider's own scripts) go through the `docker` SDK's Engine API client
(`platoon_sandbox.engine`), which saves the CLI's process start on the hot path; with another CLI than `docker`,
or an engine the SDK cannot reach, they fall back to `docker exec`.

Each sandbox is a detached `sleep infinity` container named `platoon-<12hex>` (under `--init`, so orphaned children
are reaped and the container's own processes are an init and a keep-alive). Commands carry `PLATOON_EXEC=<uuid>`:
abandoning an exec (its API connection or its `docker exec` client) does not stop the command inside, so a timeout
or a cancellation runs a kill script in the container that SIGKILLs every process whose environment holds the
marker.

Routes (harness.md 5.6): a `network: none` container reaches each Unix-socket upstream through a forwarder inside it
(`routes.ContainerForwarders`): the socket's directory is bound read-only at `/run/platoon/<name>` and the forwarder
listens on 127.0.0.1:18080 (18081, ... in name order). It is started by its own `docker exec` (so no exec marker
reaches it) and `kill_processes` spares it by pid and start time, like the container's own processes.

Registration (harness.md 5.5): the process labels are merged into the spec's, the sandbox is registered (and
mirrored) before its container is created, and unregistered once the container is gone; a container that could not
be removed stays registered, so a reap by label finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from platoon_sandbox.contract import ExecResult, SandboxError, SandboxGone, SandboxSpec
from platoon_sandbox.engine import POOL, engine_client, run_in_container
from platoon_sandbox.inside import KILL_ALL, LIST_OWN, OwnProcesses
from platoon_sandbox.output import DRAIN_S, CappedOutput
from platoon_sandbox.registry import Registration, class_path, merge_labels, registry
from platoon_sandbox.routes import ContainerForwarders

__all__ = ["DockerProvider", "DockerSandbox", "DockerSnapshot"]

#: Every CLI call except `exec` (which has the caller's timeout) may take this long: pulls, copies, commits.
CLI_TIMEOUT_S = 600.0
SNAPSHOT_REPO = "platoon-snapshot"

# Runs inside the container (POSIX sh: busybox and Debian both have it): SIGKILL every process whose environment
# holds the marker, in passes until none is left (a pass can race a fork). The script runs without the marker, so
# its own helpers (tr, grep) never match.
_KILL_MARKER = r"""
m="$1"; me=$$
pass=0
while [ $pass -lt 50 ]; do
  pass=$((pass + 1)); found=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$me" ] && continue
    if tr '\0' '\n' 2>/dev/null < "$d/environ" | grep -qxF "$m"; then
      kill -9 "$p" 2>/dev/null && found=1
    fi
  done
  [ $found = 0 ] && exit 0
done
exit 1
"""

# Enters the working directory (exit 126 with one line when it cannot), then runs the command.
_ENTER = 'cd -- "$1" 2>/dev/null || { echo "platoon-sandbox: cannot enter the working directory $1" >&2; exit 126; }; shift; exec "$@"'


def docker_binary() -> str:
    """The CLI to drive: `PLATOON_DOCKER` (podman works), else `docker`."""
    return os.environ.get("PLATOON_DOCKER") or "docker"


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


@dataclass(frozen=True)
class DockerSnapshot:
    """A committed image of a sandbox's filesystem; removed when that sandbox stops."""

    image: str


class DockerSandbox:
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
        # TCP upstreams are their own route; Unix-socket ones get a forwarder only without network (5.6): a
        # host-network sandbox reaches the gateway on loopback, so no route.
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

    async def _run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
        """Run one of the provider's own commands (no marker, no timeout of the caller's) to completion."""
        if self._api is None:
            extra = [a for key, value in (env or {}).items() for a in ("--env", f"{key}={value}")]
            return await _cli(self._docker, "exec", "--workdir", "/", *extra, self.name, *argv, check=False)
        out, err = CappedOutput(), CappedOutput()
        code = await asyncio.get_running_loop().run_in_executor(
            POOL, run_in_container, self._api, self.name, argv, env or {}, None, out, err, []
        )
        return (code if code is not None else -1), out.text(), err.text()

    async def _record_own_processes(self) -> None:
        rc, out, err = await self._run(["sh", "-c", LIST_OWN, "platoon-list"])
        if rc != 0:
            raise SandboxError(f"cannot list the processes of {self.name} (exit {rc}): {err.strip()}")
        self._own = OwnProcesses.parse(out)

    def _check_live(self) -> None:
        if self._stopped:
            raise SandboxError(f"sandbox {self.name} has stopped")

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        self._check_live()
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("exec needs a command")
        token = uuid.uuid4().hex
        marker = f"PLATOON_EXEC={token}"
        command = ["sh", "-c", _ENTER, "platoon-exec", cwd or self.spec.workdir, *argv]
        data = stdin.encode() if isinstance(stdin, str) else stdin
        if self._api is not None:
            return await self._exec_api(
                command, {**(env or {}), "PLATOON_EXEC": token}, data, timeout_s, marker
            )
        args = ["exec", "--workdir", "/", "--env", marker]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
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
                await self._kill_marker(marker)
                await self._reap_client(proc)
        except BaseException:
            # Cancelled (or failed) while the command runs: it must not outlive the caller. The original
            # exception is what the caller sees, whatever the cleanup meets.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._kill_marker(marker))
            with contextlib.suppress(Exception):
                await asyncio.shield(self._reap_client(proc))
            for task in (*readers, feeder):
                task.cancel()
            raise
        # The pipes get DRAIN_S to drain; a background child still holding them is ignored.
        _done, pending = await asyncio.wait([*readers, feeder], timeout=DRAIN_S)
        for task in pending:
            task.cancel()
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
    ) -> ExecResult:
        """`exec` through the Engine API: the same marker, timeout and cancellation rules as the CLI path."""
        out, err, opened = CappedOutput(), CappedOutput(), list[socket.socket]()
        run = asyncio.get_running_loop().run_in_executor(
            POOL, run_in_container, self._api, self.name, command, env, data, out, err, opened
        )
        timed_out = False
        try:
            try:
                code = await asyncio.wait_for(asyncio.shield(run), timeout_s)
            except TimeoutError:
                timed_out = True
                await self._kill_marker(marker)
                code = await self._abandon(run, opened)
        except BaseException:
            # Cancelled (or failed) while the command runs: it must not outlive the caller.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._kill_marker(marker))
            with contextlib.suppress(Exception):
                await asyncio.shield(self._abandon(run, opened))
            raise
        return ExecResult(code if code is not None else -9, out.text(), err.text(), timed_out=timed_out)

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

    async def _kill_marker(self, marker: str) -> None:
        rc, _out, err = await self._run(["sh", "-c", _KILL_MARKER, "platoon-kill", marker])
        if rc != 0 and not self._stopped:
            raise SandboxError(f"could not kill the processes of {marker} in {self.name}: {err.strip()}")

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
        self._check_live()
        source = Path(src)
        if not source.exists() and not source.is_symlink():
            raise FileNotFoundError(f"upload source {source} does not exist")
        if source.is_dir() and not source.is_symlink():
            await self._mkdir(dst)
            await _cli(self._docker, "cp", f"{source}/.", f"{self.name}:{dst}")
        else:
            await self._mkdir(os.path.dirname(dst.rstrip("/")) or "/")
            await _cli(self._docker, "cp", str(source), f"{self.name}:{dst}")

    async def _mkdir(self, path: str) -> None:
        rc, out, err = await self._run(["mkdir", "-p", path])
        if rc != 0:
            raise SandboxError(
                f"cannot create {path} in sandbox {self.name} (exit {rc}): {(err or out).strip()}"
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
        image = f"{SNAPSHOT_REPO}:{uuid.uuid4().hex[:12]}"
        self._snapshots.append(image)  # before commit: a commit that half-succeeded is still removed at stop
        await _cli(self._docker, "commit", self.name, image)
        return DockerSnapshot(image)

    async def kill_processes(self) -> None:
        self._check_live()
        if (why := self._own.kill_refusal(self.name)) is not None:
            raise SandboxError(why)
        if await self._sh(KILL_ALL, self._own.keep(*self._forwarders.keep)) != 0:
            raise SandboxError(f"processes survived SIGKILL in sandbox {self.name}")

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        rc, _out, err = await _cli(self._docker, "rm", "--force", self.name, check=False)
        if self._snapshots:
            await _cli(self._docker, "rmi", "--force", *self._snapshots, check=False)
        gone = rc == 0 or "no such container" in err.lower()
        if not gone:
            # Still there: it stays registered so a reap by label removes it later.
            raise SandboxError(f"could not remove container {self.name}: {err.strip()}")
        registry().unregister(self._entry)


class DockerProvider:
    """Starts `DockerSandbox`es. Options: `binary` (else `PLATOON_DOCKER`, else `docker`)."""

    name: ClassVar[str] = "docker"
    # clean_env: a container starts from its image's environment and the variables it is given with values
    # (`--env KEY=VALUE`, the Engine API's `KEY=VALUE`), never a bare `--env KEY`, which would copy the host's
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"snapshot", "network_none", "isolation", "routes", "host_loopback", "clean_env"}
    )
    isolates: ClassVar[bool] = True

    def __init__(
        self,
        *,
        binary: str | None = None,
    ) -> None:
        self.options: dict[str, Any] = {"binary": binary} if binary else {}
        self.docker = binary or docker_binary()

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
        return None

    @classmethod
    def network_none_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        return None

    def _run_args(self, name: str, spec: SandboxSpec, image: str) -> list[str]:
        args = [
            "run",
            "--detach",
            "--init",
            "--name",
            name,
            "--workdir",
            spec.workdir,
            "--network",
            spec.network,
        ]
        for key, value in spec.env.items():
            args += ["--env", f"{key}={value}"]
        for key, value in spec.labels.items():
            args += ["--label", f"{key}={value}"]
        for mount in spec.mounts:
            args += ["--volume", f"{mount.source}:{mount.target}{':ro' if mount.read_only else ''}"]
        if spec.network == "none":
            for source, target in ContainerForwarders.binds(spec.upstreams):
                args += ["--volume", f"{source}:{target}:ro"]
        if spec.cpus is not None:
            args += ["--cpus", f"{spec.cpus:g}"]
        if spec.memory_mb is not None:
            args += ["--memory", f"{int(spec.memory_mb)}m"]
        return [*args, "--entrypoint", "sleep", image, "infinity"]

    async def start(self, spec: SandboxSpec) -> DockerSandbox:
        return await self._start(spec, _image_ref(spec.image))

    async def restore(self, snapshot: Any, spec: SandboxSpec) -> DockerSandbox:
        image = snapshot.image if isinstance(snapshot, DockerSnapshot) else str(snapshot)
        return await self._start(spec, _image_ref(image))

    async def _start(self, spec: SandboxSpec, image: str) -> DockerSandbox:
        name = f"platoon-{uuid.uuid4().hex[:12]}"
        api = await self.engine()  # before registering: nothing to clean up if this is cancelled
        spec = replace(spec, labels=merge_labels(spec.labels))
        entry = registry().register(
            class_path(self), self.options, spec.labels
        )  # before the container exists
        sandbox = DockerSandbox(self, name, spec, entry)
        sandbox._api = api
        # The run call is shielded: killing its client would not stop the engine from creating the container
        # after the removal below had already found nothing.
        run = asyncio.ensure_future(_cli(self.docker, *self._run_args(name, spec, image)))
        try:
            await asyncio.shield(run)
            await sandbox._record_own_processes()
            await sandbox._forwarders.start(sandbox.upload)
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
        _, out, _ = await _cli(self.docker, "ps", "--all", "--quiet", "--no-trunc", *filters)
        ids = out.split()
        if ids:
            await _cli(self.docker, "rm", "--force", *ids)
        _, out, _ = await _cli(
            self.docker, "images", "--quiet", "--no-trunc", "--filter", f"reference={SNAPSHOT_REPO}", *filters
        )
        images = sorted(set(out.split()))
        if images:
            await _cli(self.docker, "rmi", "--force", *images, check=False)
        return len(ids)
