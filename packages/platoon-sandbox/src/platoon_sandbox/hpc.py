"""The `singularity` and `enroot` providers: an adapter over hpc-sandbox (the `hpc` extra).

hpc-sandbox (`hpc_sandbox.SingularityProvider` / `EnrootProvider`) runs rootless sandboxes on HPC nodes: one
Singularity/Apptainer instance or one enroot container per sandbox, its root filesystem a private copy on node-local
scratch. This module gives it platoon's contract (`platoon.sandbox`): `hpc_sandbox.<Provider>(**options)`
with the options passed through; string commands under `bash -c` (hpc-sandbox would use `/bin/sh`); uploads and
downloads from `/` (a relative path is taken from `/`, as `docker cp` does, never from a workdir the agent may have
deleted); snapshots deleted when their sandbox stops; the sandbox's own failures (hpc-sandbox's `SandboxError`,
`SandboxStartError`, `SandboxLostError`) raised as platoon's `SandboxError` (`SandboxGone` for a lost one), never turned into exit codes.

hpc-sandbox is imported only when a provider is constructed (or asked whether it is available), so `import
platoon_sandbox.hpc` and `platoon --help` stay light. Which inner class a provider wraps is the class attribute
`inner_class` (an import string); the tests point a subclass at a fake, because no Apptainer or enroot can be
installed on the CI machine.

What hpc-sandbox lacks, the adapter adds through `exec`, as the docker provider does with `docker exec`:
- routes: a `network: none` sandbox has its own network namespace, so each Unix-socket upstream's
  directory is bound read-only at `/run/platoon/<name>` and a forwarder inside listens on 127.0.0.1:18080, 18081...
  (`routes.ContainerForwarders`);
- `kill_processes`: hpc sandboxes have their own PID namespace (Singularity's `--containall`, enroot's anchor), so
  the sandbox's own processes (the instance's keep-alive, enroot's init) are listed right after start by pid and
  start time and spared, with the forwarders; everything else is frozen and SIGKILLed.

Registration is the docker provider's: process labels merged over the spec's, registered before the
inner start, attached once started, unregistered once stopped; a start that fails leaves nothing registered unless
hpc-sandbox itself says its cleanup failed (then a reap by label finds the session).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import os
import posixpath
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from platoon.sandbox import (
    CAPABILITIES,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxGone,
    SandboxProvider,
    SandboxSpec,
    unenforced_field,
)
from platoon_sandbox.inside import KILL_ALL, LIST_OWN, OwnProcesses
from platoon_sandbox.output import CappedOutput
from platoon_sandbox.registry import Registration, class_path, merge_labels, registry
from platoon_sandbox.routes import ContainerForwarders

__all__ = ["EnrootProvider", "HpcProvider", "HpcSandbox", "SingularityProvider", "singularity_binary"]

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'platoon-sandbox[hpc]' (or `uv add 'platoon-sandbox[hpc]'`)"
#: The environment variable naming the Singularity/Apptainer binary when the options give none.
SINGULARITY_ENV = "PLATOON_SINGULARITY"
#: Provider options that are platoon's, not hpc-sandbox's: `allow_host_network` (public and allowlist sandboxes on
#: the host's network, unfiltered) and `egress_allow` (a site profile's, for providers that filter egress).
NETWORK_OPTIONS = ("allow_host_network", "egress_allow")
#: Seconds a helper script (process listing, kill, forwarder start) may take inside the sandbox.
SCRIPT_TIMEOUT_S = 120.0
#: hpc-sandbox's mark where it cut a stream's middle out (it keeps head and tail).
_HPC_TRUNCATED = re.compile(rb"\n\[hpc-sandbox: output truncated, (\d+) bytes omitted\]\n")


def singularity_binary(options: Mapping[str, Any] | None = None) -> str | None:
    """The Singularity/Apptainer binary to run: the `binary` option, else `$PLATOON_SINGULARITY`, else None
    (hpc-sandbox then looks for `singularity`, then `apptainer`, on PATH)."""
    return (options or {}).get("binary") or os.environ.get(SINGULARITY_ENV) or None


def _hpc() -> Any:
    """hpc-sandbox, imported on first use (it is an optional extra, and core stays light without it)."""
    return importlib.import_module("hpc_sandbox")


def _cap(data: str) -> str:
    """A stream as platoon keeps it: the first 8 MiB, then "[N bytes of output dropped]", N counting
    what hpc-sandbox had already cut out of the middle."""
    raw = data.encode("utf-8", errors="surrogateescape")
    omitted = 0
    if (mark := _HPC_TRUNCATED.search(raw)) is not None:
        omitted = int(mark.group(1))
        raw = raw[: mark.start()] + raw[mark.end() :]
    out = CappedOutput()
    out.add(raw)
    out.dropped += omitted
    if not out.dropped:
        return data
    return out.text()


class HpcSandbox(Sandbox):
    """One hpc-sandbox sandbox seen through platoon's contract; build it with the provider's `start`."""

    def __init__(self, provider: HpcProvider, inner: Any, spec: SandboxSpec, entry: Registration) -> None:
        self._provider = provider
        self._inner = inner
        self.name = str(getattr(inner, "id", "")) or "hpc-sandbox"
        self.spec = spec
        self._entry = entry
        self._own = OwnProcesses()
        self._snapshots: list[Any] = []
        self._stopped = False
        self._torn_down = False
        # TCP upstreams are their own route; Unix-socket ones get a forwarder only without network: a
        # host-network sandbox reaches the gateway on loopback. A `network: none` hpc sandbox has its own network
        # namespace, so its forwarders take the fixed ports 18080, 18081, ...
        self._routes = {k: v for k, v in spec.upstreams.items() if not v.startswith("unix://")}
        self._forwarders = ContainerForwarders.for_spec(spec, self._route_shell)

    @property
    def inner(self) -> Any:
        """The hpc-sandbox sandbox behind this one."""
        return self._inner

    @property
    def routes(self) -> Mapping[str, str]:
        return {**self._routes, **self._forwarders.routes}

    async def ensure_routes(self) -> None:
        """Restart a dead forwarder on its port (the runner calls this before every harness launch)."""
        self._check_live()
        await self._forwarders.ensure()

    def _check_live(self) -> None:
        if self._stopped:
            raise SandboxError(f"sandbox {self.name} has stopped")

    async def _inner_call(self, what: str, call: Any) -> Any:
        """Await an inner call; hpc-sandbox's own errors become platoon's `SandboxError` (the cause kept)."""
        try:
            return await call
        except _hpc().SandboxError as error:
            # hpc-sandbox's SandboxLostError: the instance died under us, as a killed container does
            lost = isinstance(error, getattr(_hpc(), "SandboxLostError", ()))
            raise (SandboxGone if lost else SandboxError)(
                f"{self._provider.name} sandbox {self.name}: {what}: {error}"
            ) from error

    async def _script(self, script: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> Any:
        return await self._inner_call(
            "a helper script failed",
            self._inner.exec(
                ["/bin/sh", "-c", script, "platoon", *args],
                timeout_s=SCRIPT_TIMEOUT_S,
                env=dict(env) if env else None,
                cwd="/",
            ),
        )

    async def _route_shell(
        self, script: str, args: Sequence[str], env: Mapping[str, str]
    ) -> tuple[int, str, str]:
        result = await self._script(script, args, env)
        return result.exit_code, result.stdout, result.stderr

    async def _record_own_processes(self) -> None:
        result = await self._script(LIST_OWN, [])
        if result.exit_code != 0:
            raise SandboxError(
                f"cannot list the processes of sandbox {self.name} (exit {result.exit_code}): "
                f"{result.stderr.strip()}"
            )
        self._own = OwnProcesses.parse(result.stdout)

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        """Run a command; a string runs under `bash -c`. `timeout_s=None` means hpc-sandbox's default timeout
        (the `default_timeout_s` option, 600 s): every hpc-sandbox command has one. On timeout the exit code is
        124."""
        self._check_live()
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("exec needs a command")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        result = await self._inner_call(
            "exec failed",
            self._inner.exec(argv, timeout_s=timeout_s, env=dict(env) if env else None, cwd=cwd, stdin=data),
        )
        return ExecResult(
            int(result.exit_code), _cap(result.stdout), _cap(result.stderr), timed_out=bool(result.timed_out)
        )

    async def upload(self, src: str | Path, dst: str) -> None:
        self._check_live()
        await self._inner_call("upload failed", self._inner.upload(src, posixpath.join("/", dst)))

    async def download(self, src: str, dst: str | Path) -> Any:
        """Copy `src` out (`FileNotFoundError` when missing); returns hpc-sandbox's `DownloadReport` of the
        symlinks it left out because they could lead outside the copy."""
        self._check_live()
        return await self._inner_call("download failed", self._inner.download(posixpath.join("/", src), dst))

    async def snapshot(self) -> Any:
        """hpc-sandbox's `SandboxSnapshot` (a directory on this node's scratch), deleted when this sandbox stops:
        restore from it while the sandbox lives."""
        self._check_live()
        snapshot = await self._inner_call("snapshot failed", self._inner.snapshot())
        self._snapshots.append(snapshot)
        return snapshot

    async def kill_processes(self) -> None:
        self._check_live()
        if (why := self._own.kill_refusal(self.name)) is not None:
            raise SandboxError(why)
        result = await self._script(KILL_ALL, [self._own.keep(*self._forwarders.keep)])
        if result.exit_code != 0:
            raise SandboxError(f"processes survived SIGKILL in sandbox {self.name}")

    async def stop(self) -> None:
        """Stop the sandbox, delete its snapshots, unregister it. A stop that hpc-sandbox could not finish raises
        and keeps the registration (a reap by label finds the session); calling stop again retries."""
        if self._torn_down:
            return
        self._stopped = True
        await self._inner_call("stop failed", self._inner.stop())
        delete = getattr(self._provider.inner, "delete_snapshot", None)
        for snapshot in self._snapshots:
            try:
                if delete is not None:
                    await delete(snapshot)
                else:  # an inner provider without it: the snapshot is a directory on scratch
                    await asyncio.to_thread(shutil.rmtree, snapshot.path, True)
            except Exception as error:  # a leftover snapshot is scratch space, not a running process
                log.warning("sandbox %s: could not delete snapshot %s: %s", self.name, snapshot, error)
        self._snapshots.clear()
        self._torn_down = True
        registry().unregister(self._entry)


class HpcProvider(SandboxProvider):
    """Starts `HpcSandbox`es through an hpc-sandbox provider. Subclasses name the inner class and the runtime."""

    name: ClassVar[str] = "hpc"
    #: The hpc-sandbox provider wrapped: an import string (resolved when a provider is constructed) or a class.
    inner_class: ClassVar[str | type] = ""
    isolates: ClassVar[bool] = True
    #: Without options (an instance has its own, from the inner provider's: `gpu`, `allow_network_none`).
    #: clean_env: hpc-sandbox 0.3 starts Singularity/Apptainer with `--cleanenv` (dropping the variables it passes
    #: despite it, `*_proxy` and `TERM`, and `SINGULARITYENV_*`) and enroot with only the variables it needs; a
    #: command gets the spec's and its own variables, written into it, and nothing of the host's.
    capabilities: frozenset[str] = frozenset(
        {"snapshot", "isolation", "routes", "host_loopback", "clean_env"}
    )

    def __init__(self, **options: Any) -> None:
        # What a supervisor re-creates this provider from to reap: the options as given, JSON-able.
        self.options: dict[str, Any] = dict(options)
        if (why := self.rootfs_layout_refusal(options)) is not None:
            raise SandboxError(why)
        try:
            self.inner = self._resolve_inner()(**self._inner_options(options))
        except ImportError as error:
            raise SandboxError(f"the {self.name} provider needs hpc-sandbox: {INSTALL_HINT}") from error
        self.capabilities = (
            (frozenset(self.inner.capabilities) & CAPABILITIES)
            | {"routes", "host_loopback", "clean_env"}
            | ({"limit_cpu_memory"} if options.get("cgroup_limits") else set())
        )

    @classmethod
    def _resolve_inner(cls) -> Any:
        target = cls.inner_class
        if not isinstance(target, str):
            return target
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)

    @classmethod
    def _inner_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments of the inner provider (subclasses translate aliases); platoon's own network options
        stay here."""
        return {k: v for k, v in options.items() if k not in NETWORK_OPTIONS}

    @classmethod
    def _missing_package(cls) -> str | None:
        try:
            cls._resolve_inner()
        except ImportError:
            return f"the {cls.name} provider needs hpc-sandbox, which is not installed: {INSTALL_HINT}"
        return None

    @classmethod
    def unavailable(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why this node cannot run the provider (hpc-sandbox missing, no runtime binary), or None."""
        return cls._missing_package()

    @classmethod
    def network_none_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        return None

    @classmethod
    def network_public_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """hpc-sandbox knows only the host's network and none: public (and allowlist) sandboxes are refused unless
        the provider options opt into the host's network, unfiltered, by name."""
        if (options or {}).get("allow_host_network") is True:
            return None
        return (
            f"the {cls.name} provider cannot filter a sandbox's egress (hpc-sandbox runs it on the host's network "
            "or on none): give the task network_mode no-network, or set the provider option allow_host_network: "
            "true to run public and allowlist sandboxes on the host's network, unfiltered"
        )

    @classmethod
    def network_allowlist_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        return cls.network_public_refusal(options)

    @classmethod
    def rootfs_layout_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        return None

    @classmethod
    def refusal(cls, spec: SandboxSpec, options: Mapping[str, Any] | None = None) -> str | None:
        """hpc-sandbox enforces CPU and memory with `cgroup_limits` (singularity); without it only memory, through
        its watchdog, so a spec naming `cpus` is refused. Processes, disk and users: never."""
        enforced = set(cls.capabilities)
        if (options or {}).get("cgroup_limits") or spec.cpus is None:
            enforced.add("limit_cpu_memory")
        return unenforced_field(spec, frozenset(enforced), cls.name)

    async def start(self, spec: SandboxSpec) -> HpcSandbox:
        return await self._start(spec, None)

    async def restore(self, snapshot: Any, spec: SandboxSpec) -> HpcSandbox:
        return await self._start(spec, snapshot)

    def _inner_spec(self, spec: SandboxSpec) -> Any:
        hpc = _hpc()
        mounts = [hpc.Mount(m.source, m.target, m.read_only) for m in spec.mounts]
        if spec.network == "none":  # each Unix socket's directory, for the forwarders
            mounts += [
                hpc.Mount(source, target, True)
                for source, target in ContainerForwarders.binds(spec.upstreams)
            ]
        return hpc.SandboxSpec(
            image=spec.image,
            workdir=spec.workdir,
            env=dict(spec.env),
            mounts=mounts,
            network=spec.network,
            cpus=spec.cpus,
            memory_mb=spec.memory_mb,
            labels=dict(spec.labels),
        )

    async def _start(self, spec: SandboxSpec, snapshot: Any) -> HpcSandbox:
        if spec.network == "none" and (why := self.network_none_refusal(self.options)) is not None:
            raise SandboxError(why)
        if (why := self.refusal(spec, self.options)) is not None:
            raise SandboxError(why)
        if spec.network in ("public", "allowlist"):
            if (why := self.network_public_refusal(self.options)) is not None:
                raise SandboxError(why)
            spec = replace(spec, network="host", allowed_hosts=())  # allow_host_network: the old behaviour
        spec = replace(spec, labels=merge_labels(spec.labels))
        inner_spec = self._inner_spec(spec)
        hpc = _hpc()
        entry = registry().register(class_path(self), self.options, spec.labels)  # before anything starts
        try:
            # hpc-sandbox's start is cancellation-safe: a start that fails or is cancelled stops what it made.
            if snapshot is None:
                inner = await self.inner.start(inner_spec)
            else:
                inner = await self.inner.restore(snapshot, inner_spec)
        except BaseException as error:
            if isinstance(error, hpc.SandboxError) and "cleanup failed" in str(error):
                # hpc-sandbox says it left the session behind: it stays registered, so a reap by label finds it.
                raise SandboxError(f"the {self.name} sandbox failed to start: {error}") from error
            registry().unregister(entry)
            if isinstance(error, hpc.SandboxError):
                raise SandboxError(f"the {self.name} sandbox failed to start: {error}") from error
            raise
        sandbox = HpcSandbox(self, inner, spec, entry)
        try:
            await sandbox._record_own_processes()
            await sandbox._forwarders.start(sandbox.upload)
        except BaseException:
            # Failed or cancelled after the inner start: stop it (which unregisters it); if even that fails it
            # stays registered, so a later reap by label finds it. The caller sees the original exception.
            with contextlib.suppress(Exception):
                await asyncio.shield(sandbox.stop())
            raise
        registry().attach(entry, sandbox)
        return sandbox

    async def reap(self, labels: Mapping[str, str]) -> int:
        """Stop this process's live sandboxes of this runtime carrying all `labels`, then let hpc-sandbox's reap
        remove the labelled sessions whose owner process is gone (never another live process's). An empty label
        set is refused. Returns how many sandboxes were stopped or removed."""
        if not labels:
            raise ValueError(
                "reaping with an empty label set is refused: it would reap every run's sandboxes"
            )
        wanted = dict(labels)
        count = 0
        for entry in registry().live:
            sandbox = entry.sandbox
            if (
                isinstance(sandbox, HpcSandbox)
                and sandbox._provider.name == self.name
                and wanted.items() <= sandbox.spec.labels.items()
            ):
                await sandbox.stop()
                count += 1
        reaper = getattr(self.inner, "reap", None)
        if reaper is None:
            return count
        report = await reaper(wanted)
        for error in getattr(report, "errors", ()):
            log.warning("%s reap: %s", self.name, error)
        return count + len(getattr(report, "removed", ()))


class SingularityProvider(HpcProvider):
    """Singularity CE / Apptainer instances through `hpc_sandbox.SingularityProvider(**options)`.

    Images: `docker://` refs or `.sif` files. `network: none` is refused unless `allow_network_none: true`.
    `rootfs_layout`: `copy` (default) or `fuse-overlay`. The binary: the `binary` option, else
    `$PLATOON_SINGULARITY`, else `singularity`, then `apptainer`, on PATH.
    """

    name: ClassVar[str] = "singularity"
    inner_class: ClassVar[str | type] = "hpc_sandbox:SingularityProvider"

    @classmethod
    def _inner_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        out = super()._inner_options(options)
        if not out.get("binary") and (binary := singularity_binary()):
            out["binary"] = binary
        return out

    @classmethod
    def unavailable(cls, options: Mapping[str, Any] | None = None) -> str | None:
        if (missing := cls._missing_package()) is not None:
            return missing
        binary = singularity_binary(options)
        if binary is not None:
            if shutil.which(binary) is None:
                return f"the singularity provider's binary {binary!r} is not an executable on this node"
            return None
        if shutil.which("singularity") is None and shutil.which("apptainer") is None:
            return (
                "the singularity provider needs `singularity` or `apptainer` on PATH (or the `binary` option, "
                f"or ${SINGULARITY_ENV}, naming one)"
            )
        return None

    @classmethod
    def network_none_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        if (options or {}).get("allow_network_none") is True:
            return None
        return (
            "the singularity provider refuses network: none sandboxes unless its provider_options set "
            "allow_network_none: true (only where the site lets users create network namespaces)"
        )

    @classmethod
    def rootfs_layout_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why the `rootfs_layout` option cannot be honoured here, or None (it is unset, or fine)."""
        options = options or {}
        layout = options.get("rootfs_layout")
        if layout is None:
            return None
        try:
            inner = cls._resolve_inner()
        except ImportError:
            return None  # `unavailable` names what to install
        if "rootfs_layout" not in inspect.signature(inner).parameters:
            version = getattr(_hpc(), "__version__", "?") if isinstance(cls.inner_class, str) else "?"
            return (
                f"rootfs_layout: {layout}: the installed hpc-sandbox ({version}) has no rootfs layouts; "
                "install hpc-sandbox 0.3 or newer, or drop rootfs_layout"
            )
        if layout not in ("copy", "fuse-overlay"):
            return f"rootfs_layout must be copy or fuse-overlay; got {layout!r}"
        if layout == "copy":
            return None
        conflicts = []
        if options.get("gpu"):
            conflicts.append("gpu")
        if options.get("cgroup_limits"):
            conflicts.append("cgroup_limits")
        if any(arg in ("--fakeroot", "-f") for arg in options.get("extra_start_args") or ()):
            conflicts.append("--fakeroot start args")
        if options.get("rootfs_templates") is False:
            conflicts.append("rootfs_templates: false")
        if conflicts:
            return (
                "rootfs_layout: fuse-overlay runs unprivileged instances over a shared template and cannot be "
                f"combined with {', '.join(conflicts)}; use rootfs_layout: copy"
            )
        missing = []
        if shutil.which("fuse-overlayfs") is None:
            missing.append("fuse-overlayfs")
        if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
            missing.append("fusermount3 (or fusermount)")
        if missing:
            return f"rootfs_layout: fuse-overlay needs {' and '.join(missing)} on PATH"
        return None


class EnrootProvider(HpcProvider):
    """enroot containers through `hpc_sandbox.EnrootProvider(**options)`.

    Images: `docker://` refs (digest pins too) or `.sqsh` files. `root` is an alias of `remap_root` (not both);
    `rootfs_layout` is dropped (enroot extracts every sandbox); `network: none` is allowed unless
    `allow_network_none: false`. The binary: the `binary` option, else `enroot` on PATH.
    """

    name: ClassVar[str] = "enroot"
    inner_class: ClassVar[str | type] = "hpc_sandbox:EnrootProvider"
    capabilities: frozenset[str] = frozenset(
        {"snapshot", "isolation", "network_none", "routes", "host_loopback", "clean_env"}
    )

    @classmethod
    def _inner_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        out = super()._inner_options(options)
        if "root" in out:
            if "remap_root" in out:
                raise SandboxError("the enroot provider takes root or remap_root (an alias of it), not both")
            out["remap_root"] = out.pop("root")
        # A site profile's rootfs_layout (a Singularity setting) must not fail enroot: it always extracts.
        out.pop("rootfs_layout", None)
        return out

    @classmethod
    def unavailable(cls, options: Mapping[str, Any] | None = None) -> str | None:
        if (missing := cls._missing_package()) is not None:
            return missing
        binary = (options or {}).get("binary")
        if binary:
            if shutil.which(binary) is None:
                return f"the enroot provider's binary {binary!r} is not an executable on this node"
            return None
        if shutil.which("enroot") is None:
            return "the enroot provider needs `enroot` on PATH (or the `binary` option naming it)"
        return None

    @classmethod
    def network_none_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        if (options or {}).get("allow_network_none") is False:
            return (
                "the enroot provider's provider_options turned network: none off (allow_network_none: false)"
            )
        return None
