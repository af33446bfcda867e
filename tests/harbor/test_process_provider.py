"""Harbor tasks on the process provider: refused unconfined unless the run config accepts it, and graded on real
paths (/app, /logs) when confined by bubblewrap. Lives with platoon-harbor's tests: it needs the Harbor service."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from platoon.config.site import parse_site
from platoon.envs.service import EnvSetupError
from platoon.errors import ConfigError
from platoon_harbor.service import HarborService
from platoon_sandbox import confine, netns


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


@pytest.fixture
def confined_here() -> None:
    if netns.bwrap_binary() is None and not os.environ.get("CI"):
        pytest.skip(
            "bubblewrap (bwrap) is not installed: apt-get install bubblewrap (CI installs it and never skips)"
        )
    reason = confine.unavailable()
    assert reason is None, f"process sandboxes cannot be confined here: {reason}"


def harbor_task(root: Path) -> Path:
    task = root / "tasks" / "t"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(
        'version = "1.0"\n[verifier]\ntimeout_sec = 60\n[agent]\ntimeout_sec = 60\n'
    )
    (task / "instruction.md").write_text("Write 42 to /app/answer.txt.\n")
    (task / "tests" / "test.sh").write_text(
        'if [ "$(cat /app/answer.txt)" = 42 ]; then echo 1 > /logs/verifier/reward.txt; '
        "else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    return task.parent


def test_harbor_refuses_unconfined_process_sandboxes_unless_the_run_config_accepts_them(
    tmp_path, monkeypatch
):
    tasks = harbor_task(tmp_path)
    monkeypatch.setenv(netns.BWRAP_ENV, str(tmp_path / "no-such-bwrap"))
    refused = HarborService(
        dataset_dir=str(tasks), provider="process", provider_options={"scratch_root": str(tmp_path)}
    )
    with pytest.raises(EnvSetupError) as caught:
        run(refused.check_tasks("train", ["t"]))
    assert caught.value.failure_kind == "env_config" and "\n" not in caught.value.message
    assert caught.value.message.startswith("provider process: commands would run unconfined on this host")
    assert "provider_options.confine: none" in caught.value.message
    accepted = HarborService(
        dataset_dir=str(tasks),
        provider="process",
        # without bubblewrap a public task also needs the host's network accepted (no namespace to filter)
        provider_options={"scratch_root": str(tmp_path), "confine": "none", "allow_host_network": True},
    )
    run(accepted.check_tasks("train", ["t"]))
    # a site profile cannot say it: the option weakens isolation
    profile = "provider: docker\nprovider_options:\n  confine: none\n"
    with pytest.raises(ConfigError, match=r"provider_options\.confine: a site profile may set only"):
        parse_site(tmp_path / "site.yaml", profile)


@pytest.mark.usefixtures("confined_here")
def test_harbor_grades_real_paths_in_a_confined_process_sandbox(tmp_path):
    """A task written for a container (no $PLATOON_SANDBOX_ROOT) scores on the confined process provider."""
    tasks = harbor_task(tmp_path)
    service = HarborService(
        dataset_dir=str(tasks), provider="process", provider_options={"scratch_root": str(tmp_path)}
    )

    async def main() -> tuple[Any, Any]:
        await service.check_tasks("train", ["t"])
        rewards = []
        for answer in ("42", "41"):
            session = await service.open(await service.get_task("t"), rollout_id=f"r-{answer}")
            try:
                await session.call_tool("bash", {"command": f"echo {answer} > /app/answer.txt"})
                rewards.append(await session.grade())
            finally:
                await session.close()
        return rewards[0], rewards[1]

    right, wrong = run(main())
    assert (right.status, right.rewards) == ("scored", {"reward": 1.0})
    assert (wrong.status, wrong.rewards) == ("scored", {"reward": 0.0})
