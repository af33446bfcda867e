"""The `docker` provider against a real Docker engine.

CI starts the engine and builds the images first (`.ci/docker-engine start`, then source the env file it prints):
these tests never skip, so a machine without an engine fails them with one line saying so. Every container they
start carries a per-session label, and the session ends by checking that none is left.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon.sandbox import ExecResult, Mount, SandboxError, SandboxGone, SandboxSpec
from platoon_sandbox.docker import DockerProvider, DockerSandbox, docker_binary
from platoon_sandbox.registry import clear_process_labels, registry, set_process_labels

PYTHON_IMAGE = "docker://platoon-test/python:bookworm"
BUSYBOX_IMAGE = "docker://platoon-test/busybox"
SESSION_LABEL = {"platoon.test": f"docker-{uuid.uuid4().hex[:12]}"}


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def docker(*args: str) -> str:
    return subprocess.run(
        [docker_binary(), *args], check=True, capture_output=True, text=True, timeout=120
    ).stdout


#: Run inside a sandbox with a port: prints "connected", or "refused <why>" when 127.0.0.1:<port> cannot be reached.
CONNECT_PROBE = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3).close()\n"
    "    print('connected')\n"
    "except OSError as e:\n"
    "    print('refused', e)\n"
)


def containers(**labels: str) -> list[str]:
    filters = [a for k, v in labels.items() for a in ("--filter", f"label={k}={v}")]
    return docker("ps", "--all", "--quiet", *filters).split()


@pytest.fixture(scope="session", autouse=True)
def engine() -> Iterator[None]:
    binary = docker_binary()
    host = os.environ.get("DOCKER_HOST", "(unset)")
    reachable = shutil.which(binary) is not None and (
        subprocess.run([binary, "info"], capture_output=True, timeout=60).returncode == 0
    )
    if not reachable:
        pytest.fail(
            f"no Docker engine answers at DOCKER_HOST={host}: run `.ci/docker-engine start` and source the env "
            "file it prints",
            pytrace=False,
        )
    for image in (PYTHON_IMAGE, BUSYBOX_IMAGE):
        ref = image.removeprefix("docker://")
        if subprocess.run([binary, "image", "inspect", ref], capture_output=True).returncode != 0:
            pytest.fail(f"image {ref} is missing: `.ci/docker-engine start` builds it", pytrace=False)
    yield
    left = containers(**SESSION_LABEL)
    if left:
        docker("rm", "--force", *left)
        pytest.fail(f"the tests left {len(left)} container(s) behind", pytrace=False)


def spec(**kwargs: Any) -> SandboxSpec:
    labels = {**SESSION_LABEL, **kwargs.pop("labels", {})}
    return SandboxSpec(image=kwargs.pop("image", PYTHON_IMAGE), labels=labels, **kwargs)


async def started(**kwargs: Any) -> DockerSandbox:
    return await DockerProvider().start(spec(**kwargs))


@pytest.fixture(params=["engine-api", "cli"])
def exec_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Commands run through the Engine API when the SDK reaches the engine, else through `docker exec` (another
    CLI such as podman, or an engine the SDK cannot reach): the exec rules hold on both paths."""
    if request.param == "cli":
        monkeypatch.setattr("platoon_sandbox.docker.engine_client", lambda *_: None)
    return str(request.param)


def processes(sandbox: DockerSandbox) -> list[str]:
    """The command lines of the processes running in the sandbox (excluding the lister)."""

    async def go() -> ExecResult:
        return await sandbox.exec(
            [
                "sh",
                "-c",
                "for d in /proc/[0-9]*; do [ ${d#/proc/} = $$ ] || tr '\\0' ' ' < $d/cmdline; echo; done",
            ]
        )

    return [line.strip() for line in run(go()).stdout.splitlines() if line.strip()]


def test_the_entry_point_names_the_provider() -> None:
    from platoon.plugins import get_sandbox_runtime, resolve_target

    runtime = get_sandbox_runtime("docker")
    assert resolve_target(runtime.provider) is DockerProvider
    assert DockerProvider.isolates
    assert DockerProvider.capabilities == {
        "snapshot",
        "network_none",
        "network_public",
        "network_allowlist",
        "isolation",
        "routes",
        "host_loopback",
        "clean_env",
        "least_privilege",
        "limit_cpu_memory",
        "limit_pids",
        "limit_disk",
        "run_as_user",
        "lifetime",
    }
    # gVisor delivers a SIGKILL from inside the sandbox to its init: a command can end a runsc sandbox
    assert "lifetime" not in DockerProvider(runtime="runsc").capabilities


def test_exec_strings_run_under_bash_with_env_cwd_and_stdin(exec_path: str) -> None:
    async def go() -> None:
        sandbox = await started(env={"FROM_SPEC": "a"})
        try:
            result = await sandbox.exec(
                'echo "$FROM_SPEC $FROM_EXEC $(pwd)"; [[ -n $PLATOON_EXEC ]] && echo marked; cat; echo e >&2; exit 3',
                env={"FROM_EXEC": "b"},
                stdin="in",
            )
            assert result == ExecResult(3, "a b /app\nmarked\nin", "e\n")
            listed = await sandbox.exec(["ls", "/"], cwd="/etc/..")
            assert "bin" in listed.stdout.split()
            missing = await sandbox.exec("true", cwd="/no/such/dir")
            assert missing.exit_code == 126
        finally:
            await sandbox.stop()

    run(go())


def test_commands_go_through_the_engine_api_and_the_cli_only_drives_the_life_cycle(tmp_path: Path) -> None:
    real = shutil.which(docker_binary())
    assert real is not None
    calls = tmp_path / "calls"
    for name in ("docker", "podman"):  # podman stands for any other CLI: it gets the commands too
        wrapper = tmp_path / name / name
        wrapper.parent.mkdir()
        wrapper.write_text(f'#!/bin/sh\necho "{name} $1" >> {calls}\nexec {real} "$@"\n')
        wrapper.chmod(0o755)

    async def go(binary: Path) -> None:
        sandbox = await DockerProvider(binary=str(binary)).start(spec())
        try:
            assert (await sandbox.exec("echo via $0", stdin="x")).stdout == "via bash\n"
        finally:
            await sandbox.stop()

    run(go(tmp_path / "docker" / "docker"))
    run(go(tmp_path / "podman" / "podman"))
    used = calls.read_text().splitlines()
    assert [c for c in used if c.startswith("docker")] == ["docker run", "docker rm"]
    podman = [c for c in used if c.startswith("podman")]
    assert podman[0] == "podman run" and "podman exec" in podman and podman[-1] == "podman rm"


def test_output_is_capped_at_8_mib_per_stream(exec_path: str) -> None:
    async def go() -> None:
        sandbox = await started()
        try:
            result = await sandbox.exec("head -c 9437184 /dev/zero | tr '\\0' a")
            assert result.stdout == "a" * (8 << 20) + "\n[1048576 bytes of output dropped]\n"
        finally:
            await sandbox.stop()

    run(go())


def test_memory_limit_kills_with_137() -> None:
    async def go() -> None:
        sandbox = await started(memory_mb=64)
        try:
            result = await sandbox.exec(
                ["python3", "-c", "b = bytearray(300 * 1024 * 1024); print('survived')"]
            )
            assert result.exit_code == 137 and not result.timed_out
            assert "survived" not in result.stdout
            assert (await sandbox.exec("echo still here")).stdout == "still here\n"
        finally:
            await sandbox.stop()

    run(go())


def test_a_sandbox_killed_from_outside_is_gone_not_a_failed_command(exec_path: str) -> None:
    """An OOM killer or a node's cleanup kills the container: the next command raises `SandboxGone` (an
    untrainable `sandbox_gone` outcome for the rollout), where a command's own failure is only an exit code."""

    async def go() -> None:
        sandbox = await started()
        try:
            lie = "echo 'Error response from daemon: container is not running' >&2; exit 1"
            assert (await sandbox.exec(lie)).exit_code == 1  # a command's words change nothing
            docker("kill", sandbox.name)
            with pytest.raises(SandboxGone, match=f"sandbox {sandbox.name} is gone") as gone:
                await sandbox.exec("echo still here")
            assert gone.value.failure_kind == "sandbox_gone"
        finally:
            await sandbox.stop()

    run(go())


def test_a_read_the_engine_never_ends_stops_once_the_container_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gVisor sandbox that crashed left the engine holding an exec's stream open for good: the exec asks the
    engine every ALIVE_CHECK_S whether its container runs, and raises `SandboxGone` once it does not. No engine here
    leaves a stream open for a dead container, so the read is one that never ends."""
    from platoon_sandbox import docker as docker_module

    monkeypatch.setattr(docker_module, "ALIVE_CHECK_S", 0.2)

    async def go() -> None:
        sandbox = await started()
        try:
            if sandbox._api is None:
                pytest.fail("the Engine API path is not in use; DOCKER_HOST must name the test engine")
            endless: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
            docker("kill", sandbox.name)
            # SandboxGone, not the TimeoutError the 600 s budget would end in: the watch ended the wait
            with pytest.raises(SandboxGone, match=f"sandbox {sandbox.name} is gone .*while a command ran"):
                await sandbox._wait_while_running(endless, 600)
        finally:
            await sandbox.stop()

    run(go())


def test_network_none_cannot_reach_a_host_listener_but_host_network_can() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = str(listener.getsockname()[1])

        async def go() -> None:
            isolated, shared = await asyncio.gather(started(network="none"), started(network="host"))
            try:
                assert (await isolated.exec(["python3", "-c", CONNECT_PROBE, port])).stdout.startswith(
                    "refused"
                )
                assert (await shared.exec(["python3", "-c", CONNECT_PROBE, port])).stdout == "connected\n"
            finally:
                await asyncio.gather(isolated.stop(), shared.stop())

        run(go())


@pytest.mark.parametrize("image", [PYTHON_IMAGE, BUSYBOX_IMAGE])
def test_exec_timeout_kills_the_whole_tree(image: str, exec_path: str) -> None:
    async def go() -> DockerSandbox:
        sandbox = await started(image=image)
        # A grandchild in its own session, detached from the shell, still carries the exec's marker.
        result = await sandbox.exec(["sh", "-c", "setsid sleep 301 & (sleep 302 &); sleep 303"], timeout_s=1)
        assert result.timed_out and result.exit_code != 0
        return sandbox

    sandbox = run(go())
    try:
        assert not [p for p in processes(sandbox) if p.startswith("sleep 30")]
    finally:
        run(sandbox.stop())


def test_a_cancelled_exec_kills_its_tree(exec_path: str) -> None:
    async def go() -> DockerSandbox:
        sandbox = await started()
        task = asyncio.ensure_future(sandbox.exec("(sleep 304 &); sleep 305"))
        await asyncio.sleep(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return sandbox

    sandbox = run(go())
    try:
        assert not [p for p in processes(sandbox) if p.startswith("sleep 30")]
    finally:
        run(sandbox.stop())


def test_copy_round_trips(tmp_path: Path) -> None:
    source = tmp_path / "in"
    (source / "nested" / "deeper").mkdir(parents=True)
    (source / "nested" / "deeper" / "file.txt").write_text("deep\n")
    (source / "top.txt").write_text("top\n")
    (source / "link").symlink_to("top.txt")
    (source / "dirlink").symlink_to("nested")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(50 * 1024 * 1024))
    single = tmp_path / "single.txt"
    single.write_text("one file\n")

    async def go() -> None:
        sandbox = await started()
        try:
            await sandbox.upload(source, "/work/tree")
            await sandbox.upload(single, "/elsewhere/deep/single.txt")
            await sandbox.upload(big, "/data/big.bin")
            listed = await sandbox.exec(
                "cd /work/tree && readlink link dirlink && cat nested/deeper/file.txt"
            )
            assert listed.stdout == "top.txt\nnested\ndeep\n"
            await sandbox.exec("echo changed > /work/tree/nested/new.txt")

            out = tmp_path / "out"
            await sandbox.download("/work/tree", out / "tree")
            await sandbox.download("/elsewhere/deep/single.txt", out / "single.txt")
            await sandbox.download("/data/big.bin", out / "big.bin")
            with pytest.raises(FileNotFoundError):
                await sandbox.download("/no/such/file", out / "missing")
        finally:
            await sandbox.stop()

    run(go())
    tree = tmp_path / "out" / "tree"
    assert (tree / "top.txt").read_text() == "top\n"
    assert (tree / "nested" / "deeper" / "file.txt").read_text() == "deep\n"
    assert (tree / "nested" / "new.txt").read_text() == "changed\n"
    assert os.readlink(tree / "link") == "top.txt" and os.readlink(tree / "dirlink") == "nested"
    assert (tmp_path / "out" / "single.txt").read_text() == "one file\n"
    digest = hashlib.sha256(big.read_bytes()).hexdigest()
    assert hashlib.sha256((tmp_path / "out" / "big.bin").read_bytes()).hexdigest() == digest


def test_read_only_mounts(tmp_path: Path) -> None:
    (tmp_path / "shared.txt").write_text("from the host\n")

    async def go() -> None:
        sandbox = await started(mounts=[Mount(str(tmp_path), "/mnt/host")])
        try:
            assert (await sandbox.exec("cat /mnt/host/shared.txt")).stdout == "from the host\n"
            assert (await sandbox.exec("touch /mnt/host/x")).exit_code != 0
        finally:
            await sandbox.stop()

    run(go())


@pytest.mark.parametrize("image", [PYTHON_IMAGE, BUSYBOX_IMAGE])
def test_kill_processes_keeps_the_container(image: str, exec_path: str) -> None:
    async def go() -> DockerSandbox:
        sandbox = await started(image=image)
        await sandbox.exec(
            ["sh", "-c", "(sleep 306 &); (setsid sleep 307 &); nohup sleep 308 >/dev/null 2>&1 &"]
        )
        await sandbox.kill_processes()
        return sandbox

    sandbox = run(go())
    try:
        left = processes(sandbox)
        assert not [p for p in left if p.startswith("sleep 30")]
        assert "sleep 2147483647" in left  # the keep-alive, spared
        assert run(sandbox.exec(["echo", "alive"])).stdout == "alive\n"
    finally:
        run(sandbox.stop())


# Every signal a command may send (SIGKILL and SIGSTOP included) to PID 1, then SIGKILL to every other process it can
# see, the keep-alive among them: an agent that ends its sandbox gets an untrainable `sandbox_gone` instead of a 0.
END_OWN_SANDBOX = (
    "for s in KILL TERM INT HUP QUIT STOP USR1 USR2 PIPE ALRM; do kill -$s 1; done; "
    "for d in /proc/[0-9]*; do p=${d#/proc/}; [ $p = $$ ] || [ $p = 1 ] || kill -9 $p; done; exit 0"
)


@pytest.mark.parametrize("image", [PYTHON_IMAGE, BUSYBOX_IMAGE])
def test_a_command_cannot_end_its_own_sandbox(image: str) -> None:
    async def go() -> tuple[DockerSandbox, str, str]:
        sandbox = await started(image=image)
        await sandbox.exec(["sh", "-c", END_OWN_SANDBOX])
        after = (await sandbox.exec(["echo", "alive"])).stdout
        await sandbox.exec(["sh", "-c", "sleep 0.1 &"])  # an orphan once its shell exits
        await sandbox.kill_processes()
        return sandbox, after, (await sandbox.exec(["echo", "alive"])).stdout

    sandbox, after, after_kill = run(go())
    try:
        assert (after, after_kill) == ("alive\n", "alive\n")
        state = subprocess.run(
            [docker_binary(), "inspect", "--format", "{{.State.Running}}", sandbox.name],
            capture_output=True,
            text=True,
        )
        assert state.stdout.strip() == "true"
        if image == PYTHON_IMAGE:  # bash reaps orphans even once the keep-alive is gone (busybox sh does not)
            assert run(sleeps_left(sandbox)) == 0
    finally:
        run(sandbox.stop())


#: How many `sleep` processes the sandbox holds, running or zombies (a zombie keeps its name in /proc/<pid>/stat).
COUNT_SLEEPS = "cat /proc/[0-9]*/stat 2>/dev/null | grep -c '(sleep) ' || true"


async def sleeps_left(sandbox: DockerSandbox) -> int:
    """The `sleep` processes left in the sandbox, polled until none is (a hang guard of 30 s): 0 once every one
    has exited and been reaped; a zombie that its init never reaps stays counted."""
    deadline = time.monotonic() + 30.0
    while (left := int((await sandbox.exec(["sh", "-c", COUNT_SLEEPS])).stdout.strip() or 0)) and (
        time.monotonic() < deadline
    ):
        await asyncio.sleep(0.2)
    return left


def test_a_keep_alive_not_yet_started_when_the_start_lists_its_processes_is_waited_for(monkeypatch) -> None:
    """`docker run -d` may return before the container's init has started its keep-alive. Played here by answering
    the start's first listing of the container's own processes with the init alone: the start lists again, so the
    keep-alive is recorded and `kill_processes` spares it (the container would stop with it)."""
    real_run = DockerSandbox._run
    early = []

    async def keep_alive_not_started_yet(
        self: DockerSandbox, argv: Any, **kwargs: Any
    ) -> tuple[int, str, str]:
        rc, out, err = await real_run(self, argv, **kwargs)
        if "platoon-list" in argv and not early:
            early.append(out)
            out = "".join(line + "\n" for line in out.splitlines() if line.startswith(("1:", "ns:")))
        return rc, out, err

    monkeypatch.setattr(DockerSandbox, "_run", keep_alive_not_started_yet)

    async def go() -> tuple[DockerSandbox, str]:
        sandbox = await started()
        await sandbox.exec(["sh", "-c", "nohup sleep 309 >/dev/null 2>&1 &"])
        await sandbox.kill_processes()
        return sandbox, (await sandbox.exec(["echo", "alive"])).stdout

    sandbox, alive = run(go())
    try:
        assert early, "the start listed the container's processes"
        assert alive == "alive\n"
        left = processes(sandbox)
        assert "sleep 2147483647" in left and not [p for p in left if p.startswith("sleep 309")]
    finally:
        run(sandbox.stop())


def test_the_providers_own_commands_run_after_the_workdir_is_deleted(exec_path: str) -> None:
    """An agent may delete its working directory: the kill script and commands with another cwd still run (from
    `/`), and a command told to enter the deleted directory gets 126."""

    async def go() -> tuple[ExecResult, ExecResult]:
        sandbox = await started()
        try:
            await sandbox.exec("cd / && rm -rf /app && nohup sleep 311 >/dev/null 2>&1 &", cwd="/")
            await sandbox.kill_processes()
            return await sandbox.exec(["pwd"], cwd="/"), await sandbox.exec(["pwd"])
        finally:
            await sandbox.stop()

    elsewhere, inside = run(go())
    assert elsewhere.stdout == "/\n"
    assert inside.exit_code == 126


def test_snapshot_restore_and_stop_removes_container_and_images() -> None:
    async def go() -> None:
        provider = DockerProvider()
        sandbox = await provider.start(spec())
        await sandbox.exec("echo saved > /app/state.txt")
        snap = await sandbox.snapshot()
        assert docker("images", "--quiet", snap.image).strip()
        restored = await provider.restore(snap, spec())
        try:
            assert (await restored.exec("cat /app/state.txt")).stdout == "saved\n"
        finally:
            await restored.stop()
        await sandbox.stop()
        await sandbox.stop()  # idempotent
        assert not docker("ps", "--all", "--quiet", "--filter", f"name=^{sandbox.name}$").strip()
        assert not docker("images", "--quiet", snap.image).strip()
        with pytest.raises(SandboxError):
            await sandbox.exec("true")

    run(go())


def test_a_failed_start_leaks_no_container_and_no_registration() -> None:
    label = {"platoon.case": uuid.uuid4().hex}

    async def go() -> None:
        provider = DockerProvider()
        with pytest.raises(SandboxError):
            await provider.start(spec(image="docker://platoon-test/no-such-image:1", labels=label))
        with pytest.raises(SandboxError, match="docker://"):
            await provider.start(spec(image="/images/task.sif", labels=label))

    run(go())
    assert containers(**label) == []
    assert not [
        entry for entry in registry().live if entry.labels.get("platoon.case") == label["platoon.case"]
    ]


def test_a_sandbox_is_registered_under_the_process_labels_while_it_lives() -> None:
    run_label = {"platoon.run": f"/runs/{uuid.uuid4().hex}"}
    set_process_labels(run_label)

    async def go() -> None:
        sandbox = await DockerProvider().start(spec(labels={"platoon.role": "verifier"}))
        try:
            (entry,) = [e for e in registry().live if e.sandbox is sandbox]
            assert {**run_label, "platoon.role": "verifier"}.items() <= entry.labels.items()
            assert containers(**run_label) != []  # the container carries the run label too
        finally:
            await sandbox.stop()
        assert not [e for e in registry().live if e.sandbox is sandbox]

    try:
        run(go())
    finally:
        clear_process_labels()
    assert containers(**run_label) == []


@pytest.mark.parametrize("delay_s", [0.02, 0.1, 0.2])
def test_a_cancelled_start_leaks_no_container(delay_s: float) -> None:
    label = {"platoon.case": uuid.uuid4().hex}

    async def go() -> None:
        task = asyncio.ensure_future(DockerProvider().start(spec(labels=label)))
        await asyncio.sleep(delay_s)  # somewhere inside the start: before, during or after `docker run`
        task.cancel()
        try:
            sandbox = await task
        except asyncio.CancelledError:
            return
        await sandbox.stop()  # the start finished before the cancel landed

    run(go())
    assert containers(**label) == []


def test_reap_removes_exactly_the_labelled_containers() -> None:
    run_a = {"platoon.run": f"/runs/a-{uuid.uuid4().hex}"}
    run_b = {"platoon.run": f"/runs/b-{uuid.uuid4().hex}"}

    async def go() -> None:
        provider = DockerProvider()
        a1, a2, b = await asyncio.gather(
            provider.start(spec(image=BUSYBOX_IMAGE, labels=run_a)),
            provider.start(spec(image=BUSYBOX_IMAGE, labels=run_a)),
            provider.start(spec(image=BUSYBOX_IMAGE, labels=run_b)),
        )
        snap = await a1.snapshot()
        listed = await provider.labelled(run_a)  # `platoon sandbox list RUN`
        assert sorted(found["id"] for found in listed) == sorted([a1.name, a2.name])
        assert all(found["state"].startswith("running") for found in listed), listed
        with pytest.raises(SandboxError):
            await provider.labelled({})
        with pytest.raises(ValueError):
            await provider.reap({})
        assert await provider.reap(run_a) == 2
        assert containers(**run_a) == []
        assert not docker("images", "--quiet", snap.image).strip()
        assert containers(**run_b) != []
        assert (await b.exec(["echo", "survivor"])).stdout == "survivor\n"
        await asyncio.gather(a1.stop(), a2.stop(), b.stop())  # stopping what a reap removed is fine

    run(go())
    assert containers(**run_b) == []


# -- routes -------------------------------------------------------------------------------------


_GET = (
    "import sys, urllib.request\n"
    "print(urllib.request.urlopen(sys.argv[1] + '/v1/models', timeout=10).read().decode())\n"
)


def test_a_network_none_sandbox_reaches_a_unix_upstream_through_its_route_and_nothing_else(
    unix_upstream: str,
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = str(listener.getsockname()[1])

        async def go() -> None:
            sandbox = await started(network="none", upstreams={"model": unix_upstream, "mcp": unix_upstream})
            try:
                # name order: "mcp" first, "model" second
                assert sandbox.routes == {"mcp": "http://127.0.0.1:18080", "model": "http://127.0.0.1:18081"}
                got = await sandbox.exec(["python3", "-c", _GET, sandbox.routes["model"]])
                assert got.stdout == "hello from the host: /v1/models\n", got.stderr
                assert (await sandbox.exec(["python3", "-c", CONNECT_PROBE, port])).stdout.startswith(
                    "refused"
                )
                # the socket's directory is bound read-only
                assert (await sandbox.exec("touch /run/platoon/model/x")).exit_code != 0
                state = await sandbox.exec("ls /tmp/platoon-route")
                assert set(state.stdout.split()) >= {"forwarder.py", "model.pid", "model.port", "model.log"}
            finally:
                await sandbox.stop()

        run(go())


def test_host_network_sandboxes_get_no_route_for_unix_upstreams(unix_upstream: str) -> None:
    async def go() -> None:
        sandbox = await started(
            network="host", upstreams={"model": unix_upstream, "judge": "http://127.0.0.1:9"}
        )
        try:
            assert sandbox.routes == {"judge": "http://127.0.0.1:9"}
            await sandbox.ensure_routes()
        finally:
            await sandbox.stop()

    run(go())


def _forwarders(sandbox: DockerSandbox) -> list[str]:
    return [p for p in processes(sandbox) if "/tmp/platoon-route/forwarder.py" in p]


def test_kill_processes_spares_the_forwarder_and_ensure_routes_restarts_it(unix_upstream: str) -> None:
    async def go() -> None:
        sandbox = await started(network="none", upstreams={"model": unix_upstream})
        try:
            route = sandbox.routes["model"]
            await sandbox.exec(["sh", "-c", "(setsid sleep 309 &); nohup sleep 310 >/dev/null 2>&1 &"])
            await sandbox.kill_processes()
            left = await asyncio.to_thread(processes, sandbox)
            assert not [p for p in left if p.startswith("sleep 3")]
            assert len(await asyncio.to_thread(_forwarders, sandbox)) == 1
            assert (await sandbox.exec(["python3", "-c", _GET, route])).exit_code == 0

            # an exec timeout's marker kill spares it too
            slow = await sandbox.exec(["sleep", "30"], timeout_s=0.5)
            assert slow.timed_out
            assert len(await asyncio.to_thread(_forwarders, sandbox)) == 1

            pid = (await sandbox.exec("cat /tmp/platoon-route/model.pid")).stdout.strip()
            assert (await sandbox.exec(["sh", "-c", 'kill -9 "$1"', "sh", pid])).exit_code == 0
            assert (await sandbox.exec(["python3", "-c", _GET, route])).exit_code != 0
            await sandbox.ensure_routes()
            assert sandbox.routes["model"] == route  # the same port
            got = await sandbox.exec(["python3", "-c", _GET, route])
            assert got.stdout == "hello from the host: /v1/models\n", got.stderr
            assert (await sandbox.exec("cat /tmp/platoon-route/model.pid")).stdout.strip() != pid
            await sandbox.ensure_routes()  # healthy: nothing restarted
            assert len(await asyncio.to_thread(_forwarders, sandbox)) == 1
        finally:
            await sandbox.stop()

    run(go())


def test_a_sandbox_without_python_for_its_forwarder_fails_to_start_and_leaks_no_container(
    unix_upstream: str,
) -> None:
    label = {"platoon.case": uuid.uuid4().hex}

    async def go() -> None:
        with pytest.raises(SandboxError, match=r"no Python 3\.6 or newer.*python3, python"):
            await DockerProvider().start(
                spec(image=BUSYBOX_IMAGE, network="none", upstreams={"model": unix_upstream}, labels=label)
            )

    run(go())
    assert containers(**label) == []
