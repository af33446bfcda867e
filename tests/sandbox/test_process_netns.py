"""`network: none` process sandboxes in a network namespace of their own (issue 18),
with real bubblewrap, nsenter and processes: only `lo`, no host listener in reach, the gateway through a
forwarder on 127.0.0.1:18080, timeouts and stop that leave nothing (no namespace either); and the fallback without
bubblewrap, which is today's host-network behaviour said once, loudly.

They need bubblewrap (`apt-get install bubblewrap`; .ci/run installs it). Without bwrap they skip, except under CI
(`CI` set), where they fail; with a bwrap that cannot make a namespace they fail, saying why.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import platoon_sandbox.process as process_module
from platoon.sandbox import Mount, SandboxSpec
from platoon_sandbox import netns
from platoon_sandbox.process import ProcessProvider, ProcessSandbox
from platoon_sandbox.procs import pids_with_marker
from platoon_sandbox.registry import clear_process_labels

# Skipped only where bwrap is absent outside CI; a bwrap that is there but fails makes them fail, with its reason.
_skip_without_bwrap = pytest.mark.skipif(
    netns.bwrap_binary() is None and not os.environ.get("CI"),
    reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap (CI installs it and never skips these)",
)


@pytest.fixture
def namespace_here() -> None:
    reason = netns.unavailable()
    assert reason is None, f"network: none process sandboxes get no namespace here: {reason}"


def needs_netns(test):  # type: ignore[no-untyped-def]
    return _skip_without_bwrap(pytest.mark.usefixtures("namespace_here")(test))


HOST_NET = os.readlink("/proc/self/ns/net")

# Inside the sandbox: the interfaces, the network namespace, and whether a host port on 127.0.0.1 answers.
PROBE = """
import json, os, socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5).close()
    reached = True
except OSError:
    reached = False
print(json.dumps({"interfaces": [n for _, n in socket.if_nameindex()], "ns": os.readlink("/proc/self/ns/net"),
                  "reached": reached}))
"""

GET = """
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1] + "/hello", timeout=10).read().decode())
"""


@pytest.fixture(autouse=True)
def _fresh_labels() -> Iterator[None]:
    clear_process_labels()
    yield
    clear_process_labels()


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP listener on the host's 127.0.0.1 (the kernel completes connects from its backlog)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield server.getsockname()[1]


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"{self.server.name} says hello at {self.path}".encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:  # quiet, and a Unix peer has no address to log
        pass


@pytest.fixture
def unix_http(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Two HTTP servers on Unix sockets in host directories: name -> unix:// URL."""
    servers = {}
    for name in ("gateway", "mcp"):
        directory = tmp_path / f"{name}-dir"
        directory.mkdir()
        server = socketserver.ThreadingUnixStreamServer(str(directory / f"{name}.sock"), _Hello)
        server.name = name  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers[name] = server
    yield {name: f"unix://{server.server_address}" for name, server in servers.items()}
    for server in servers.values():
        server.shutdown()
        server.server_close()


def namespace_users(ns: str) -> list[int]:
    """Every process whose network namespace is `ns`, and this process if it still holds a descriptor to it."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/ns/net") == ns and int(entry.name) != os.getpid():
                    found.append(int(entry.name))
            except OSError:
                pass
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == ns:
                found.append(os.getpid())
        except OSError:
            pass
    return found


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def started(tmp_path: Path, **spec: object) -> ProcessSandbox:
    # unconfined: the network namespace alone (with bubblewrap's confinement too: test_process_confine.py)
    provider = ProcessProvider(scratch_root=str(tmp_path), confine="none")
    return await provider.start(SandboxSpec(**spec))  # type: ignore[arg-type]


@needs_netns
def test_network_none_sees_only_lo_and_no_host_listener_while_a_host_network_sandbox_does(
    tmp_path: Path, host_listener: int
):
    async def main() -> None:
        closed = await started(tmp_path, network="none")
        open_ = await started(tmp_path)
        try:
            seen = json.loads((await closed.exec(["python3", "-c", PROBE, str(host_listener)])).stdout)
            assert seen["interfaces"] == ["lo"] and seen["ns"] != HOST_NET and seen["reached"] is False
            # a string command too, and lo is up: the sandbox can listen and connect on its own loopback
            loop = await closed.exec(
                'python3 -c \'import socket; s = socket.create_server(("127.0.0.1", 0)); '
                'socket.create_connection(s.getsockname()).close(); print("lo up")\''
            )
            assert loop.stdout == "lo up\n"
            host = json.loads((await open_.exec(["python3", "-c", PROBE, str(host_listener)])).stdout)
            assert host["ns"] == HOST_NET and host["reached"] is True
            assert json.loads((closed.root / "sandbox.json").read_text())["network_namespace"] is True
            # each network: none sandbox has its own
            other = await started(tmp_path, network="none")
            try:
                assert (await other.exec(["readlink", "/proc/self/ns/net"])).stdout.strip() not in (
                    seen["ns"],
                    HOST_NET,
                )
            finally:
                await other.stop()
        finally:
            await closed.stop()
            await open_.stop()
        assert "network_none" in ProcessProvider.capabilities

    asyncio.run(main())


@needs_netns
def test_forwarders_on_18080_and_18081_reach_unix_socket_http_upstreams_in_host_dirs(
    tmp_path: Path, unix_http: dict[str, str]
):
    async def main() -> None:
        sandbox = await started(tmp_path / "s", network="none", upstreams=unix_http)
        try:
            # in name order: gateway, then mcp
            assert sandbox.routes == {"gateway": "http://127.0.0.1:18080", "mcp": "http://127.0.0.1:18081"}
            for name, route in sandbox.routes.items():
                got = await sandbox.exec(["python3", "-c", GET, route])
                assert got.stdout == f"{name} says hello at /hello\n", got
            forwarder = int((sandbox.root / "routes" / "gateway.pid").read_text())
            sandbox_ns = (await sandbox.exec(["readlink", "/proc/self/ns/net"])).stdout.strip()
            assert os.readlink(f"/proc/{forwarder}/ns/net") == sandbox_ns != HOST_NET
            await sandbox.kill_processes()  # spares the forwarders
            assert (await sandbox.exec(["python3", "-c", GET, sandbox.routes["mcp"]])).ok
            os.kill(forwarder, 9)
            await asyncio.sleep(0.1)
            await sandbox.ensure_routes()  # restarted in the namespace, on the same port
            assert sandbox.routes["gateway"] == "http://127.0.0.1:18080"
            again = await sandbox.exec(["python3", "-c", GET, sandbox.routes["gateway"]])
            assert again.stdout == "gateway says hello at /hello\n"
        finally:
            await sandbox.stop()
        assert namespace_users(sandbox_ns) == []

    asyncio.run(main())


@needs_netns
def test_a_timeout_kills_the_whole_tree_inside_the_namespace(tmp_path: Path):
    async def main() -> None:
        sandbox = await started(tmp_path, network="none")
        try:
            script = (
                "readlink /proc/self/ns/net > /tmp/ns; "
                "sleep 300 & echo $! > /tmp/child; "
                "setsid sleep 301 & echo $! > /tmp/escaped; "
                "wait"
            )
            result = await sandbox.exec(script, timeout_s=1.5)
            assert result.timed_out and result.exit_code == 137
            ns = (sandbox.fs / "tmp" / "ns").read_text().strip()
            assert ns != HOST_NET
            for name in ("child", "escaped"):
                assert gone(int((sandbox.fs / "tmp" / name).read_text())), name
            assert namespace_users(ns) == [os.getpid()]  # only the sandbox's own descriptor holds it
        finally:
            await sandbox.stop()

    asyncio.run(main())


@needs_netns
def test_stop_leaves_no_process_no_namespace_and_no_directory(tmp_path: Path, unix_http: dict[str, str]):
    async def main() -> None:
        sandbox = await started(tmp_path, network="none", upstreams={"gateway": unix_http["gateway"]})
        ns = (await sandbox.exec(["readlink", "/proc/self/ns/net"])).stdout.strip()
        child = int((await sandbox.exec("sleep 300 >/dev/null 2>&1 & echo $!")).stdout)
        escaped = int((await sandbox.exec("setsid sleep 300 >/dev/null 2>&1 & echo $!")).stdout)
        assert len(namespace_users(ns)) >= 4  # the two sleeps, the forwarder, our descriptor
        await sandbox.stop()
        await sandbox.stop()
        assert gone(child) and gone(escaped)
        assert namespace_users(ns) == []  # no holder process, no descriptor: the namespace is gone
        assert not pids_with_marker([f"PLATOON_SANDBOX_ROOT={sandbox.fs}".encode()])
        assert not sandbox.root.exists()

    asyncio.run(main())


@needs_netns
def test_a_failed_start_leaves_no_namespace(tmp_path: Path):
    async def main() -> None:
        before = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if _readable(fd)}
        blocker = tmp_path / "file"
        blocker.write_text("")
        with pytest.raises(OSError):  # the second mount's parent is a link to a file
            await started(
                tmp_path,
                network="none",
                mounts=[Mount(str(blocker), "/tests"), Mount(str(tmp_path), "/tests/x")],
            )
        after = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if _readable(fd)}
        assert not {link for link in after - before if link.startswith("net:")}

    asyncio.run(main())


def _readable(fd: str) -> bool:
    try:
        os.readlink(f"/proc/self/fd/{fd}")
        return True
    except OSError:
        return False


def test_without_bubblewrap_network_none_is_the_host_network_said_once_loudly(
    tmp_path: Path, host_listener: int, unix_http: dict[str, str], caplog, monkeypatch
):
    monkeypatch.setenv(netns.BWRAP_ENV, str(tmp_path / "no-such-bwrap"))
    monkeypatch.setattr(process_module, "_warned", False)
    assert "not an executable" in (netns.unavailable() or "")
    assert "network_none" not in ProcessProvider.capabilities

    async def main() -> None:
        provider = ProcessProvider(scratch_root=str(tmp_path / "s"))
        for _ in range(2):
            sandbox = await provider.start(SandboxSpec(network="none", upstreams=unix_http))
            try:
                seen = json.loads((await sandbox.exec(["python3", "-c", PROBE, str(host_listener)])).stdout)
                assert seen["ns"] == HOST_NET and seen["reached"] is True  # 5.2: not enforced
                ports = {int(route.rsplit(":", 1)[1]) for route in sandbox.routes.values()}
                assert len(ports) == 2  # free host loopback ports, and the gateway answers through them
                got = await sandbox.exec(["python3", "-c", GET, sandbox.routes["gateway"]])
                assert got.stdout == "gateway says hello at /hello\n"
                assert json.loads((sandbox.root / "sandbox.json").read_text())["network_namespace"] is False
            finally:
                await sandbox.stop()

    with caplog.at_level("WARNING", logger="platoon_sandbox.process"):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if r.name == "platoon_sandbox.process"]
    assert len(warnings) == 1
    said = warnings[0]
    assert "isolates nothing" in said and "network: none is not enforced" in said
    assert "not an executable" in said and "apt-get install bubblewrap" in said


def test_a_bwrap_that_cannot_make_namespaces_is_reported_not_used(tmp_path: Path, monkeypatch):
    """A bwrap that fails (as where user namespaces are off) gives a reason with its own words."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv(netns.BWRAP_ENV, str(fake))
    reason = netns.unavailable()
    assert reason is not None and "No permissions to create new namespace" in reason
    with pytest.raises(netns.NamespaceError):
        netns.NetNamespace.create()
