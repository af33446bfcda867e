"""A Harbor task's limits and users: `[environment]` cpus, memory and storage and the
`[agent]`/`[verifier]` users reach the agent's and the verifier's sandboxes, and a run refuses at its start, one line
per task, what its provider cannot honour. Against the real Docker engine where a sandbox starts.

CI starts the Docker engine and builds `platoon-test/python:bookworm` first (`.ci/docker-engine start`).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon.envs.service import EnvSetupError
from platoon.errors import ConfigError
from platoon_harbor.service import HarborService

PYTHON_IMAGE = "platoon-test/python:bookworm"
DOCKER = os.environ.get("PLATOON_DOCKER", "docker")

LIMITED = """\
[environment]
docker_image = "platoon-test/python:bookworm"
cpus = 1
memory_mb = 512
storage_mb = 300
[agent]
user = "1000:1000"
[verifier]
user = 1001
[verifier.environment]
docker_image = "platoon-test/python:bookworm"
memory_mb = 256
"""


def write_task(
    root: Path, name: str, toml: str, test_sh: str = "echo 0 > /logs/verifier/reward.txt\n"
) -> Path:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(textwrap.dedent(toml))
    (task / "instruction.md").write_text(f"Task {name}.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + textwrap.dedent(test_sh))
    return task


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def env_name() -> Iterator[str]:
    """A per-test service name (the `platoon.env` label); no container may carry it after the test."""
    name = f"harbor-limits-{uuid.uuid4().hex[:10]}"
    yield name
    left = subprocess.run(
        [DOCKER, "ps", "--all", "--quiet", "--filter", f"label=platoon.env={name}"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.split()
    if left:
        subprocess.run([DOCKER, "rm", "--force", *left], capture_output=True, timeout=120)
        pytest.fail(f"the test left {len(left)} container(s) behind", pytrace=False)


def test_the_tasks_limits_and_users_reach_the_agent_and_verifier_sandboxes(tmp_path: Path) -> None:
    write_task(tmp_path, "limited", LIMITED)
    service = HarborService(dataset_dir=str(tmp_path))
    task = service.harbor_task("limited")
    spec, _env = service._spec(task, "r-1", None)
    assert (spec.cpus, spec.memory_mb, spec.storage_mb, spec.user) == (1.0, 512, 300, "1000:1000")
    verifier, _bundled = service._verifier_spec(task, spec, "r-1")
    assert (verifier.cpus, verifier.memory_mb, verifier.storage_mb, verifier.user) == (
        None,
        256,
        None,
        "1001",
    )
    ignoring = HarborService(dataset_dir=str(tmp_path), agent_user="ignore")
    assert ignoring._spec(task, "r-1", None)[0].user is None


def test_a_run_start_refuses_what_the_provider_cannot_honour_in_one_line_per_task(tmp_path: Path) -> None:
    write_task(tmp_path, "memory", "[environment]\nmemory_mb = 512\n")
    write_task(tmp_path, "user", "[agent]\nuser = 'alice'\n")
    write_task(tmp_path, "plain", "")
    process = {
        "dataset_dir": str(tmp_path),
        "provider": "process",
        "provider_options": {"scratch_root": str(tmp_path)},
    }
    service = HarborService(**process)
    assert run(service.check_tasks("train", ["plain"])) is None
    with pytest.raises(EnvSetupError) as refused:
        run(service.check_tasks("train", ["plain", "memory", "user"]))
    assert refused.value.failure_kind == "env_config"
    assert str(refused.value).split("; ") == [
        "Harbor task memory [environment].memory_mb = 512: provider process does not enforce memory_mb = 512 (it "
        "lacks the limit_cpu_memory capability): choose a provider that does, e.g. docker (or set "
        "service_kwargs.limits: ignore)",
        "Harbor task user [agent].user = 'alice': provider process does not enforce user = 'alice' (it lacks the "
        "run_as_user capability): choose a provider that does, e.g. docker (or set service_kwargs.agent_user: "
        "ignore)",
    ]
    relaxed = HarborService(**process, limits="ignore", agent_user="ignore")
    assert run(relaxed.check_tasks("train", ["plain", "memory", "user"])) is None
    task = relaxed.harbor_task("memory")
    assert (
        relaxed._spec(task, "r-1", None)[0].memory_mb is None
    )  # dropped, not passed to a provider that ignores it


def test_config_validate_says_the_same_and_exits_78(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from platoon.cli import main

    dataset = tmp_path / "dataset"
    write_task(dataset, "user", "[agent]\nuser = 'alice'\n")
    (tmp_path / "train.yaml").write_text(
        textwrap.dedent(
            f"""
            log_path: {tmp_path / "runs"}
            tinker_base_url: local
            train: {{model_name: platoon/toy, renderer_name: qwen3_instruct, batch_size: 1, max_training_steps: 1}}
            environments:
              - service: harbor
                service_kwargs:
                  dataset_dir: {dataset}
                  provider: process
                  provider_options: {{scratch_root: {tmp_path}}}
                  harbor_check: "off"
                harness: platoon-bandit-answer
            stats: {{wandb: {{mode: disabled}}}}
            """
        )
    )
    assert main(["config", "validate", str(tmp_path / "train.yaml")]) == 78
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  environments.0: Harbor task user [agent].user = 'alice': provider process does not enforce user = "
        "'alice' (it lacks the run_as_user capability): choose a provider that does, e.g. docker (or set "
        "service_kwargs.agent_user: ignore)"
    ]


def test_a_runtime_the_engine_lacks_is_refused_at_the_run_start(tmp_path: Path) -> None:
    write_task(tmp_path, "plain", f'[environment]\ndocker_image = "{PYTHON_IMAGE}"\n')
    service = HarborService(dataset_dir=str(tmp_path), provider_options={"runtime": "no-such-runtime"})
    with pytest.raises(
        EnvSetupError, match="provider docker: the docker engine has no runtime 'no-such-runtime'"
    ):
        run(service.check_tasks("train", ["plain"]))
    # runsc is registered with this engine, and runsc-hostinet, which public and allowlist tasks run under
    write_task(
        tmp_path, "offline", f'[environment]\ndocker_image = "{PYTHON_IMAGE}"\nnetwork_mode = "no-network"\n'
    )
    runsc = HarborService(dataset_dir=str(tmp_path), provider_options={"runtime": "runsc"})
    assert run(runsc.check_tasks("train", ["offline", "plain"])) is None
    # an egress runtime the engine lacks refuses the public task only, in one line naming daemon.json's entry
    missing = HarborService(
        dataset_dir=str(tmp_path), provider_options={"runtime": "runsc", "egress_runtime": "no-such-hostinet"}
    )
    with pytest.raises(EnvSetupError) as refused:
        run(missing.check_tasks("train", ["offline", "plain"]))
    said = str(refused.value)
    assert "plain" in said and "offline" not in said and "\n" not in said, said
    assert (
        'add "no-such-hostinet": {"path": ' in said and '"--network=host"' in said and "daemon.json" in said
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"agent_user": "root"}, "agent_user: run (as the task's user), ignore (as the image's) or refuse"),
        (
            {"limits": "soft"},
            "limits: enforce (refuse a task whose limits the provider cannot enforce) or ignore",
        ),
    ],
)
def test_bad_options_are_one_line(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        HarborService(dataset_dir=str(tmp_path), **kwargs)
    assert str(refused.value).startswith(f"service_kwargs.{message}") and "\n" not in str(refused.value)


# --- in Docker ----------------------------------------------------------------------------------------------------

# The agent's user writes its answer where the task asks; the verifier, as its own user, checks both users.
USER_TEST = """\
if [ "$(cat /app/answer.txt)" = 1000 ] && [ "$(id -u)" = 1001 ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


@pytest.mark.slow
@pytest.mark.parametrize("verifier_mode", ["separate", "shared"])
def test_the_agent_and_the_verifier_run_as_the_users_the_task_names(
    tmp_path: Path, env_name: str, verifier_mode: str
) -> None:
    toml = '[environment]\ndocker_image = "platoon-test/python:bookworm"\n[agent]\nuser = "1000:1000"\n'
    write_task(tmp_path, "users", toml + "[verifier]\nuser = 1001\n", USER_TEST)
    service = HarborService(dataset_dir=str(tmp_path), name=env_name, verifier_mode=verifier_mode)

    async def go() -> Any:
        session = await service.open(await service.get_task("users"), rollout_id=f"r-{uuid.uuid4().hex[:8]}")
        try:
            said = await session.call_tool(
                "bash", {"command": "id -u > /app/answer.txt && id -u && touch /logs/agent/x"}
            )
            assert said.as_text().strip() == "1000"
            root = await session.call_tool("bash", {"command": "touch /etc/owned"})
            assert "Permission denied" in root.as_text()
            return await session.grade()
        finally:
            await session.close()

    outcome = run(go())
    assert (outcome.status, outcome.rewards, outcome.metadata["verifier_mode"]) == (
        "scored",
        {"reward": 1.0},
        verifier_mode,
    ), outcome
    assert "ignored_users" not in outcome.metadata


@pytest.mark.slow
def test_an_agent_that_writes_past_storage_mb_ends_as_sandbox_disk_limit(
    tmp_path: Path, env_name: str
) -> None:
    toml = '[environment]\ndocker_image = "platoon-test/python:bookworm"\nstorage_mb = 50\n'
    write_task(tmp_path, "disk", toml, "echo 1 > /logs/verifier/reward.txt\n")
    service = HarborService(dataset_dir=str(tmp_path), name=env_name)

    async def go() -> Any:
        session = await service.open(await service.get_task("disk"), rollout_id=f"r-{uuid.uuid4().hex[:8]}")
        try:
            await session.call_tool("bash", {"command": "head -c 200000000 /dev/zero > /app/big"})
            return await session.grade()
        finally:
            await session.close()

    outcome = run(go())
    assert (outcome.status, outcome.failure_kind) == ("error", "sandbox_disk_limit"), outcome
