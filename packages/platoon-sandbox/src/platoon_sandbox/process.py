"""The `process` provider: a directory on the host standing in for a container. NOT isolated.

Commands run as host processes, as the user running platoon, with the host's files readable. Where bubblewrap
works they are confined (`confine`): a PID namespace of the sandbox's own, the host read-only with the sandbox's
directories bound at their sandbox paths, a private `/tmp` and `/run`, no Docker socket; without it (or with
`confine: none`) sandbox paths (`/app`, `/tests`, `/logs`, `/solution`, `/tmp`, the workdir, mount targets) are
translated to the private directory in command text instead. Either way a command starts from an allowlisted
environment (`platoon.host_env`), never the host's. The network is kept apart where bubblewrap can make a namespace
(`netns`): a `network: none` sandbox gets one holding only `lo`; `public` and `allowlist` ones get one with filtered
egress attached (`egress`: slirp4netns and nftables rules inside), or, where that is unavailable, are refused unless
the provider option `allow_host_network: true` lets them run on the host's network, unfiltered. Every command runs in
its own process group, timeouts kill the whole tree, and a stop or reap leaves no process and no directory behind.
For tests and laptops.
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

from platoon.errors import ConfigError
from platoon.host_env import allowed_host_env
from platoon.sandbox import ExecResult, Sandbox, SandboxError, SandboxProvider, SandboxSpec, unenforced_field
from platoon_sandbox import egress, netns, procs
from platoon_sandbox.confine import CONFINE_MODES, Bind, Confinement, root_layout
from platoon_sandbox.confine import unavailable as confinement_unavailable
from platoon_sandbox.output import CappedOutput, drain
from platoon_sandbox.registry import Registration, class_path, merge_labels, registry
from platoon_sandbox.routes import FIRST_PORT, Forwarder, find_python

__all__ = ["ProcessProvider", "ProcessSandbox", "ProcessSnapshot", "node_scratch"]

log = logging.getLogger(__name__)

#: Said once per process, at the first start: what a model-written command can reach here. Where bubblewrap works,
#: commands are confined and network: none sandboxes are off the network...
NOT_ISOLATED_WARNING = (
    "the process sandbox provider confines commands with bubblewrap (a PID namespace of the sandbox's own, a private "
    "/tmp, no Docker socket, none of the host's environment; a network namespace of their own, holding only lo or "
    "filtered egress) but does not isolate them: they run as %s on this host, with its files readable. Use it for "
    "tests and laptops; pick an isolating provider (docker, singularity, enroot) for model-written code you do not "
    "trust."
)
#: ...where bubblewrap works but the run config said `confine: none`, commands are not confined...
UNCONFINED_WARNING = (
    "the process sandbox provider runs commands unconfined (provider_options confine: none): they run as %s on this "
    "host with its files, its processes' environments and its Docker socket in reach (network: none sandboxes still "
    "get a network namespace holding only lo). Use it for tests and laptops; pick an isolating provider (docker, "
    "singularity, enroot) for model-written code you do not trust."
)
#: ...and where it does not work at all, they are on the host's network too, which this says as loudly.
NOT_ISOLATED_NO_NETNS_WARNING = (
    "the process sandbox provider isolates nothing: commands run as %s on this host, with its files, its processes' "
    "environments, its Docker socket and its network in reach (network: none is not enforced: %s; apt-get install "
    "bubblewrap confines commands and gives network: none sandboxes a network namespace of their own, with "
    "unprivileged user namespaces enabled unless platoon runs as root, or set PLATOON_BWRAP to a bwrap binary). Use "
    "it for tests and laptops; pick an isolating provider (docker, singularity, enroot) for model-written code you "
    "do not trust."
)
#: Where bwrap makes network namespaces but cannot confine commands (an old or restricted bwrap).
NOT_CONFINED_WARNING = (
    "the process sandbox provider cannot confine commands here (%s): they run as %s on this host with its files, its "
    "processes' environments and its Docker socket in reach (network: none sandboxes still get a network namespace "
    "holding only lo). Use it for tests and laptops; pick an isolating provider (docker, singularity, enroot) for "
    "model-written code you do not trust."
)
_warned = False

#: The sandbox paths every process sandbox maps, besides its workdir and mount targets.
MAPPED_ROOTS = ("/app", "/tests", "/logs", "/solution", "/tmp")
ROOT_ENV = "PLATOON_SANDBOX_ROOT"
#: A confined sandbox's private /var/tmp and /dev/shm, beside fs/ (not in its snapshots); its /run is fs/run.
CONFINED_DIRS = ("var-tmp", "shm")
#: The route forwarder carries this and is spared by `kill_processes`.
INFRA_MARKER = b"PLATOON_INFRA=route"
SCRATCH_VARIABLES = ("PLATOON_NODE_SCRATCH", "PBS_LOCALDIR", "SLURM_TMPDIR", "TMPDIR")
#: Kill passes over the leftover processes at stop.
KILL_PASSES = 50
#: How long the processes of a command killed at its timeout may take to be gone (a moment, normally).
KILL_WAIT_S = 10.0


def _user() -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(os.getuid()).pw_name!r}"
    except (ImportError, KeyError):
        return f"uid {os.getuid()}"


def node_scratch() -> Path:
    """`$PLATOON_NODE_SCRATCH`, `$PBS_LOCALDIR`, `$SLURM_TMPDIR`, `$TMPDIR`, else `/tmp`."""
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
    where bubblewrap can make a network namespace, and `clean_env` only where it confines commands (and the
    provider's options do not say `confine: none`). The first read probes (once per process, a few milliseconds)."""

    def __get__(self, instance: object, owner: type | None = None) -> frozenset[str]:
        if netns.unavailable() is not None:
            caps = BASE_CAPABILITIES
        elif egress.process_unavailable() is not None:
            caps = BASE_CAPABILITIES | {"network_none"}
        else:
            caps = BASE_CAPABILITIES | {"network_none", "network_public", "network_allowlist"}
        if getattr(instance, "confine", None) != "none" and confinement_unavailable() is None:
            # the allowlisted environment is there without bwrap too, but the parent's /proc/<pid>/environ is not
            # out of reach there: only a confined command has nothing of the host's environment to read; and only
            # there is the sandbox's life its holder's init, which no command can signal
            caps |= {"clean_env", "lifetime"}
        return caps


class ProcessProvider(SandboxProvider):
    """Starts process sandboxes under `<scratch_root>/platoon-sandboxes-<uid>/` (scratch_root: the node scratch
    unless given). `egress_allow`: host or host:port destinations public and allowlist sandboxes may reach even when
    private or the host's own. `allow_host_network`: where filtered egress is unavailable, run public and allowlist
    sandboxes on the host's network, unfiltered (else they are refused)."""

    name: ClassVar[str] = "process"
    # typed as the contract's attribute (a descriptor reads as one)
    capabilities: frozenset[str] = cast("frozenset[str]", _Capabilities())
    isolates: ClassVar[bool] = False

    def __init__(
        self,
        scratch_root: str | None = None,
        confine: str | None = None,
        egress_allow: Sequence[str] | None = None,
        allow_host_network: bool = False,
    ) -> None:
        if confine is not None and confine not in CONFINE_MODES:
            raise ConfigError(
                f"provider_options.confine: bwrap (commands under bubblewrap, the default where it works) or none "
                f"(unconfined, on the host as they are); got {confine!r}"
            )
        self.options: dict[str, Any] = {"scratch_root": scratch_root} if scratch_root else {}
        if confine is not None:
            self.options["confine"] = confine
        #: `bwrap`: confined or refused; `none`: never confined; None: confined where bubblewrap works
        self.confine = confine
        self.base = Path(scratch_root or node_scratch()) / f"platoon-sandboxes-{os.getuid()}"
        self.egress_allow = egress.parse_egress_allow(egress_allow)
        if self.egress_allow:
            self.options["egress_allow"] = list(self.egress_allow)
        self.allow_host_network = allow_host_network is True
        if self.allow_host_network:
            self.options["allow_host_network"] = True

    @classmethod
    def unavailable(cls, options: Mapping[str, Any] | None = None) -> str | None:
        if not os.path.isdir("/proc/self"):
            return "the process provider needs Linux's /proc to find and kill what its commands started"
        if shutil.which("bash") is None:
            return "the process provider runs string commands under bash, and bash is not on PATH"
        return None

    @classmethod
    def unconfined_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why commands would run unconfined here with `options`, or None: bubblewrap confines them, or the options
        say `confine: none`, which accepts that. The Harbor service refuses to run tasks while this answers;
        a site profile cannot set `confine`."""
        if (options or {}).get("confine") == "none":
            return None
        why = confinement_unavailable()
        if why is None:
            return None
        return (
            f"commands would run unconfined on this host ({why}); install bubblewrap (or set PLATOON_BWRAP to a bwrap "
            "binary), or accept that in the run config with provider_options.confine: none"
        )

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
        cannot_confine = None
        if self.confine != "none":
            cannot_confine = await asyncio.to_thread(confinement_unavailable)  # probed once per process
            if cannot_confine is not None and self.confine == "bwrap":
                raise SandboxError(f"provider_options confine: bwrap, but {cannot_confine}")
        bwrap = netns.bwrap_binary()
        confined = self.confine != "none" and cannot_confine is None and bwrap is not None
        if not _warned:
            _warned = True
            if no_netns is not None:
                log.warning(NOT_ISOLATED_NO_NETNS_WARNING, _user(), no_netns)
            elif confined:
                log.warning(NOT_ISOLATED_WARNING, _user())
            elif self.confine == "none":
                log.warning(UNCONFINED_WARNING, _user())
            else:
                log.warning(NOT_CONFINED_WARNING, cannot_confine, _user())
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
            sandbox._create(confined=confined)
            if confined and bwrap is not None:
                layout = root_layout(str(sandbox.fs), [*MAPPED_ROOTS, "/run"], sandbox._binds())
                sandbox._confinement = Confinement(bwrap, layout)
                prefix = sandbox._netns.prefix() if sandbox._netns is not None else []
                await sandbox._confinement.start(prefix, sandbox._confined_env())
            await sandbox._start_routes()
        except BaseException:
            await sandbox._stop_routes()
            if sandbox._confinement is not None:
                await sandbox._confinement.stop()
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
            if entry.sandbox._confinement is not None:
                entry.sandbox._confinement.forget()
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
    killed: set[int] = set()
    for _ in range(KILL_PASSES):
        survivors = procs.pids_with_marker([marker], spare=INFRA_MARKER if spare_routes else None)
        if not survivors:
            break
        procs.kill_pids(survivors)
        killed.update(survivors)
        time.sleep(0.01)
    # A dying process drops its memory, environment included, before it becomes a zombie: the marker scan stops
    # seeing it while it still runs, so each killed pid is also waited for.
    return survivors + procs.wait_gone(killed - set(survivors), KILL_WAIT_S)


class ProcessSandbox(Sandbox):
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
        # TCP upstreams are their own route; Unix ones get a forwarder unless on the host network
        self._routes = {name: url for name, url in spec.upstreams.items() if not url.startswith("unix://")}
        self._forwarders: dict[str, Forwarder] = {}
        #: `none`, `public`, `allowlist` where bubblewrap works: every command and forwarder runs in this namespace
        self._netns: netns.NetNamespace | None = None
        #: where bubblewrap confines commands: they see sandbox paths as they are, and nothing is translated
        self._confinement: Confinement | None = None
        #: `public`, `allowlist`: the slirp4netns giving the namespace its filtered egress
        self._egress: egress.Slirp | None = None

    # -- setup -------------------------------------------------------------------------------------------------

    def _create(self, *, confined: bool = False) -> None:
        self.base_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.mkdir(mode=0o700)
        for target in (*MAPPED_ROOTS, self.spec.workdir):
            Path(self.translate(target)).mkdir(parents=True, exist_ok=True)
        if confined:
            for private in CONFINED_DIRS:
                (self.root / private).mkdir()
            (self.fs / "run").mkdir()
        else:  # bubblewrap binds mounts at their targets; unconfined, their translated paths lead to them
            for mount in self.spec.mounts:
                link = Path(self.translate(mount.target))
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

    @property
    def confined(self) -> bool:
        """Whether bubblewrap confines this sandbox's commands (then they see sandbox paths as they are)."""
        return self._confinement is not None

    def process_ids(self) -> list[int]:
        """The host pids of the processes this sandbox's commands started that still run (its route forwarders and
        the holder of its PID namespace aside): those carrying its marker, and, confined, its PID namespace's."""
        found = procs.pids_with_marker([f"{ROOT_ENV}={self.fs}".encode()], spare=INFRA_MARKER)
        if self._confinement is not None:
            found += self._confinement.members(commands_only=True)
        holder = self._confinement.holder_pids() if self._confinement is not None else set()
        return sorted(set(found) - holder)

    def _host(self, path: str) -> Path:
        """A sandbox path's host path: under a mount target, the mount's source; else translated (untranslated when
        outside the mapped roots)."""
        for mount in sorted(self.spec.mounts, key=lambda m: len(m.target), reverse=True):
            target = mount.target.rstrip("/")
            if path == target or path.startswith(target + "/"):
                return Path(os.path.abspath(mount.source) + path[len(target) :])
        return Path(self.translate(path))

    def _binds(self) -> list[Bind]:
        """What a confined command sees besides `fs/` as its root: the mounts as asked, the private /var/tmp and
        /dev/shm, and the workdir where it lies below one of the host's directories (say /root/project)."""
        binds = [Bind(os.path.abspath(m.source), m.target, not m.read_only) for m in self.spec.mounts]
        binds += [Bind(str(self.root / "var-tmp"), "/var/tmp"), Bind(str(self.root / "shm"), "/dev/shm")]
        if os.path.isdir("/var/run") and not os.path.islink("/var/run"):
            binds.append(
                Bind(str(self.fs / "run"), "/var/run")
            )  # a /var/run that is no link to /run: private too
        workdir = self.spec.workdir.rstrip("/")
        top = "/" + workdir.strip("/").split("/")[0]
        if workdir and top not in MAPPED_ROOTS and os.path.lexists(top):
            binds.append(Bind(self.translate(workdir), workdir))
        return binds

    def _confined_env(self) -> dict[str, str]:
        """The environment of the holder (what /proc/1/environ shows) and of transfers: the allowlist, and the
        sandbox's marker, which finds the holder when the sandbox is reaped."""
        return {**allowed_host_env(), ROOT_ENV: str(self.fs), "TMPDIR": "/tmp"}

    def _prefix(self) -> list[str]:
        return self._netns.prefix() if self._netns is not None else []

    def translate(self, text: str) -> str:
        """Sandbox paths under the mapped roots, wherever they appear in `text`, as host paths."""
        fs = str(self.fs)
        return self._pattern.sub(lambda m: fs + m.group(1), text)

    # -- the contract ------------------------------------------------------------------------------------------

    async def _start_routes(self) -> None:
        """A forwarder per Unix-socket upstream of a sandbox off the host network (none, public, allowlist), in name
        order: inside its own network namespace on 18080, 18081, ... (it reaches the socket through the shared
        filesystem), else on free host loopback ports. On the host network there is nothing to forward: the
        sandbox reaches the socket itself."""
        unix = sorted((n, u) for n, u in self.spec.upstreams.items() if u.startswith("unix://"))
        if self.spec.network == "host" or not unix:
            return
        python = await find_python([m.source for m in self.spec.mounts if m.read_only])
        env = {**allowed_host_env(), ROOT_ENV: str(self.fs), "TMPDIR": str(self.fs / "tmp")}
        prefix = self._netns.prefix() if self._netns else []
        for index, (name, url) in enumerate(unix):
            socket_path = Path(url[len("unix://") :])
            # The socket's *directory* at <root>/sockets/<name> (the socket may appear there later), and the
            # forwarder's script and state in <root>/routes: outside fs/, where no command can swap them for its
            # own, which a restarted forwarder would run, unconfined, or follow to a socket of the host's.
            link = self.root / "sockets" / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(socket_path.parent)
            forwarder = Forwarder(name, link / socket_path.name, self.root / "routes", python, env, prefix)
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
        # confined, a command sees the sandbox's paths as they are; unconfined, they are the host's, translated
        inside = _as_is if self._confinement is not None else self.translate
        argv = ["bash", "-c", inside(cmd)] if isinstance(cmd, str) else [inside(a) for a in cmd]
        if not argv:
            raise ValueError("exec needs a command; got an empty argv")
        # a relative cwd is the workdir's, never platoon's own working directory
        where = posixpath.join(self.spec.workdir, cwd) if cwd else self.spec.workdir
        workdir = str(self._host(where))
        # Entering the directory ourselves first makes "cannot enter the cwd" its own OSError,
        # never confused with a missing executable.
        if not os.path.isdir(workdir):
            raise FileNotFoundError(2, "cannot enter the working directory", where)
        if not os.access(workdir, os.X_OK):
            raise PermissionError(13, "cannot enter the working directory", where)
        full_env = allowed_host_env()  # never the host's whole environment: its keys stay with platoon
        for key, value in {**self.spec.env, **(env or {})}.items():
            full_env[key] = inside(value)
        exec_marker = uuid.uuid4().hex
        full_env.update({"TMPDIR": inside("/tmp"), "PLATOON_EXEC": exec_marker})
        pass_fds: tuple[int, ...] = ()
        if self._confinement is not None:
            # in the holder's namespaces: its PID namespace finds and kills what the command leaves; the paths are
            # the sandbox's own, so there is no root for scripts to prefix them with
            argv = self._confinement.command(argv, where)
            pass_fds = self._confinement.pass_fds
            workdir = str(self.root)  # where nsenter starts: never a directory a command could have swapped
        else:
            full_env[ROOT_ENV] = str(self.fs)
        if self._netns is not None:
            argv = [
                *self._netns.prefix(),
                *argv,
            ]  # nsenter execs the command in place: same pid, group, markers
        data = stdin.encode() if isinstance(stdin, str) else stdin
        # Our own pipes, not asyncio's: its wait() also waits for the pipes to close, which a background child
        # holding them would put off forever; here wait() is the exit, and the pipes drain after it (`drain`).
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
                pass_fds=pass_fds,
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
                killed = self._kill_tree(proc.pid, exec_marker)
                await asyncio.shield(proc.wait())
                await asyncio.shield(asyncio.to_thread(procs.wait_gone, killed, KILL_WAIT_S))
        # To the pipes' end, or until DRAIN_S pass with nothing read: a background child holding a pipe is not
        # waited for (what it writes from then on is not this result's).
        await drain(readers, [out, err])
        out.close()
        err.close()
        code = (
            proc.returncode
            if proc.returncode is not None and proc.returncode >= 0
            else 128 - (proc.returncode or 0)
        )
        return ExecResult(code, out.text(), err.text(), timed_out)

    def _kill_tree(self, pgid: int, exec_marker: str) -> set[int]:
        """The group, then whatever left it but still carries this command's marker; returns what it killed."""
        marker = [f"PLATOON_EXEC={exec_marker}".encode()]
        # listed before any of them dies: a dying process's environment reads empty, yet it has not gone yet
        killed = set(procs.pids_with_marker(marker))
        procs.kill_group(pgid)
        procs.kill_pids(killed)
        for _ in range(KILL_PASSES):
            left = procs.pids_with_marker(marker)
            if not left:
                break
            killed.update(left)
            procs.kill_pids(left)
        return killed

    async def upload(self, src: str | Path, dst: str) -> None:
        self._check()
        if self._confinement is not None:
            # unpacked by a command in the sandbox: a symlink a command left there leads where it would lead the
            # agent's own commands, never into the host's files
            source = Path(src).absolute()
            if not source.exists() and not source.is_symlink():
                raise FileNotFoundError(2, "no such file", str(src))
            where = posixpath.join(self.spec.workdir, dst)
            await asyncio.to_thread(
                self._confinement.upload, source, where, self._prefix(), self._confined_env()
            )
            return
        await asyncio.to_thread(_copy, Path(src), self._host(dst))

    async def download(self, src: str, dst: str | Path) -> None:
        self._check()
        if self._confinement is not None:
            where = posixpath.join(self.spec.workdir, src)
            await asyncio.to_thread(
                self._confinement.download, where, Path(dst).absolute(), self._prefix(), self._confined_env()
            )
            return
        source = self._host(src)
        if not source.exists() and not source.is_symlink():
            raise FileNotFoundError(2, "no such file in the sandbox", src)
        await asyncio.to_thread(_copy, source, Path(dst))

    async def snapshot(self) -> ProcessSnapshot:
        self._check()
        path = self.base_dir / f"snapshot-{uuid.uuid4().hex[:12]}"
        stubs = self._confinement.stubs() if self._confinement is not None else set()

        def holders_own(directory: str, names: list[str]) -> set[str]:
            # the holder's mount points and links: a restored sandbox's holder makes them again
            here = os.path.relpath(directory, self.fs)
            return {n for n in names if os.path.normpath(os.path.join(here, n)) in stubs}

        try:
            await asyncio.to_thread(shutil.copytree, self.fs, path, symlinks=True, ignore=holders_own)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return ProcessSnapshot(path)

    async def kill_processes(self) -> None:
        self._check()
        if self._confinement is not None:
            # every process in the sandbox's PID namespace but the holder's: none can have left it
            survivors = await asyncio.to_thread(self._confinement.kill_commands)
        else:
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
            survivors = await self._confinement.stop() if self._confinement is not None else []
            survivors += await asyncio.to_thread(_kill_all, self.fs, _groups(self.root), spare_routes=False)
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


def _as_is(text: str) -> str:
    return text


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
