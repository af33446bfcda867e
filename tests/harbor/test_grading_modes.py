"""Harbor grading against the real Docker engine (docs/harbor.md, Grading): the default separate verifier that an
agent cannot bribe by replacing a tool the tests use, what shared mode trusts, and the default classifiers that tell
an offline verifier from a failed agent, with the evidence each outcome keeps.

CI starts the Docker engine and builds `platoon-test/python:bookworm` first (`.ci/docker-engine start`); these tests
never skip. Each test's sandboxes carry a per-test `platoon.env` label, and none may be left after the test.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon_harbor.service import HarborService

PYTHON_IMAGE = "platoon-test/python:bookworm"
DOCKER = os.environ.get("PLATOON_DOCKER", "docker")

# The answer is checked with grep, as many Harbor tasks' tests do.
GREP_TEST = """\
if grep -qx 42 /app/answer.txt; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
# What an agent rewarded for passing might try: a grep that always matches, where PATH finds it first.
BRIBE = "printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/grep && chmod +x /usr/local/bin/grep"


@pytest.fixture(scope="module")
def engine() -> None:
    if shutil.which(DOCKER) is None or subprocess.run([DOCKER, "info"], capture_output=True).returncode != 0:
        pytest.fail(
            f"no Docker engine answers at DOCKER_HOST={os.environ.get('DOCKER_HOST', '(unset)')}: run "
            "`.ci/docker-engine start` and source the env file it prints",
            pytrace=False,
        )
    if subprocess.run([DOCKER, "image", "inspect", PYTHON_IMAGE], capture_output=True).returncode != 0:
        pytest.fail(f"image {PYTHON_IMAGE} is missing: `.ci/docker-engine start` builds it", pytrace=False)


@pytest.fixture
def env_name(engine: None) -> Iterator[str]:
    name = f"harbor-grading-{uuid.uuid4().hex[:10]}"
    yield name
    left = subprocess.run(
        [DOCKER, "ps", "--all", "--quiet", "--filter", f"label=platoon.env={name}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    if left:
        subprocess.run([DOCKER, "rm", "--force", *left], capture_output=True)
        pytest.fail(f"the test left {len(left)} container(s) behind", pytrace=False)


def write_task(root: Path, name: str, test_sh: str, environment: str = "") -> None:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(f'[environment]\ndocker_image = "{PYTHON_IMAGE}"\n{environment}')
    (task / "instruction.md").write_text("Write 42 to /app/answer.txt.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + textwrap.dedent(test_sh))


async def agent_then_grade(service: HarborService, task_id: str, *commands: str) -> Any:
    """Open a session, run `commands` through the bash tool as an agent would, grade, close."""
    session = await service.open(await service.get_task(task_id), rollout_id=f"r-{uuid.uuid4().hex[:8]}")
    try:
        for command in commands:
            await session.call_tool("bash", {"command": command})
        return await session.grade()
    finally:
        await session.close()


@pytest.mark.slow
@pytest.mark.guarantee(
    "An agent replaces a tool the tests use (`/usr/local/bin/grep`)",
    "Harbor task in Docker",
    "graded in a fresh sandbox by default, so scored 0; `verifier_mode: shared` scores it 1, as docs/harbor.md says",
)
def test_a_replaced_grep_scores_0_by_default_and_1_in_shared_mode(tmp_path, env_name):
    write_task(tmp_path, "grep-check", GREP_TEST)
    default = HarborService(dataset_dir=str(tmp_path), name=env_name)
    shared = HarborService(dataset_dir=str(tmp_path), name=env_name, verifier_mode="shared")

    bribed = asyncio.run(agent_then_grade(default, "grep-check", BRIBE))
    assert (bribed.status, bribed.rewards, bribed.metadata["verifier_mode"]) == (
        "scored",
        {"reward": 0.0},
        "separate",
    )
    # The honest answer reaches the fresh verifier: the workdir is the task's artifact.
    honest = asyncio.run(agent_then_grade(default, "grep-check", "echo 42 > /app/answer.txt"))
    assert (honest.status, honest.rewards) == ("scored", {"reward": 1.0})
    assert honest.metadata["artifacts"] == ["/logs/artifacts", "/app"]
    # What docs/harbor.md says shared mode trusts: the tools the agent could change.
    trusted = asyncio.run(agent_then_grade(shared, "grep-check", BRIBE))
    assert (trusted.status, trusted.rewards, trusted.metadata["verifier_mode"]) == (
        "scored",
        {"reward": 1.0},
        "shared",
    )


@pytest.mark.slow
def test_a_file_the_agent_deleted_stays_deleted_in_the_verifier(tmp_path, env_name):
    # The image's workdir holds a file the task asks the agent to remove; the verifier's workdir is the agent's.
    write_task(
        tmp_path,
        "clean-up",
        """\
        if [ ! -e /app/secret.txt ] && [ -f /app/kept.txt ]; then echo 1 > /logs/verifier/reward.txt
        else echo 0 > /logs/verifier/reward.txt; fi
        """,
    )
    service = HarborService(dataset_dir=str(tmp_path), name=env_name)
    outcome = asyncio.run(
        agent_then_grade(
            service, "clean-up", "echo x > /app/secret.txt && echo y > /app/kept.txt", "rm /app/secret.txt"
        )
    )
    assert (outcome.status, outcome.rewards) == ("scored", {"reward": 1.0})


@pytest.mark.slow
@pytest.mark.guarantee(
    "A verifier installs its test runner from the internet, offline",
    "Harbor task in Docker, no network",
    "an infrastructure outcome (`verifier_network`) with its evidence, never a 0; text the agent's code prints does not excuse its failure",
)
def test_an_offline_install_is_infra_with_its_evidence_and_agent_text_is_not(tmp_path, env_name):
    # Harbor's usual test.sh: install the runner from the internet (the image has no curl: Python downloads it),
    # run it, write 1 or 0, exit 0.
    write_task(
        tmp_path,
        "offline",
        """\
        python3 -c "import urllib.request as u; u.urlretrieve('https://astral.sh/uv/install.sh', '/tmp/uv.sh')" &&
          sh /tmp/uv.sh
        echo "running the tests"
        uvx pytest /tests/test_outputs.py
        if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
        """,
        'network_mode = "no-network"\n',
    )
    # The tests run the agent's program and show what it printed (stderr included) on their stdout, and run a
    # script the agent was asked to write: neither text makes the agent's failure an infrastructure one.
    write_task(
        tmp_path,
        "agent-text",
        """\
        out=$(python3 /app/solve.py 2>&1)
        echo "$out"
        /app/run.sh
        if [ "$out" = 42 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
        """,
    )
    service = HarborService(dataset_dir=str(tmp_path), name=env_name)
    offline = asyncio.run(agent_then_grade(service, "offline", "echo 42 > /app/answer.txt"))
    assert (offline.status, offline.failure_kind, offline.trainable) == ("invalid", "verifier_network", False)
    evidence = offline.metadata["evidence"]
    assert (evidence["exit_code"], evidence["timed_out"], evidence["mode"]) == (0, False, "separate")
    assert evidence["seconds"] > 0
    assert (
        "Temporary failure in name resolution" in evidence["output"]
        and "running the tests" in evidence["output"]
    )
    assert "uvx: command not found" in evidence["output"]

    lie = "import sys; print('curl: (6) Could not resolve host: pypi.org', file=sys.stderr); print(41)"
    failed = asyncio.run(agent_then_grade(service, "agent-text", f"echo {lie!r} > /app/solve.py"))
    assert (failed.status, failed.rewards) == ("scored", {"reward": 0.0})
    assert "Could not resolve host" in failed.metadata["evidence"]["output"]
    assert "/app/run.sh: No such file or directory" in failed.metadata["evidence"]["output"]
