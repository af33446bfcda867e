"""Bubblewrap around a process sandbox's commands: what they may see of the host, and what not.

Each sandbox has a *holder*: a bwrap started with the sandbox, before any command of the agent's, that makes the
sandbox's namespaces (PID, mount, IPC, UTS) and mounts its filesystem once; its init (`HOLD`, which no command can
signal) lives as long as the sandbox and dies with platoon (`--die-with-parent`), taking every process of the
sandbox with it. Every command enters the holder's namespaces with `nsenter` and drops every capability, with no
new privileges (`setpriv`): so a sandbox's commands see one another (a server one command starts is there for the
next, as in a container) and none of the host's processes (`/proc` is the namespace's, a command's parent is
outside it, and no host process's `/proc/<pid>/environ` is in reach). The mounts are never made again while the agent's files are there: a symlink a
command plants cannot steer them onto the host's files.

The filesystem a command sees: the sandbox's `fs/` as `/`, so `/app`, `/tests`, `/logs`, `/solution`, `/tmp` and
`/run` are its own directories (a command may delete its workdir, as in a container), with the host's other
top-level entries bound over it read-only (sockets and fifos left out), the mounts at their targets (read-only as
asked), its own `/var/tmp` and `/dev/shm`, a fresh `/proc` and a minimal `/dev`. The Docker socket is out of reach:
`/tmp` and `/run` are the sandbox's, and the socket `DOCKER_HOST` names (or Docker Desktop's in the home directory)
is masked wherever else it lies. Not hidden: the host's files, readable as far as the user running platoon may read
them. The network is netns.py's business: the holder and every command run in the sandbox's network namespace
through its `nsenter` prefix, and bwrap leaves the network alone.

Files go in and out as tar streams through a command in the sandbox, so a path resolves as the agent's own commands
would resolve it: a symlink the agent left leads to the sandbox's files or to the read-only host, never to a place
platoon would write. Whether all this works here is probed once per process and bwrap binary (`PLATOON_BWRAP`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import posixpath
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

from platoon.sandbox import SandboxError, SandboxGone
from platoon_sandbox import procs
from platoon_sandbox.netns import BWRAP_ENV, bwrap_binary, read_until_closed

__all__ = ["CONFINE_MODES", "Bind", "Confinement", "root_layout", "unavailable"]

#: `provider_options.confine` of the process provider: `bwrap` (the default where it works) or `none`.
CONFINE_MODES = ("bwrap", "none")
#: bubblewrap answers within milliseconds; this only bounds a wedged one.
START_TIMEOUT_S = 30.0
#: How long the processes of a killed sandbox may take to be gone (they die as the kernel tears it down).
TEARDOWN_S = 10.0
#: Stop-then-kill passes over the processes of the sandbox's commands (`kill_commands`).
KILL_PASSES = 50
#: The holder's command, the PID namespace's init (`--as-pid-1`): says it runs (so every mount is in place), then
#: waits for its stdin to close. The kernel delivers no signal to a namespace's init from inside it unless the init
#: handles it, never SIGKILL or SIGSTOP, and this shell ignores the rest: no command can end its own sandbox (which
#: would make its episode the untrainable `sandbox_gone`). bash, where the host has it, reaps orphaned processes
#: while it reads; a plain sh leaves them as zombies until the sandbox stops.
HOLD = 'trap "" HUP INT QUIT TERM USR1 USR2 PIPE ALRM; echo ready; while read -r _; do :; done'
#: Mounted fresh rather than taken from the host.
_FRESH = ("/proc", "/dev")
#: Sockets that reach a Docker engine besides the one `DOCKER_HOST` names (those under /run and /tmp are private).
_HOME_DOCKER_SOCKETS = (".docker/run/docker.sock", ".docker/desktop/docker.sock")
#: The holder: the namespaces every command joins, no capabilities, and SIGKILL when platoon goes.
_HOLDER_FLAGS = (
    "--unshare-pid",
    "--as-pid-1",
    "--unshare-ipc",
    "--unshare-uts",
    "--new-session",
    "--die-with-parent",
    "--cap-drop",
    "ALL",
)
#: What a command joins, in nsenter's words (and the user namespace that owns them, when not root).
_NAMESPACES = (("mnt", "mount"), ("pid", "pid"), ("ipc", "ipc"), ("uts", "uts"))
#: ioctl(2) on a namespace's descriptor: a descriptor of the user namespace that owns it (Linux 4.9).
NS_GET_USERNS = 0xB701
#: Every command, once in: no capabilities at all, no new privileges, and SIGKILL when nsenter goes.
_DROP = (
    "--no-new-privs",
    "--bounding-set=-all",
    "--inh-caps=-all",
    "--ambient-caps=-all",
    "--pdeathsig=KILL",
)
# Enters the working directory inside (never a directory of the host's, which `..` could climb out of) and runs the
# command, so that a missing program is exit 127 and one that cannot run 126, as without bwrap.
_ENTER = 'cd -- "$1" || exit 126; shift; exec "$@"'
# Unpacks a tar stream into the sandbox: a directory's contents into the destination, or one file (or link) named
# $3 to the destination, or into it when it is a directory.
_UNPACK = r"""
dst=$1 kind=$2 name=$3
if [ "$kind" = dir ]; then mkdir -p -- "$dst" && exec tar -x -f - -C "$dst" --no-same-owner; fi
mkdir -p -- "$(dirname -- "$dst")" || exit 1
if [ -d "$dst" ] && [ ! -L "$dst" ]; then exec tar -x -f - -C "$dst" --no-same-owner; fi
tmp=$(mktemp -d "$(dirname -- "$dst")/.platoon-upload.XXXXXX") || exit 1
tar -x -f - -C "$tmp" --no-same-owner && mv -f -- "$tmp/$name" "$dst"
rc=$?
rm -rf -- "$tmp"
exit $rc
"""
# Packs a sandbox path (itself, a link as a link) into a tar stream; exit 3 when there is nothing there.
_PACK = r"""
src=$1
if [ ! -e "$src" ] && [ ! -L "$src" ]; then exit 3; fi
cd -- "$(dirname -- "$src")" && exec tar -c -f - -- "$(basename -- "$src")"
"""


@dataclass(frozen=True)
class Bind:
    """A host path (`source`) at a sandbox path (`target`), writable or read-only."""

    source: str
    target: str
    writable: bool = True


def _depth(path: str) -> int:
    return 0 if path == "/" else path.rstrip("/").count("/")


def _ancestors(path: str) -> list[str]:
    """`/a/b/c` -> `/`, `/a`, `/a/b` (outermost first)."""
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(len(parts))]


def _synthetic_dirs(targets: set[str], own: set[str]) -> set[str]:
    """The directories that must be the sandbox's own (its directory, holding the host's entries read-only beside
    new mount points) because a target below them does not exist on the host and the read-only host cannot grow
    it. The root always is one; so is every directory of `own` (top-level names that are the sandbox's)."""
    synthetic = {"/"}
    for target in targets:
        for path in [*_ancestors(target)[1:], target]:
            if path in own or (path in targets and path != target):
                break  # in the sandbox's own directory, or below another bind: bwrap makes the mount point there
            if not os.path.lexists(path):
                synthetic.update(_ancestors(path))
                break
            if os.path.islink(path) or not os.path.isdir(path):
                break  # through a link or onto a file: bwrap follows it as the command would
    return synthetic


def _masks(hidden: set[str]) -> list[str]:
    """Binds of /dev/null over the Docker sockets the root would still show (outside every path in `hidden`)."""
    candidates = []
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        candidates.append(urlparse(host).path)
    home = os.environ.get("HOME")
    if home:
        candidates += [os.path.join(home, name) for name in _HOME_DOCKER_SOCKETS]
    args: list[str] = []
    for path in dict.fromkeys(os.path.normpath(c) for c in candidates if c.startswith("/")):
        covered = any(path == h or path.startswith(h.rstrip("/") + "/") for h in hidden)
        if not covered and os.path.exists(path) and not os.path.isdir(path):
            args += ["--ro-bind", "/dev/null", path]
    return args


def root_layout(fs: str, own: Sequence[str], binds: Sequence[Bind]) -> list[str]:
    """bwrap arguments for the holder's root: `fs` as `/`, with the host's top-level entries bound over it
    read-only except `own` (top-level paths that are the sandbox's: `/app`, `/tmp`, ...), `binds` at their targets
    (parents first), a fresh /proc and /dev, the Docker sockets masked."""
    owned = set(own)
    targets = {b.target for b in binds}
    synthetic = _synthetic_dirs(targets, owned)
    args = ["--bind", fs, "/"]
    for directory in sorted(synthetic, key=_depth):
        if directory != "/":
            args += ["--dir", directory]
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            raise SandboxError(f"cannot list {directory} to build a bubblewrap root: {exc.strerror}") from exc
        for entry in entries:
            path = posixpath.join(directory, entry.name)
            if path in synthetic or path in targets or path in owned or path in _FRESH:
                continue
            if entry.is_symlink():
                args += ["--symlink", os.readlink(path), path]
            elif entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
                args += ["--ro-bind", path, path]
            # sockets, fifos and device nodes are left out: nothing to read, and a socket is a way out
    args += ["--proc", "/proc", "--dev", "/dev"]
    for bind in sorted(binds, key=lambda b: _depth(b.target)):
        args += ["--bind" if bind.writable else "--ro-bind", bind.source, bind.target]
    return [*args, *_masks(owned | targets | set(_FRESH))]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except OSError:
        return []


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"T", b"t", b"Z")


class Confinement:
    """One sandbox's bubblewrap: the holder of its namespaces (`start`, `stop`), and the way in (`command`)."""

    def __init__(self, bwrap: str, layout: Sequence[str]) -> None:
        self.bwrap = bwrap
        self.layout = list(layout)
        self._holder: asyncio.subprocess.Process | None = None
        self._ns_fds: list[tuple[str, int]] = []  # (nsenter option, our descriptor of the holder's namespace)
        self._pidns: tuple[int, int] | None = (
            None  # (device, inode) of the PID namespace, to find its members
        )
        self._own: set[int] = set()  # the holder's init: the namespace's, not a command's

    async def start(self, prefix: Sequence[str], env: Mapping[str, str]) -> None:
        """Start the holder (`prefix` runs it in the sandbox's network namespace, as every command) and wait until
        its mounts are all made. Its environment (`env`) is what a command reads at /proc/1/environ."""
        # The holder's output (its readiness line, or bwrap's complaint) comes on a pipe that is ours alone, and
        # closed once it is ready: a command could reopen a file of the host's the holder wrote to through its
        # /proc/<pid>/fd, never this pipe's reading end.
        info_read, info_write = os.pipe()
        said_read, said_write = os.pipe()
        try:
            # forked on the event loop's thread: --die-with-parent watches the thread that forks
            self._holder = await asyncio.create_subprocess_exec(
                *prefix,
                self.bwrap,
                *_HOLDER_FLAGS,
                *self.layout,
                "--info-fd",
                str(info_write),
                "--",
                shutil.which("bash") or "sh",
                "-c",
                HOLD,
                stdin=asyncio.subprocess.PIPE,  # the init lives until we close it
                stdout=said_write,
                stderr=said_write,
                env=dict(env),
                pass_fds=(info_write,),
                start_new_session=True,
            )
        except OSError as exc:
            os.close(info_read)
            os.close(said_read)
            raise SandboxError(f"cannot run {self.bwrap}: {exc.strerror}") from exc
        finally:
            os.close(info_write)
            os.close(said_write)
        try:
            # bwrap names the init before it makes the mounts; only the holder's own line says they all worked
            info = await asyncio.to_thread(read_until_closed, info_read, START_TIMEOUT_S)
            said = await asyncio.to_thread(read_until_closed, said_read, START_TIMEOUT_S, b"ready\n")
        finally:
            os.close(info_read)
            os.close(said_read)
        try:
            if not info or not said.endswith(b"ready\n"):
                lines = said.decode(errors="replace").strip().splitlines()
                raise SandboxError(
                    f"bubblewrap could not confine the sandbox: {lines[-1] if lines else 'it exited without a word'}"
                )
            init = int(json.loads(info)["child-pid"])
            self._own = {init, *_children(init)}
            for name, option in _NAMESPACES:
                if os.readlink(f"/proc/{init}/ns/{name}") != os.readlink(f"/proc/self/ns/{name}"):
                    self._ns_fds.append((option, os.open(f"/proc/{init}/ns/{name}", os.O_RDONLY)))
            if [o for o, _ in self._ns_fds] != ["mount", "pid", "ipc", "uts"]:
                raise SandboxError("bubblewrap left the sandbox in one of the host's namespaces")
            owner = fcntl.ioctl(self._ns_fds[0][1], NS_GET_USERNS)
            if os.fstat(owner).st_ino == os.stat("/proc/self/ns/user").st_ino:
                os.close(owner)  # platoon runs as root: bwrap made no user namespace
            else:
                # Not root: the namespaces belong to the user namespace bwrap made to set them up (where our uid is
                # root), not to the one its init ends in; a command joins that owner, as a rootless container's
                # root, and setpriv takes every capability away.
                self._ns_fds.insert(0, ("user", owner))
            seen = os.stat(f"/proc/{init}/ns/pid")
            self._pidns = (seen.st_dev, seen.st_ino)
        except BaseException:
            await self.stop()
            raise

    def stubs(self) -> set[str]:
        """The paths (relative to the root) that exist in `fs/` only as the holder's mount points and links: a
        snapshot leaves them out, and the holder of a restored sandbox makes them again."""
        made = set()
        args = self.layout
        for index, arg in enumerate(args):
            if arg in ("--ro-bind", "--bind", "--symlink") and index + 2 < len(args):
                made.add(args[index + 2])
            elif arg in ("--proc", "--dev", "--dir") and index + 1 < len(args):
                made.add(args[index + 1])
        return {path.lstrip("/") for path in made if path != "/"}

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The descriptors a `command` needs passed on to it."""
        return tuple(fd for _, fd in self._ns_fds)

    @property
    def running(self) -> bool:
        return self._holder is not None

    def holder_pids(self) -> set[int]:
        """The holder's processes (its bwrap on the host's side, the init) while it runs."""
        return {self._holder.pid, *self._own} if self._holder is not None else set()

    def command(self, argv: Sequence[str], cwd: str) -> list[str]:
        """The argv that runs `argv` in the sandbox at `cwd` (a sandbox path), without capabilities. nsenter forks
        into the PID namespace and waits: the command is its child, in its process group, and it passes on the
        command's exit (a signal's too)."""
        if self._holder is None:
            raise SandboxError("the sandbox's namespaces are gone (its holder stopped)")
        if not all(procs.running(pid) for pid in self._own):
            # the init is gone (killed from outside the sandbox: no command can signal it), and every process with it
            raise SandboxGone(
                "the sandbox is gone: the init of its PID namespace exited, and every process with it"
            )
        # our descriptors, passed on (`pass_fds`): a /proc/<our pid>/fd path would be out of nsenter's reach once
        # the network prefix has put it in a user namespace of its own
        enter = [f"--{option}=/proc/self/fd/{fd}" for option, fd in self._ns_fds]
        if any(option == "user" for option, _ in self._ns_fds):
            enter.append("--preserve-credentials")  # keep our uid (root in that namespace): no setuid to make
        nsenter, setpriv = shutil.which("nsenter") or "nsenter", shutil.which("setpriv") or "setpriv"
        return [nsenter, *enter, "--", setpriv, *_DROP, "--", "sh", "-c", _ENTER, "sh", cwd, *argv]

    # -- transfers ---------------------------------------------------------------------------------------------

    def upload(self, source: Path, destination: str, prefix: Sequence[str], env: Mapping[str, str]) -> None:
        """Copy a host file, link or directory's contents to `destination` in the sandbox (blocking)."""
        kind = "dir" if source.is_dir() and not source.is_symlink() else "file"
        argv = [
            *prefix,
            *self.command(["sh", "-c", _UNPACK, "platoon-upload", destination, kind, source.name], "/"),
        ]
        with tempfile.TemporaryFile() as said:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=said,
                env=dict(env),
                pass_fds=self.pass_fds,
            )
            assert proc.stdin is not None
            try:
                with contextlib.suppress(BrokenPipeError), tarfile.open(fileobj=proc.stdin, mode="w|") as tar:
                    if kind == "dir":
                        for entry in sorted(source.iterdir()):
                            tar.add(entry, arcname=entry.name)
                    else:
                        tar.add(source, arcname=source.name)
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
                code = proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            if code != 0:
                raise SandboxError(f"upload to {destination} failed (exit {code}){_last_line(said)}")

    def download(self, source: str, destination: Path, prefix: Sequence[str], env: Mapping[str, str]) -> None:
        """Copy a sandbox path out to `destination` on the host (blocking): a directory's contents into it, a file to
        it (or into it when it is a directory). The stream is unpacked with tarfile's `tar` filter into a fresh
        directory beside the destination first, so no member lands outside it."""
        argv = [*prefix, *self.command(["sh", "-c", _PACK, "platoon-download", source], "/")]
        destination.parent.mkdir(parents=True, exist_ok=True)
        with (
            tempfile.TemporaryFile() as said,
            tempfile.TemporaryDirectory(dir=destination.parent, prefix=".platoon-download-") as staging,
        ):
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=said,
                env=dict(env),
                pass_fds=self.pass_fds,
            )
            assert proc.stdout is not None
            try:
                try:
                    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                        tar.extractall(staging, filter="tar")
                except tarfile.ReadError:
                    pass  # no stream at all: the exit says why
                code = proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            if code == 3:
                raise FileNotFoundError(2, "no such file in the sandbox", source)
            if code != 0:
                raise SandboxError(f"download of {source} failed (exit {code}){_last_line(said)}")
            name = posixpath.basename(source.rstrip("/")) or "."
            _move_into(Path(staging) / name, destination)

    # -- ending ------------------------------------------------------------------------------------------------

    def members(self, *, commands_only: bool = False) -> list[int]:
        """The host pids of the live processes in the sandbox's PID namespace (`commands_only`: but the holder's)."""
        if self._pidns is None:
            return []
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or (commands_only and int(entry.name) in self._own):
                continue
            try:
                seen = os.stat(f"/proc/{entry.name}/ns/pid")
            except OSError:
                continue
            if (seen.st_dev, seen.st_ino) == self._pidns and procs.running(int(entry.name)):
                found.append(int(entry.name))  # a zombie runs nothing: its parent's to reap, not ours to kill
        return found

    def kill_commands(self) -> list[int]:
        """SIGKILL every process the sandbox's commands started, and keep the holder (blocking). They are stopped
        first, pass after pass, so that none forks while we look; none can leave the namespace. Returns the pids
        still there after `KILL_PASSES` (none, normally)."""
        for _ in range(KILL_PASSES):
            running = [pid for pid in self.members(commands_only=True) if not _stopped(pid)]
            if not running:
                break
            procs.kill_pids(running, signal.SIGSTOP)
        left: list[int] = []
        for _ in range(KILL_PASSES):
            left = self.members(commands_only=True)
            if not left:
                break
            procs.kill_pids(left)
            time.sleep(0.01)
        return left

    async def stop(self) -> list[int]:
        """Kill the holder, and with its init every process of the sandbox (the kernel ends a PID namespace whose
        init dies); wait for them to be gone. Returns the pids still there after `TEARDOWN_S`. Idempotent."""
        survivors: list[int] = []
        holder, self._holder = self._holder, None
        if holder is not None:
            # A dying process leaves its namespaces before it becomes a zombie: for that moment it is no member,
            # yet still runs. So the members seen before the kill are also waited for by pid, below.
            seen = set(self.members())
            if holder.stdin is not None:
                holder.stdin.close()
            procs.kill_group(holder.pid)
            await holder.wait()
            deadline = time.monotonic() + TEARDOWN_S
            while (survivors := self.members()) and time.monotonic() < deadline:
                seen.update(survivors)
                procs.kill_pids(survivors)
                await asyncio.sleep(0.01)
            survivors += await asyncio.to_thread(
                procs.wait_gone, seen - set(survivors), max(0.0, deadline - time.monotonic())
            )
        self._close()
        return survivors

    def forget(self) -> None:
        """Kill the holder without waiting (the sandbox is being reaped by its own process, which kills the rest by
        group and marker) and let go of the namespaces."""
        holder, self._holder = self._holder, None
        if holder is not None:
            if holder.stdin is not None:
                holder.stdin.close()
            procs.kill_group(holder.pid)
        self._close()

    def _close(self) -> None:
        for _, fd in self._ns_fds:
            os.close(fd)
        self._ns_fds = []


def _last_line(said: IO[bytes]) -> str:
    said.seek(0)
    lines = said.read().decode(errors="replace").strip().splitlines()
    return f": {lines[-1]}" if lines else ""


def _move_into(got: Path, destination: Path) -> None:
    """What a download unpacked (`got`, in a staging directory of ours) to its destination: a directory's contents
    into it, a file or link to it, or into it when it is a directory."""
    if got.is_dir() and not got.is_symlink():
        shutil.copytree(got, destination, symlinks=True, dirs_exist_ok=True)
        return
    if destination.is_dir() and not destination.is_symlink():
        destination = destination / got.name
    if destination.is_symlink() or destination.exists():
        destination.unlink()
    os.replace(got, destination)


_probed: dict[tuple[str | None, str | None], str | None] = {}
_probe_lock = threading.Lock()


def unavailable() -> str | None:
    """Why process sandboxes cannot be confined here, or None when they can. Probed once per process and bwrap
    binary (a holder started, and a command run in it). Blocking on the first call: call it in a thread."""
    key = (bwrap_binary(), os.environ.get(BWRAP_ENV))
    with _probe_lock:
        if key not in _probed:
            _probed[key] = _probe(key[0])
        return _probed[key]


def _probe(bwrap: str | None) -> str | None:
    if bwrap is None:
        wanted = os.environ.get(BWRAP_ENV)
        return f"{BWRAP_ENV}={wanted} is not an executable" if wanted else "bubblewrap (bwrap) is not on PATH"
    for tool in ("nsenter", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) is not on PATH"
    said: list[str | None] = []
    # a thread of its own: the caller may be an event loop's, and asyncio.run needs one without a loop
    probing = threading.Thread(
        target=lambda: said.append(_probe_in_thread(bwrap)), name="platoon-confine-probe"
    )
    probing.start()
    probing.join()
    return said[0] if said else "the bubblewrap probe failed"


def _probe_in_thread(bwrap: str) -> str | None:
    with tempfile.TemporaryDirectory(prefix="platoon-confine-probe-") as scratch:
        root = Path(scratch)
        (root / "fs").mkdir()
        try:
            confinement = Confinement(bwrap, root_layout(str(root / "fs"), ["/tmp"], []))
            return asyncio.run(_probe_run(confinement))
        except (SandboxError, OSError) as exc:
            return str(exc)


async def _probe_run(confinement: Confinement) -> str | None:
    env: dict[str, Any] = {"PATH": os.environ.get("PATH", os.defpath)}
    await confinement.start([], env)
    try:
        proc = await asyncio.create_subprocess_exec(
            *confinement.command(["true"], "/"),
            pass_fds=confinement.pass_fds,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        _, err = await asyncio.wait_for(proc.communicate(), START_TIMEOUT_S)
    finally:
        await confinement.stop()
    if proc.returncode != 0:
        said = err.decode(errors="replace").strip().splitlines()
        return f"a command cannot enter the namespaces bwrap made (exit {proc.returncode}{': ' + said[-1] if said else ''})"
    return None
