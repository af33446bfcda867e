"""What bubblewrap keeps from a process sandbox's commands, tried as an agent would try it, with
real bubblewrap, nsenter, processes and a real Docker engine: the host's secrets (its environment, /proc/1/environ,
the parent's environ), the host's processes, the Docker socket, the host's files and /tmp, a symlink that would
steer platoon's own writes; that killing still leaves nothing; and, without bubblewrap, one warning and a Harbor
run refused unless its config says `confine: none`.

They need bubblewrap (CI installs it and never skips these).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import platoon_sandbox.process as process_module
from platoon.errors import ConfigError
from platoon.sandbox import Mount, SandboxError, SandboxGone, SandboxSpec
from platoon_sandbox import confine, netns, procs
from platoon_sandbox.docker import DockerProvider, docker_binary
from platoon_sandbox.process import ProcessProvider, ProcessSandbox
from platoon_sandbox.registry import clear_process_labels, set_process_labels

pytestmark = pytest.mark.skipif(
    netns.bwrap_binary() is None and not os.environ.get("CI"),
    reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap (CI installs it and never skips these)",
)

#: Secrets a host running platoon holds in its environment (DOCKER_HOST stays the engine's: the docker test needs it).
SECRET_NAMES = ("TINKER_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY")
LABELS = {"platoon.test": f"confine-{uuid.uuid4().hex[:12]}"}

# Every environment a command can read in the sandbox: its own, pid 1's, its parent's, every process's it can see.
ALL_ENVIRONS = (
    'env; cat /proc/1/environ /proc/$PPID/environ /proc/[0-9]*/environ 2>/dev/null | tr "\\0" "\\n"'
)
# Connects to a Unix socket: "connected", or "refused <why>".
CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    print("connected")
except OSError as e:
    print("refused", e)
"""


@pytest.fixture(autouse=True)
def _fresh_labels() -> Iterator[None]:
    clear_process_labels()
    yield
    clear_process_labels()


@pytest.fixture
def confined_here() -> None:
    reason = confine.unavailable()
    assert reason is None, f"process sandboxes cannot be confined here: {reason}"


@pytest.fixture
def host_secrets(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {name: f"secret-{secrets.token_hex(8)}" for name in SECRET_NAMES}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def started(scratch: Path, confine_mode: str | None = None, **spec: Any) -> ProcessSandbox:
    return await ProcessProvider(scratch_root=str(scratch), confine=confine_mode).start(SandboxSpec(**spec))


def leaked(text: str, values: dict[str, str]) -> list[str]:
    return [name for name, value in values.items() if value in text]


@pytest.fixture
def home_dir() -> Iterator[Path]:
    """A directory of the test's in the host's home: visible, read-only, to a confined command (unlike /tmp)."""
    path = Path(tempfile.mkdtemp(prefix=".platoon-confine-test-", dir=Path.home()))
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.mark.usefixtures("confined_here")
def test_no_environment_a_confined_command_can_read_holds_the_hosts_secrets(tmp_path, host_secrets):
    async def main() -> None:
        sandbox = await started(tmp_path, env={"MODE": "test"})
        try:
            assert sandbox.confined and {"clean_env", "lifetime"} <= ProcessProvider().capabilities
            seen = await sandbox.exec(ALL_ENVIRONS, env={"EXTRA": "given"})
            assert seen.exit_code == 0 and "MODE=test" in seen.stdout and "EXTRA=given" in seen.stdout
            assert leaked(seen.stdout, host_secrets) == []
            assert os.environ["DOCKER_HOST"] not in seen.stdout and "DOCKER_HOST" not in seen.stdout
            assert "PATH=" in seen.stdout and f"HOME={os.environ['HOME']}" in seen.stdout  # the allowlist
            parent = await sandbox.exec("echo $PPID; ls /proc/$PPID 2>&1 | head -1")
            assert parent.stdout.split("\n")[0] == "0"  # the command's parent is outside its PID namespace
        finally:
            await sandbox.stop()

    run(main())


def test_unconfined_the_environment_is_still_the_allowlist_but_the_parents_is_in_reach(
    tmp_path, host_secrets
):
    async def main() -> None:
        sandbox = await started(tmp_path, "none")
        try:
            assert not sandbox.confined
            assert not {"clean_env", "lifetime"} & ProcessProvider(confine="none").capabilities
            own = await sandbox.exec("env")
            assert leaked(own.stdout, host_secrets) == [] and "DOCKER_HOST" not in own.stdout
            # what confinement is for: unconfined, the parent's environment (as this process started) is one file
            # away, DOCKER_HOST and all
            parent = await sandbox.exec("cat /proc/$PPID/environ | tr '\\0' '\\n'")
            assert f"DOCKER_HOST={os.environ['DOCKER_HOST']}" in parent.stdout.split("\n")
        finally:
            await sandbox.stop()

    run(main())


@pytest.mark.usefixtures("confined_here")
def test_a_confined_command_sees_only_its_own_sandboxs_processes(tmp_path):
    async def main() -> None:
        first = await started(tmp_path / "a")
        second = await started(tmp_path / "b")
        try:
            await first.exec("sleep 300 >/dev/null 2>&1 &")
            seen = await second.exec("ps -eo pid=,args=")
            processes = dict(line.strip().split(None, 1) for line in seen.stdout.strip().split("\n"))
            # pid 1 (the holder's shell) holds the namespace; then ps itself: nothing else
            assert processes.pop("1").startswith(f"{shutil.which('bash')} -c trap")
            assert sorted(processes.values()) == ["ps -eo pid=,args="]  # bash execs a lone command
            assert str(os.getpid()) not in (await second.exec("ls /proc")).stdout.split()
        finally:
            await first.stop()
            await second.stop()

    run(main())


@pytest.mark.usefixtures("confined_here")
def test_the_docker_socket_is_out_of_reach_wherever_it_lies(tmp_path, home_dir, monkeypatch):
    async def main() -> None:
        engine = os.environ["DOCKER_HOST"].removeprefix("unix://")
        # a second engine socket where /tmp and /run being private would not hide it: DOCKER_HOST names it
        elsewhere = home_dir / "docker.sock"
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(elsewhere))
        listener.listen(8)
        try:
            for host in (f"unix://{engine}", f"unix://{elsewhere}"):
                monkeypatch.setenv("DOCKER_HOST", host)
                sandbox = await started(tmp_path / uuid.uuid4().hex[:6])
                try:
                    for path in (host.removeprefix("unix://"), "/var/run/docker.sock", "/run/docker.sock"):
                        said = await sandbox.exec(["python3", "-c", CONNECT, path])
                        assert said.stdout.startswith("refused"), (path, said)
                    assert (await sandbox.exec("ls -A /run /tmp")).stdout.split() == ["/run:", "/tmp:"]
                finally:
                    await sandbox.stop()
            unconfined = await started(tmp_path / "none", "none")  # the way out that confinement closes
            try:
                said = await unconfined.exec(["python3", "-c", CONNECT, str(elsewhere)])
                assert said.stdout.strip() == "connected"
            finally:
                await unconfined.stop()
        finally:
            listener.close()

    run(main())


@pytest.mark.usefixtures("confined_here")
def test_writes_outside_the_sandbox_fail_and_its_tmp_is_its_own(tmp_path, home_dir):
    async def main() -> None:
        on_host = tmp_path / f"made-by-the-host-{uuid.uuid4().hex[:6]}"
        on_host.write_text("host")
        name = f"platoon-confine-{uuid.uuid4().hex[:8]}"
        sandbox = await started(tmp_path / "s")
        try:
            for path in ("/etc/x", f"{home_dir}/x", "/usr/x", f"{os.environ['HOME']}/x", "/var/x"):
                tried = await sandbox.exec(f"touch {path}")
                assert tried.exit_code != 0 and "Read-only file system" in tried.stderr, path
            assert not (home_dir / "x").exists() and not Path("/etc/x").exists()
            assert (await sandbox.exec(f"cat {on_host}")).exit_code != 0  # the host's /tmp is not there
            # nor any file of the host's through the descriptors of the namespace's holder
            links = (await sandbox.exec("readlink /proc/1/fd/* /proc/2/fd/*")).stdout.split()
            assert links and all(link.startswith(("pipe:", "anon_inode:", "/dev/null")) for link in links), (
                links
            )
            assert (await sandbox.exec(f"echo mine > /tmp/{name} && echo x > /var/tmp/{name}")).ok
            assert not Path(f"/tmp/{name}").exists() and not Path(f"/var/tmp/{name}").exists()
            assert (sandbox.fs / "tmp" / name).read_text() == "mine\n"
            # a confined command may do in its sandbox what it could in a container: delete its workdir
            assert (await sandbox.exec("rm -rf /app && mkdir /data && echo d > /data/f", cwd="/")).ok
            assert not (sandbox.fs / "app").exists() and (sandbox.fs / "data" / "f").read_text() == "d\n"
            assert (
                await sandbox.exec("mount -t tmpfs none /data", cwd="/")
            ).exit_code != 0  # no capabilities
        finally:
            await sandbox.stop()
        assert on_host.read_text() == "host"

    run(main())


@pytest.mark.usefixtures("confined_here")
def test_a_symlink_the_agent_leaves_never_steers_platoons_writes_onto_the_host(tmp_path, home_dir):
    async def main() -> None:
        mounted = tmp_path / "mounted"
        mounted.mkdir()
        payload = tmp_path / "payload.txt"
        payload.write_text("from platoon")
        sandbox = await started(
            tmp_path / "s", mounts=[Mount(str(mounted), "/app/sub/data", read_only=False)]
        )
        try:
            # links to a directory of the host's, and the mount's parent moved aside for one
            plant = f"ln -s {home_dir} /app/evil && mv /app/sub /app/sub2 && ln -s {home_dir} /app/sub"
            assert (await sandbox.exec(plant)).ok
            with pytest.raises(SandboxError):
                await sandbox.upload(payload, "/app/evil/payload.txt")
            await sandbox.kill_processes()
            assert (
                await sandbox.exec("echo still > /app/sub2/data/y")
            ).ok  # the mount stayed where it was made
            # a snapshot holds the link; restoring it may fail over the mount made where the link is, never follow it
            snapshot = await sandbox.snapshot()
            with contextlib.suppress(OSError):
                spec = SandboxSpec(mounts=[Mount(str(mounted), "/app/sub/data", read_only=False)])
                await (await ProcessProvider(scratch_root=str(tmp_path / "r")).restore(snapshot, spec)).stop()
            snapshot.discard()
        finally:
            await sandbox.stop()
        assert list(home_dir.iterdir()) == []  # nothing of platoon's landed on the host through a link
        assert (mounted / "y").read_text() == "still\n"

    run(main())


@pytest.mark.usefixtures("confined_here")
def test_processes_live_across_commands_and_kill_processes_leaves_none_however_they_hide(tmp_path):
    async def main() -> None:
        sandbox = await started(tmp_path)
        try:
            serve = "python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 &"
            # a server one command starts is there for the next, as in a container
            assert (await sandbox.exec(serve)).ok
            await sandbox.exec(
                "for i in $(seq 100); do ps -eo args= | grep -q '^python3 -m http' && break; sleep 0.1; done"
            )
            assert "http.server" in (await sandbox.exec("ps -eo args=")).stdout
            # one that drops every marker: a new session and an empty environment
            assert (await sandbox.exec("setsid env -i /bin/sleep 301 >/dev/null 2>&1 &")).ok
            assert len(sandbox.process_ids()) >= 2
            await sandbox.kill_processes()
            assert sandbox.process_ids() == []
            left = (await sandbox.exec("ps -eo args=")).stdout
            assert "sleep" not in left and "http.server" not in left
        finally:
            await sandbox.stop()
        assert sandbox.process_ids() == [] and not sandbox.root.exists()

    run(main())


OWNER = """
import asyncio, sys
from platoon.sandbox import SandboxSpec
from platoon_sandbox.process import ProcessProvider

async def main():
    sandbox = await ProcessProvider(scratch_root=sys.argv[1]).start(SandboxSpec(labels={"platoon.run": "r"}))
    await sandbox.exec("setsid env -i /bin/sleep 300 >/dev/null 2>&1 &")
    print(sandbox.root, sandbox.process_ids()[0], flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


@pytest.mark.usefixtures("confined_here")
def test_a_confined_sandboxs_processes_die_with_their_owner_and_a_reap_takes_the_rest(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        root, sleeper = owner.stdout.readline().split()
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert procs.wait_gone([int(sleeper)], 30.0) == [], "the sandbox's process outlived its owner"
        assert asyncio.run(ProcessProvider(scratch_root=str(tmp_path)).reap({"platoon.run": "r"})) == 1
        assert not Path(root).exists()
    finally:
        owner.kill()
        owner.wait()


@pytest.mark.usefixtures("confined_here")
def test_network_none_and_confinement_together(tmp_path, unix_upstream):
    if netns.unavailable() is not None:
        pytest.fail(f"no network namespace here: {netns.unavailable()}")

    async def main() -> None:
        sandbox = await started(tmp_path, network="none", upstreams={"gateway": unix_upstream})
        try:
            seen = await sandbox.exec(
                ["python3", "-c", "import socket; print([n for _, n in socket.if_nameindex()])"]
            )
            assert seen.stdout.strip() == "['lo']"
            get = f"import urllib.request; print(urllib.request.urlopen('{sandbox.routes['gateway']}/x').read())"
            assert (await sandbox.exec(["python3", "-c", get])).stdout.strip() == "b'hello from the host: /x'"
            result = await sandbox.exec("sleep 300 & sleep 301", timeout_s=1.5)
            assert result.timed_out and sandbox.process_ids() == []
        finally:
            await sandbox.stop()
        assert sandbox.process_ids() == [] and not sandbox.root.exists()

    run(main())


def test_without_bubblewrap_one_warning_and_confine_bwrap_refuses(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(netns.BWRAP_ENV, str(tmp_path / "no-such-bwrap"))
    monkeypatch.setattr(process_module, "_warned", False)
    assert "not an executable" in (confine.unavailable() or "")
    assert not {"clean_env", "lifetime"} & ProcessProvider.capabilities

    async def main() -> None:
        provider = ProcessProvider(scratch_root=str(tmp_path / "s"))
        for _ in range(2):
            sandbox = await provider.start(SandboxSpec())
            assert not sandbox.confined
            await sandbox.stop()
        with pytest.raises(SandboxError, match=r"confine: bwrap, but PLATOON_BWRAP=.* is not an executable"):
            await ProcessProvider(scratch_root=str(tmp_path / "s"), confine="bwrap").start(SandboxSpec())

    with caplog.at_level("WARNING", logger="platoon_sandbox.process"):
        run(main())
    warnings = [r.getMessage() for r in caplog.records if r.name == "platoon_sandbox.process"]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "isolates nothing" in warnings[0] and "Docker socket" in warnings[0]
    assert "apt-get install bubblewrap" in warnings[0]
    refusal = ProcessProvider.unconfined_refusal({})
    assert refusal is not None and "provider_options.confine: none" in refusal
    assert ProcessProvider.unconfined_refusal({"confine": "none"}) is None
    with pytest.raises(ConfigError, match=r"provider_options\.confine: bwrap .* or none"):
        ProcessProvider(confine="off")


DOCKER_IMAGE = "docker://platoon-test/busybox"


@pytest.mark.parametrize("path", ["engine-api", "cli"])
def test_a_docker_sandbox_gets_none_of_the_hosts_variables(tmp_path, host_secrets, path):
    binary = shutil.which(docker_binary())
    if binary is None or subprocess.run([binary, "info"], capture_output=True).returncode != 0:
        pytest.fail(f"no Docker engine answers at DOCKER_HOST={os.environ.get('DOCKER_HOST')}", pytrace=False)
    cli = tmp_path / "docker-cli"  # a name other than `docker`: the provider runs commands through the CLI
    cli.symlink_to(binary)
    provider = DockerProvider(binary=str(cli)) if path == "cli" else DockerProvider()
    set_process_labels(LABELS)

    async def main() -> None:
        assert (await provider.engine() is None) == (path == "cli")
        sandbox = await provider.start(SandboxSpec(image=DOCKER_IMAGE, network="none", env={"MODE": "test"}))
        try:
            every = 'env; cat /proc/[0-9]*/environ 2>/dev/null | tr "\\0" "\\n"'
            seen = await sandbox.exec(["sh", "-c", every], env={"EXTRA": "given"})  # busybox: sh, no bash
            assert "MODE=test" in seen.stdout and "EXTRA=given" in seen.stdout
            assert leaked(seen.stdout, host_secrets) == [] and "DOCKER_HOST" not in seen.stdout
        finally:
            await sandbox.stop()

    run(main())
    assert "clean_env" in DockerProvider.capabilities


def test_the_holder_is_ready_only_once_every_mount_is_made(tmp_path):
    """A mount bwrap cannot make (below a file) fails the start with bwrap's own words, and leaves nothing."""
    if confine.unavailable() is not None:
        pytest.fail(f"process sandboxes cannot be confined here: {confine.unavailable()}")
    blocker = tmp_path / "file"
    blocker.write_text("")

    async def main() -> None:
        with pytest.raises(SandboxError, match="bubblewrap could not confine the sandbox: bwrap: "):
            await started(tmp_path, mounts=[Mount(str(blocker), "/tests"), Mount(str(tmp_path), "/tests/x")])

    run(main())
    assert list((tmp_path / f"platoon-sandboxes-{os.getuid()}").iterdir()) == []


def _pid_inside(pid: int) -> int:
    """A host process's pid in its own (innermost) PID namespace."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[-1])


@pytest.mark.usefixtures("confined_here")
def test_a_command_cannot_end_its_own_sandbox_but_a_killed_init_is_said(tmp_path):
    """An agent that ends its sandbox would make its episode the untrainable `sandbox_gone` instead of its score:
    every signal to the namespace's init, and SIGKILL to every other process, leave the sandbox running (an orphan is
    still reaped). The init killed from outside the sandbox (the host) ends it, and the sandbox says so."""

    async def main() -> None:
        sandbox = await started(tmp_path)
        try:
            signals = "KILL TERM INT HUP QUIT STOP USR1 USR2 PIPE ALRM"
            await sandbox.exec(f"for s in {signals}; do kill -$s 1; done; kill -9 -1; exit 0")
            assert (await sandbox.exec("echo alive")).stdout == "alive\n"
            await sandbox.exec("sleep 0.1 &")  # orphaned as its shell exits
            # gone, not a zombie: polled until no `sleep` is left (a zombie keeps its name in /proc/<pid>/stat)
            count = "cat /proc/[0-9]*/stat 2>/dev/null | grep -c '(sleep) ' || true"
            deadline = time.monotonic() + 30.0  # a hang guard
            while int((await sandbox.exec(count)).stdout.strip() or 0) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert (await sandbox.exec(count)).stdout.strip() == "0"
            assert sandbox._confinement is not None
            (init,) = [pid for pid in sandbox._confinement.holder_pids() if _pid_inside(pid) == 1]
            os.kill(init, signal.SIGKILL)  # from the host: outside the namespace
            assert procs.wait_gone([init, *sandbox.process_ids()], 30.0) == []
            with pytest.raises(SandboxGone, match="the init of its PID namespace exited"):
                await sandbox.exec("true")
        finally:
            await sandbox.stop()
        assert not sandbox.root.exists()

    run(main())
