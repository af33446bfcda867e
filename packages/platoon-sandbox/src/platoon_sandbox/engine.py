"""Commands in a container through the Docker Engine API (the `docker` SDK's low-level `APIClient`).

`docker exec` through the CLI costs a process start (about 20 ms here) on top of the engine's own exec; the
docker provider's hot path (every agent command, the kill scripts, the forwarder checks) goes straight to the
engine instead. Everything else (run, cp, commit, rm, reap) stays on the docker CLI.

The SDK is synchronous, so each command runs in a worker thread of a private pool (the event loop's default pool
has only a handful of threads, and a rollout may run dozens of commands at once). The API path is taken only when
the CLI is the plain `docker` (a `PLATOON_DOCKER` such as podman keeps the CLI for everything) and the SDK reaches
the engine that `DOCKER_HOST` names; otherwise the provider uses the CLI for commands too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from platoon.sandbox import SandboxGone
from platoon_sandbox.output import CappedOutput

log = logging.getLogger(__name__)

#: Worker threads for blocking Engine API calls; created on demand, so an idle provider holds none.
POOL = ThreadPoolExecutor(max_workers=128, thread_name_prefix="platoon-docker-api")


@functools.cache
def engine_client(binary: str, docker_host: str | None) -> Any | None:
    """An `APIClient` for the engine the CLI would talk to, or None when commands must go through the CLI.

    Cached per (binary, DOCKER_HOST): the first docker sandbox of a process pays one version request."""
    if os.path.basename(binary) != "docker":
        return None
    try:
        import docker  # the SDK: imported only when a docker sandbox starts
    except ImportError:
        return None
    try:
        client = docker.APIClient(
            base_url=docker_host or "unix:///var/run/docker.sock", version="auto", timeout=600
        )
    except Exception as error:  # any failure to reach the engine means: use the CLI
        log.debug("docker Engine API not reachable (%s); commands go through the %s CLI", error, binary)
        return None
    return client


def run_in_container(
    api: Any,
    container: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: bytes | None,
    out: CappedOutput,
    err: CappedOutput,
    opened: list[socket.socket],
    user: str | None = None,
) -> int | None:
    """Run argv in the container (blocking; call it in `POOL`) as `user` (None: the container's), feeding stdin and
    collecting both streams until the engine closes them. Returns the exit code, or None when the engine has none
    (the exec could not start).

    The connection's socket is appended to `opened` so the caller can close it to abandon the read."""
    # From `/`, never the container's own working directory: an agent may have deleted it, and the provider's own
    # commands (the kill script above all) must still run; `exec` enters the caller's cwd itself.
    try:
        exec_id = _retried(
            api.exec_create,
            container,
            list(argv),
            stdin=stdin is not None,
            environment=[f"{k}={v}" for k, v in env.items()],
            workdir="/",
            user=user or "",
        )["Id"]
    except Exception as error:
        if (gone := _gone(error, container)) is None:
            raise
        raise gone from error
    try:
        conn = _retried(api.exec_start, exec_id, socket=True)
    except Exception as error:  # the container died between the two requests: the exec went with it
        if (gone := _gone(error, container)) is None:
            raise
        raise gone from error
    raw: socket.socket = getattr(conn, "_sock", conn)
    opened.append(raw)
    try:
        if stdin is not None:
            # A writer of its own: a command that writes before it reads must not block on our unread output.
            threading.Thread(target=_feed, args=(raw, stdin), daemon=True).start()
        _read_frames(raw, out, err)
        abandoned = raw.fileno() == -1  # the caller closed the socket: a timeout or a cancellation
    finally:
        with contextlib.suppress(OSError):
            raw.close()
    return None if abandoned else _exit_code(api, exec_id)


def _gone(error: Exception, container: str) -> SandboxGone | None:
    """`SandboxGone` for the engine's own refusal of an exec, made before anything ran in the container (so no
    command's output can fake it): 409 for a container that is not running, 404 for one (or its exec) removed with
    it. None for any other error."""
    if getattr(error, "status_code", None) in (404, 409):
        return SandboxGone(
            f"sandbox {container} is gone (killed, or its main process exited); the engine answered: "
            f"{getattr(error, 'explanation', None) or error}"
        )
    return None


def written_bytes(api: Any, container: str) -> int | None:
    """The bytes in the container's writable layer (the engine's `SizeRw`), or None when the engine does not say
    (blocking; call it in `POOL`). The engine walks the layer to answer, so callers poll it sparingly."""
    found = _retried(api.containers, all=True, size=True, filters={"name": f"^/{container}$"})
    for entry in found:
        size = entry.get("SizeRw")
        return int(size) if size is not None else None
    return None


def _feed(raw: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)  # end of input for the command


def _read_frames(conn: Any, out: CappedOutput, err: CappedOutput) -> None:
    from docker.utils.socket import (
        STDERR,
        frames_iter,
    )  # the engine's stream multiplexing, as the SDK reads it

    with contextlib.suppress(OSError):  # closed by the caller: a timeout or a cancellation abandoned the read
        for stream, data in frames_iter(conn, tty=False):
            (err if stream == STDERR else out).add(data)


def _retried(call: Any, *args: Any, **kwargs: Any) -> Any:
    """`call`, once more if the connection failed: the SDK keeps connections to the engine in a pool, and one the
    engine closed while idle fails the next request before the engine sees it (the SDK's `requests` raises a
    `ConnectionError`, an `OSError`)."""
    try:
        return call(*args, **kwargs)
    except OSError:
        return call(*args, **kwargs)


#: How long the engine may take to record an exec's exit code after its streams closed. A moment on a quiet
#: machine; over a second on a loaded one (a 1 s bound once lost the code of a command that had succeeded).
EXIT_CODE_WAIT_S = 30.0


def _exit_code(api: Any, exec_id: str) -> int | None:
    # The streams close as the process exits; the engine records the code a moment later: poll, backing off.
    deadline = time.monotonic() + EXIT_CODE_WAIT_S
    pause = 0.005
    while True:
        state = _retried(api.exec_inspect, exec_id)
        if not state.get("Running"):
            code = state.get("ExitCode")
            return int(code) if code is not None else None
        if time.monotonic() >= deadline:
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
