"""The process provider, with real processes: exec, timeouts that kill the tree, output caps,
copies, stop and a failed start leaving nothing behind. Every test runs twice: confined by bubblewrap (the default
where it works; then commands see sandbox paths as they are) and with `confine: none` (paths translated).
What confinement itself keeps out is test_process_confine.py's."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from platoon.sandbox import OUTPUT_CAP_BYTES, ExecResult, Mount, SandboxError, SandboxSpec
from platoon_sandbox.process import ProcessProvider, ProcessSandbox
from platoon_sandbox.procs import start_time
from platoon_sandbox.registry import clear_process_labels, registry

#: `provider_options.confine` of every sandbox a test starts (set per run by `_confine_mode`)
MODE = "bwrap"


@pytest.fixture(autouse=True)
def _fresh_labels() -> Iterator[None]:
    clear_process_labels()
    yield
    clear_process_labels()


@pytest.fixture(autouse=True, params=["bwrap", "none"])
def _confine_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "MODE", request.param)


def provider(scratch: Path) -> ProcessProvider:
    return ProcessProvider(scratch_root=str(scratch), confine=MODE)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def gone(pid: int) -> bool:
    """Gone, or a zombie nobody waited for (it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def leftovers(sandbox: ProcessSandbox) -> list[int]:
    """What its commands started that still runs: by its marker, and, confined, in its PID namespace."""
    return sandbox.process_ids()


def inside(sandbox: ProcessSandbox, path: str) -> str:
    """`path` as a command sees it: itself when confined, else translated to the host's."""
    return path if sandbox.confined else sandbox.translate(path)


def host_pid(sandbox: ProcessSandbox, shown: int) -> int:
    """The host's pid of a process a command reported (`$!`: the PID namespace's own number when confined)."""
    if not sandbox.confined:
        return shown
    for pid in sandbox.process_ids():
        with open(f"/proc/{pid}/status") as handle:
            numbers = next(line for line in handle if line.startswith("NSpid:")).split()[1:]
        if int(numbers[-1]) == shown:
            return pid
    raise AssertionError(f"no process {shown} in sandbox {sandbox.root.name}")


async def runs_inside(sandbox: ProcessSandbox, pid: int) -> bool:
    """Whether the process a command reported as `pid` still runs (a zombie does not), asked in the sandbox."""
    stat = (await sandbox.exec(f"cat /proc/{pid}/stat 2>/dev/null")).stdout
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] != "Z"


async def started(tmp_path: Path, **spec: object) -> ProcessSandbox:
    return await provider(tmp_path).start(SandboxSpec(**spec))  # type: ignore[arg-type]


def test_the_root_holds_fs_and_a_record_with_labels_owner_and_start_time(tmp_path: Path):
    async def main() -> None:
        sandbox = await started(tmp_path, labels={"platoon.task": "t1"})
        assert sandbox.root.parent == tmp_path / f"platoon-sandboxes-{os.getuid()}"
        assert sandbox.root.name.startswith("process-") and len(sandbox.root.name) == len("process-") + 12
        meta = json.loads((sandbox.root / "sandbox.json").read_text())
        assert meta["labels"] == {"platoon.task": "t1"}
        assert (meta["owner_pid"], meta["owner_start"]) == (os.getpid(), start_time(os.getpid()))
        for mapped in ("app", "tests", "logs", "solution", "tmp"):
            assert (sandbox.fs / mapped).is_dir()
        await sandbox.stop()

    run(main())


def test_exec_strings_argv_env_cwd_and_stdin_with_paths_translated(tmp_path: Path):
    async def main() -> None:
        sandbox = await started(tmp_path, env={"DATA": "/app/data.txt"})
        try:
            result = await sandbox.exec("echo hi > /app/x.txt && cat /app/x.txt && pwd")
            assert result == ExecResult(0, f"hi\n{inside(sandbox, '/app')}\n", "")
            assert (sandbox.fs / "app" / "x.txt").read_text() == "hi\n"
            argv = await sandbox.exec(
                ["python3", "-c", "import sys, os; print(sys.argv[1], os.getcwd())", "/tmp/y"], cwd="/logs"
            )
            assert argv.stdout == f"{inside(sandbox, '/tmp/y')} {inside(sandbox, '/logs')}\n"
            env = await sandbox.exec(
                'printf "%s|" "$DATA" "$EXTRA" "$PLATOON_SANDBOX_ROOT" "$TMPDIR"', env={"EXTRA": "/tests/a"}
            )
            assert env.stdout.split("|")[:-1] == [
                inside(sandbox, "/app/data.txt"),
                inside(sandbox, "/tests/a"),
                "" if sandbox.confined else str(sandbox.fs),  # scripts prefix paths with it: nothing to add
                inside(sandbox, "/tmp"),
            ]
            assert (await sandbox.exec("cat", stdin="from stdin")).stdout == "from stdin"
            assert (await sandbox.exec(["cat"], stdin=b"bytes")).stdout == "bytes"
            failed = await sandbox.exec("echo oops >&2; exit 3")
            assert (failed.exit_code, failed.stderr, failed.ok) == (3, "oops\n", False)
            # a path that only starts like a mapped root is not one, nor one after ~, a variable or a URL's host
            kept = ["/application", "/usr/bin", "~/app", "${X}/app", "http://h/app", "/app.txt"]
            assert (await sandbox.exec(["echo", *kept])).stdout == " ".join(kept) + "\n"
            assert (
                sandbox.translate("A=/app:/tests/b '/logs'")
                == f"A={sandbox.fs}/app:{sandbox.fs}/tests/b '{sandbox.fs}/logs'"
            )
            assert (await sandbox.exec(["no-such-program-xyz"])).exit_code == 127
        finally:
            await sandbox.stop()

    run(main())


def test_a_cwd_that_cannot_be_entered_raises_the_oserror(tmp_path: Path):
    async def main() -> None:
        sandbox = await started(tmp_path)
        try:
            with pytest.raises(FileNotFoundError):
                await sandbox.exec("true", cwd="/app/missing")
            await sandbox.exec("mkdir -p /app/sub")
            assert (await sandbox.exec("pwd", cwd="sub")).stdout == inside(
                sandbox, "/app/sub"
            ) + "\n"  # the workdir's
        finally:
            await sandbox.stop()

    run(main())


def test_a_timeout_kills_the_whole_tree_even_a_grandchild_in_another_session(tmp_path: Path):
    async def main() -> None:
        sandbox = await started(tmp_path)
        try:
            script = (
                "sleep 300 & echo $! > /tmp/child; "
                "setsid sleep 301 & echo $! > /tmp/escaped; "
                'python3 -c \'import os, time; os.setsid(); open(os.environ["TMPDIR"] + "/grand", "w").write(str(os.getpid())); time.sleep(300)\' & '
                "wait"
            )
            result = await sandbox.exec(script, timeout_s=1.5)
            assert result.timed_out and result.exit_code == 137 and not result.ok
            for name in ("child", "escaped", "grand"):
                pid = int((sandbox.fs / "tmp" / name).read_text())
                assert not await runs_inside(sandbox, pid), name
        finally:
            await sandbox.stop()

    run(main())


def test_output_is_capped_per_stream_with_a_note_and_background_pipes_are_not_waited_for(tmp_path: Path):
    async def main() -> None:
        sandbox = await started(tmp_path)
        try:
            extra = 12345
            result = await sandbox.exec(
                f"head -c {OUTPUT_CAP_BYTES + extra} /dev/zero | tr '\\0' a; echo err >&2"
            )
            assert result.stdout == "a" * OUTPUT_CAP_BYTES + f"\n[{extra} bytes of output dropped]\n"
            assert result.stderr == "err\n"
            # a background child keeps stdout open: the command's result comes after the drain window anyway
            held = await sandbox.exec("echo before; sleep 30 &")
            assert (held.exit_code, held.stdout) == (0, "before\n")
        finally:
            await sandbox.stop()

    run(main())


def test_copies_round_trip_files_directories_symlinks_and_50_mb(tmp_path: Path):
    async def main() -> None:
        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        (src / "a.txt").write_text("a")
        (src / "sub" / "b.bin").write_bytes(b"\0\1\2")
        (src / "link").symlink_to("a.txt")
        big = tmp_path / "big.bin"
        big.write_bytes(os.urandom(50 * 1024 * 1024))
        sandbox = await started(tmp_path / "scratch")
        try:
            await sandbox.upload(src, "/app/tree")
            await sandbox.upload(big, "/app/big.bin")
            await sandbox.upload(src / "a.txt", "/tests/one.txt")
            listing = await sandbox.exec(
                "cd /app/tree && find . | sort && readlink link && sha256sum < /app/big.bin"
            )
            digest = hashlib.sha256(big.read_bytes()).hexdigest()
            assert listing.stdout == f".\n./a.txt\n./link\n./sub\n./sub/b.bin\na.txt\n{digest}  -\n"
            out = tmp_path / "out"
            await sandbox.download("/app/tree", out / "tree")
            await sandbox.download("/app/big.bin", out / "big.bin")
            await sandbox.download("/tests/one.txt", out / "one.txt")
            assert (out / "tree" / "sub" / "b.bin").read_bytes() == b"\0\1\2"
            assert os.readlink(out / "tree" / "link") == "a.txt"
            assert (out / "big.bin").read_bytes() == big.read_bytes()
            assert (out / "one.txt").read_text() == "a"
            with pytest.raises(FileNotFoundError):
                await sandbox.download("/app/missing", out / "missing")
        finally:
            await sandbox.stop()

    run(main())


def test_mounts_show_their_sources_at_their_targets(tmp_path: Path):
    async def main() -> None:
        data, out = tmp_path / "data", tmp_path / "out"
        data.mkdir()
        out.mkdir()
        (data / "x").write_text("mounted")
        mounts = [Mount(str(data), "/opt/data"), Mount(str(out), "/app/out", read_only=False)]
        sandbox = await started(tmp_path / "scratch", mounts=mounts)
        try:
            assert (await sandbox.exec("cat /opt/data/x")).stdout == "mounted"
            assert (await sandbox.exec("echo written > /app/out/y")).ok
            assert (out / "y").read_text() == "written\n"
            await sandbox.upload(data / "x", "/app/out/z")
            await sandbox.download("/opt/data/x", tmp_path / "back")
            assert (out / "z").read_text() == (tmp_path / "back").read_text() == "mounted"
            if sandbox.confined:  # bound as asked: a read-only mount is read-only
                assert not (await sandbox.exec("echo no > /opt/data/x")).ok
            else:  # links to the sources, which the translated paths lead to
                assert os.readlink(sandbox.fs / "opt" / "data") == str(data)
        finally:
            await sandbox.stop()
        assert (data / "x").read_text() == "mounted"  # stopping removes the mount, never the source

    run(main())


def test_stop_leaves_no_process_and_no_directory_and_is_idempotent(tmp_path: Path):
    async def main() -> None:
        sandbox = await started(tmp_path)
        child = host_pid(sandbox, int((await sandbox.exec("sleep 300 >/dev/null 2>&1 & echo $!")).stdout))
        escaped = host_pid(
            sandbox, int((await sandbox.exec("setsid sleep 300 >/dev/null 2>&1 & echo $!")).stdout)
        )
        assert leftovers(sandbox)
        await sandbox.stop()
        await sandbox.stop()
        assert gone(child) and gone(escaped)
        assert not leftovers(sandbox) and not sandbox.root.exists()
        assert sandbox not in [e.sandbox for e in registry().live]
        with pytest.raises(SandboxError, match="has stopped"):
            await sandbox.exec("true")

    run(main())


def test_kill_processes_keeps_the_sandbox(tmp_path: Path):
    async def main() -> None:
        sandbox = await started(tmp_path)
        try:
            await sandbox.exec("echo kept > /app/f; sleep 300 >/dev/null 2>&1 &")
            await sandbox.kill_processes()
            assert not leftovers(sandbox)
            assert (await sandbox.exec("cat /app/f")).stdout == "kept\n"
        finally:
            await sandbox.stop()

    run(main())


def test_a_start_that_fails_leaks_nothing(tmp_path: Path):
    async def main() -> None:
        before = len(registry().live)
        blocker = tmp_path / "file"
        blocker.write_text("")
        # the second mount's parent is the first, a file (a link to it when unconfined): the start fails half-way
        with pytest.raises((OSError, SandboxError)):
            await started(tmp_path, mounts=[Mount(str(blocker), "/tests"), Mount(str(tmp_path), "/tests/x")])
        base = tmp_path / f"platoon-sandboxes-{os.getuid()}"
        assert [p.name for p in base.iterdir()] == []
        assert len(registry().live) == before

    run(main())


def test_snapshot_and_restore_copy_the_filesystem(tmp_path: Path):
    async def main() -> None:
        chosen = provider(tmp_path)
        sandbox = await chosen.start(SandboxSpec())
        await sandbox.exec("echo state > /app/s")
        snap = await sandbox.snapshot()
        await sandbox.stop()
        restored = await chosen.restore(snap, SandboxSpec())
        try:
            assert (await restored.exec("cat /app/s")).stdout == "state\n"
        finally:
            await restored.stop()
            snap.discard()

    run(main())


def test_routes_tcp_upstreams_are_their_own_and_unix_ones_on_the_host_network_get_none(tmp_path: Path):
    async def main() -> None:
        sandbox = await started(
            tmp_path, upstreams={"model": "http://127.0.0.1:9", "mcp": "unix:///x/y.sock"}
        )
        try:
            assert sandbox.routes == {"model": "http://127.0.0.1:9"}
            await sandbox.ensure_routes()
        finally:
            await sandbox.stop()
        assert ProcessProvider.isolates is False
        # the network guarantees, clean_env and lifetime only where bubblewrap (and slirp4netns) work
        # (test_process_netns.py, test_egress.py, test_process_confine.py)
        where_bwrap = {"network_none", "network_public", "network_allowlist", "clean_env", "lifetime"}
        assert provider(tmp_path).capabilities - where_bwrap == {"snapshot", "routes", "host_loopback"}
        assert stat.S_IMODE(os.stat(sandbox.root.parent).st_mode) == 0o700

    run(main())


CLIENT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"ping"); s.shutdown(socket.SHUT_WR)
print(s.recv(100).decode())
"""


def test_a_network_none_sandbox_reaches_a_unix_socket_upstream_through_a_forwarder(tmp_path: Path):
    async def main() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"pong:" + await reader.read())
            await writer.drain()
            writer.close()

        sock_dir = tmp_path / "gw"
        sock_dir.mkdir()
        server = await asyncio.start_unix_server(echo, path=str(sock_dir / "gw.sock"))
        sandbox = await started(
            tmp_path / "s", network="none", upstreams={"model": f"unix://{sock_dir}/gw.sock"}
        )
        try:
            route = sandbox.routes["model"]
            assert route.startswith("http://127.0.0.1:")
            port = route.rsplit(":", 1)[1]
            assert os.readlink(sandbox.root / "sockets" / "model") == str(
                sock_dir
            )  # out of the commands' reach
            assert (await sandbox.exec(["python3", "-c", CLIENT, port])).stdout == "pong:ping\n"
            await sandbox.kill_processes()  # spares the forwarder
            assert (await sandbox.exec(["python3", "-c", CLIENT, port])).stdout == "pong:ping\n"
            forwarder = int((sandbox.root / "routes" / "model.pid").read_text())
            os.kill(forwarder, 9)
            await asyncio.sleep(0.1)
            await sandbox.ensure_routes()  # restarted on the same port
            assert sandbox.routes["model"] == route
            assert (await sandbox.exec(["python3", "-c", CLIENT, port])).stdout == "pong:ping\n"
            forwarder = int((sandbox.root / "routes" / "model.pid").read_text())
        finally:
            await sandbox.stop()
            server.close()
        assert gone(forwarder) and not leftovers(sandbox)

    run(main())


def test_a_command_that_never_reads_a_large_stdin_still_times_out(tmp_path: Path):
    async def main() -> None:
        sandbox = await started(tmp_path)
        try:
            result = await sandbox.exec("sleep 300", stdin=b"x" * (4 * 1024 * 1024), timeout_s=1)
            assert result.timed_out and not leftovers(sandbox)
        finally:
            await sandbox.stop()

    run(main())


def test_the_first_start_says_once_and_plainly_that_nothing_is_isolated(tmp_path, caplog, monkeypatch):
    import platoon_sandbox.process as process_module

    monkeypatch.setattr(process_module, "_warned", False)

    async def go() -> None:
        chosen = provider(tmp_path)
        for _ in range(2):
            sandbox = await chosen.start(SandboxSpec())
            await sandbox.stop()

    with caplog.at_level("WARNING", logger="platoon_sandbox.process"):
        asyncio.run(go())
    warnings = [r.getMessage() for r in caplog.records if r.name == "platoon_sandbox.process"]
    assert len(warnings) == 1
    if MODE == "bwrap":
        assert "does not isolate" in warnings[0] and "with its files readable" in warnings[0]
    else:  # the network, and no bwrap at all: test_process_netns, test_process_confine
        assert "unconfined (provider_options confine: none)" in warnings[0]
        assert "its processes' environments and its Docker socket in reach" in warnings[0]
