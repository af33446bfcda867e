"""The open remote ORS sessions of this process, mirrored to a file so that no exit path leaves one open.

Every session a remote service opens is registered here (server url, session id, API key, deployment) until it is
closed, and the registry is written (atomically, mode 0600: it holds API keys) to
`<dir>/<host>-<pid>.json`. Three ways out close what is left:

- a normal close unregisters the session (the service deleted it on the server);
- a stopping process (`atexit`) deletes what is still registered with `POST <url>/delete` (headers `X-Session-ID`,
  `X-API-Key`, `X-Deployment`), then removes its file; after that no new session or call is allowed;
- a process killed outright (SIGKILL) leaves its file behind: the next process of this host that uses a remote
  service sweeps the files whose owner is gone and deletes their sessions. A session nobody sweeps ends with its
  lease: the server reaps a session that has not been pinged for about 900 s.

The directory is `$PLATOON_ORS_SESSION_DIR`, else `<cache root>/ors-sessions` (the site profile's cache root).
Deleting uses plain aiohttp with a short timeout and no retries: the SDK can only delete sessions it opened itself.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from platoon.config.site import default_cache_root, load_site

__all__ = ["DIR_VARIABLE", "OpenSession", "SessionRegistry", "registry", "session_dir"]

log = logging.getLogger(__name__)

DIR_VARIABLE = "PLATOON_ORS_SESSION_DIR"
#: how long deleting one orphaned session may take (a dead server refuses at once; a hung one is given up on)
DELETE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class OpenSession:
    url: str
    sid: str
    api_key: str
    deployment: str


def session_dir() -> Path:
    """`$PLATOON_ORS_SESSION_DIR`, else `<cache root>/ors-sessions`."""
    given = os.environ.get(DIR_VARIABLE)
    if given:
        return Path(given)

    try:
        profile = load_site()
    except Exception:  # a broken profile is the command's to report; the registry then uses the default root
        profile = None
    root = profile.cache_root if profile is not None else default_cache_root()
    return root / "ors-sessions"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a live owner from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return started is None or _start_time(pid) in (None, started)


async def delete_sessions(
    sessions: Iterable[OpenSession], timeout_s: float = DELETE_TIMEOUT_S
) -> list[OpenSession]:
    """Delete these sessions on their servers; returns those that could not be deleted (server up but failing).

    A server that refuses the connection is gone, and its sessions with it: they count as deleted.
    """
    import aiohttp

    failed: list[OpenSession] = []
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one(session: OpenSession) -> None:
            headers = {
                "X-Session-ID": session.sid,
                "X-API-Key": session.api_key,
                "X-Deployment": session.deployment,
            }
            try:
                for path in ("/delete", "/delete_session"):
                    async with http.post(session.url.rstrip("/") + path, headers=headers) as response:
                        if response.status >= 500:
                            raise RuntimeError(f"HTTP {response.status}")
            except aiohttp.ClientConnectorError:
                return  # nothing listens there any more: no session is open on it
            except Exception as exc:
                log.warning("could not delete ORS session %s on %s: %s", session.sid, session.url, exc)
                failed.append(session)

        await asyncio.gather(*(one(s) for s in sessions))
    return failed


class SessionRegistry:
    """This process's open remote sessions, and the sweep of those a killed process left."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, OpenSession] = {}
        #: each open session as the file writes it (made once per session, not once per write)
        self._entries: dict[str, dict[str, str]] = {}
        self._swept = False
        self._sweeping: asyncio.Future[None] | None = None
        self.shut_down = False
        self._dir: Path | None = None
        self._fd: int | None = None
        self._fd_path: Path | None = None
        self._started = _start_time(os.getpid())

    def _reset_after_fork(self) -> None:
        # A forked worker owns none of its parent's sessions, and its loops are its own.
        self._lock = threading.Lock()
        self._open = {}
        self._entries = {}
        self._fd = None  # the parent's file: this process writes its own
        # a respawned worker sweeps what a killed sibling left, even when the process it forked from swept
        self._swept = False
        self._sweeping = None
        self._started = _start_time(os.getpid())

    @property
    def directory(self) -> Path:
        given = os.environ.get(DIR_VARIABLE)
        if given:  # read each time: cheap, and a test (or a caller) may point it elsewhere
            return Path(given)
        if self._dir is None:
            self._dir = session_dir()
        return self._dir

    def _file(self) -> Path:
        return self.directory / f"{socket.gethostname()}-{os.getpid()}.json"

    @property
    def open_sessions(self) -> list[OpenSession]:
        with self._lock:
            return list(self._open.values())

    def add(self, session: OpenSession) -> None:
        with self._lock:
            self._open[session.sid] = session
            self._entries[session.sid] = asdict(session)
            self._write()

    def remove(self, sid: str) -> None:
        with self._lock:
            if self._open.pop(sid, None) is not None:
                self._entries.pop(sid, None)
                self._write()

    def _write(self) -> None:
        """Mirror the open sessions to this process's file (called with the lock held).

        The file stays open, written in place with `pwrite` and cut to length: opening, creating or renaming a
        file costs milliseconds on some filesystems, twice an episode, on the event loop. A sweep that reads a
        half-written file leaves it for later; an empty list means nothing is open.
        """
        data = json.dumps(
            {
                "pid": os.getpid(),
                "started": self._started,
                "sessions": list(self._entries.values()),
            }
        ).encode()
        try:
            path = self._file()
            if self._fd is not None and self._fd_path != path:  # the directory was pointed elsewhere
                os.close(self._fd)
                self._fd = None
            if self._fd is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                self._fd_path = path
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))
        except OSError as exc:
            log.warning("could not record open ORS sessions in %s: %s", self._file(), exc)

    def _close_file(self) -> None:
        """At exit, with nothing left open: the file goes."""
        with self._lock:
            if self._fd is not None and not self._open:
                os.close(self._fd)
                self._fd = None
                if self._fd_path is not None:
                    self._fd_path.unlink(missing_ok=True)

    async def sweep(self) -> None:
        """Once per process: delete the sessions of this host's registry files whose process is gone."""
        if self._swept:
            return
        if self._sweeping is None:
            self._sweeping = asyncio.ensure_future(self._sweep())
        try:
            await asyncio.shield(self._sweeping)
        finally:
            self._swept = True

    async def _sweep(self) -> None:
        prefix = f"{socket.gethostname()}-"
        try:
            files = [p for p in self.directory.glob(f"{prefix}*.json") if p != self._file()]
        except OSError:
            return
        for path in files:
            try:
                data = json.loads(path.read_text())
                pid = int(data["pid"])
                sessions = [OpenSession(**s) for s in data["sessions"]]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being written, or not ours to understand: leave it
            if _alive(pid, data.get("started")):
                continue
            if not sessions:
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            log.info("deleting %d ORS session(s) left open by process %d", len(sessions), pid)
            failed = await delete_sessions(sessions)
            if failed:
                data["sessions"] = [asdict(s) for s in failed]
                with contextlib.suppress(OSError):
                    path.write_text(json.dumps(data))
            else:
                with contextlib.suppress(OSError):
                    path.unlink()

    def shutdown(self) -> None:
        """At exit: refuse new sessions and calls, delete what is still open, remove this process's file."""
        self.shut_down = True
        left = self.open_sessions
        if not left:
            self._close_file()
            return

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:  # exiting from inside a running loop: no new loop here, and no new thread at shutdown
            log.warning("%d ORS session(s) left open at exit; the next start deletes them", len(left))
            return
        try:
            failed = asyncio.run(delete_sessions(left))
        except Exception as exc:  # at exit, say it and go
            log.warning("could not delete %d open ORS session(s) at exit: %s", len(left), exc)
            return
        with self._lock:
            for session in left:
                if session not in failed:
                    self._open.pop(session.sid, None)
                    self._entries.pop(session.sid, None)
            self._write()
        self._close_file()

    def status(self) -> dict[str, Any]:
        return {"file": str(self._file()), "open": len(self._open)}


registry = SessionRegistry()
atexit.register(registry.shutdown)
os.register_at_fork(after_in_child=registry._reset_after_fork)
