"""Filtered egress for `public` and `allowlist` sandboxes, shared by the docker and process providers.

A sandbox with one of these policies has a network namespace of its own (a `--network none` container's, or one
bubblewrap made for a process sandbox). Two things are attached to it when it starts:

- user-mode networking: one `slirp4netns` per sandbox, on the host, relaying the namespace's `tap0` to ordinary host
  sockets (10.0.2.100 inside; DNS at 10.0.2.3; 10.0.2.2 is the host side). Its host-loopback switch stays off, so
  10.0.2.2 reaches nothing on the host unless the site allows a loopback port by name. It runs under a seccomp
  filter and lives exactly as long as a pipe that platoon holds: closing it (stop) or platoon dying ends it; every
  slirp4netns carries a marker naming its sandbox, so a reap finds a stray one.
- an nftables rule set loaded *inside* that namespace (a docker sandbox holds no CAP_NET_ADMIN, so it cannot change
  it): DNS goes to slirp's resolver; loopback, link-local (169.254.169.254 included), private, CGNAT, multicast and
  reserved IPv4 ranges, 10.0.2.2 and every address of the host itself are refused with a TCP reset or an ICMP error,
  so a refused connect fails at once; all IPv6 is refused (slirp4netns's IPv6 is off). `allowlist` accepts only the
  addresses its hosts resolve to, on the host, when the sandbox starts (a name is pinned to those addresses). A
  second table on `tap0`'s egress hook drops the same packets, so frames written on a raw socket cannot go around
  the first.

`egress_allow` (a provider option a site profile may set: `host` or `host:port` entries) names destinations the
filter lets through even when they are private or the host's own; the host's loopback only with a port, and then
inside the sandbox at 10.0.2.2:<port>.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from platoon.sandbox import SandboxError
from platoon_sandbox import netns, procs
from platoon_sandbox.netns import read_until_closed

__all__ = [
    "EGRESS_NETWORKS",
    "HOST_SIDE",
    "SANDBOX_DNS",
    "Destination",
    "EgressPlan",
    "Slirp",
    "allowed_host_problem",
    "attach",
    "host_addresses",
    "kill_strays",
    "missing_tools",
    "parse_destination",
    "parse_egress_allow",
    "plan",
    "process_unavailable",
    "ruleset",
    "start",
]

log = logging.getLogger(__name__)

#: The policies whose sandboxes get filtered egress through this module.
EGRESS_NETWORKS = ("public", "allowlist")
#: slirp4netns's addresses inside the sandbox: the host side (10.0.2.2) and its DNS resolver (10.0.2.3).
HOST_SIDE = "10.0.2.2"
SANDBOX_DNS = "10.0.2.3"
TAP = "tap0"
#: slirp4netns's largest MTU: fewer, larger frames through the user-mode stack.
MTU = 65520
#: Every slirp4netns platoon starts carries `PLATOON_EGRESS=<sandbox id>`, so a reap can find one left behind.
MARKER_ENV = "PLATOON_EGRESS"
#: slirp4netns is ready in milliseconds; this only bounds a wedged one.
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0

#: What `public` never reaches (besides the host's own addresses): IPv4 that is not the public internet's.
REFUSED_V4 = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",  # private (slirp's own 10.0.2.0/24 among them)
        "100.64.0.0/10",  # carrier-grade NAT
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local: cloud metadata services (169.254.169.254)
        "172.16.0.0/12",  # private
        "192.168.0.0/16",  # private
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the limited broadcast address
    )
)

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Destination:
    """An IPv4 address, and a port (None: every port)."""

    address: ipaddress.IPv4Address
    port: int | None = None

    def __str__(self) -> str:
        return f"{self.address}:{self.port}" if self.port is not None else str(self.address)


# -- parsing -----------------------------------------------------------------------------------------------------

_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?$"
)


def parse_destination(text: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `1.2.3.4[:port]`, `[v6]:port` or a bare IPv6 address -> (host, port). ValueError with a
    reason for anything else (a wildcard, a URL, a path, a port out of range)."""
    entry = text.strip() if isinstance(text, str) else text
    if not isinstance(entry, str) or not entry:
        raise ValueError("expected a host name or address, optionally with :port")
    if "*" in entry:
        raise ValueError(
            "a wildcard cannot be enforced: egress is filtered by address, so list each host name"
        )
    if "/" in entry or "://" in entry:
        raise ValueError("expected a host name or address (no scheme, path or prefix length)")
    host, port_text = entry, None
    if entry.startswith("["):
        close = entry.find("]")
        if close < 0:
            raise ValueError("an IPv6 address in brackets needs its closing ]")
        host, rest = entry[1:close], entry[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError("expected [address]:port")
            port_text = rest[1:]
    elif entry.count(":") == 1:
        host, port_text = entry.split(":")
    port = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"port {port_text!r} is not a number from 1 to 65535")
        port = int(port_text)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_NAME.match(host):
            raise ValueError(f"{host!r} is not a host name or an IP address") from None
    return host, port


def allowed_host_problem(text: Any) -> str | None:
    """Why an `allowed_hosts` entry cannot be enforced, or None."""
    try:
        parse_destination(text)
    except ValueError as exc:
        return str(exc)
    return None


def parse_egress_allow(value: Any) -> tuple[str, ...]:
    """The `egress_allow` provider option checked: a list of `host` / `host:port` strings. SandboxError names the
    bad entry. The host's loopback needs a port: it is opened one port at a time, never whole."""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise SandboxError(f"egress_allow must be a list of host or host:port entries; got {value!r}")
    entries = []
    for entry in value:
        try:
            host, port = parse_destination(entry)
        except ValueError as exc:
            raise SandboxError(f"egress_allow entry {entry!r}: {exc}") from None
        if port is None and _is_loopback_name(host):
            raise SandboxError(
                f"egress_allow entry {entry!r}: the host's loopback is opened one port at a time; write "
                f"{host}:PORT"
            )
        entries.append(str(entry).strip())
    return tuple(entries)


def _is_loopback_name(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- what the host is ----------------------------------------------------------------------------------------------


def host_addresses() -> list[ipaddress.IPv4Network]:
    """Every IPv4 address (and local prefix) of this host's network namespace, from /proc/net/fib_trie: the host's
    own interfaces, whatever their range, are refused to `public` sandboxes. Read afresh at each sandbox start."""
    found: set[ipaddress.IPv4Network] = set()
    try:
        with open("/proc/net/fib_trie") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    last = None
    for line in lines:
        text = line.strip()
        if text.startswith("|--"):
            last = text[3:].strip()
        elif last and text.startswith("/") and ("host LOCAL" in text or "BROADCAST" in text):
            prefix = text.split()[0]
            with contextlib.suppress(ValueError):
                found.add(ipaddress.IPv4Network(f"{last}{prefix}", strict=False))
    return sorted(found)


def _resolve(host: str) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses `host` resolves to here (a literal is itself). Blocking."""
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        return [literal] if isinstance(literal, ipaddress.IPv4Address) else []
    try:
        infos = socket.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise SandboxError(f"cannot resolve {host!r} on this host: {exc.strerror}") from None
    return sorted({ipaddress.IPv4Address(info[4][0]) for info in infos})


# -- the plan of one sandbox ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EgressPlan:
    """What one sandbox's egress is: the policy, the destinations accepted before the refusals (in the sandbox's
    terms: the host's 127.0.0.1 is 10.0.2.2 there), the refused IPv4 ranges, whether slirp4netns must reach the
    host's loopback, and the names an allowlist pinned (name -> addresses, for a container's /etc/hosts)."""

    mode: str
    accepted: tuple[Destination, ...] = ()
    refused: tuple[ipaddress.IPv4Network, ...] = REFUSED_V4
    host_loopback: bool = False
    pinned: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def _refused(address: ipaddress.IPv4Address, refused: Sequence[ipaddress.IPv4Network]) -> bool:
    return any(address in network for network in refused)


def _inside(destination: Destination) -> Destination:
    """A host-side destination as the sandbox addresses it: the host's loopback is slirp's 10.0.2.2, one port at a
    time."""
    if destination.address.is_loopback:
        if destination.address != ipaddress.IPv4Address("127.0.0.1"):
            raise SandboxError(
                f"{destination}: a sandbox reaches the host's loopback only at 127.0.0.1 (as {HOST_SIDE})"
            )
        if destination.port is None:
            raise SandboxError(
                f"{destination}: the host's loopback is opened one port at a time; name the port"
            )
        return Destination(ipaddress.IPv4Address(HOST_SIDE), destination.port)
    return destination


def plan(network: str, allowed_hosts: Sequence[str] = (), egress_allow: Sequence[str] = ()) -> EgressPlan:
    """Resolve a sandbox's policy into an `EgressPlan`, on the host, now (blocking: names are looked up).

    `public`: everything but the refused ranges and the host's addresses, plus the `egress_allow` destinations.
    `allowlist`: only the addresses of `allowed_hosts` (those in a refused range only where `egress_allow` names
    them too). A name that does not resolve is a SandboxError: the sandbox could not reach what its task needs."""
    if network not in EGRESS_NETWORKS:
        raise ValueError(f"egress plans are for {' and '.join(EGRESS_NETWORKS)} sandboxes; got {network!r}")
    refused = tuple(ipaddress.collapse_addresses([*REFUSED_V4, *host_addresses()]))
    exceptions: list[Destination] = []
    for entry in parse_egress_allow(list(egress_allow)):
        host, port = parse_destination(entry)
        exceptions += [Destination(a, port) for a in _resolve(host)]
    if network == "public":
        accepted = [_inside(d) for d in exceptions if _refused(d.address, refused)]
        return EgressPlan(
            "public",
            tuple(dict.fromkeys(accepted)),
            refused,
            any(d.address.is_loopback for d in exceptions),
        )
    accepted, pinned = [], {}
    for entry in allowed_hosts:
        try:
            host, port = parse_destination(entry)
        except ValueError as exc:
            raise SandboxError(f"allowed host {entry!r}: {exc}") from None
        addresses = _resolve(host)
        if not addresses:
            raise SandboxError(f"allowed host {entry!r} has no IPv4 address (sandboxes have no IPv6)")
        kept = []
        for address in addresses:
            if not _refused(address, refused):
                kept.append(Destination(address, port))
                continue
            # a private or host address: only as far as the site's egress_allow opens it
            for allowed in (e for e in exceptions if e.address == address):
                if port is None or allowed.port is None or port == allowed.port:
                    kept.append(_inside(Destination(address, port if port is not None else allowed.port)))
        accepted += kept
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if kept:
                pinned[host] = tuple(dict.fromkeys(str(d.address) for d in kept))
    loopback = any(d.address == ipaddress.IPv4Address(HOST_SIDE) for d in accepted)
    return EgressPlan("allowlist", tuple(dict.fromkeys(accepted)), refused, loopback, pinned)


# -- the rule set ------------------------------------------------------------------------------------------------


def _accept_rules(destinations: Sequence[Destination]) -> list[str]:
    rules = [f"ip daddr {SANDBOX_DNS} meta l4proto {{ tcp, udp }} th dport 53 accept"]
    for d in destinations:
        if d.port is None:
            rules.append(f"ip daddr {d.address} accept")
        else:
            rules.append(f"ip daddr {d.address} meta l4proto {{ tcp, udp }} th dport {d.port} accept")
    return rules


def ruleset(egress: EgressPlan, *, raw_guard: bool = True) -> str:
    """The nftables script loaded into the sandbox's namespace (see the module docstring). `raw_guard`: the table on
    `tap0`'s egress hook that catches raw frames (kernels before 5.16 lack the hook)."""
    refused = ", ".join(str(n) for n in egress.refused)
    accept = _accept_rules(egress.accepted)
    refuse_v4 = (
        f"ip daddr {{ {refused} }} jump refuse"
        if egress.mode == "public"
        else "meta nfproto ipv4 jump refuse"
    )
    drop_v4 = f"ip daddr {{ {refused} }} drop" if egress.mode == "public" else "meta protocol ip drop"
    lines = [
        "table inet platoon_egress {",
        "  chain output {",
        "    type filter hook output priority filter; policy accept;",
        '    oifname "lo" accept',
        "    meta nfproto ipv6 jump refuse",
        *(f"    {rule}" for rule in accept),
        f"    {refuse_v4}",
        "  }",
        "  chain refuse {",
        "    meta l4proto tcp reject with tcp reset",
        "    reject with icmpx type admin-prohibited",
        "  }",
        "}",
        # whatever resolver the sandbox's resolv.conf names (the host's, for a process sandbox), DNS goes to slirp's
        "table ip platoon_dns {",
        "  chain output {",
        "    type nat hook output priority -100; policy accept;",
        f'    oifname != "lo" meta l4proto {{ tcp, udp }} th dport 53 dnat to {SANDBOX_DNS}',
        "  }",
        "}",
    ]
    if raw_guard:
        lines += [
            "table netdev platoon_raw {",
            "  chain egress {",
            f'    type filter hook egress device "{TAP}" priority filter; policy accept;',
            "    meta protocol ip6 drop",
            *(f"    meta protocol ip {rule}" for rule in accept),
            f"    {drop_v4}",
            "  }",
            "}",
        ]
    return "\n".join(lines) + "\n"


# -- slirp4netns -------------------------------------------------------------------------------------------------


def missing_tools() -> str | None:
    """Why this host cannot give a namespace filtered egress (a tool missing, or not root), or None."""
    missing = [tool for tool in ("slirp4netns", "nft", "nsenter") if shutil.which(tool) is None]
    if missing:
        packages = {"slirp4netns": "slirp4netns", "nft": "nftables", "nsenter": "util-linux"}
        return (
            f"{', '.join(missing)} not on PATH (apt-get install "
            f"{' '.join(dict.fromkeys(packages[m] for m in missing))})"
        )
    if os.geteuid() != 0:
        return "loading a sandbox's egress rules into its network namespace needs root"
    return None


class Slirp:
    """One running slirp4netns attached to a sandbox's namespace. `stop()` ends it (idempotent, blocking)."""

    def __init__(self, proc: subprocess.Popen[bytes], exit_fd: int, marker: str) -> None:
        self.proc = proc
        self.marker = marker
        self._exit_fd = exit_fd
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """Close the exit pipe (slirp4netns ends itself), then kill it if it lingers."""
        with self._lock:
            if self._exit_fd >= 0:
                os.close(self._exit_fd)
                self._exit_fd = -1
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_raw_guard_warned = False


def attach(
    egress: EgressPlan,
    *,
    marker: str,
    pid: int | None = None,
    netns_path: str | None = None,
    userns_path: str | None = None,
    enter: Sequence[str] = (),
) -> Slirp:
    """Give a namespace filtered egress: start slirp4netns on it (by a process in it, `pid`, or by `netns_path`),
    wait until it is ready, and load the rule set through `enter` (an argv prefix that runs a command in the
    namespace, e.g. `nsenter -t PID -n --`). Blocking (run it in a thread). On any failure nothing is left running
    and SandboxError says what failed."""
    if (why := missing_tools()) is not None:
        raise SandboxError(f"filtered egress is unavailable here: {why}")
    if (pid is None) == (netns_path is None):
        raise ValueError("attach needs exactly one of pid and netns_path")
    slirp = _start_slirp(egress, marker, pid, netns_path, userns_path)
    try:
        _load_rules(egress, enter)
    except BaseException:
        slirp.stop()
        raise
    return slirp


def _start_slirp(
    egress: EgressPlan, marker: str, pid: int | None, netns_path: str | None, userns_path: str | None
) -> Slirp:
    binary = shutil.which("slirp4netns") or "slirp4netns"
    ready_read, ready_write = os.pipe()
    exit_read, exit_write = os.pipe()  # our end (exit_write) is not inherited by other children (PEP 446)
    argv = [
        binary,
        "--configure",
        f"--mtu={MTU}",
        f"--ready-fd={ready_write}",
        f"--exit-fd={exit_read}",
        # A syscall filter (no exec, ptrace, mount, setns...): it parses packets a hostile sandbox writes. Not
        # --enable-sandbox: measured with Docker 20.10, its mount-namespace setup took a running container's root
        # filesystem mount away from the host (docker cp then failed), even after slirp4netns exited.
        "--enable-seccomp",
    ]
    if not egress.host_loopback:
        argv.append("--disable-host-loopback")
    if netns_path is not None:
        argv += ["--netns-type=path"]
        if userns_path is not None:
            argv += [f"--userns-path={userns_path}"]
        argv += [netns_path, TAP]
    else:
        argv += [str(pid), TAP]
    # slirp4netns's output goes to a file of its own (a pipe nobody drains could stall it); read on failure only
    with tempfile.TemporaryFile() as log_file:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                pass_fds=(ready_write, exit_read),
                env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), MARKER_ENV: marker},
                start_new_session=True,  # no signal meant for our terminal's group reaches it
            )
        except OSError as exc:
            for fd in (ready_read, ready_write, exit_read, exit_write):
                os.close(fd)
            raise SandboxError(f"cannot run slirp4netns: {exc.strerror}") from exc
        os.close(ready_write)
        os.close(exit_read)
        slirp = Slirp(proc, exit_write, marker)
        try:
            ready = read_until_closed(ready_read, READY_TIMEOUT_S, end=b"1")
            if ready != b"1":
                slirp.stop()
                log_file.seek(0)
                said = [
                    line.strip()
                    for line in log_file.read().decode(errors="replace").splitlines()
                    if line.strip() and "experimental" not in line
                ]
                why = said[-1] if said else f"exit {proc.returncode}"
                raise SandboxError(f"slirp4netns did not start for the sandbox's network: {why}")
        except BaseException:
            slirp.stop()
            raise
        finally:
            os.close(ready_read)
    return slirp


def _load_rules(egress: EgressPlan, enter: Sequence[str]) -> None:
    global _raw_guard_warned
    nft = shutil.which("nft") or "nft"
    said = _nft(enter, nft, ruleset(egress))
    if said is None:
        return
    # A kernel without the netdev egress hook (before 5.16) refuses the raw-frame guard: keep the rest, say so once.
    if _nft(enter, nft, ruleset(egress, raw_guard=False)) is not None:
        raise SandboxError(f"the sandbox's egress rules did not load (nft: {said})")
    if not _raw_guard_warned:
        _raw_guard_warned = True
        log.warning(
            "this kernel has no nftables egress hook (%s): sandboxes holding CAP_NET_RAW could send raw frames past "
            "their egress filter",
            said,
        )


def _nft(enter: Sequence[str], nft: str, script: str) -> str | None:
    try:
        done = subprocess.run(
            [*enter, nft, "-f", "-"],
            input=script.encode(),
            capture_output=True,
            timeout=READY_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.decode(errors="replace").splitlines() if line.strip()]
    return lines[0].strip() if lines else f"exit {done.returncode}"


def kill_strays(markers: Sequence[str]) -> int:
    """SIGKILL every slirp4netns that carries one of these sandbox markers (a reap, or a stop whose process lost
    its handle) and wait until they are gone. Returns how many were found."""
    if not markers:
        return 0
    wanted = [f"{MARKER_ENV}={m}".encode() for m in markers]
    handles = []
    for pid in procs.pids_with_marker(wanted):
        try:
            handle = os.pidfd_open(pid)
        except OSError:  # gone already
            continue
        # the pid is pinned now: check it is still the marked process before the signal
        if pid in procs.pids_with_marker(wanted):
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(handle, signal.SIGKILL)
            handles.append(handle)
        else:
            os.close(handle)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    try:
        for handle in handles:  # a pidfd turns readable once its process has exited
            select.select([handle], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        for handle in handles:
            os.close(handle)
    return len(handles)


# -- whether a process sandbox can have it -------------------------------------------------------------------------

_process_probe: dict[tuple[str | None, ...], str | None] = {}
_process_probe_lock = threading.Lock()


def process_unavailable() -> str | None:
    """Why `public`/`allowlist` process sandboxes cannot get filtered egress here, or None. Probed once per process
    (and per tool set): a namespace made by bubblewrap, slirp4netns attached, the rule set loaded. Blocking."""
    key = (
        netns.bwrap_binary(),
        os.environ.get(netns.BWRAP_ENV),
        shutil.which("slirp4netns"),
        shutil.which("nft"),
    )
    with _process_probe_lock:
        if key not in _process_probe:
            _process_probe[key] = _probe_process(netns)
        return _process_probe[key]


def _probe_process(netns: Any) -> str | None:
    if (why := missing_tools()) is not None:
        return why
    if (why := netns.unavailable()) is not None:
        return why
    try:
        namespace = netns.NetNamespace.create()
    except netns.NamespaceError as exc:
        return str(exc)
    try:
        net_path, user_path = namespace.paths()
        attach(
            EgressPlan("public"),
            marker=f"probe-{os.getpid()}",
            netns_path=net_path,
            userns_path=user_path,
            enter=namespace.prefix(),
        ).stop()
    except SandboxError as exc:
        return str(exc)
    finally:
        namespace.close()
    return None


async def start(egress: EgressPlan, **where: Any) -> Slirp:
    """`attach` from async code, in a thread. Cancelled meanwhile, it waits for the thread and stops what it started,
    so a cancelled sandbox start leaves no slirp4netns."""
    job = asyncio.ensure_future(asyncio.to_thread(attach, egress, **where))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            slirp = await job
            await asyncio.to_thread(slirp.stop)
        raise
