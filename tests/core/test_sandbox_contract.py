"""The sandbox contract in core (`platoon.sandbox`): what a provider may leave out answers with its documented
default, and a provider written to platoon 0.1's structural contract (no base class) still reaps. Runs with
platoon-core alone."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from platoon.sandbox import (
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxProvider,
    SandboxSpec,
    as_provider_class,
)
from platoon.sandbox_runs import reap_run_async


class BareSandbox(Sandbox):
    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        return ExecResult(0, "", "")

    async def upload(self, src: str | Path, dst: str) -> None:
        return None

    async def download(self, src: str, dst: str | Path) -> None:
        return None

    async def kill_processes(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class BareProvider(SandboxProvider):
    """Only what a provider must write: a name and `start`."""

    name = "bare"

    async def start(self, spec: SandboxSpec) -> Sandbox:
        return BareSandbox()


def test_a_provider_with_only_name_and_start_answers_every_optional_question_with_its_default():
    assert BareProvider.capabilities == frozenset() and BareProvider.isolates is False
    options: dict[str, Any] = {}
    for ask in (
        BareProvider.unavailable,
        BareProvider.network_none_refusal,
        BareProvider.network_public_refusal,
        BareProvider.network_allowlist_refusal,
        BareProvider.rootfs_layout_refusal,
        BareProvider.unconfined_refusal,
    ):
        assert ask(options) is None
    for network in ("host", "none", "public", "allowlist"):
        assert BareProvider.network_refusal(network, options) is None
    assert BareProvider.refusal(SandboxSpec(), options) is None
    assert BareProvider.refusal(SandboxSpec(memory_mb=512), options) == (
        "provider bare does not enforce memory_mb = 512 (it lacks the limit_cpu_memory capability): choose a "
        "provider that does, e.g. docker"
    )
    provider = BareProvider()
    assert asyncio.run(provider.reap({"platoon.run": "/runs/a"})) == 0
    assert asyncio.run(provider.labelled({"platoon.run": "/runs/a"})) is None
    with pytest.raises(SandboxError, match="provider bare cannot restore a snapshot"):
        asyncio.run(provider.restore(object(), SandboxSpec()))


def test_a_sandbox_without_routes_or_snapshots_has_none_and_refuses_a_snapshot():
    sandbox = asyncio.run(BareProvider().start(SandboxSpec()))
    assert sandbox.routes == {}
    asyncio.run(sandbox.ensure_routes())
    with pytest.raises(SandboxError, match="BareSandbox cannot snapshot"):
        asyncio.run(sandbox.snapshot())


def test_a_provider_that_leaves_out_start_cannot_be_made():
    class NoStart(SandboxProvider):
        name = "nostart"

    with pytest.raises(TypeError, match="start"):
        NoStart()  # type: ignore[abstract]


OLD_PROVIDERS = """
class Reaping:
    name = "reaping"
    capabilities = frozenset({"limit_cpu_memory"})

    def __init__(self, count=0):
        self.count = count

    async def start(self, spec):
        raise NotImplementedError

    async def reap(self, labels):
        return self.count


class NotReaping:
    name = "not-reaping"

    async def start(self, spec):
        raise NotImplementedError
"""


def test_a_provider_written_without_the_base_class_gets_the_defaults_and_reaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "old_providers.py").write_text(textwrap.dedent(OLD_PROVIDERS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "old_providers", raising=False)
    import old_providers  # type: ignore[import-not-found]

    adapted = as_provider_class(old_providers.Reaping)
    assert adapted is as_provider_class(old_providers.Reaping)
    # a supervisor re-imports the class by this path to reap
    assert f"{adapted.__module__}:{adapted.__qualname__}" == "old_providers:Reaping"
    assert adapted.unavailable({}) is None
    assert adapted.refusal(SandboxSpec(cpus=2), {}) is None  # its own capabilities enforce it
    assert as_provider_class(BareProvider) is BareProvider

    reaped = asyncio.run(
        reap_run_async(
            [("old_providers:Reaping", {"count": 3}), ("old_providers:NotReaping", {})],
            "/runs/a",
            strict=True,
        )
    )
    assert reaped == 3


def test_the_contract_keeps_its_platoon_sandbox_import_path():
    pytest.importorskip("platoon_sandbox")
    from platoon_sandbox.contract import SandboxProvider as OldPath

    assert OldPath is SandboxProvider
