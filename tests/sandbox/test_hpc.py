"""The `singularity` and `enroot` providers: platoon's adapter over hpc-sandbox.

Neither Apptainer/Singularity nor enroot can be installed on the CI machine, so two kinds of fake
stand in, and nothing else is replaced:

- fake *binaries*: small scripts named `singularity`, `apptainer`, `enroot` (and `fuse-overlayfs`, `fusermount3`)
  put first on PATH, which record their argv and fail. With them the real hpc-sandbox providers run: availability,
  option handling, and a start that reaches the binary, fails, and leaves nothing registered;
- a fake *inner provider* (`FakeHpcProvider`) implementing hpc-sandbox's `SandboxProvider`/`Sandbox` protocol, put
  in place of `hpc_sandbox.SingularityProvider` through the adapter's `inner_class` attribute (the production code
  path is the same, only the class it constructs differs). Each of its sandboxes is a holder process in fresh
  user, mount, PID and network namespaces (`unshare`), with a session directory bound at /tmp; commands enter it
  with `nsenter`. That is enough for the adapter's own work to run for real: `bash -c`, transfers from `/`,
  snapshot deletion, labels and registration, the forwarder of a `network: none` route on 127.0.0.1:18080 inside
  a network namespace of its own, and `kill_processes` in a PID namespace of its own.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, ClassVar

import hpc_sandbox
import pytest

from platoon.sandbox import CAPABILITIES, SandboxError, SandboxGone, SandboxSpec
from platoon_sandbox import registry as registry_module
from platoon_sandbox.hpc import EnrootProvider, SingularityProvider, _cap
from platoon_sandbox.registry import SandboxRegistry, clear_process_labels, registry, set_process_labels


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture(autouse=True)
def _own_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SandboxRegistry]:
    """A registry of this test's own, no process labels from another test, and hpc-sandbox's scratch and image
    cache under tmp_path."""
    clear_process_labels()
    fresh = SandboxRegistry(tmp_path / "mirror" / "sandboxes.json")
    monkeypatch.setattr(registry_module, "_registry", fresh)
    monkeypatch.setenv("HPC_SANDBOX_SCRATCH", str(tmp_path / "hpc-scratch"))
    monkeypatch.setenv("HPC_SANDBOX_IMAGE_CACHE", str(tmp_path / "hpc-images"))
    monkeypatch.delenv("HPC_SANDBOX_ROOTFS_LAYOUT", raising=False)
    monkeypatch.delenv("PLATOON_SINGULARITY", raising=False)
    yield fresh
    clear_process_labels()


# -- fake binaries ---------------------------------------------------------------------------------------------


class FakeBins:
    """A directory of fake executables that append `<name> <argv...>` to a log and fail (or succeed)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "bin"
        self.dir.mkdir(parents=True)
        self.log = root / "calls.log"
        self.log.touch()

    def add(self, name: str, *, exit_code: int = 1, where: Path | None = None) -> Path:
        # The log path is written into the script: hpc-sandbox runs the binaries with an environment of its own.
        path = (where or self.dir) / name
        path.write_text(
            "#!/bin/sh\n"
            f"printf '%s\\n' \"{name} $*\" >> '{self.log}'\n"
            f"echo 'fake {name}: this is not a real runtime' >&2\n"
            f"exit {exit_code}\n"
        )
        path.chmod(0o755)
        return path

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture
def bins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeBins:
    """PATH holds only the fake binaries' directory and the system's tool directories (sh, cp, nsenter...)."""
    fake = FakeBins(tmp_path / "fakes")
    monkeypatch.setenv("PATH", f"{fake.dir}:/usr/sbin:/usr/bin:/sbin:/bin")
    return fake


def test_the_entry_points_name_the_providers() -> None:
    from platoon.plugins import get_sandbox_runtime, resolve_target

    assert resolve_target(get_sandbox_runtime("singularity").provider) is SingularityProvider
    assert resolve_target(get_sandbox_runtime("enroot").provider) is EnrootProvider
    assert SingularityProvider.isolates and EnrootProvider.isolates
    assert SingularityProvider.capabilities <= CAPABILITIES and EnrootProvider.capabilities <= CAPABILITIES


def test_the_adapter_module_imports_hpc_sandbox_only_when_a_provider_is_used() -> None:
    code = (
        "import sys, platoon_sandbox.hpc as h\n"
        "assert 'hpc_sandbox' not in sys.modules\n"
        "h.SingularityProvider.network_none_refusal({})\n"
        "assert 'hpc_sandbox' not in sys.modules\n"
        "h.EnrootProvider()\n"
        "assert 'hpc_sandbox' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_unavailable_names_the_extra_when_hpc_sandbox_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hpc_sandbox", None)  # what `import hpc_sandbox` meets without the extra
    for provider in (SingularityProvider, EnrootProvider):
        why = provider.unavailable({})
        assert why is not None
        assert "pip install 'platoon-sandbox[hpc]'" in why and "uv add 'platoon-sandbox[hpc]'" in why
        with pytest.raises(SandboxError, match=r"platoon-sandbox\[hpc\]"):
            provider()


def test_unavailable_without_a_runtime_on_path(bins: FakeBins) -> None:
    why = SingularityProvider.unavailable({})
    assert why is not None and "`singularity` or `apptainer` on PATH" in why
    why = EnrootProvider.unavailable({})
    assert why is not None and "`enroot` on PATH" in why


@pytest.mark.parametrize("name", ["singularity", "apptainer"])
def test_either_singularity_or_apptainer_on_path_makes_it_available(bins: FakeBins, name: str) -> None:
    bins.add(name)
    assert SingularityProvider.unavailable({}) is None
    assert EnrootProvider.unavailable({}) is not None
    bins.add("enroot")
    assert EnrootProvider.unavailable({}) is None


def test_a_given_binary_replaces_the_path_lookup(
    bins: FakeBins, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "opt"
    elsewhere.mkdir()
    apptainer = bins.add("my-apptainer", where=elsewhere)
    enroot = bins.add("my-enroot", where=elsewhere)
    assert SingularityProvider.unavailable({"binary": str(apptainer)}) is None
    assert EnrootProvider.unavailable({"binary": str(enroot)}) is None
    missing = SingularityProvider.unavailable({"binary": str(elsewhere / "nothing")})
    assert missing is not None and "nothing" in missing
    monkeypatch.setenv("PLATOON_SINGULARITY", str(apptainer))
    assert SingularityProvider.unavailable({}) is None
    monkeypatch.setenv("PLATOON_SINGULARITY", str(elsewhere / "gone"))
    why = SingularityProvider.unavailable({})
    assert why is not None and "gone" in why


def test_a_start_runs_the_real_hpc_sandbox_code_up_to_the_binary_and_leaks_nothing(
    bins: FakeBins, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "opt"
    elsewhere.mkdir()
    bins.add("singularity")
    bins.add("my-apptainer", where=elsewhere)
    bins.add("enroot")
    # Files that look like images to hpc-sandbox (their magic bytes), so that it goes on to run the binary.
    sif = tmp_path / "python.sif"
    sif.write_bytes(b"#!/usr/bin/env run-singularity\n".ljust(32) + b"SIF_MAGIC" + bytes(64))
    sqsh = tmp_path / "python.sqsh"
    sqsh.write_bytes(b"hsqs" + bytes(64))
    set_process_labels({"platoon.run": "/runs/r"})

    async def go() -> None:
        provider = SingularityProvider()
        assert isinstance(provider.inner, hpc_sandbox.SingularityProvider)
        with pytest.raises(SandboxError, match="fake singularity") as caught:
            await provider.start(SandboxSpec(image="docker://example/python:3"))
        assert isinstance(
            caught.value.__cause__, hpc_sandbox.SandboxError
        )  # hpc-sandbox's own, kept as cause
        with pytest.raises(SandboxError, match="not a valid SIF"):
            await provider.start(SandboxSpec(image=str(sif)))
        assert registry().live == [] and registry().records() == []

        monkeypatch.setenv("PLATOON_SINGULARITY", str(elsewhere / "my-apptainer"))
        with pytest.raises(SandboxError, match="not a valid SIF"):
            await SingularityProvider().start(SandboxSpec(image=str(sif)))

        enroot = EnrootProvider()
        assert isinstance(enroot.inner, hpc_sandbox.EnrootProvider)
        with pytest.raises(SandboxError, match="fake enroot"):
            await enroot.start(SandboxSpec(image=str(sqsh)))
        assert registry().live == []
        assert await enroot.reap({"platoon.run": "/runs/r"}) == 0  # hpc-sandbox's janitor finds nothing
        with pytest.raises(ValueError, match="empty label set"):
            await enroot.reap({})

    run(go())
    calls = bins.calls()
    assert calls[-4].startswith("singularity pull --force ") and calls[-4].endswith(
        " docker://example/python:3"
    )
    assert calls[-3:] == [
        f"singularity sif list {sif}",
        f"my-apptainer sif list {sif}",
        f"enroot create --name rootfs {sqsh}",
    ]


def test_capabilities_are_the_inner_ones_restricted_plus_routes_host_loopback_and_clean_env(
    bins: FakeBins,
) -> None:
    bins.add("singularity")
    bins.add("enroot")
    base = {
        "routes",
        "host_loopback",
        "clean_env",
    }  # hpc-sandbox starts its runtimes with a clean environment
    assert SingularityProvider().capabilities == base | {"snapshot", "isolation"}  # "pods" is not platoon's
    assert SingularityProvider(allow_network_none=True, gpu="nv").capabilities == base | {
        "snapshot",
        "isolation",
        "network_none",
        "gpu",
    }
    assert EnrootProvider().capabilities == base | {"snapshot", "isolation", "network_none"}
    assert EnrootProvider(allow_network_none=False).capabilities == base | {"snapshot", "isolation"}


def test_network_none_is_refused_before_any_start_unless_allowed(bins: FakeBins) -> None:
    bins.add("singularity")
    assert "allow_network_none: true" in (SingularityProvider.network_none_refusal({}) or "")
    assert SingularityProvider.network_none_refusal({"allow_network_none": True}) is None
    assert EnrootProvider.network_none_refusal({}) is None
    assert "allow_network_none: false" in (
        EnrootProvider.network_none_refusal({"allow_network_none": False}) or ""
    )

    async def go() -> None:
        with pytest.raises(SandboxError, match="allow_network_none: true"):
            await SingularityProvider().start(SandboxSpec(image="docker://example/x", network="none"))

    run(go())
    assert bins.calls() == [] and registry().live == []  # refused before the runtime was asked anything


def test_public_and_allowlist_are_refused_before_any_start_unless_the_host_network_is_allowed(
    bins: FakeBins,
) -> None:
    """hpc-sandbox knows only the host's network and none: it cannot filter egress."""
    bins.add("singularity")
    for provider in (SingularityProvider, EnrootProvider):
        refusal = provider.network_public_refusal({})
        assert refusal is not None and "allow_host_network: true" in refusal
        assert provider.network_allowlist_refusal({}) == refusal
        assert provider.network_public_refusal({"allow_host_network": True}) is None

    async def go() -> None:
        for network in ("public", "allowlist"):
            with pytest.raises(SandboxError, match="allow_host_network: true"):
                await SingularityProvider().start(SandboxSpec(image="docker://example/x", network=network))  # type: ignore[arg-type]

    run(go())
    assert bins.calls() == [] and registry().live == []  # refused before the runtime was asked anything


@pytest.mark.usefixtures("fake_inner")
def test_allow_host_network_runs_public_sandboxes_on_the_host_network_unfiltered(unix_upstream: str) -> None:
    async def go() -> None:
        # the option stays platoon's: the fake inner provider would refuse an unknown keyword
        provider = FakeEnroot(allow_host_network=True, egress_allow=["127.0.0.1:9"])
        sandbox = await provider.start(
            spec(network="allowlist", allowed_hosts=["pypi.org"], upstreams={"model": unix_upstream})
        )
        try:
            (inner,) = provider.inner.started
            assert inner.spec.network == "host"
            assert sandbox.routes == {}  # on the host network the gateway is reached on loopback, as before
        finally:
            await sandbox.stop()

    run(go())


def test_rootfs_layout_refusals(bins: FakeBins) -> None:
    refusal = SingularityProvider.rootfs_layout_refusal
    assert refusal({}) is None and refusal({"rootfs_layout": "copy"}) is None
    assert "copy or fuse-overlay" in (refusal({"rootfs_layout": "zfs"}) or "")
    for options, named in (
        ({"gpu": "nv"}, "gpu"),
        ({"cgroup_limits": True}, "cgroup_limits"),
        ({"extra_start_args": ["--fakeroot"]}, "--fakeroot"),
        ({"extra_start_args": ["-f"]}, "--fakeroot"),
        ({"rootfs_templates": False}, "rootfs_templates: false"),
    ):
        why = refusal({"rootfs_layout": "fuse-overlay", **options})
        assert why is not None and named in why, options
    missing = refusal({"rootfs_layout": "fuse-overlay"})
    assert missing is not None and "fuse-overlayfs" in missing and "fusermount3" in missing
    bins.add("fuse-overlayfs")
    assert "fusermount3" in (refusal({"rootfs_layout": "fuse-overlay"}) or "")
    bins.add("fusermount")  # the older name serves too
    assert refusal({"rootfs_layout": "fuse-overlay"}) is None

    bins.add("singularity")
    provider = SingularityProvider(rootfs_layout="fuse-overlay")
    assert provider.inner.rootfs_layout == "fuse-overlay"
    with pytest.raises(SandboxError, match="cgroup_limits"):
        SingularityProvider(rootfs_layout="fuse-overlay", cgroup_limits=True)
    # enroot drops the option (a site profile may set it for both runtimes); hpc-sandbox's enroot would refuse it
    bins.add("enroot")
    assert EnrootProvider.rootfs_layout_refusal({"rootfs_layout": "fuse-overlay"}) is None
    EnrootProvider(rootfs_layout="fuse-overlay")


def test_an_hpc_sandbox_without_layouts_refuses_any_explicit_layout() -> None:
    class Old(SingularityProvider):
        inner_class: ClassVar[str | type] = FakeHpcProviderWithoutLayouts

    why = Old.rootfs_layout_refusal({"rootfs_layout": "copy"})
    assert why is not None and "no rootfs layouts" in why
    assert Old.rootfs_layout_refusal({}) is None
    with pytest.raises(SandboxError, match="no rootfs layouts"):
        Old(rootfs_layout="copy")


def test_enroot_root_is_an_alias_of_remap_root(bins: FakeBins) -> None:
    bins.add("enroot")
    assert EnrootProvider().inner.remap_root is True
    assert EnrootProvider(root=False).inner.remap_root is False
    assert EnrootProvider(root=False).options == {"root": False}  # what a supervisor re-creates it from
    with pytest.raises(SandboxError, match="root or remap_root"):
        EnrootProvider(root=True, remap_root=True)


def test_output_is_capped_at_8_mib_counting_what_hpc_sandbox_cut(bins: FakeBins) -> None:
    from hpc_sandbox.process import DEFAULT_OUTPUT_LIMIT, BoundedOutput

    kept = BoundedOutput(DEFAULT_OUTPUT_LIMIT)  # hpc-sandbox's own capture: head and tail of 16 MiB
    kept.append(b"a" * (20 * 1024 * 1024))
    capped = _cap(kept.getvalue().decode())
    assert capped == "a" * (8 * 1024 * 1024) + f"\n[{12 * 1024 * 1024} bytes of output dropped]\n"
    assert _cap("short") == "short"


# -- a fake inner provider -------------------------------------------------------------------------------------

_HOLDER = r"""
set -e
s=$1; wd=$2; shift 2
# Everything the sandbox sees is staged in a private /run first: a source under the host's /tmp would be hidden
# once the session's tmp is bound there.
mount -t tmpfs fake-run /run
mkdir -p /run/.fake/tmp /run/.fake/var-tmp
mount --bind "$s/tmp" /run/.fake/tmp
mount --bind "$s/var-tmp" /run/.fake/var-tmp
i=0; for a in "$@"; do
  if [ $((i % 3)) = 1 ]; then mkdir -p "/run/.fake/m$i"; mount --bind "$a" "/run/.fake/m$i"; fi
  i=$((i + 1))
done
mount --bind /run/.fake/tmp /tmp
mount --bind /run/.fake/var-tmp /var/tmp
i=0; while [ $# -gt 0 ]; do
  mode=$1; dst=$3; shift 3
  mkdir -p "$dst"; mount --bind "/run/.fake/m$((i + 1))" "$dst"
  if [ "$mode" = ro ]; then mount -o remount,bind,ro "$dst"; fi
  i=$((i + 3))
done
ip link set lo up
mkdir -p "$wd"
echo ready
exec sleep infinity >/dev/null
"""

NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"  # absolute: a command's env may give another PATH

# What hpc-sandbox's prologue does about the working directory, in short.
_ENTER = (
    'cd -- "$1" 2>/dev/null || { printf "hpc-sandbox: cannot enter the working directory %s: it does not exist or '
    'cannot be reached\\n" "$1" >&2; exit 126; }; shift; exec "$@"'
)


class FakeHpcSandbox:
    """A FAKE hpc-sandbox `Sandbox` for tests (there is no Apptainer or enroot here): a holder process in new user,
    mount, PID and network namespaces whose /tmp and /var/tmp are the session's directories; `exec` enters them
    with nsenter. Workdirs and mount targets must lie under /tmp, /var/tmp or /run (the rest is the host's)."""

    def __init__(self, provider: FakeHpcProvider, spec: hpc_sandbox.SandboxSpec, session: Path) -> None:
        self.id = f"fake-{uuid.uuid4().hex[:12]}"
        self.spec = spec
        self.provider = provider
        self.session = session
        self.execs: list[list[str]] = []
        self.stopped = False
        self._holder: asyncio.subprocess.Process | None = None
        self.pid = 0

    async def boot(self) -> None:
        for mount in self.spec.mounts:
            if not mount.target.startswith(("/tmp/", "/var/tmp/", "/run/")):
                raise ValueError(f"the fake binds only under /tmp, /var/tmp or /run: {mount.target}")
        (self.session / "tmp").mkdir(parents=True, exist_ok=True)
        (self.session / "var-tmp").mkdir(exist_ok=True)
        args = [a for m in self.spec.mounts for a in ("ro" if m.read_only else "rw", m.source, m.target)]
        self._holder = await asyncio.create_subprocess_exec(
            "unshare", "--user", "--map-root-user", "--mount", "--net", "--pid", "--fork", "--mount-proc",
            "--kill-child", "/bin/sh", "-c", _HOLDER, "fake-holder", str(self.session), self.spec.workdir, *args,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        FakeHpcProvider.holders.append(self._holder.pid)
        assert self._holder.stdout is not None and self._holder.stderr is not None
        line = await asyncio.wait_for(self._holder.stdout.readline(), 30)
        if line.strip() != b"ready":
            err = (await self._holder.stderr.read()).decode()
            await self.stop()
            raise hpc_sandbox.SandboxStartError(f"fake holder failed: {err.strip()}")
        children = Path(f"/proc/{self._holder.pid}/task/{self._holder.pid}/children").read_text().split()
        self.pid = int(children[0])  # PID 1 of the new namespaces

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> hpc_sandbox.ExecResult:
        if self.stopped:
            raise hpc_sandbox.SandboxError(f"sandbox {self.id} is not running")
        if self._holder is not None and (self._holder.returncode is not None or not _alive(self._holder.pid)):
            raise hpc_sandbox.SandboxLostError(f"pod {self.id} lost its holder")  # as hpc-sandbox's pods say
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)  # hpc-sandbox's own choice
        self.execs.append(argv)
        where = (
            cwd if cwd and cwd.startswith("/") else f"{self.spec.workdir}/{cwd}" if cwd else self.spec.workdir
        )
        environment = {"PATH": os.environ["PATH"], "HOME": "/root", **self.spec.env, **(env or {})}
        proc = await asyncio.create_subprocess_exec(
            NSENTER, "--target", str(self.pid), "--user", "--mount", "--net", "--pid", "--",
            "/bin/sh", "-c", _ENTER, "fake-exec", where, *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=environment, cwd="/",
            start_new_session=True,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s or 600.0)
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return hpc_sandbox.ExecResult(124, "", "fake: timed out\n", timed_out=True)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        assert proc.returncode is not None
        return hpc_sandbox.ExecResult(proc.returncode, out.decode(), err.decode())

    async def _transfer(self, script: str, *args: str) -> hpc_sandbox.ExecResult:
        return await self.exec(["/bin/sh", "-c", script, "fake", *args], cwd="/")

    def _in_workdir(self, path: str) -> str:
        # As hpc-sandbox resolves a transfer's relative path: from the workdir (the adapter passes absolute ones).
        return path if path.startswith("/") else f"{self.spec.workdir}/{path}"

    async def upload(self, src: str | Path, dst: str) -> None:
        source = Path(src)
        if not source.exists():
            raise FileNotFoundError(source)
        token = uuid.uuid4().hex
        staging = self.session / "tmp" / ".xfer" / token
        staging.mkdir(parents=True)
        try:
            if source.is_dir():
                shutil.copytree(source, staging / "payload")
                script = 'mkdir -p -- "$2" && cp -R -- "$1/." "$2/"'
            else:
                shutil.copy2(source, staging / "payload")
                script = 'mkdir -p -- "$(dirname -- "$2")" && cp -- "$1" "$2"'
            result = await self._transfer(script, f"/tmp/.xfer/{token}/payload", self._in_workdir(dst))
            if result.exit_code != 0:
                raise hpc_sandbox.SandboxError(f"upload to {dst} failed: {result.stderr.strip()}")
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    async def download(self, src: str, dst: str | Path) -> hpc_sandbox.DownloadReport:
        token = uuid.uuid4().hex
        staging = self.session / "tmp" / ".xfer" / token
        staging.mkdir(parents=True)
        try:
            result = await self._transfer(
                '[ -e "$1" ] || exit 66; cp -R -- "$1" "$2"', self._in_workdir(src), f"/tmp/.xfer/{token}/p"
            )
            if result.exit_code == 66:
                raise FileNotFoundError(f"no such file or directory in the sandbox: {src}")
            if result.exit_code != 0:
                raise hpc_sandbox.SandboxError(f"download of {src} failed: {result.stderr.strip()}")
            target = Path(dst)
            target.parent.mkdir(parents=True, exist_ok=True)
            if (staging / "p").is_dir():
                shutil.copytree(staging / "p", target, dirs_exist_ok=True)
            else:
                shutil.copy2(staging / "p", target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return hpc_sandbox.DownloadReport()

    async def snapshot(self) -> hpc_sandbox.SandboxSnapshot:
        snapshot_id = f"snap-{uuid.uuid4().hex}"
        target = self.provider.scratch / "snapshots" / snapshot_id
        shutil.copytree(self.session / "tmp", target / "tmp", ignore=shutil.ignore_patterns(".xfer"))
        return hpc_sandbox.SandboxSnapshot(
            snapshot_id, "fake", str(target), self.spec.image, {"format": "fake"}
        )

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.provider.live.discard(self)
        if self._holder is not None:
            if self._holder.returncode is None:
                self._holder.kill()  # --kill-child: the namespaces' PID 1 goes with it, and with it every process
            await self._holder.wait()
        shutil.rmtree(self.session, ignore_errors=True)


class FakeHpcProvider:
    """A FAKE hpc-sandbox `SandboxProvider` for tests: starts `FakeHpcSandbox`es; options as hpc-sandbox's
    Singularity provider names them, plus test knobs (`fail_start`, `start_delay_s`)."""

    name = "fake"
    holders: ClassVar[list[int]] = []  # every holder process ever started, to check none outlives its test
    on_start: ClassVar[Callable[[hpc_sandbox.SandboxSpec], None] | None] = None

    def __init__(
        self,
        *,
        scratch_root: str | None = None,
        allow_network_none: bool = False,
        gpu: str | None = None,
        rootfs_layout: str | None = None,
        fail_start: str | None = None,
        start_delay_s: float = 0.0,
    ) -> None:
        self.scratch = Path(scratch_root or os.environ["HPC_SANDBOX_SCRATCH"])
        self.capabilities = frozenset(
            {"snapshot", "isolation", "pods"}
            | ({"network_none"} if allow_network_none else set())
            | ({"gpu"} if gpu else set())
        )
        self.rootfs_layout = rootfs_layout
        self.fail_start = fail_start
        self.start_delay_s = start_delay_s
        self.live: set[FakeHpcSandbox] = set()
        self.started: list[FakeHpcSandbox] = []
        self.deleted: list[str] = []

    async def start(self, spec: hpc_sandbox.SandboxSpec) -> FakeHpcSandbox:
        return await self._start(spec, None)

    async def restore(
        self, snapshot: hpc_sandbox.SandboxSnapshot, spec: hpc_sandbox.SandboxSpec
    ) -> FakeHpcSandbox:
        return await self._start(spec, Path(snapshot.path))

    async def _start(self, spec: hpc_sandbox.SandboxSpec, snapshot: Path | None) -> FakeHpcSandbox:
        if FakeHpcProvider.on_start is not None:
            FakeHpcProvider.on_start(spec)
        await asyncio.sleep(self.start_delay_s)
        if self.fail_start:
            raise hpc_sandbox.SandboxStartError(self.fail_start)
        session = self.scratch / "sessions" / uuid.uuid4().hex
        if snapshot is not None:
            shutil.copytree(snapshot / "tmp", session / "tmp")
        sandbox = FakeHpcSandbox(self, spec, session)
        try:
            await sandbox.boot()
        except BaseException:
            await asyncio.shield(sandbox.stop())
            raise
        self.live.add(sandbox)
        self.started.append(sandbox)
        return sandbox

    async def delete_snapshot(self, snapshot: hpc_sandbox.SandboxSnapshot) -> None:
        shutil.rmtree(snapshot.path)
        self.deleted.append(snapshot.id)

    async def reap(self, labels: dict[str, str]) -> hpc_sandbox.JanitorReport:
        report = hpc_sandbox.JanitorReport()
        for sandbox in list(self.live):
            if labels.items() <= sandbox.spec.labels.items():
                await sandbox.stop()
                report.removed.append(sandbox.id)
        return report


class FakeHpcProviderWithoutLayouts:
    """A FAKE of an hpc-sandbox from before rootfs layouts: its provider takes no `rootfs_layout`."""

    name = "fake-old"
    capabilities = frozenset({"snapshot", "isolation"})

    def __init__(self, *, scratch_root: str | None = None) -> None:
        self.scratch_root = scratch_root


class FakeSingularity(SingularityProvider):
    inner_class: ClassVar[str | type] = FakeHpcProvider


class FakeEnroot(EnrootProvider):
    inner_class: ClassVar[str | type] = FakeHpcProvider


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


@pytest.fixture
def fake_inner() -> Iterator[None]:
    """Namespaces must work; no holder process may outlive the test."""
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "--net", "--pid", "--fork", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.fail(
            f"the fake inner provider needs unshare's namespaces: {probe.stderr.strip()}", pytrace=False
        )
    FakeHpcProvider.holders.clear()
    FakeHpcProvider.on_start = None
    yield
    FakeHpcProvider.on_start = None
    left = [pid for pid in FakeHpcProvider.holders if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], "a fake sandbox outlived its test"


def spec(**kwargs: Any) -> SandboxSpec:
    return SandboxSpec(image=kwargs.pop("image", "docker://example/python:3"), workdir="/tmp/app", **kwargs)


@pytest.mark.usefixtures("fake_inner")
def test_an_instance_that_dies_under_its_sandbox_is_gone() -> None:
    """hpc-sandbox's SandboxLostError (the instance's holder died: a node's cleanup, an OOM killer) is platoon's
    `SandboxGone`, so the rollout ends as an untrainable `sandbox_gone`, never a failed command."""

    async def go() -> None:
        sandbox = await FakeSingularity().start(spec())
        try:
            holder = sandbox.inner._holder
            os.kill(holder.pid, signal.SIGKILL)
            await holder.wait()
            with pytest.raises(SandboxGone, match="lost its holder") as gone:
                await sandbox.exec("echo still here")
            assert gone.value.failure_kind == "sandbox_gone"
        finally:
            await sandbox.stop()

    run(go())


@pytest.mark.usefixtures("fake_inner")
def test_exec_runs_strings_under_bash_and_lists_as_argv() -> None:
    async def go() -> None:
        sandbox = await FakeSingularity().start(spec(env={"FROM_SPEC": "a"}))
        inner = sandbox.inner
        try:
            got = await sandbox.exec(
                '[[ -n "$BASH_VERSION" ]] && echo "bash $FROM_SPEC $X $(pwd)"', env={"X": "b"}
            )
            assert (got.exit_code, got.stdout, got.timed_out) == (0, "bash a b /tmp/app\n", False)
            assert inner.execs[-1][:2] == ["bash", "-c"]  # not hpc-sandbox's /bin/sh
            got = await sandbox.exec(["sh", "-c", "cat; exit 3"], stdin="typed", cwd="/tmp")
            assert (got.exit_code, got.stdout) == (3, "typed")
            assert inner.execs[-1] == ["sh", "-c", "cat; exit 3"]
            got = await sandbox.exec("echo x", cwd="/no/such/dir")
            assert got.exit_code == 126
            assert got.stderr.startswith("hpc-sandbox: cannot enter the working directory /no/such/dir: ")
            got = await sandbox.exec("sleep 30", timeout_s=0.5)
            assert got.timed_out and got.exit_code == 124
        finally:
            await sandbox.stop()

    run(go())


@pytest.mark.usefixtures("fake_inner")
def test_transfers_run_from_the_root(tmp_path: Path) -> None:
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "f.txt").write_text("in a tree")
    (tmp_path / "one.txt").write_text("one file")

    async def go() -> None:
        sandbox = await FakeEnroot().start(spec())
        try:
            await sandbox.upload(tmp_path / "tree", "tmp/up")  # relative: from /, not from the workdir
            await sandbox.upload(tmp_path / "one.txt", "/tmp/app/one.txt")
            listing = await sandbox.exec("cat /tmp/up/sub/f.txt; echo; cat one.txt")
            assert listing.stdout == "in a tree\none file"
            report = await sandbox.download("tmp/up", tmp_path / "back")
            assert isinstance(report, hpc_sandbox.DownloadReport)
            assert (tmp_path / "back" / "sub" / "f.txt").read_text() == "in a tree"
            await sandbox.download("/tmp/app/one.txt", tmp_path / "back-one.txt")
            assert (tmp_path / "back-one.txt").read_text() == "one file"
            with pytest.raises(FileNotFoundError):
                await sandbox.download("/tmp/nothing", tmp_path / "none")
            with pytest.raises(FileNotFoundError):
                await sandbox.upload(tmp_path / "nothing", "/tmp/x")
        finally:
            await sandbox.stop()

    run(go())


@pytest.mark.usefixtures("fake_inner")
def test_snapshots_restore_and_are_deleted_when_their_sandbox_stops() -> None:
    async def go() -> None:
        provider = FakeSingularity()
        sandbox = await provider.start(spec())
        await sandbox.exec("echo kept > /tmp/app/state")
        snapshot = await sandbox.snapshot()
        restored = await provider.restore(snapshot, spec())
        try:
            assert (await restored.exec("cat /tmp/app/state")).stdout == "kept\n"
        finally:
            await restored.stop()
        assert Path(snapshot.path).is_dir()
        await sandbox.stop()
        assert not Path(snapshot.path).exists() and provider.inner.deleted == [snapshot.id]
        await sandbox.stop()  # idempotent
        with pytest.raises(SandboxError, match="has stopped"):
            await sandbox.exec("true")

    run(go())


@pytest.mark.usefixtures("fake_inner")
def test_capabilities_of_a_provider_follow_its_inner_provider() -> None:
    assert FakeSingularity().capabilities == {"snapshot", "isolation", "routes", "host_loopback", "clean_env"}
    assert FakeSingularity(allow_network_none=True, gpu="nv").capabilities == {
        "snapshot",
        "isolation",
        "network_none",
        "gpu",
        "routes",
        "host_loopback",
        "clean_env",
    }


@pytest.mark.usefixtures("fake_inner")
def test_labels_are_merged_and_registered_before_the_inner_start_and_unregistered_at_stop() -> None:
    seen: list[Any] = []

    def at_inner_start(inner_spec: hpc_sandbox.SandboxSpec) -> None:
        seen.append((inner_spec.labels, [dict(e.labels) for e in registry().live]))

    async def go() -> None:
        set_process_labels({"platoon.run": "/runs/a"}, **{"platoon.worker": "w1"})
        FakeHpcProvider.on_start = at_inner_start
        provider = FakeEnroot(allow_network_none=True)
        sandbox = await provider.start(spec(labels={"platoon.task": "t", "platoon.run": "/runs/forged"}))
        labels = {"platoon.task": "t", "platoon.run": "/runs/a", "platoon.worker": "w1"}
        assert seen == [(labels, [labels])]  # registered while the inner provider had not started anything
        (entry,) = registry().live
        assert entry.sandbox is sandbox and entry.provider.endswith(":FakeEnroot")
        assert entry.options == {"allow_network_none": True}
        assert registry().records() == [
            {
                "provider": entry.provider,
                "options": {"allow_network_none": True},
                "labels": {"platoon.run": "/runs/a", "platoon.worker": "w1"},
            }
        ]
        await sandbox.stop()
        assert registry().live == []
        registry().shut_down()
        with pytest.raises(SandboxError, match="shutting down"):
            await provider.start(spec())
        assert len(seen) == 1  # the refused start never reached hpc-sandbox

    run(go())


@pytest.mark.usefixtures("fake_inner")
def test_a_failed_or_cancelled_start_leaks_no_registration_and_no_sandbox(tmp_path: Path) -> None:
    (tmp_path / "gw").mkdir()

    async def go() -> None:
        set_process_labels({"platoon.run": "/runs/b"})
        with pytest.raises(SandboxError, match="the image is broken") as caught:
            await FakeSingularity(fail_start="the image is broken").start(spec())
        assert isinstance(caught.value.__cause__, hpc_sandbox.SandboxStartError)
        assert registry().live == [] and registry().records() == []

        slow = FakeSingularity(start_delay_s=30)
        task = asyncio.ensure_future(slow.start(spec()))
        await asyncio.sleep(0.2)
        assert len(registry().live) == 1  # registered while starting
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert registry().live == []

        # The inner start succeeds, then the adapter's own step fails (no Python for the route forwarder): the
        # inner sandbox is stopped and nothing stays registered.
        provider = FakeSingularity(allow_network_none=True)
        with pytest.raises(SandboxError, match=r"no Python 3\.6 or newer"):
            await provider.start(
                spec(
                    network="none",
                    upstreams={"model": f"unix://{tmp_path}/gw/gw.sock"},
                    env={"PATH": "/nonexistent"},
                )
            )
        (inner,) = provider.inner.started
        assert inner.stopped and not inner.session.exists()
        assert registry().live == []

    run(go())


@pytest.mark.usefixtures("fake_inner")
def test_the_sandboxs_own_failures_raise_rather_than_return_exit_codes() -> None:
    async def go() -> None:
        sandbox = await FakeSingularity().start(spec())
        await sandbox.inner.stop()  # the container went away underneath
        with pytest.raises(SandboxError, match="not running") as caught:
            await sandbox.exec("true")
        assert isinstance(caught.value.__cause__, hpc_sandbox.SandboxError)
        await sandbox.stop()
        assert registry().live == []

    run(go())


@pytest.mark.usefixtures("fake_inner")
def test_reap_stops_the_labelled_sandboxes_of_this_process() -> None:
    async def go() -> None:
        provider = FakeEnroot()
        mine = await provider.start(spec(labels={"platoon.run": "/runs/c"}))
        other = await provider.start(spec(labels={"platoon.run": "/runs/d"}))
        try:
            assert await FakeEnroot().reap({"platoon.run": "/runs/c"}) == 1
            assert [e.sandbox for e in registry().live] == [other]
            with pytest.raises(SandboxError):
                await mine.exec("true")
            with pytest.raises(ValueError, match="empty label set"):
                await provider.reap({})
        finally:
            await other.stop()

    run(go())


# -- routes -----------------------------------------------------------------------------------


_GET = (
    "import sys, urllib.request\n"
    "print(urllib.request.urlopen(sys.argv[1] + '/v1/models', timeout=10).read().decode())\n"
)


def _forwarders(listing: str) -> list[str]:
    return [line for line in listing.splitlines() if "/tmp/platoon-route/forwarder.py" in line]


_PS = "for d in /proc/[0-9]*; do [ ${d#/proc/} = $$ ] || tr '\\0' ' ' < $d/cmdline; echo; done"


@pytest.mark.usefixtures("fake_inner")
def test_a_network_none_sandbox_reaches_a_unix_upstream_through_its_own_namespace_route(
    unix_upstream: str,
) -> None:
    async def go() -> None:
        provider = FakeSingularity(allow_network_none=True)
        sandbox = await provider.start(
            spec(network="none", upstreams={"model": unix_upstream, "mcp": unix_upstream})
        )
        try:
            assert sandbox.routes == {"mcp": "http://127.0.0.1:18080", "model": "http://127.0.0.1:18081"}
            (inner,) = provider.inner.started
            socket_dir = os.path.dirname(unix_upstream.removeprefix("unix://"))
            binds = {(m.source, m.target, m.read_only) for m in inner.spec.mounts}
            assert binds == {(socket_dir, "/run/platoon/mcp", True), (socket_dir, "/run/platoon/model", True)}
            got = await sandbox.exec(["python3", "-c", _GET, sandbox.routes["model"]])
            assert got.stdout.strip() == "hello from the host: /v1/models", got.stderr
            write = await sandbox.exec("touch /run/platoon/model/x")
            assert write.exit_code != 0  # the socket's directory is bound read-only

            # kill_processes kills what commands left (in the sandbox's own PID namespace), spares the forwarders
            await sandbox.exec("sleep 300 > /dev/null 2>&1 &")
            assert any(p.startswith("sleep 300") for p in (await sandbox.exec(_PS)).stdout.splitlines())
            await sandbox.kill_processes()
            listing = (await sandbox.exec(_PS)).stdout
            assert not any(p.startswith("sleep 300") for p in listing.splitlines())
            assert len(_forwarders(listing)) == 2
            assert (await sandbox.exec(["python3", "-c", _GET, sandbox.routes["mcp"]])).exit_code == 0

            # a dead forwarder is restarted on the same port
            pid = (await sandbox.exec("cat /tmp/platoon-route/model.pid")).stdout.strip()
            await sandbox.exec(["kill", "-9", pid])
            assert (await sandbox.exec(["python3", "-c", _GET, sandbox.routes["model"]])).exit_code != 0
            await sandbox.ensure_routes()
            assert sandbox.routes["model"] == "http://127.0.0.1:18081"
            got = await sandbox.exec(["python3", "-c", _GET, sandbox.routes["model"]])
            assert got.stdout.strip() == "hello from the host: /v1/models"
        finally:
            await sandbox.stop()

    run(go())


@pytest.mark.usefixtures("fake_inner")
def test_host_network_sandboxes_get_no_route_for_unix_upstreams(unix_upstream: str) -> None:
    async def go() -> None:
        provider = FakeEnroot()
        sandbox = await provider.start(
            spec(network="host", upstreams={"model": unix_upstream, "judge": "http://127.0.0.1:9"})
        )
        try:
            assert sandbox.routes == {"judge": "http://127.0.0.1:9"}
            await sandbox.ensure_routes()
            (inner,) = provider.inner.started
            assert inner.spec.mounts == []
        finally:
            await sandbox.stop()

    run(go())
