"""The sandbox contract: what a task sandbox is asked for, and what it answers.

A *provider* (`process`, `docker`, `singularity`, `enroot` from platoon-sandbox, or a user's `module:Class`) subclasses
`SandboxProvider` and starts `Sandbox`es from a `SandboxSpec`; what a provider may leave out has a default here.
Standard library only, so that a provider, core and a plugin can all import it cheaply.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

__all__ = [
    "CAPABILITIES",
    "NETWORKS",
    "OUTPUT_CAP_BYTES",
    "SPEC_FIELD_CAPABILITIES",
    "ExecResult",
    "Mount",
    "Sandbox",
    "SandboxDiskLimit",
    "SandboxError",
    "SandboxGone",
    "SandboxProvider",
    "SandboxSpec",
    "as_provider_class",
    "unenforced_field",
]

#: The capabilities a provider may declare. Besides the features (snapshot, gpu, routes, host_loopback), each
#: names a guarantee that the provider enforces for every sandbox it starts:
#: `network_none` (loopback and the routes only), `network_public` (a namespace of its own whose egress cannot
#: reach the host's loopback, link-local, private or own addresses), `network_allowlist` (the same, reaching only
#: `allowed_hosts`), `isolation` (the host's files and processes out of reach), `clean_env` (commands start with an
#: allowlisted environment, never the host's), `limit_cpu_memory`, `limit_pids`, `limit_disk` (`storage_mb`),
#: `run_as_user` (`user`), `least_privilege` (no capabilities beyond a documented minimum, no new privileges),
#: `lifetime` (no command can end its own sandbox: a dead sandbox is the untrainable `sandbox_gone`, which an agent
#: must not be able to trade a failing episode for).
CAPABILITIES = frozenset(
    (
        "snapshot",
        "gpu",
        "routes",
        "host_loopback",
        "isolation",
        "network_none",
        "network_public",
        "network_allowlist",
        "clean_env",
        "limit_cpu_memory",
        "limit_pids",
        "limit_disk",
        "run_as_user",
        "least_privilege",
        "lifetime",
    )
)

#: Each captured stream of a command keeps at most this many bytes; the rest is counted and dropped.
OUTPUT_CAP_BYTES = 8 * 1024 * 1024

#: `none`: loopback and the routes only. `public`: a network namespace of the sandbox's own with filtered egress.
#: `allowlist`: the same, reaching only `allowed_hosts`. `host`: the host's own network
#: namespace, for a caller that asks for it by name (no Harbor policy does).
Network = Literal["host", "none", "public", "allowlist"]
NETWORKS: tuple[str, ...] = ("host", "none", "public", "allowlist")


class SandboxError(RuntimeError):
    """A sandbox that cannot start, or that failed under a command (not the command's own failure)."""


class SandboxGone(SandboxError):
    """The sandbox stopped under its user: killed from outside (an OOM killer, a node's cleanup) or its main process
    exited. `failure_kind` names the untrainable outcome a rollout that meets it ends with."""

    failure_kind = "sandbox_gone"


class SandboxDiskLimit(SandboxGone):
    """The sandbox wrote more than its `storage_mb` and was ended for it (a watchdog saw its writable layer pass the
    limit): the rollout ends as the untrainable `sandbox_disk_limit`."""

    failure_kind = "sandbox_disk_limit"


@dataclass(frozen=True)
class Mount:
    """A host path made visible inside the sandbox at `target` (read-only unless said otherwise)."""

    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox is started from.

    `image`: `docker://repo:tag`, a `.sif`/`.sqsh` path, or `local` (the process provider). `network`: see
    `Network`; in every mode but `host`, Unix-socket `upstreams` reach their services through a forwarder.
    `allowed_hosts`: the destinations of an `allowlist` sandbox (host names or addresses).
    `upstreams`: name -> `unix:///abs/dir/x.sock` or `http(s)://host:port`; each gets a route usable inside.
    `labels`: merged with the process's labels (the run and worker labels) before the sandbox is registered.
    Limits (None: the provider's default): `cpus`, `memory_mb`, `pids_limit` (processes at once), `storage_mb`
    (megabytes the sandbox may write); `user`: the user commands run as (a name or `uid[:gid]`; None: the image's).
    A provider enforces what its `capabilities` say and refuses, at start, a field it cannot honour
    (`SPEC_FIELD_CAPABILITIES`). A provider with `run_as_user` also takes `exec(..., user=...)`, one command as
    another user (root for a caller's own setup); its own operations (uploads, downloads, kills) run as root.
    """

    image: str = "local"
    workdir: str = "/app"
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[Mount] = ()
    network: Network = "host"
    allowed_hosts: Sequence[str] = ()
    cpus: float | None = None
    memory_mb: int | None = None
    pids_limit: int | None = None
    storage_mb: int | None = None
    user: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    upstreams: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.network not in NETWORKS:
            raise ValueError(
                f"SandboxSpec.network must be one of {', '.join(NETWORKS)}; got {self.network!r}"
            )
        if self.allowed_hosts and self.network != "allowlist":
            raise ValueError("SandboxSpec.allowed_hosts is for network: allowlist only")
        for name, value in (("pids_limit", self.pids_limit), ("storage_mb", self.storage_mb)):
            if value is not None and value <= 0:
                raise ValueError(f"SandboxSpec.{name} must be a positive integer; got {value!r}")
        if not self.workdir.startswith("/"):
            raise ValueError(f"SandboxSpec.workdir must be an absolute path; got {self.workdir!r}")
        for mount in self.mounts:
            if not mount.target.startswith("/"):
                raise ValueError(f"a mount target must be an absolute path; got {mount.target!r}")
        for name, url in self.upstreams.items():
            if not url.startswith(("unix:///", "http://", "https://")):
                raise ValueError(
                    f"upstream {name!r} must be unix:///abs/path.sock or http(s)://host:port; got {url!r}"
                )
            if self.network == "none" and not url.startswith("unix://"):
                raise ValueError(
                    f"upstream {name!r} is TCP ({url}): a network: none sandbox reaches only Unix-socket upstreams"
                )
            if self.network in ("public", "allowlist") and _on_loopback(url):
                raise ValueError(
                    f"upstream {name!r} is on the host's loopback ({url}): a network: {self.network} sandbox cannot "
                    "reach it; serve it on a Unix socket (it then gets a route)"
                )


#: The spec fields a provider must enforce to accept a spec that sets them, and the capability that says it does.
SPEC_FIELD_CAPABILITIES: dict[str, str] = {
    "cpus": "limit_cpu_memory",
    "memory_mb": "limit_cpu_memory",
    "pids_limit": "limit_pids",
    "storage_mb": "limit_disk",
    "user": "run_as_user",
}


def unenforced_field(spec: SandboxSpec, capabilities: frozenset[str], provider: str) -> str | None:
    """One line naming the first field `spec` sets that a provider with `capabilities` does not enforce, or None:
    what a provider's `refusal(spec, options)` answers by default."""
    for name, capability in SPEC_FIELD_CAPABILITIES.items():
        value = getattr(spec, name)
        if value is not None and capability not in capabilities:
            return (
                f"provider {provider} does not enforce {name} = {value!r} (it lacks the {capability} "
                "capability): choose a provider that does, e.g. docker"
            )
    return None


@dataclass(frozen=True)
class ExecResult:
    """A finished command: its exit code, its captured output, and whether it was killed at its timeout.

    The exit code after a timeout is the provider's (a killed process's code, usually 137 or -9).
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Sandbox(abc.ABC):
    """One started sandbox. `stop()` is idempotent; every other method needs a sandbox that has not stopped.

    A provider implements `exec`, `upload`, `download`, `kill_processes` and `stop`; `routes`, `ensure_routes` and
    `snapshot` have defaults for a sandbox without routes or snapshots.
    """

    @property
    def routes(self) -> Mapping[str, str]:
        """Upstream name -> a URL usable inside the sandbox. Default: none."""
        return {}

    async def ensure_routes(self) -> None:
        """Restart the forwarders of routes that died (called before every harness launch). Default: nothing to
        restart."""
        return None

    @abc.abstractmethod
    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        """Run a command (a string runs under `bash -c`; a list is argv); at `timeout_s` it is killed, with every
        process it started, and `timed_out` is set."""

    @abc.abstractmethod
    async def upload(self, src: str | Path, dst: str) -> None:
        """Copy a host file to `dst`, or a host directory's *contents* into `dst`."""

    @abc.abstractmethod
    async def download(self, src: str, dst: str | Path) -> Any:
        """Copy `src` out to the host (`FileNotFoundError` when missing); may return a report of dropped
        symlinks."""

    async def snapshot(self) -> Any:
        """The sandbox's filesystem, to `restore` later (providers with the `snapshot` capability). Default: refused
        with `SandboxError`."""
        raise SandboxError(
            f"{type(self).__name__} cannot snapshot (its provider lacks the snapshot capability)"
        )

    @abc.abstractmethod
    async def kill_processes(self) -> None:
        """SIGKILL every process commands started and keep the sandbox; raise if one survives, or if the sandbox's
        own processes cannot be told apart from them."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop the sandbox and remove what it holds; a second call does nothing."""


class SandboxProvider(abc.ABC):
    """Starts sandboxes. A provider is constructed with its `provider_options` as keyword arguments.

    It declares `name` and implements `start`; everything else has a default. `capabilities` (default none) are
    what it enforces (`CAPABILITIES`); `isolates` (default False) says whether a sandbox is isolated from the host (a
    site profile may choose only isolating providers). The class methods answer before any start, from the options
    alone, why a run could not use the provider (None: it can); `reap` and `labelled` serve a supervisor and
    `platoon sandbox` after the process that started the sandboxes is gone.
    """

    name: ClassVar[str]
    # not a ClassVar: a provider may learn its capabilities from its options (hpc-sandbox's do)
    capabilities: frozenset[str] = frozenset()
    isolates: ClassVar[bool] = False

    @abc.abstractmethod
    async def start(self, spec: SandboxSpec) -> Sandbox:
        """A started sandbox (registered under its labels before it starts; a failed start leaks nothing)."""

    async def restore(self, snapshot: Any, spec: SandboxSpec) -> Sandbox:
        """A sandbox started from a snapshot of another. Default: refused with `SandboxError` (a provider without
        the `snapshot` capability)."""
        raise SandboxError(
            f"provider {self.name} cannot restore a snapshot (it lacks the snapshot capability)"
        )

    @classmethod
    def unavailable(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why this node cannot run the provider with `options` (a missing binary or package), or None. Default:
        None."""
        return None

    @classmethod
    def refusal(cls, spec: SandboxSpec, options: Mapping[str, Any] | None = None) -> str | None:
        """Why `start(spec)` would be refused, so that a caller can refuse a task before any start, or None.
        Default: the first field `spec` sets that `capabilities` do not enforce (`unenforced_field`)."""
        return unenforced_field(spec, cls.capabilities, cls.name)

    @classmethod
    def network_none_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why `network: none` sandboxes cannot start with `options`, or None. Default: None."""
        return None

    @classmethod
    def network_public_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why `network: public` sandboxes cannot start with `options`, or None. Default: None."""
        return None

    @classmethod
    def network_allowlist_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why `network: allowlist` sandboxes cannot start with `options`, or None. Default: None."""
        return None

    @classmethod
    def network_refusal(cls, network: str, options: Mapping[str, Any] | None = None) -> str | None:
        """The `network_<network>_refusal` answer for one policy (None for `host`, which no provider refuses here)."""
        ask: dict[str, Callable[[Mapping[str, Any] | None], str | None]] = {
            "none": cls.network_none_refusal,
            "public": cls.network_public_refusal,
            "allowlist": cls.network_allowlist_refusal,
        }
        return ask[network](options) if network in ask else None

    @classmethod
    def rootfs_layout_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why the provider's sandbox root filesystem layout cannot work with `options`, or None. Default: None."""
        return None

    @classmethod
    def unconfined_refusal(cls, options: Mapping[str, Any] | None = None) -> str | None:
        """Why commands would run unconfined on this host with `options`, or None (a caller refuses
        to run tasks while this answers). Default: None."""
        return None

    async def reap(self, labels: Mapping[str, str]) -> int:
        """Stop and remove the sandboxes carrying all `labels` that no live process of another run holds; refuse an
        empty label set. Returns how many went. Default: 0 (a provider whose sandboxes never outlive their
        process)."""
        return 0

    async def labelled(self, labels: Mapping[str, str]) -> list[dict[str, Any]] | None:
        """The sandboxes carrying all `labels`, one dict each with `id`, `owner_pid`, `state` and `path` (for
        `platoon sandbox list`). Default: None, the provider cannot list its sandboxes."""
        return None


@functools.cache
def as_provider_class(cls: type) -> type[SandboxProvider]:
    """A provider class with the contract's defaults: `cls` itself when it subclasses `SandboxProvider`; else (a
    provider written to platoon 0.1's structural contract) a subclass of `cls` and `SandboxProvider` under `cls`'s
    own name and module, so that a supervisor re-imports `cls` to reap. One class per `cls`."""
    if issubclass(cls, SandboxProvider):
        return cls
    adapted = type(cls.__name__, (cls, SandboxProvider), {"__module__": cls.__module__})
    adapted.__qualname__ = cls.__qualname__
    return adapted


def _on_loopback(url: str) -> bool:
    """Whether an http(s) URL names the host's loopback (or every address, 0.0.0.0)."""
    import ipaddress
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified
