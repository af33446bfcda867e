"""The Docker engine these end-to-end Harbor tests need, and a per-test service name no container may outlive."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest


def _docker() -> str:
    return os.environ.get("PLATOON_DOCKER", "docker")


@pytest.fixture
def env_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A per-test service name (the sandboxes' `platoon.env` label); no container may carry it afterwards."""
    binary = _docker()
    if shutil.which(binary) is None or subprocess.run([binary, "info"], capture_output=True).returncode != 0:
        pytest.fail(
            f"no Docker engine answers at DOCKER_HOST={os.environ.get('DOCKER_HOST', '(unset)')}: run "
            "`.ci/docker-engine start` and source the env file it prints",
            pytrace=False,
        )
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    name = f"{module}-{uuid.uuid4().hex[:10]}"
    yield name
    left = subprocess.run(
        [binary, "ps", "--all", "--quiet", "--filter", f"label=platoon.env={name}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    if left:
        subprocess.run([binary, "rm", "--force", *left], capture_output=True)
        pytest.fail(f"the test left {len(left)} container(s) behind", pytrace=False)
