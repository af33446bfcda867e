"""Filtered egress of `public` and `allowlist` sandboxes on the docker and process providers, with a
real Docker engine, slirp4netns, nftables and bubblewrap: what each policy reaches and what it is refused (at once,
with a reset), the gateway route under every policy, raw frames held by the filter too, and no slirp4netns left
after a stop, a reap, a failed or cancelled start, or a killed run.

"The outside" cannot be relied on in CI, so an allowed destination is played by a server on the host's loopback that
the provider's `egress_allow` (the site profile's option) names; reaching the package registry, which CI has, is
tested on its own (marked `registry`).

They need a Docker engine (`.ci/docker-engine start`), slirp4netns, nftables and bubblewrap, and root; outside CI a
host without them skips the process-provider half, in CI it fails.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import ipaddress
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon.sandbox import Mount, SandboxError, SandboxSpec
from platoon_sandbox import egress
from platoon_sandbox.docker import DockerProvider, docker_binary
from platoon_sandbox.process import ProcessProvider
from platoon_sandbox.registry import clear_process_labels

PYTHON_IMAGE = "docker://platoon-test/python:bookworm"
BUSYBOX_IMAGE = "docker://platoon-test/busybox"
LABELS = {"platoon.test": f"egress-{uuid.uuid4().hex[:12]}"}
#: `docker+runsc`: gVisor, whose public and allowlist sandboxes run under the engine's egress runtime
PROVIDERS = ("docker", "docker+runsc", "process")


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(autouse=True)
def _fresh_labels() -> Iterator[None]:
    clear_process_labels()
    yield
    clear_process_labels()


@pytest.fixture(scope="module")
def docker_engine() -> Iterator[None]:
    binary = docker_binary()
    if shutil.which(binary) is None or subprocess.run([binary, "info"], capture_output=True).returncode != 0:
        pytest.fail(
            f"no Docker engine answers at DOCKER_HOST={os.environ.get('DOCKER_HOST', '(unset)')}: run "
            "`.ci/docker-engine start` and source the env file it prints",
            pytrace=False,
        )
    yield
    left = subprocess.run(
        [binary, "ps", "--all", "--quiet", "--filter", f"label=platoon.test={LABELS['platoon.test']}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    if left:
        subprocess.run([binary, "rm", "--force", *left], capture_output=True)
        pytest.fail(f"the tests left {len(left)} container(s) behind", pytrace=False)


@pytest.fixture
def kind(request: pytest.FixtureRequest) -> str:
    """The provider under test: docker needs the engine; process needs filtered egress here (bubblewrap,
    slirp4netns, nftables, root), skipped without it outside CI only."""
    name = str(request.param)
    if name.startswith("docker"):
        request.getfixturevalue("docker_engine")
    elif (why := egress.process_unavailable()) is not None:
        if os.environ.get("CI"):
            pytest.fail(f"public process sandboxes get no filtered egress here: {why}", pytrace=False)
        pytest.skip(f"no filtered egress for process sandboxes here: {why}")
    return name


def provider(kind: str, tmp_path: Path, **options: Any) -> Any:
    if kind == "docker":
        return DockerProvider(**options)
    if kind == "docker+runsc":
        return DockerProvider(runtime="runsc", **options)
    return ProcessProvider(scratch_root=str(tmp_path / "scratch"), **options)


def spec(kind: str, **kwargs: Any) -> SandboxSpec:
    image = kwargs.pop("image", PYTHON_IMAGE if kind.startswith("docker") else "local")
    return SandboxSpec(image=image, labels={**LABELS, **kwargs.pop("labels", {})}, **kwargs)


by_provider = pytest.mark.parametrize("kind", PROVIDERS, indirect=True)


class Greeter:
    """A TCP server on the host that greets every connection with one line and counts them."""

    def __init__(self, host: str = "127.0.0.1", greeting: str = "hello") -> None:
        self.greeting = greeting
        self.accepted = 0
        self._server = socket.create_server((host, 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.sendall(f"{self.greeting}\n".encode())

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def greeters() -> Iterator[dict[str, Greeter]]:
    """`allowed` and `other` on the host's 127.0.0.1; `everywhere` on 0.0.0.0 (every address of the host)."""
    made = {
        "allowed": Greeter("127.0.0.1", "allowed"),
        "other": Greeter("127.0.0.1", "other"),
        "everywhere": Greeter("0.0.0.0", "everywhere"),
    }
    yield made
    for greeter in made.values():
        greeter.close()


def own_addresses() -> list[str]:
    """The host's own non-loopback IPv4 addresses (what a public sandbox must not reach), from the kernel's table
    of local addresses."""
    lines = Path("/proc/net/fib_trie").read_text().splitlines()
    found = {
        lines[i - 1].split("--")[-1].strip()
        for i, line in enumerate(lines)
        if line.strip() == "/32 host LOCAL" and i > 0
    }
    return sorted(a for a in found if not ipaddress.IPv4Address(a).is_loopback)


# Inside the sandbox: connect to each host:port and say what happened (the greeting, or the errno's name).
PROBE = textwrap.dedent(
    """
    import errno, json, socket, sys
    out = {}
    for target in sys.argv[1:]:
        host, port = target.rsplit(":", 1)
        s = socket.socket()
        s.settimeout(30)
        try:
            s.connect((host, int(port)))
            out[target] = "greeted " + s.recv(64).decode().strip()
        except socket.timeout:
            out[target] = "timeout"
        except OSError as e:
            out[target] = errno.errorcode.get(e.errno, str(e.errno))
        finally:
            s.close()
    print(json.dumps(out))
    """
)

#: Never reachable from public or allowlist: cloud metadata, private, CGNAT, link-local.
FORBIDDEN = ["169.254.169.254:80", "10.1.2.3:80", "172.16.0.1:80", "192.168.0.1:80", "100.64.0.1:80"]


async def probe(sandbox: Any, *targets: str) -> dict[str, str]:
    result = await sandbox.exec(["python3", "-c", PROBE, *targets], timeout_s=240)
    assert result.exit_code == 0, result
    return dict(json.loads(result.stdout))


def slirp_children() -> list[int]:
    """The running (not zombie) slirp4netns processes this test process started."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if name == "slirp4netns" and rest[0] != "Z" and int(rest[1]) == os.getpid():
            found.append(int(entry.name))
    return found


# --- what each policy reaches -----------------------------------------------------------------------------------


@by_provider
def test_public_reaches_what_the_site_allows_and_nothing_of_the_host(
    kind: str, tmp_path: Path, greeters: dict[str, Greeter]
) -> None:
    allowed, other, everywhere = greeters["allowed"], greeters["other"], greeters["everywhere"]
    hosts = own_addresses()
    for address in hosts:  # from the host itself these answer: the refusals below are the filter's
        with socket.create_connection((address, everywhere.port), timeout=10) as conn:
            assert conn.recv(64) == b"everywhere\n"
    reached_before = everywhere.accepted

    async def go() -> None:
        sandbox = await provider(kind, tmp_path, egress_allow=[f"127.0.0.1:{allowed.port}"]).start(
            spec(kind, network="public")
        )
        try:
            seen = await probe(
                sandbox,
                f"10.0.2.2:{allowed.port}",
                f"10.0.2.2:{other.port}",
                f"127.0.0.1:{other.port}",
                *(f"{address}:{everywhere.port}" for address in hosts),
                *FORBIDDEN,
            )
        finally:
            await sandbox.stop()
        # the host's loopback port the site named, at 10.0.2.2; everything else refused at once, with a reset
        assert seen.pop(f"10.0.2.2:{allowed.port}") == "greeted allowed"
        assert set(seen.values()) == {"ECONNREFUSED"}, seen

    run(go())
    assert other.accepted == 0 and everywhere.accepted == reached_before


@by_provider
def test_allowlist_reaches_only_its_hosts(kind: str, tmp_path: Path, greeters: dict[str, Greeter]) -> None:
    allowed, other = greeters["allowed"], greeters["other"]
    # the site opens both loopback ports; the task lists only one of them
    site = {"egress_allow": [f"127.0.0.1:{allowed.port}", f"127.0.0.1:{other.port}"]}

    async def go() -> None:
        listed = await provider(kind, tmp_path, **site).start(
            spec(kind, network="allowlist", allowed_hosts=[f"127.0.0.1:{allowed.port}"])
        )
        unlisted = await provider(kind, tmp_path, **site).start(spec(kind, network="allowlist"))
        try:
            targets = [f"10.0.2.2:{allowed.port}", f"10.0.2.2:{other.port}", *FORBIDDEN]
            seen = await probe(listed, *targets)
            assert seen.pop(f"10.0.2.2:{allowed.port}") == "greeted allowed"
            assert set(seen.values()) == {"ECONNREFUSED"}, seen
            # an empty allowlist reaches nothing but DNS
            assert set((await probe(unlisted, *targets)).values()) == {"ECONNREFUSED"}
        finally:
            await asyncio.gather(listed.stop(), unlisted.stop())

    run(go())
    assert other.accepted == 0


@by_provider
def test_a_private_allowed_host_stays_refused_unless_the_site_allows_it(
    kind: str, tmp_path: Path, greeters: dict[str, Greeter]
) -> None:
    """A task cannot open the host's loopback (or a private address) by listing it: only the site can."""
    allowed = greeters["allowed"]

    async def go() -> None:
        sandbox = await provider(kind, tmp_path).start(
            spec(kind, network="allowlist", allowed_hosts=[f"127.0.0.1:{allowed.port}", "10.1.2.3"])
        )
        try:
            seen = await probe(sandbox, f"10.0.2.2:{allowed.port}", "10.1.2.3:80")
        finally:
            await sandbox.stop()
        assert seen == {f"10.0.2.2:{allowed.port}": "ECONNREFUSED", "10.1.2.3:80": "ECONNREFUSED"}

    run(go())
    assert allowed.accepted == 0


@by_provider
def test_none_reaches_nothing(kind: str, tmp_path: Path, greeters: dict[str, Greeter]) -> None:
    allowed = greeters["allowed"]

    async def go() -> None:
        sandbox = await provider(kind, tmp_path, egress_allow=[f"127.0.0.1:{allowed.port}"]).start(
            spec(kind, network="none")
        )
        try:
            seen = await probe(sandbox, f"10.0.2.2:{allowed.port}", f"127.0.0.1:{allowed.port}", *FORBIDDEN)
        finally:
            await sandbox.stop()
        assert seen.pop(f"127.0.0.1:{allowed.port}") == "ECONNREFUSED"  # its own loopback, empty
        # no route: gVisor's own network stack says so with EHOSTUNREACH
        assert set(seen.values()) == {"EHOSTUNREACH" if kind == "docker+runsc" else "ENETUNREACH"}, seen

    run(go())
    assert allowed.accepted == 0


GET = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1] + '/v1/models', timeout=30).read().decode())"


@pytest.mark.parametrize("network", ["none", "public", "allowlist"])
@by_provider
def test_the_gateway_is_reached_through_its_route_under_every_policy(
    kind: str, network: str, tmp_path: Path, unix_upstream: str
) -> None:
    async def go() -> None:
        sandbox = await provider(kind, tmp_path).start(
            spec(kind, network=network, upstreams={"gateway": unix_upstream})
        )
        try:
            assert sandbox.routes == {"gateway": "http://127.0.0.1:18080"}
            got = await sandbox.exec(["python3", "-c", GET, sandbox.routes["gateway"]], timeout_s=120)
            assert got.stdout == "hello from the host: /v1/models\n", got
        finally:
            await sandbox.stop()

    run(go())


# --- the filter holds against the sandbox -----------------------------------------------------------------------

# Inside a docker sandbox: a TCP SYN written as a raw Ethernet frame on tap0 (past the socket layer's output hook) to
# each host:port; prints, per target, "answered <flags>", "dropped <errno>" (the send was refused) or "silent".
RAW_SYN = textwrap.dedent(
    """
    import errno, json, socket, struct, sys, time
    def checksum(b):
        b += b"\\0" * (len(b) % 2)
        t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
        t = (t >> 16) + (t & 0xFFFF)
        return ~(t + (t >> 16)) & 0xFFFF
    try:
        raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    except OSError as e:  # no CAP_NET_RAW (EPERM); gVisor's hostinet has no packet sockets (EAFNOSUPPORT)
        print(json.dumps("no raw sockets: " + errno.errorcode.get(e.errno, str(e.errno)))); sys.exit(0)
    raw.bind(("tap0", 0))
    raw.settimeout(0.5)
    mac = raw.getsockname()[4]
    src = socket.inet_aton("10.0.2.100")
    out = {}
    for n, target in enumerate(sys.argv[1:]):
        host, port = target.rsplit(":", 1)
        dst = socket.inet_aton(host)
        tcp = struct.pack("!HHIIBBHHH", 40000 + n, int(port), 1, 0, 5 << 4, 0x02, 64240, 0, 0)
        tcp = tcp[:16] + struct.pack("!H", checksum(src + dst + struct.pack("!BBH", 0, 6, len(tcp)) + tcp)) + tcp[18:]
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), n, 0, 64, 6, 0, src, dst)
        ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
        try:
            raw.send(bytes.fromhex("52550a000202") + mac + b"\\x08\\x00" + ip + tcp)
        except OSError as e:
            out[target] = "dropped " + errno.errorcode.get(e.errno, str(e.errno))
            continue
        out[target] = "silent"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                frame = raw.recv(65535)
            except socket.timeout:
                continue
            if frame[12:14] == b"\\x08\\x00" and frame[23] == 6 and frame[26:30] == dst and frame[36:38] == tcp[0:2]:
                out[target] = "answered %#x" % frame[47]
                break
    print(json.dumps(out))
    """
)


by_runtime = pytest.mark.parametrize("runtime", [None, "runsc"], ids=["runc", "runsc"])


@by_runtime
@pytest.mark.usefixtures("docker_engine")
def test_raw_frames_cannot_go_around_the_filter(
    runtime: str | None, tmp_path: Path, greeters: dict[str, Greeter]
) -> None:
    """With docker's default capabilities a sandbox holds CAP_NET_RAW: frames it writes on a packet socket skip the
    output hook, and the table on tap0's egress hook must drop them. Without CAP_NET_RAW (platoon drops it), and under
    gVisor (whose hostinet has no packet sockets), there is no socket to write them with."""
    allowed, other = greeters["allowed"], greeters["other"]

    async def go() -> Any:
        sandbox = await DockerProvider(runtime=runtime, egress_allow=[f"127.0.0.1:{allowed.port}"]).start(
            spec("docker", network="public")
        )
        try:
            result = await sandbox.exec(
                [
                    "python3",
                    "-c",
                    RAW_SYN,
                    f"10.0.2.2:{allowed.port}",
                    f"10.0.2.2:{other.port}",
                    "169.254.169.254:80",
                ],
                timeout_s=240,
            )
        finally:
            await sandbox.stop()
        assert result.exit_code == 0, result
        return json.loads(result.stdout)

    seen = run(go())
    if isinstance(seen, str):
        assert seen == ("no raw sockets: EAFNOSUPPORT" if runtime == "runsc" else "no raw sockets: EPERM")
        return
    # the allowed destination answers a raw SYN (SYN-ACK): the raw path works, so the refusals below are the filter's
    assert seen.pop(f"10.0.2.2:{allowed.port}") == "answered 0x12"
    assert set(seen.values()) == {"dropped ENOBUFS"}, seen
    assert other.accepted == 0


# Inside the sandbox: what it holds, then two ways to change its network: set tap0 down (an ioctl) and delete the
# egress table (an nftables batch on a netfilter netlink socket, what `nft delete table` sends).
CHANGE_NETWORK = textwrap.dedent(
    """
    import errno, fcntl, socket, struct
    caps = int([l for l in open("/proc/self/status") if l.startswith("CapEff:")][0].split()[1], 16)
    print("net_admin" if caps & (1 << 12) else "no net_admin")
    def refused(e):
        return "refused " + errno.errorcode.get(e.errno, str(e.errno))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"tap0", 0))  # SIOCSIFFLAGS: tap0 down
        print("tap0 down")
    except OSError as e:
        print(refused(e))
    def message(kind, flags, seq, body):
        return struct.pack("=LHHLL", 16 + len(body), kind, flags, seq, 0) + body
    name = b"platoon_egress\\0"
    attr = struct.pack("=HH", 4 + len(name), 1) + name + b"\\0" * (-len(name) % 4)  # NFTA_TABLE_NAME
    nftables = struct.pack("=BBH", 0, 0, socket.htons(10))  # NFNL_SUBSYS_NFTABLES
    batch = (
        message(16, 1, 1, nftables)  # batch begin
        + message((10 << 8) | 2, 1 | 4, 2, struct.pack("=BBH", 1, 0, 0) + attr)  # NFT_MSG_DELTABLE, inet
        + message(17, 1, 3, nftables)  # batch end
    )
    try:
        n = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)  # NETLINK_NETFILTER
        n.settimeout(30)
        n.send(batch)
        reply = n.recv(65536)
        code = struct.unpack_from("=i", reply, 16)[0] if struct.unpack_from("=H", reply, 4)[0] == 2 else 0
        print("table deleted" if code == 0 else "refused " + errno.errorcode.get(-code, str(code)))
    except OSError as e:
        print(refused(e))
    """
)


def namespace_state(container: str) -> str:
    """tap0's link and the rule set of a container's network namespace, read from the host."""
    pid = subprocess.run(
        [docker_binary(), "inspect", "--format", "{{.State.Pid}}", container],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    enter = ["nsenter", f"--target={pid}", "--net", "--"]
    link = subprocess.run([*enter, "ip", "-o", "link", "show", "tap0"], capture_output=True, text=True)
    rules = subprocess.run([*enter, "nft", "list", "ruleset"], capture_output=True, text=True)
    assert link.returncode == 0 and rules.returncode == 0, (link, rules)
    return link.stdout + rules.stdout


@by_runtime
@pytest.mark.usefixtures("docker_engine")
def test_a_docker_sandbox_cannot_change_its_network(runtime: str | None) -> None:
    """The rules live in the container's own namespace; changing them (or tap0) needs CAP_NET_ADMIN, which no
    sandbox holds, and gVisor's hostinet passes neither the ioctl nor netfilter netlink through. The host sees the
    namespace as it was."""

    async def go() -> tuple[list[str], str, str]:
        sandbox = await DockerProvider(runtime=runtime).start(spec("docker", network="public"))
        try:
            before = namespace_state(sandbox.name)
            result = await sandbox.exec(["python3", "-c", CHANGE_NETWORK])
            after = namespace_state(sandbox.name)
        finally:
            await sandbox.stop()
        assert result.exit_code == 0, result
        return result.stdout.splitlines(), before, after

    said, before, after = run(go())
    assert ",UP," in before and "table inet platoon_egress" in before
    assert after == before
    expected = (
        ["refused ENOTTY", "refused EPROTONOSUPPORT"]
        if runtime == "runsc"
        else ["refused EPERM", "refused EPERM"]
    )
    assert said == ["no net_admin", *expected]


# --- slirp4netns lives exactly as long as its sandbox -----------------------------------------------------------


@by_provider
def test_no_slirp4netns_is_left_after_a_stop_or_a_reap(kind: str, tmp_path: Path) -> None:
    async def go() -> None:
        made = provider(kind, tmp_path)
        stopped = await made.start(spec(kind, network="public"))
        assert len(slirp_children()) == 1
        await stopped.stop()
        assert slirp_children() == []
        labels = {"platoon.task": uuid.uuid4().hex}
        reaped = await made.start(spec(kind, network="allowlist", labels=labels))
        assert len(slirp_children()) == 1
        assert await made.reap({**LABELS, **labels}) == 1
        assert slirp_children() == []
        await reaped.stop()  # the live object of a reaped sandbox: stopping it again is harmless

    run(go())


@pytest.mark.usefixtures("docker_engine")
def test_a_failed_docker_start_leaves_no_slirp4netns(unix_upstream: str) -> None:
    """busybox has no Python for the route's forwarder: the start fails after the egress was attached."""

    async def go() -> None:
        with pytest.raises(SandboxError, match="no Python"):
            await DockerProvider().start(
                spec("docker", network="public", image=BUSYBOX_IMAGE, upstreams={"gateway": unix_upstream})
            )

    run(go())
    assert slirp_children() == []


@pytest.mark.parametrize("delay_s", [0.05, 0.2, 0.4])
@by_provider
def test_a_cancelled_start_leaves_no_slirp4netns(kind: str, delay_s: float, tmp_path: Path) -> None:
    async def go() -> None:
        start = asyncio.ensure_future(provider(kind, tmp_path).start(spec(kind, network="public")))
        await asyncio.sleep(delay_s)
        start.cancel()
        try:
            sandbox = await start
        except asyncio.CancelledError:
            return
        await sandbox.stop()  # it won the race: started before the cancel

    run(go())
    assert slirp_children() == []


KILLED_RUN = textwrap.dedent(
    """
    import asyncio, json, sys
    from platoon.sandbox import SandboxSpec
    from platoon_sandbox.docker import DockerProvider
    from platoon_sandbox.process import ProcessProvider

    async def main():
        kind, labels, scratch = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
        if kind.startswith("docker"):
            made = DockerProvider(runtime="runsc" if kind == "docker+runsc" else None)
            image = "docker://platoon-test/python:bookworm"
        else:
            made, image = ProcessProvider(scratch_root=scratch), "local"
        sandbox = await made.start(SandboxSpec(image=image, network="public", labels=labels))
        print(sandbox._egress.pid, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


@by_provider
def test_a_killed_run_leaves_no_slirp4netns(kind: str, tmp_path: Path) -> None:
    """slirp4netns lives on a pipe its run holds: SIGKILL the run and it exits; the run's reap removes the rest."""
    labels = {**LABELS, "platoon.task": uuid.uuid4().hex}
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, kind, json.dumps(labels), str(tmp_path / "scratch")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        slirp = int(child.stdout.readline())
        watch = os.pidfd_open(slirp)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    try:
        ready, _, _ = select.select([watch], [], [], 60)  # a pidfd turns readable when its process exits
    finally:
        os.close(watch)
    assert ready, "slirp4netns outlived its killed run"
    assert run(provider(kind, tmp_path).reap(labels)) == 1


# --- options and refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["localhost"], "one port at a time"),
        (["127.0.0.1"], "one port at a time"),
        (["*.example.com"], "wildcard cannot be enforced"),
        (["https://pypi.org"], "no scheme"),
        (["pypi.org:99999"], "port '99999'"),
        ("pypi.org", "must be a list"),
    ],
)
def test_bad_egress_allow_entries_are_refused_in_one_line(entries: Any, message: str, tmp_path: Path) -> None:
    for make in (DockerProvider, lambda **o: ProcessProvider(scratch_root=str(tmp_path), **o)):
        with pytest.raises(SandboxError, match=message):
            make(egress_allow=entries)


@pytest.mark.usefixtures("docker_engine")
def test_runsc_needs_its_egress_runtime_and_says_which_in_one_line() -> None:
    """The engine `.ci/docker-engine` starts lists runsc-hostinet; a missing egress runtime refuses public and
    allowlist sandboxes (never none) before anything starts, naming the daemon.json entry to add."""
    assert DockerProvider.network_public_refusal({"runtime": "runsc"}) is None
    options = {"runtime": "runsc", "egress_runtime": "no-such-hostinet"}
    refusal = DockerProvider.network_public_refusal(options)
    assert refusal is not None and "\n" not in refusal
    assert '\'no-such-hostinet\', which it does not list: add "no-such-hostinet": {"path": ' in refusal
    assert DockerProvider.network_allowlist_refusal(options) == refusal
    made = DockerProvider(runtime="runsc", egress_runtime="no-such-hostinet")
    with pytest.raises(SandboxError) as refused:
        run(made.start(spec("docker", network="public")))
    assert str(refused.value) == refusal
    with pytest.raises(SandboxError, match="egress_runtime option applies with runtime: runsc only"):
        DockerProvider(egress_runtime="runsc-hostinet")


@pytest.mark.usefixtures("docker_engine")
def test_a_public_runsc_sandbox_runs_under_the_egress_runtime_and_a_none_one_does_not() -> None:
    async def go() -> dict[str, str]:
        made = DockerProvider(runtime="runsc")
        public, offline = await asyncio.gather(
            made.start(spec("docker", network="public")), made.start(spec("docker", network="none"))
        )
        try:
            return {
                box.spec.network: subprocess.run(
                    [docker_binary(), "inspect", "--format", "{{.HostConfig.Runtime}}", box.name],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.strip()
                for box in (public, offline)
            }
        finally:
            await asyncio.gather(public.stop(), offline.stop())

    assert run(go()) == {"public": "runsc-hostinet", "none": "runsc"}


def test_missing_tools_are_refusals_before_any_start() -> None:
    assert DockerProvider.network_public_refusal({}) is None  # slirp4netns, nft, nsenter and root are here
    assert "one port at a time" in (
        DockerProvider.network_public_refusal({"egress_allow": ["localhost"]}) or ""
    )


def test_the_process_provider_has_filtered_egress_here_or_says_why() -> None:
    why = egress.process_unavailable()
    if why is None:
        assert {"network_public", "network_allowlist"} <= ProcessProvider.capabilities
        assert ProcessProvider.network_public_refusal({}) is None
    else:
        assert "network_public" not in ProcessProvider.capabilities
        assert "allow_host_network: true" in (ProcessProvider.network_public_refusal({}) or "")
    assert ProcessProvider.network_public_refusal({"allow_host_network": True}) is None


def test_an_allowlist_pins_names_and_maps_the_hosts_loopback_to_slirps_host_side() -> None:
    plan = egress.plan(
        "allowlist", ["localhost:8080", "127.0.0.1:9", "10.9.9.9"], ["127.0.0.1:8080", "10.9.9.9:443"]
    )
    # 127.0.0.1:9 is not opened by the site; 10.9.9.9 only on the port the site opened
    assert [str(d) for d in plan.accepted] == ["10.0.2.2:8080", "10.9.9.9:443"]
    assert plan.pinned == {"localhost": ("10.0.2.2",)} and plan.host_loopback
    public = egress.plan("public", egress_allow=["10.9.9.9"])
    assert [str(d) for d in public.accepted] == ["10.9.9.9"] and not public.host_loopback
    assert ipaddress.IPv4Network("169.254.0.0/16") in public.refused
    with pytest.raises(SandboxError, match=r"cannot resolve 'no-such-host\.invalid'"):
        egress.plan("allowlist", ["no-such-host.invalid"])


# --- the package registry (CI reaches it) -----------------------------------------------------------------------


def _index() -> tuple[str, str]:
    """The package index the host's pip uses (PIP_INDEX_URL, else PyPI), and its host name."""
    url = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    host = url.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1].split(":")[0]
    return url, host


def _host_reaches(host: str) -> bool:
    try:
        socket.create_connection((host, 443), timeout=10).close()
    except OSError:
        return False
    return True


@pytest.mark.registry
@pytest.mark.slow
@pytest.mark.parametrize("network", ["public", "allowlist"])
@by_runtime
@pytest.mark.usefixtures("docker_engine")
def test_pip_downloads_a_package_in_a_public_or_allowlist_docker_sandbox(
    network: str, runtime: str | None
) -> None:
    """A task that installs its test runner at test time: pip (the interpreter's bundled wheel, run from the zip)
    downloads one small package through the sandbox's filtered egress, trusting the host's CA bundle."""
    index, host = _index()
    if not _host_reaches(host) and not os.environ.get("CI"):
        pytest.skip(f"this host cannot reach the package index {host}")
    wheel = next(
        p for p in (importlib.resources.files("ensurepip") / "_bundled").iterdir() if "pip-" in p.name
    )
    ca = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    mounts = [Mount(str(wheel), "/opt/pip.whl"), Mount(ca, "/etc/platoon-ca.crt")]
    allowed = [host, "files.pythonhosted.org"] if network == "allowlist" else []
    # a mirror on a private address is reached only where the site's egress_allow names it
    private = any(
        not ipaddress.ip_address(a[4][0]).is_global for a in socket.getaddrinfo(host, 443, socket.AF_INET)
    )

    async def go() -> Any:
        made = DockerProvider(runtime=runtime, egress_allow=[host] if private else None)
        sandbox = await made.start(spec("docker", network=network, allowed_hosts=allowed, mounts=mounts))
        try:
            pip = ["python3", "/opt/pip.whl/pip", "download", "--no-deps", "--disable-pip-version-check"]
            got = await sandbox.exec(
                [
                    *pip,
                    "--cert",
                    "/etc/platoon-ca.crt",
                    "--index-url",
                    index,
                    "--dest",
                    "/tmp/dl",
                    "six==1.16.0",
                ],
                timeout_s=300,
            )
            # Python, not ls: this runsc release fails coreutils 9's statx (docs/sandboxes.md, gVisor)
            listed = await sandbox.exec(["python3", "-c", "import os; print(*os.listdir('/tmp/dl'))"])
        finally:
            await sandbox.stop()
        return got, listed

    got, listed = run(go())
    assert got.exit_code == 0, got
    assert listed.stdout.split() == ["six-1.16.0-py2.py3-none-any.whl"]
