"""Least privilege and limits in the `docker` provider, against a real Docker engine and gVisor.

Each test does what an agent in the sandbox could try (raise its capabilities, mount, gain root through a setuid
binary, start thousands of processes, fill the disk) and checks that it fails while the sandbox's own features
(timeouts, kills, copies, snapshots, routes) still work, under runc and under `runtime: runsc`. Tests that do not
disturb each other share one sandbox per module. The engine fixture of test_docker.py checks the engine and the
images; every container carries a per-session label and none may be left.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import shutil
import socketserver
import subprocess
import threading
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon.sandbox import SandboxDiskLimit, SandboxError, SandboxSpec, unenforced_field
from platoon_sandbox.docker import (
    DEFAULT_PIDS_LIMIT,
    KEPT_CAPABILITIES,
    DockerProvider,
    DockerSandbox,
    docker_binary,
)
from platoon_sandbox.process import ProcessProvider

PYTHON_IMAGE = "docker://platoon-test/python:bookworm"
SESSION_LABEL = {"platoon.test": f"hardening-{uuid.uuid4().hex[:12]}"}

#: Capability numbers (linux/capability.h) of the kept set.
CAPABILITY_BITS = {
    "CHOWN": 0,
    "DAC_OVERRIDE": 1,
    "FOWNER": 3,
    "FSETID": 4,
    "KILL": 5,
    "SETGID": 6,
    "SETUID": 7,
}
KEPT_MASK = sum(1 << CAPABILITY_BITS[name] for name in KEPT_CAPABILITIES)


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def docker(*args: str) -> str:
    return subprocess.run(
        [docker_binary(), *args], check=True, capture_output=True, text=True, timeout=120
    ).stdout


def spec(**kwargs: Any) -> SandboxSpec:
    return SandboxSpec(
        image=kwargs.pop("image", PYTHON_IMAGE),
        network=kwargs.pop("network", "none"),
        labels=SESSION_LABEL,
        **kwargs,
    )


def status_field(text: str, name: str) -> str:
    """A field of /proc/self/status as printed inside the sandbox."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise AssertionError(f"{name} is not in {text!r}")


def inspect(sandbox: DockerSandbox) -> dict[str, Any]:
    return json.loads(docker("container", "inspect", sandbox.name))[0]


@pytest.fixture(scope="module", autouse=True)
def nothing_left() -> Iterator[None]:
    """The engine answers and has the test image (`.ci/docker-engine start`); no container is left at the end."""
    if (
        shutil.which(docker_binary()) is None
        or subprocess.run(
            [docker_binary(), "image", "inspect", PYTHON_IMAGE.removeprefix("docker://")], capture_output=True
        ).returncode
    ):
        pytest.fail(
            f"no Docker engine with {PYTHON_IMAGE} at DOCKER_HOST={os.environ.get('DOCKER_HOST', '(unset)')}: run "
            "`.ci/docker-engine start` and source the env file it prints",
            pytrace=False,
        )
    yield
    left = docker("ps", "--all", "--quiet", "--filter", f"label=platoon.test={SESSION_LABEL['platoon.test']}")
    if left.split():
        docker("rm", "--force", *left.split())
        pytest.fail(f"the hardening tests left {len(left.split())} container(s) behind", pytrace=False)


@pytest.fixture(scope="module")
def hardened() -> Iterator[DockerSandbox]:
    """One default sandbox (no network, no user, no limits named) for the tests that only look and try."""
    sandbox = run(DockerProvider().start(spec()))
    try:
        yield sandbox
    finally:
        run(sandbox.stop())


def test_a_default_sandbox_keeps_only_the_documented_capabilities(hardened: DockerSandbox) -> None:
    status = run(hardened.exec("cat /proc/self/status")).stdout
    assert int(status_field(status, "CapEff"), 16) == KEPT_MASK
    assert int(status_field(status, "CapBnd"), 16) == KEPT_MASK  # nothing to regain either
    assert status_field(status, "NoNewPrivs") == "1"
    host = inspect(hardened)["HostConfig"]
    assert host["PidsLimit"] == DEFAULT_PIDS_LIMIT
    assert "no-new-privileges" in host["SecurityOpt"]


def test_mounting_and_device_nodes_are_refused(hardened: DockerSandbox) -> None:
    result = run(hardened.exec("mkdir -p /tmp/m && mount -t tmpfs none /tmp/m"))
    assert result.exit_code != 0
    assert "permission denied" in result.stderr.lower()
    assert run(hardened.exec("mknod /tmp/null c 1 3")).exit_code != 0
    assert run(hardened.exec("chroot / true")).exit_code != 0


def test_a_setuid_binary_gains_no_privileges(hardened: DockerSandbox) -> None:
    """Root in the sandbox makes a setuid-root Python; a non-root user running it stays non-root."""
    made = run(hardened.exec("cp /usr/bin/python3 /tmp/suid-python && chmod 4755 /tmp/suid-python"))
    assert made.ok, made.stderr
    check = "import os; print(os.geteuid(), open('/proc/self/status').read().count('NoNewPrivs:\\t1'))"
    result = run(hardened.exec(["/tmp/suid-python", "-c", check], user="1000"))
    assert result.stdout.split() == ["1000", "1"], result.stderr


def test_package_managers_and_user_management_work_as_root(hardened: DockerSandbox) -> None:
    """What the kept capabilities are for: dpkg installs a package that sets a setgid file and a group, useradd and
    chown make a user's home, su switches to it, and root signals that user's processes."""
    script = r"""
set -e
mkdir -p /tmp/pkg/DEBIAN /tmp/pkg/usr/local/bin
printf 'Package: demo\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@example.com>\nDescription: d\n' \
  > /tmp/pkg/DEBIAN/control
printf '#!/bin/sh\ngroupadd --system demo\nchown root:demo /usr/local/bin/demo\nchmod 2755 /usr/local/bin/demo\n' \
  > /tmp/pkg/DEBIAN/postinst
chmod 755 /tmp/pkg/DEBIAN/postinst
printf '#!/bin/sh\necho demo\n' > /tmp/pkg/usr/local/bin/demo && chmod 755 /tmp/pkg/usr/local/bin/demo
dpkg-deb --build --root-owner-group /tmp/pkg /tmp/demo.deb >/dev/null
dpkg -i /tmp/demo.deb >/dev/null
stat -c '%a %G' /usr/local/bin/demo
useradd -m alice
touch /tmp/alice-file && chown alice:alice /tmp/alice-file && chmod 600 /tmp/alice-file
echo written-by-root > /tmp/alice-file
su alice -c 'id -un; cat /tmp/alice-file'
setpriv --reuid=alice --regid=alice --clear-groups sleep 60 &
kill "$!" && echo signalled
"""
    result = run(hardened.exec(script, timeout_s=120))
    assert result.stdout.split() == ["2755", "demo", "alice", "written-by-root", "signalled"], result.stderr


def test_starting_5000_processes_stops_at_the_pids_limit_and_the_sandbox_still_answers() -> None:
    flood = r"""
import os, time
started = 0
try:
    for _ in range(5000):
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)
        started += 1
except OSError as error:
    print("refused", error.errno)
print("started", started)
"""

    async def go() -> None:
        sandbox = await DockerProvider().start(spec(pids_limit=200))
        try:
            result = await sandbox.exec(["python3", "-c", flood], timeout_s=120)
            words = result.stdout.split()
            assert words[:2] == ["refused", "11"], result  # EAGAIN
            assert 100 < int(words[-1]) < 200
            await sandbox.kill_processes()
            assert (await sandbox.exec("echo still here")).stdout == "still here\n"
        finally:
            await sandbox.stop()

    run(go())


def test_commands_run_as_the_task_user_and_the_provider_keeps_root(
    tmp_path: Path, unix_upstream: str
) -> None:
    """`user`: every command runs as it with no capabilities; a timeout still kills its tree, `kill_processes` still
    kills its processes, uploads become its own, and the route forwarder (root's) is out of its reach."""
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "notes.txt").write_text("from the host\n")

    async def go() -> None:
        sandbox = await DockerProvider().start(spec(user="1000:1000", upstreams={"model": unix_upstream}))
        try:
            who = await sandbox.exec("id -u; id -g; grep CapEff /proc/self/status")
            assert who.stdout.split() == ["1000", "1000", "CapEff:", "0000000000000000"]
            assert (await sandbox.exec("id -u", user="0")).stdout == "0\n"

            slow = await sandbox.exec("sleep 301 & sleep 302", timeout_s=1)
            assert slow.timed_out
            await sandbox.exec("setsid sleep 303 >/dev/null 2>&1 < /dev/null &")
            await sandbox.kill_processes()
            left = await sandbox.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '", user="0")
            assert "sleep 30" not in left.stdout

            await sandbox.upload(tmp_path / "up", "/app/up")
            changed = await sandbox.exec("echo by the user >> /app/up/notes.txt && stat -c %u /app/up")
            assert changed.stdout == "1000\n", changed.stderr

            pid = (await sandbox.exec("cat /tmp/platoon-route/model.pid")).stdout.strip()
            assert (await sandbox.exec(["kill", "-9", pid])).exit_code != 0
            forwarder = await sandbox.exec("echo x >> /tmp/platoon-route/forwarder.py")
            assert forwarder.exit_code != 0
            got = await sandbox.exec(
                [
                    "python3",
                    "-c",
                    "import urllib.request as u, sys; print(u.urlopen(sys.argv[1]).read().decode())",
                    sandbox.routes["model"],
                ]
            )
            assert got.stdout.startswith("hello from the host"), got.stderr
        finally:
            await sandbox.stop()

    run(go())


def test_a_user_the_image_lacks_fails_the_start_in_one_line_and_leaks_nothing() -> None:
    label = {"platoon.case": uuid.uuid4().hex}

    async def go() -> None:
        with pytest.raises(SandboxError, match="cannot run commands as user 'nobody-here'") as failed:
            await DockerProvider().start(
                SandboxSpec(
                    image=PYTHON_IMAGE, network="none", user="nobody-here", labels={**SESSION_LABEL, **label}
                )
            )
        assert "\n" not in str(failed.value)

    run(go())
    assert not docker(
        "ps", "--all", "--quiet", "--filter", f"label=platoon.case={label['platoon.case']}"
    ).split()


def test_writing_past_storage_mb_ends_the_sandbox_and_the_host_keeps_nothing() -> None:
    """This engine's storage driver (overlay2 on ext4) takes no quota: the watchdog ends the sandbox while the
    command still runs, the command raises `SandboxDiskLimit` (infra `sandbox_disk_limit`), and the container's
    writable layer is gone from the host."""

    async def go() -> None:
        sandbox = await DockerProvider().start(spec(storage_mb=50))
        upper = Path(inspect(sandbox)["GraphDriver"]["Data"]["UpperDir"])
        assert upper.is_dir()
        try:
            with pytest.raises(SandboxDiskLimit, match="over its storage_mb = 50") as over:
                await sandbox.exec("head -c 200000000 /dev/zero > /app/big && sleep 120", timeout_s=180)
            assert over.value.failure_kind == "sandbox_disk_limit"
            with pytest.raises(SandboxDiskLimit):
                await sandbox.exec("true")
        finally:
            await sandbox.stop()
        assert not upper.exists()
        assert not docker("ps", "--all", "--quiet", "--filter", f"name=^{sandbox.name}$").strip()

    run(go())


def test_grading_measures_the_disk_before_it_judges() -> None:
    """A command that wrote past the limit and ended before the watchdog looked: `kill_processes`, where grading
    starts, measures first and raises `SandboxDiskLimit`."""

    async def go() -> None:
        sandbox = await DockerProvider().start(spec(storage_mb=50))
        try:
            wrote = await sandbox.exec("head -c 120000000 /dev/zero > /app/big")
            assert wrote.ok or wrote.exit_code != 0  # the watchdog may already have ended it
        except SandboxDiskLimit:
            await sandbox.stop()
            return
        try:
            with pytest.raises(SandboxDiskLimit):
                await sandbox.kill_processes()
        finally:
            await sandbox.stop()

    run(go())


def test_a_sandbox_under_its_disk_limit_keeps_running() -> None:
    async def go() -> None:
        sandbox = await DockerProvider().start(spec(storage_mb=200))
        try:
            assert (await sandbox.exec("head -c 20000000 /dev/zero > /app/small")).ok
            await sandbox.kill_processes()  # measured: under the limit
            assert (await sandbox.exec("echo fine")).stdout == "fine\n"
        finally:
            await sandbox.stop()

    run(go())


# -- refusals -----------------------------------------------------------------------------------------------------


def test_each_provider_refuses_the_fields_it_does_not_enforce() -> None:
    limited = spec(cpus=1, memory_mb=512, pids_limit=100, storage_mb=100, user="1000")
    assert DockerProvider.refusal(limited) is None
    said = ProcessProvider.refusal(SandboxSpec(memory_mb=512))
    assert said is not None and "memory_mb = 512" in said and "\n" not in said
    assert unenforced_field(SandboxSpec(user="alice"), frozenset(), "x") is not None


def test_a_runtime_the_engine_lacks_is_refused_in_one_line() -> None:
    said = DockerProvider.unavailable({"runtime": "no-such-runtime"})
    assert said is not None and "no runtime 'no-such-runtime'" in said and "\n" not in said
    assert DockerProvider.unavailable({"runtime": "runsc"}) is None


# -- gVisor ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gvisor(unix_upstream_module: str) -> Iterator[DockerSandbox]:
    sandbox = run(DockerProvider(runtime="runsc").start(spec(upstreams={"model": unix_upstream_module})))
    try:
        yield sandbox
    finally:
        run(sandbox.stop())


def test_runsc_runs_the_sandbox_under_gvisor_with_the_same_privileges(gvisor: DockerSandbox) -> None:
    result = run(gvisor.exec("uname -r; cat /proc/self/status"))
    assert result.stdout.splitlines()[0] == "4.4.0"  # gVisor's own kernel, not the host's
    assert int(status_field(result.stdout, "CapEff"), 16) == KEPT_MASK
    assert inspect(gvisor)["HostConfig"]["Runtime"] == "runsc"
    assert run(gvisor.exec("mount -t tmpfs none /mnt")).exit_code != 0


def test_under_runsc_timeouts_kills_copies_snapshots_and_routes_work(
    gvisor: DockerSandbox, tmp_path: Path
) -> None:
    async def go() -> None:
        slow = await gvisor.exec("sleep 311 & sleep 312", timeout_s=1)
        assert slow.timed_out
        await gvisor.exec("setsid sleep 313 >/dev/null 2>&1 < /dev/null &")
        await gvisor.kill_processes()
        left = await gvisor.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        assert "sleep 31" not in left.stdout

        (tmp_path / "in.txt").write_text("round trip\n")
        await gvisor.upload(tmp_path / "in.txt", "/app/in.txt")
        await gvisor.download("/app/in.txt", tmp_path / "out.txt")
        assert (tmp_path / "out.txt").read_text() == "round trip\n"

        got = await gvisor.exec(
            [
                "python3",
                "-c",
                "import urllib.request as u, sys; print(u.urlopen(sys.argv[1]).read().decode())",
                gvisor.routes["model"],
            ]
        )
        assert got.stdout.startswith("hello from the host"), got.stderr

        snap = await gvisor.snapshot()
        restored = await DockerProvider(runtime="runsc").restore(snap, spec())
        try:
            assert (await restored.exec("cat /app/in.txt; uname -r")).stdout == "round trip\n4.4.0\n"
        finally:
            await restored.stop()

    run(go())


def test_under_runsc_the_process_limit_refuses_forks_and_the_sandbox_still_answers() -> None:
    flood = (
        "import os, time\nn = 0\ntry:\n    for _ in range(5000):\n        if os.fork() == 0:\n"
        "            time.sleep(120); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('refused', e.errno)\n"
        "print('started', n)\n"
    )

    async def go() -> None:
        sandbox = await DockerProvider(runtime="runsc").start(spec(pids_limit=200))
        try:
            result = await sandbox.exec(["python3", "-c", flood], timeout_s=120)
            words = result.stdout.split()
            assert words[:2] == ["refused", "11"], result
            assert int(words[-1]) < 200
            await sandbox.kill_processes()
            assert (await sandbox.exec("echo still here")).stdout == "still here\n"
        finally:
            await sandbox.stop()

    run(go())


def test_under_runsc_commands_run_as_the_task_user() -> None:
    async def go() -> None:
        sandbox = await DockerProvider(runtime="runsc").start(spec(user="1000:1000"))
        try:
            assert (await sandbox.exec("id -u")).stdout == "1000\n"
            slow = await sandbox.exec("sleep 321 & sleep 322", timeout_s=1)
            assert slow.timed_out
            left = await sandbox.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '", user="0")
            assert "sleep 32" not in left.stdout
        finally:
            await sandbox.stop()

    run(go())


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello from the host"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def unix_upstream_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An HTTP server on a Unix socket (the gateway's stand-in) for a module's shared sandbox."""
    sock = tmp_path_factory.mktemp("gw") / "gw.sock"
    server = _UnixHTTPServer(str(sock), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"unix://{sock}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_old_flags_are_no_option_a_configuration_can_set() -> None:
    """`hardening` (off only in benchmarks/sandbox.py, on a subclass) is a class attribute, not an option."""
    with pytest.raises(TypeError):
        DockerProvider(hardening=False)  # type: ignore[call-arg]
    assert DockerProvider.hardening
