"""The `process` provider (harness.md 5.2): a directory on the host standing in for a container. NOT isolated.

Commands run as ordinary host processes, as the user running platoon, with the host's files in reach. The network is
the part it does keep apart where bubblewrap can make a namespace (`netns`): a `network: none` sandbox gets one
holding only `lo`; `public` and `allowlist` ones get one with filtered egress attached (`egress`: slirp4netns and
nftables rules inside), or, where that is unavailable, are refused unless the provider option
`allow_host_network: true` lets them run on the host's network, unfiltered. What it gives: sandbox paths (`/app`, `/tests`, `/logs`, `/solution`, `/tmp`, the
workdir, mount targets) translated to a private directory, every command in its own process group, timeouts that
kill the whole tree, and a stop or reap that leaves no process and no directory behind. For tests and laptops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import posixpath
import re
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

from platoon_sandbox import egress, netns, procs
from platoon_sandbox.contract import ExecResult, SandboxError, SandboxSpec, unenforced_field
from platoon_sandbox.output import DRAIN_S, CappedOutput
from platoon_sandbox.registry import Registration, class_path, merge_labels, registry
from platoon_sandbox.routes import FIRST_PORT, Forwarder, find_python

__all__ = ["ProcessProvider", "ProcessSandbox", "ProcessSnapshot", "node_scratch"]

log = logging.getLogger(__name__)

#: Said once per process, at the first start: what a model-written command can reach here. Where bubblewrap works,
#: network: none sandboxes are off the network...
NOT_ISOLATED_WARNING = (
    "the process sandbox provider isolates nothing but the network of its sandboxes (a network namespace of their "
    "own through bubblewrap: only lo, or filtered egress): commands run as %s on this host, with its files in reach. "
    "Use it for tests and laptops; pick an isolating provider (docker, singularity, enroot) for model-written code "
    "you do not trust."
)
#: ...and where it does not, they are on the host's network, which this says as loudly.
NOT_ISOLATED_NO_NETNS_WARNING = (
    "the process sandbox provider isolates nothing: commands run as %s on this host, with its files and its network "
    "in reach (network: none is not enforced: %s; apt-get install bubblewrap gives network: none sandboxes a network "
    "namespace of their own, with unprivileged user namespaces enabled unless platoon runs as root, or set "
    "PLATOON_BWRAP to a bwrap binary). Use it for tests and laptops; pick an isolating provider (docker, singularity, "
    "enroot) for model-written code you do not trust."
)
_warned = False

#: The sandbox paths every process sandbox maps, besides its workdir and mount targets.
MAPPED_ROOTS = ("/app", "/tests", "/logs", "/solution", "/tmp")
ROOT_ENV = "PLATOON_SANDBOX_ROOT"
#: The route forwarder carries this and is spared by `kill_processes` (harness.md 5.6).
INFRA_MARKER = b"PLATOON_INFRA=route"
SCRATCH_VARIABLES = ("PLATOON_NODE_SCRATCH", "PBS_LOCALDIR", "SLURM_TMPDIR", "TMPDIR")
#: Kill passes over the leftover processes at stop.
KILL_PASSES = 50


def _user() -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(os.getuid()).pw_name!r}"
    except (ImportError, KeyError):
        return f"uid {os.getuid()}"


def node_scratch() -> Path:
    """`$PLATOON_NODE_SCRATCH`, `$PBS_LOCALDIR`, `$SLURM_TMPDIR`, `$TMPDIR`, else `/tmp` (harness.md 4)."""
    for name in SCRATCH_VARIABLES:
        if os.environ.get(name):
            return Path(os.environ[name])
    return Path("/tmp")


@dataclass(frozen=True)
class ProcessSnapshot:
    """A copy of a sandbox's filesystem; `discard()` deletes it once no restore needs it."""

    path: Path

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


#: What every process sandbox can do, on any node.
BASE_CAPABILITIES = frozenset({"snapshot", "routes", "host_loopback"})


class _Capabilities:
    """`ProcessProvider.capabilities`: a fact about this node, not the class, because `network_none` holds only
    where bubblewrap can make a network namespace. The first read probes (once per process, a few milliseconds)."""

    def __get__(self, instance: object, owner: type | None = None) -> frozenset[str]:
        if netns.unavailable() is not None:
            return BASE_CAPABILITIES
        if egress.process_unavailable() is not None:
            return BASE_CAPABILITIES | {"network_none"}
        return BASE_CAPABILITIES | {"network_none", "network_public", "network_allowlist"}


class ProcessProvider:
    """Starts process sandboxes under `<scratch_root>/platoon-sandboxes-<uid>/` (scratch_root: the node scratch
    unless given). `egress_allow`: host or host:port destinations public and allowlist sandboxes may reach even when
    private or the host's own. `allow_host_network`: where filtered egress is unavailable, run public and allowlist
    sandboxes on the host's network, unfiltered (else they are refused)."""

    name: ClassVar[str] = "process"
    # typed as the contract's class variable (a descriptor reads as one), so the class still is a SandboxProvider
    capabilities: ClassVar[frozenset[str]] = cast("frozenset[str]", _Capabilities())
    isolates: ClassVar[bool] = False

    def __init__(
        self,
        scratch_root: str | None = None,
        egress_allow: Sequence[str] | None = None,
        allow_host_network: bool = False,
    ) -> None:
        self.options: dict[str, Any] = {"scratch_root": scratch_root} if scratch_root else {}
        self.base = Path(scratch_root or node_scratch()) / f"platoon-sandboxes-{os.getuid()}"
        self.egress_allow = egress.parse_egress_allow(egress_allow)
        if self.egress_allow:
            self.options["egress_allow"] = list(self.egress_allow)
        self.allow_host_network = allow_host_network is True
        if self.allow_host_network:
            self.options["allow_host_network"] = True

    @classmethod
    def unavailable(cls, options: Mapping[str, Any]) -> str | None:
        if not os.path.isdir("/proc/self"):
            return "the process provider needs Linux's /proc to find and kill what its commands started"
        if shutil.which("bash") is None:
            return "the process provider runs string commands under bash, and bash is not on PATH"
        return None

    @classmethod
    def refusal(cls, spec: SandboxSpec, options: Mapping[str, Any] | None = None) -> str | None:
        """Limits and a user are never enforced here: a spec that sets them is refused."""
        return unenforced_field(spec, cls.capabilities, cls.name)

    @classmethod
    def network_public_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why public sandboxes cannot start with these options here, or None. Blocking on the first call (a probe)."""
        options = options or {}
        try:
            egress.parse_egress_allow(options.get("egress_allow"))
        except SandboxError as exc:
            return str(exc)
        if options.get("allow_host_network") is True:
            return None
        if (why := egress.process_unavailable()) is not None:
            return (
                f"public and allowlist process sandboxes need filtered egress, unavailable here ({why}); or set the "
                "provider option allow_host_network: true to run them on the host's network, unfiltered"
            )
        return None

    @classmethod
    def network_allowlist_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why allowlist sandboxes cannot start here, or None (the same mechanism as public's)."""
        return cls.network_public_refusal(options)

    async def start(self, spec: SandboxSpec) -> ProcessSandbox:
        global _warned
        if (why := self.refusal(spec, self.options)) is not None:
            raise SandboxError(why)
        egress_plan = None
        if spec.network in egress.EGRESS_NETWORKS:
            refusal = await asyncio.to_thread(self.network_public_refusal, self.options)
            if refusal is not None:
                raise SandboxError(refusal)
            if (
                await asyncio.to_thread(egress.process_unavailable) is None
            ):  # else: allowed onto the host network
                egress_plan = await asyncio.to_thread(
                    egress.plan, spec.network, spec.allowed_hosts, self.egress_allow
                )
        no_netns = None
        if not _warned or spec.network == "none":
            no_netns = await asyncio.to_thread(netns.unavailable)  # probed once per process
        if not _warned:
            _warned = True
            if no_netns is None:
                log.warning(NOT_ISOLATED_WARNING, _user())
            else:
                log.warning(NOT_ISOLATED_NO_NETNS_WARNING, _user(), no_netns)
        labels = merge_labels(spec.labels)
        entry = registry().register(class_path(self), self.options, labels)  # before anything exists to leak
        root = self.base / f"process-{uuid.uuid4().hex[:12]}"
        sandbox = ProcessSandbox(root, spec, labels, entry)  # makes nothing yet
        try:
            if (spec.network == "none" and no_netns is None) or egress_plan is not None:
                sandbox._netns = await asyncio.to_thread(netns.NetNamespace.create)
            if egress_plan is not None and sandbox._netns is not None:
                net_path, user_path = sandbox._netns.paths()
                sandbox._egress = await egress.start(
                    egress_plan,
                    marker=str(root),
                    netns_path=net_path,
                    userns_path=user_path,
                    enter=sandbox._netns.prefix(),
                )
            sandbox._create()
            await sandbox._start_routes()
        except BaseException:
            await sandbox._stop_routes()
            await asyncio.to_thread(sandbox._stop_egress)
            sandbox._close_netns()
            shutil.rmtree(root, ignore_errors=True)
            registry().unregister(entry)
            raise
        registry().attach(entry, sandbox)
        return sandbox

    async def restore(self, snapshot: Any, spec: SandboxSpec) -> ProcessSandbox:
        if not isinstance(snapshot, ProcessSnapshot):
            raise SandboxError(
                f"the process provider restores only its own snapshots; got {type(snapshot).__name__}"
            )
        sandbox = await self.start(spec)
        try:
            await asyncio.to_thread(
                shutil.copytree, snapshot.path, sandbox.fs, symlinks=True, dirs_exist_ok=True
            )
        except BaseException:
            await sandbox.stop()
            raise
        return sandbox

    async def reap(self, labels: Mapping[str, str]) -> int:
        """Stop the sandboxes carrying all of `labels` whose owner is this process or dead; never another live
        process's. An empty label set is refused."""
        if not labels:
            raise SandboxError(
                "reaping with an empty label set is refused: it would reap every run's sandboxes"
            )
        return await asyncio.to_thread(self._reap, dict(labels))

    async def labelled(self, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """The sandboxes carrying all of `labels` (`platoon sandbox list`): id, owner pid, whether the owner is
        alive, where. An empty label set is refused, as for `reap`."""
        if not labels:
            raise SandboxError("listing with an empty label set is refused: give the run's label")
        return await asyncio.to_thread(self._labelled, dict(labels))

    def _labelled(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        try:
            roots = sorted(p for p in self.base.iterdir() if p.name.startswith("process-"))
        except FileNotFoundError:
            return found
        for root in roots:
            try:
                meta = json.loads((root / "sandbox.json").read_text())
            except (OSError, ValueError):
                continue  # mid-start or mid-stop
            if any(meta.get("labels", {}).get(k) != v for k, v in labels.items()):
                continue
            owner, started = meta.get("owner_pid"), meta.get("owner_start")
            state = "owner running" if procs.alive(owner, started) else "owner gone"
            found.append({"id": root.name, "owner_pid": owner, "state": state, "path": str(root)})
        return found

    def _reap(self, labels: dict[str, str]) -> int:
        reaped = 0
        try:
            roots = [p for p in self.base.iterdir() if p.name.startswith("process-")]
        except FileNotFoundError:
            return 0
        me, my_start = os.getpid(), procs.start_time(os.getpid())
        for root in roots:
            try:
                meta = json.loads((root / "sandbox.json").read_text())
            except (OSError, ValueError):
                continue  # mid-start or mid-stop: its owner is at work on it
            if any(meta.get("labels", {}).get(k) != v for k, v in labels.items()):
                continue
            owner, started = meta.get("owner_pid"), meta.get("owner_start")
            ours = owner == me and started == my_start
            if not ours and procs.alive(owner, started):
                continue
            if ours:
                _forget(root)
            _kill_all(root / "fs", _groups(root), spare_routes=False)
            egress.kill_strays([str(root)])  # its slirp4netns, should its owner have left one
            shutil.rmtree(root, ignore_errors=True)
            reaped += 1
        return reaped


def _forget(root: Path) -> None:
    """A sandbox of this very process is being reaped: its live object stops answering and leaves the registry."""
    for entry in registry().live:
        if isinstance(entry.sandbox, ProcessSandbox) and entry.sandbox.root == root:
            entry.sandbox._stopped = True
            entry.sandbox._stop_egress()
            entry.sandbox._close_netns()
            registry().unregister(entry)


def _groups(root: Path) -> list[tuple[int, int | None]]:
    """The process groups a sandbox's commands ran in, with their leaders' start times."""
    try:
        lines = (root / "process-groups").read_text().split("\n")
    except FileNotFoundError:
        return []
    groups = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            groups.append((int(parts[0]), int(parts[1]) if parts[1] != "-" else None))
    return groups


def _kill_all(fs: Path, groups: Sequence[tuple[int, int | None]], *, spare_routes: bool) -> list[int]:
    """Kill the groups, then every process still carrying this sandbox's root, pass after pass (a process may fork
    while we scan); the route forwarders only when not `spare_routes`. Returns the survivors of the last pass."""
    for pgid, started in groups:
        procs.kill_group(pgid, started)
    marker = f"{ROOT_ENV}={fs}".encode()
    survivors: list[int] = []
    for _ in range(KILL_PASSES):
        survivors = procs.pids_with_marker([marker], spare=INFRA_MARKER if spare_routes else None)
        if not survivors:
            break
        procs.kill_pids(survivors)
        time.sleep(0.01)
    return survivors


class ProcessSandbox:
    """One process sandbox: `root/fs` is its filesystem, `root/sandbox.json` its record."""

    def __init__(self, root: Path, spec: SandboxSpec, labels: dict[str, str], entry: Registration) -> None:
        self.root = root
        self.fs = root / "fs"
        self.spec = spec
        self.labels = labels
        self._entry = entry
        self._stopped = False
        targets = {*MAPPED_ROOTS, spec.workdir, *(m.target for m in spec.mounts)}
        targets.discard("/")
        # Longest first, so /app/sub (a mount) wins over /app. A root is a path only where a path can start: not
        # inside a word, a URL or a longer path, nor after `~`, `}` or `)` (`~/app`, `${DIR}/app`, `$(pwd)/app`).
        alternatives = "|".join(re.escape(t.rstrip("/")) for t in sorted(targets, key=len, reverse=True))
        self._pattern = re.compile(rf"(?<![\w./~}})-])({alternatives})(?=/|$|[^\w.-])")
        # TCP upstreams are their own route; Unix ones get a forwarder unless on the host network (5.6)
        self._routes = {name: url for name, url in spec.upstreams.items() if not url.startswith("unix://")}
        self._forwarders: dict[str, Forwarder] = {}
        #: `none`, `public`, `allowlist` where bubblewrap works: every command and forwarder runs in this namespace
        self._netns: netns.NetNamespace | None = None
        #: `public`, `allowlist`: the slirp4netns giving the namespace its filtered egress
        self._egress: egress.Slirp | None = None

    # -- setup -------------------------------------------------------------------------------------------------

    def _create(self) -> None:
        self.base_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.mkdir(mode=0o700)
        for target in (*MAPPED_ROOTS, self.spec.workdir):
            self._host(target).mkdir(parents=True, exist_ok=True)
        for mount in self.spec.mounts:
            link = self._host(mount.target)
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_dir() and not link.is_symlink():
                link.rmdir()  # an empty mapped root (say /tests) replaced by the mount
            link.symlink_to(os.path.abspath(mount.source))
        meta = {
            "labels": self.labels,
            "owner_pid": os.getpid(),
            "owner_start": procs.start_time(os.getpid()),
            "created": time.time(),
            "workdir": self.spec.workdir,
            "network_namespace": self._netns is not None,
        }
        # written last and atomically: a reaper skips a root without it, so a half-made sandbox is its owner's
        tmp = self.root / ".sandbox.json"
        tmp.write_text(json.dumps(meta))
        tmp.replace(self.root / "sandbox.json")

    @property
    def base_dir(self) -> Path:
        return self.root.parent

    def _host(self, path: str) -> Path:
        """A sandbox path's host path (untranslated when outside the mapped roots)."""
        return Path(self.translate(path))

    def translate(self, text: str) -> str:
        """Sandbox paths under the mapped roots, wherever they appear in `text`, as host paths."""
        fs = str(self.fs)
        return self._pattern.sub(lambda m: fs + m.group(1), text)

    # -- the contract ------------------------------------------------------------------------------------------

    async def _start_routes(self) -> None:
        """A forwarder per Unix-socket upstream of a sandbox off the host network (none, public, allowlist), in name
        order (5.6): inside its own network namespace on 18080, 18081, ... (it reaches the socket through the shared
        filesystem), else on free host loopback ports. On the host network there is nothing to forward: the
        sandbox reaches the socket itself."""
        unix = sorted((n, u) for n, u in self.spec.upstreams.items() if u.startswith("unix://"))
        if self.spec.network == "host" or not unix:
            return
        python = await find_python([m.source for m in self.spec.mounts if m.read_only])
        env = {**os.environ, ROOT_ENV: str(self.fs), "TMPDIR": str(self.fs / "tmp")}
        prefix = self._netns.prefix() if self._netns else []
        for index, (name, url) in enumerate(unix):
            socket_path = Path(url[len("unix://") :])
            # the socket's *directory* at /run/platoon/<name>: the socket may appear there later
            link = self.fs / "run" / "platoon" / name  # /run is not a mapped root: never _host()
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(socket_path.parent)
            forwarder = Forwarder(
                name, link / socket_path.name, self._host("/tmp/platoon-route"), python, env, prefix
            )
            self._forwarders[name] = forwarder
            await forwarder.start(FIRST_PORT + index if self._netns else 0)

    async def _stop_routes(self) -> None:
        for forwarder in self._forwarders.values():
            await forwarder.stop()

    def _stop_egress(self) -> None:
        """End the slirp4netns (blocking, quick); idempotent."""
        if self._egress is not None:
            self._egress.stop()
            self._egress = None

    def _close_netns(self) -> None:
        if self._netns is not None:
            self._netns.close()

    @property
    def routes(self) -> Mapping[str, str]:
        return {**self._routes, **{name: f.url for name, f in self._forwarders.items()}}

    async def ensure_routes(self) -> None:
        self._check()
        for forwarder in self._forwarders.values():
            await forwarder.ensure()

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        self._check()
        argv = (
            ["bash", "-c", self.translate(cmd)] if isinstance(cmd, str) else [self.translate(a) for a in cmd]
        )
        if not argv:
            raise ValueError("exec needs a command; got an empty argv")
        if self._netns is not None:
            argv = [
                *self._netns.prefix(),
                *argv,
            ]  # nsenter execs the command in place: same pid, group, markers
        # a relative cwd is the workdir's, never platoon's own working directory
        where = posixpath.join(self.spec.workdir, cwd) if cwd else self.spec.workdir
        workdir = self.translate(where)
        # Entering the directory ourselves first makes "cannot enter the cwd" its own OSError (harness.md 5.1),
        # never confused with a missing executable.
        if not os.path.isdir(workdir):
            raise FileNotFoundError(2, "cannot enter the working directory", where)
        if not os.access(workdir, os.X_OK):
            raise PermissionError(13, "cannot enter the working directory", where)
        full_env = dict(os.environ)
        for key, value in {**self.spec.env, **(env or {})}.items():
            full_env[key] = self.translate(value)
        exec_marker = uuid.uuid4().hex
        full_env.update({ROOT_ENV: str(self.fs), "TMPDIR": str(self.fs / "tmp"), "PLATOON_EXEC": exec_marker})
        data = stdin.encode() if isinstance(stdin, str) else stdin
        # Our own pipes, not asyncio's: its wait() also waits for the pipes to close, which a background child
        # holding them would put off forever; here wait() is the exit, and the pipes get DRAIN_S after it.
        out, err = _Capture(), _Capture()
        out_fd, err_fd = out.open(), err.open()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if data is not None else asyncio.subprocess.DEVNULL,
                stdout=out_fd,
                stderr=err_fd,
                cwd=workdir,
                env=full_env,
                start_new_session=True,  # its own process group (and session): the tree is killed as one
            )
        except (FileNotFoundError, PermissionError) as exc:
            out.close()
            err.close()
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            return ExecResult(code, "", f"{argv[0]}: {exc.strerror}\n")
        finally:
            os.close(out_fd)
            os.close(err_fd)
        with open(self.root / "process-groups", "a") as groups:
            groups.write(f"{proc.pid} {procs.start_time(proc.pid) or '-'}\n")
        readers = [asyncio.ensure_future(out.read()), asyncio.ensure_future(err.read())]
        timed_out = False

        async def feed_and_wait() -> None:
            # stdin inside the timeout too: a command that never reads it must not hang the exec
            if data is not None:
                assert proc.stdin is not None
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    proc.stdin.write(data)
                    await proc.stdin.drain()
                proc.stdin.close()
            await proc.wait()

        try:
            await asyncio.wait_for(feed_and_wait(), timeout_s)
        except TimeoutError:
            timed_out = True
        finally:
            if timed_out or proc.returncode is None:  # a timeout, or our caller cancelled us
                # the group kill reaches the leader too; never proc.kill(): Popen polls first, reaping the exit
                # status that asyncio's child watcher is waiting for (the code would then read 255)
                self._kill_tree(proc.pid, exec_marker)
                await asyncio.shield(proc.wait())
        _, pending = await asyncio.wait(readers, timeout=DRAIN_S)
        for reader in pending:
            reader.cancel()  # a background child holds the pipe: what it writes from now on is not this result's
        out.close()
        err.close()
        code = (
            proc.returncode
            if proc.returncode is not None and proc.returncode >= 0
            else 128 - (proc.returncode or 0)
        )
        return ExecResult(code, out.text(), err.text(), timed_out)

    def _kill_tree(self, pgid: int, exec_marker: str) -> None:
        """The group, then whatever left it but still carries this command's marker."""
        procs.kill_group(pgid)
        for _ in range(KILL_PASSES):
            left = procs.pids_with_marker([f"PLATOON_EXEC={exec_marker}".encode()])
            if not left:
                return
            procs.kill_pids(left)

    async def upload(self, src: str | Path, dst: str) -> None:
        self._check()
        await asyncio.to_thread(_copy, Path(src), self._host(dst))

    async def download(self, src: str, dst: str | Path) -> None:
        self._check()
        source = self._host(src)
        if not source.exists() and not source.is_symlink():
            raise FileNotFoundError(2, "no such file in the sandbox", src)
        await asyncio.to_thread(_copy, source, Path(dst))

    async def snapshot(self) -> ProcessSnapshot:
        self._check()
        path = self.base_dir / f"snapshot-{uuid.uuid4().hex[:12]}"
        try:
            await asyncio.to_thread(shutil.copytree, self.fs, path, symlinks=True)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return ProcessSnapshot(path)

    async def kill_processes(self) -> None:
        self._check()
        survivors = await asyncio.to_thread(_kill_all, self.fs, _groups(self.root), spare_routes=True)
        if survivors:
            raise SandboxError(
                f"processes {survivors} of sandbox {self.root.name} survived {KILL_PASSES} kills"
            )

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            await self._stop_routes()
            survivors = await asyncio.to_thread(_kill_all, self.fs, _groups(self.root), spare_routes=False)
            await asyncio.to_thread(self._stop_egress)
            self._close_netns()  # nothing runs in it any more: it vanishes with our descriptors
            await asyncio.to_thread(shutil.rmtree, self.root, True)
            if survivors:
                raise SandboxError(
                    f"processes {survivors} of sandbox {self.root.name} survived {KILL_PASSES} kills"
                )
        finally:
            registry().unregister(self._entry)

    def _check(self) -> None:
        if self._stopped:
            raise SandboxError(f"sandbox {self.root.name} has stopped")


class _Capture(CappedOutput):
    """One output stream read from a pipe of our own (the child gets its write end)."""

    def __init__(self) -> None:
        super().__init__()
        self._read_fd = -1

    def open(self) -> int:
        """A new pipe; returns the write end for the child (the caller closes it once the child has it)."""
        self._read_fd, write_fd = os.pipe()
        return write_fd

    async def read(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 16)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(self._read_fd, "rb", buffering=0)
        )
        self._read_fd = -1  # the transport owns it now
        self._transport = transport
        try:
            await self.read_from(reader)
        finally:
            transport.close()

    def close(self) -> None:
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1


def _copy(src: Path, dst: Path) -> None:
    """A file to `dst`; a directory's contents into `dst` (symlinks copied as symlinks)."""
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
        return
    if not src.exists() and not src.is_symlink():
        raise FileNotFoundError(2, "no such file", str(src))
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_dir() and not dst.is_symlink():
        dst = dst / src.name
    shutil.copy2(src, dst, follow_symlinks=False)
