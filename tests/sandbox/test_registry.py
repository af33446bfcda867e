"""Labels, registration, the mirror and reaping, with real sandboxes and real owner processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from platoon.sandbox import SandboxError, SandboxSpec
from platoon_sandbox import registry as registry_module
from platoon_sandbox.process import ProcessProvider
from platoon_sandbox.procs import pids_with_marker
from platoon_sandbox.registry import (
    SandboxRegistry,
    clear_process_labels,
    read_mirror,
    reap,
    registry,
    set_process_labels,
)


@pytest.fixture(autouse=True)
def _own_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SandboxRegistry]:
    """A registry of this test's own, mirrored under tmp_path, and no process labels from another test."""
    clear_process_labels()
    fresh = SandboxRegistry(tmp_path / "mirror" / "sandboxes.json")
    monkeypatch.setattr(registry_module, "_registry", fresh)
    yield fresh
    clear_process_labels()


def test_process_labels_merge_over_the_spec_and_register_before_the_start(tmp_path: Path):
    async def main() -> None:
        set_process_labels({"platoon.run": "/runs/a"}, **{"platoon.worker": "w1"})
        provider = ProcessProvider(scratch_root=str(tmp_path))
        seen: list[object] = []
        original = registry().register

        def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
            entry = original(*args, **kwargs)
            seen.append(list((tmp_path / f"platoon-sandboxes-{os.getuid()}").glob("process-*")))
            return entry

        registry().register = spy  # type: ignore[method-assign]
        sandbox = await provider.start(
            SandboxSpec(labels={"platoon.task": "t", "platoon.run": "/runs/forged"})
        )
        assert seen == [[]]  # registered while nothing existed yet
        assert sandbox.labels == {"platoon.task": "t", "platoon.run": "/runs/a", "platoon.worker": "w1"}
        (entry,) = registry().live
        assert entry.sandbox is sandbox
        assert entry.reap_labels == {"platoon.run": "/runs/a", "platoon.worker": "w1"}
        assert entry.provider == "platoon_sandbox.process:ProcessProvider"
        assert entry.options == {"scratch_root": str(tmp_path)}
        await sandbox.stop()
        assert registry().live == []

    asyncio.run(main())


def test_the_mirror_is_0600_and_lists_distinct_records(tmp_path: Path):
    async def main() -> None:
        mirror = tmp_path / "mirror" / "sandboxes.json"
        provider = ProcessProvider(scratch_root=str(tmp_path))
        unlabelled = await provider.start(SandboxSpec())
        assert read_mirror(mirror) == []  # a sandbox with no labels has nothing to be reaped by
        set_process_labels({"platoon.run": "/runs/a"})
        first = await provider.start(SandboxSpec(labels={"platoon.task": "x"}))
        second = await provider.start(SandboxSpec(labels={"platoon.task": "y"}))
        assert stat.S_IMODE(os.stat(mirror).st_mode) == 0o600
        record = {
            "provider": "platoon_sandbox.process:ProcessProvider",
            "options": {"scratch_root": str(tmp_path)},
            "labels": {"platoon.run": "/runs/a"},
        }
        assert json.loads(mirror.read_text()) == [record]
        await first.stop()
        assert read_mirror(mirror) == [record]
        for sandbox in (second, unlabelled):
            await sandbox.stop()
        assert read_mirror(mirror) == []
        assert [p.name for p in mirror.parent.iterdir()] == ["sandboxes.json"]  # no temporary file left

    asyncio.run(main())


def test_stop_all_stops_the_live_sandboxes_and_refuses_later_starts(tmp_path: Path):
    async def main() -> None:
        provider = ProcessProvider(scratch_root=str(tmp_path))
        sandboxes = [await provider.start(SandboxSpec()) for _ in range(3)]
        await sandboxes[0].exec("sleep 300 >/dev/null 2>&1 &")
        assert await registry().stop_all(10) == 3
        assert not any(s.root.exists() for s in sandboxes)
        with pytest.raises(SandboxError, match="shutting down"):
            await provider.start(SandboxSpec())
        assert not list((tmp_path / f"platoon-sandboxes-{os.getuid()}").iterdir())

    asyncio.run(main())


def test_reaping_with_no_labels_is_always_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    async def main() -> None:
        provider = ProcessProvider(scratch_root=str(tmp_path))
        sandbox = await provider.start(SandboxSpec())
        with pytest.raises(SandboxError, match="empty label set"):
            await provider.reap({})
        record = {
            "provider": "platoon_sandbox.process:ProcessProvider",
            "options": {"scratch_root": str(tmp_path)},
        }
        assert await reap([{**record, "labels": {}}], 10) == 0  # logged, never raised
        assert "empty label set" in caplog.text
        assert sandbox.root.exists()
        await sandbox.stop()

    asyncio.run(main())


OWNER = """
import asyncio, sys
from platoon.sandbox import SandboxSpec
from platoon_sandbox.process import ProcessProvider

async def main():
    # unconfined: its background command outlives it (confined, it would die with it: test_process_confine.py)
    sandbox = await ProcessProvider(scratch_root=sys.argv[1], confine="none").start(
        SandboxSpec(labels={"platoon.run": sys.argv[2]})
    )
    await sandbox.exec("sleep 300 >/dev/null 2>&1 &")
    print(sandbox.root, flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


def start_owner(scratch: Path, run: str) -> tuple[subprocess.Popen[str], Path]:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(scratch), run], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    return owner, Path(owner.stdout.readline().strip())


def test_reap_takes_a_dead_owners_sandbox_and_never_a_live_one_or_another_runs(tmp_path: Path):
    dead, dead_root = start_owner(tmp_path, "/runs/a")
    live, live_root = start_owner(tmp_path, "/runs/a")
    other, other_root = start_owner(tmp_path, "/runs/b")
    try:
        provider = ProcessProvider(scratch_root=str(tmp_path))
        assert asyncio.run(provider.reap({"platoon.run": "/runs/a"})) == 0  # both owners alive
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        marker = f"PLATOON_SANDBOX_ROOT={dead_root / 'fs'}".encode()
        assert pids_with_marker([marker])  # the dead owner's background sleep still runs
        record = {
            "provider": "platoon_sandbox.process:ProcessProvider",
            "options": {"scratch_root": str(tmp_path)},
        }
        reaped = asyncio.run(
            reap(
                [
                    {**record, "labels": {"platoon.run": "/runs/a"}},
                    {**record, "labels": {"platoon.run": "/runs/c"}},
                ],
                30,
            )
        )
        assert reaped == 1
        assert not dead_root.exists() and not pids_with_marker([marker])
        assert live_root.exists() and other_root.exists()
    finally:
        for owner in (dead, live, other):
            owner.kill()
            owner.wait()
        # the owners are dead now: reap what they left, as a supervisor would
        provider = ProcessProvider(scratch_root=str(tmp_path))
        asyncio.run(provider.reap({"platoon.run": "/runs/a"}))
        asyncio.run(provider.reap({"platoon.run": "/runs/b"}))
    assert not live_root.exists() and not other_root.exists()


def test_reap_takes_this_processs_own_sandboxes(tmp_path: Path):
    async def main() -> None:
        provider = ProcessProvider(scratch_root=str(tmp_path))
        sandbox = await provider.start(SandboxSpec(labels={"platoon.run": "/runs/me"}))
        assert await provider.reap({"platoon.run": "/runs/me"}) == 1
        assert not sandbox.root.exists() and registry().live == []
        await sandbox.stop()  # still idempotent

    asyncio.run(main())


def test_the_entry_point_finds_process():
    from platoon import plugins

    runtime = plugins.get_sandbox_runtime("process")
    assert runtime.provider == "platoon_sandbox.process:ProcessProvider"
    assert plugins.resolve_target(runtime.provider) is ProcessProvider


def test_an_empty_process_label_is_refused():
    with pytest.raises(ValueError, match="must be non-empty text"):
        set_process_labels({"platoon.run": ""})
