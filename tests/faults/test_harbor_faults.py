"""The guarantee sheet's Harbor faults: the agent's sandbox (a real Docker container) is killed mid-episode, from
outside, as an OOM killer or a node's cleanup would; in both verifier modes the rollout ends as an infrastructure
outcome, never a reward of 0, and no container is left.

CI starts the Docker engine and builds `platoon-test/python:bookworm` first (`.ci/docker-engine start`).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from docker_cli import DOCKER, containers, docker

from platoon_harbor.service import HarborService

PYTHON_IMAGE = "platoon-test/python:bookworm"
TEST_SH = """#!/bin/bash
if grep -qx 42 /app/answer.txt; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


async def _killed_mid_episode(service: HarborService, env_name: str) -> tuple[Any, Any]:
    """An agent writes the right answer, its sandbox is killed, it tries one more command; (that result, grade)."""
    session = await service.open(await service.get_task("answer"), rollout_id=f"r-{uuid.uuid4().hex[:8]}")
    try:
        await session.call_tool("bash", {"command": "echo 42 > /app/answer.txt"})
        running = containers(f"platoon.env={env_name}")
        assert running, "the agent's sandbox is not a container of this environment"
        docker("kill", *running)
        after = await session.call_tool("bash", {"command": "cat /app/answer.txt"})
        return after, await session.grade()
    finally:
        await session.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            mode,
            marks=pytest.mark.guarantee(
                "The agent's sandbox is killed mid-episode",
                f"Harbor task in Docker, `verifier_mode: {mode}`",
                "an infrastructure outcome, never a 0 (the right answer the agent wrote is lost with it); no "
                "container left",
            ),
        )
        for mode in ("separate", "shared")
    ],
)
def test_a_sandbox_killed_mid_episode_is_never_a_zero(tmp_path: Path, mode: str) -> None:
    if shutil.which(DOCKER) is None or subprocess.run([DOCKER, "info"], capture_output=True).returncode != 0:
        pytest.fail(
            "no Docker engine answers: run `.ci/docker-engine start` and source its env file", pytrace=False
        )
    task = tmp_path / "answer"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(f'[environment]\ndocker_image = "{PYTHON_IMAGE}"\n')
    (task / "instruction.md").write_text("Write 42 to /app/answer.txt.\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    env_name = f"harbor-fault-{uuid.uuid4().hex[:10]}"
    service = HarborService(dataset_dir=str(tmp_path), name=env_name, verifier_mode=mode, harbor_check="off")

    try:
        after, outcome = asyncio.run(_killed_mid_episode(service, env_name))
    finally:
        left = containers(f"platoon.env={env_name}")
        if left:
            subprocess.run([DOCKER, "rm", "--force", *left], capture_output=True)
    assert after.is_error  # the agent is told its command did not run
    assert outcome.status != "scored", outcome
    assert not outcome.rewards, outcome
    assert outcome.failure_kind, outcome
    assert not left, f"{len(left)} container(s) left behind"
