"""Harbor's network policies per phase: `public`, `allowlist` with `allowed_hosts`, and
`no-network`, read from `[environment]`, `[agent]`, `[verifier]` and `[verifier.environment]`, and run in sandboxes of
their own (never on the host's network) by a real Docker engine; a policy the provider cannot honour is refused when
the run starts, in one line, exit 78, and `platoon config validate` says the same.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon_harbor.service import HarborService, agent_network, verifier_network
from platoon_harbor.tasks import TaskRefused, read_task

PYTHON_IMAGE = "platoon-test/python:bookworm"


def write_task(
    root: Path, name: str, toml: str = "", *, test_sh: str = "echo 0 > /logs/verifier/reward.txt\n"
) -> Path:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(
        f'[environment]\ndocker_image = "{PYTHON_IMAGE}"\n' + textwrap.dedent(toml)
    )
    (task / "instruction.md").write_text(f"Task {name}.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + textwrap.dedent(test_sh))
    return task


# --- reading the policies ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "agent", "verifier"),
    [
        ("", ("public", ()), ("public", ())),
        ('network_mode = "no-network"\n', ("none", ()), ("none", ())),
        ("allow_internet = false\n", ("none", ()), ("none", ())),
        # a phase overrides the baseline; allowed hosts go with the policy that uses them
        (
            'network_mode = "allowlist"\nallowed_hosts = ["pypi.org", "files.pythonhosted.org:443"]\n'
            '[agent]\nnetwork_mode = "public"\n[verifier]\nnetwork_mode = "no-network"\n',
            ("public", ()),
            ("none", ()),
        ),
        (
            'network_mode = "no-network"\n[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["api.example.com"]\n',
            ("allowlist", ("api.example.com",)),
            ("none", ()),
        ),
        (
            'allowed_hosts = ["pypi.org"]\n[agent]\nnetwork_mode = "allowlist"\n'
            '[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = []\n',
            ("allowlist", ("pypi.org",)),
            ("allowlist", ()),
        ),
        (
            'network_mode = "no-network"\n[verifier.environment]\nnetwork_mode = "allowlist"\n'
            'allowed_hosts = ["10.1.2.3:8080"]\n',
            ("none", ()),
            ("allowlist", ("10.1.2.3:8080",)),
        ),
    ],
)
def test_each_phase_reads_its_policy_and_hosts(tmp_path: Path, toml: str, agent: Any, verifier: Any) -> None:
    task = read_task(write_task(tmp_path, "t", toml))
    assert (agent_network(task), verifier_network(task)) == (agent, verifier)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            'allowed_hosts = ["*.example.com"]\n',
            r"\[environment\]\.allowed_hosts\[0\]: '\*\.example\.com': a wildcard",
        ),
        (
            '[agent]\nallowed_hosts = ["https://pypi.org/simple"]\n',
            r"\[agent\]\.allowed_hosts\[0\]: .*no scheme",
        ),
        ('[verifier]\nallowed_hosts = "pypi.org"\n', r"\[verifier\]\.allowed_hosts: expected a list"),
        ("[verifier]\nallowed_hosts = [443]\n", r"\[verifier\]\.allowed_hosts\[0\]: expected a host name"),
    ],
)
def test_allowed_hosts_that_cannot_be_enforced_refuse_the_task(
    tmp_path: Path, toml: str, message: str
) -> None:
    with pytest.raises(TaskRefused, match=message):
        read_task(write_task(tmp_path, "t", toml))


# --- run-start refusals -----------------------------------------------------------------------------------------


def _validate(
    tmp_path: Path, dataset: Path, provider_options: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, list[str]]:
    from platoon.cli import main

    config = tmp_path / "train.yaml"
    config.write_text(
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
                  provider_options: {{scratch_root: {tmp_path / "scratch"}{provider_options}}}
                  harbor_check: off
                harness: platoon-bandit-answer
            stats: {{wandb: {{mode: disabled}}}}
            """
        )
    )
    code = main(["config", "validate", str(config)])
    return code, capsys.readouterr().out.splitlines()[1:]


def test_a_policy_the_provider_cannot_filter_is_refused_at_run_start_unless_the_host_network_is_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host where the process provider cannot make a namespace (no bubblewrap): public tasks are refused, not run
    on the host's network, until the entry opts into that by name. no-network tasks keep their old fallback."""
    monkeypatch.setenv("PLATOON_BWRAP", str(tmp_path / "no-bwrap"))
    dataset = tmp_path / "dataset"
    write_task(dataset, "offline", 'network_mode = "no-network"\n')
    write_task(dataset, "online")
    code, lines = _validate(
        tmp_path, dataset, ", confine: none", capsys
    )  # unconfined is accepted: only the network
    assert code == 78
    assert lines == [
        "  environments.0: Harbor task online runs its agent with network_mode public, which provider process "
        "refuses: public and allowlist process sandboxes need filtered egress, unavailable here "
        f"(PLATOON_BWRAP={tmp_path / 'no-bwrap'} is not an executable); or set the provider option "
        "allow_host_network: true to run them on the host's network, unfiltered"
    ]
    assert _validate(tmp_path, dataset, ", confine: none, allow_host_network: true", capsys) == (0, [])


def test_a_bad_egress_allow_is_a_config_error_in_one_line(tmp_path: Path) -> None:
    from platoon.errors import ConfigError

    write_task(tmp_path, "t")
    service = HarborService(
        dataset_dir=str(tmp_path), provider="docker", provider_options={"egress_allow": ["localhost"]}
    )
    with pytest.raises(
        ConfigError, match=r"provider_options: egress_allow entry 'localhost': .*one port at a time"
    ):
        service.provider()


# --- real sandboxes ---------------------------------------------------------------------------------------------


def _docker() -> str:
    return os.environ.get("PLATOON_DOCKER", "docker")


@pytest.fixture
def env_name() -> Iterator[str]:
    binary = _docker()
    if shutil.which(binary) is None or subprocess.run([binary, "info"], capture_output=True).returncode != 0:
        pytest.fail(
            "no Docker engine answers: run `.ci/docker-engine start` and source its env file", pytrace=False
        )
    name = f"harbor-net-{uuid.uuid4().hex[:10]}"
    yield name
    left = subprocess.run(
        [binary, "ps", "--all", "--quiet", "--filter", f"label=platoon.env={name}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    if left:
        subprocess.run([binary, "rm", "--force", *left], capture_output=True)
        pytest.fail(f"the test left {len(left)} container(s) behind", pytrace=False)


class Greeter:
    """A TCP server on the host's 127.0.0.1 that greets each connection with a line."""

    def __init__(self, greeting: str) -> None:
        self.accepted = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]

        def serve() -> None:
            while True:
                try:
                    conn, _ = self._server.accept()
                except OSError:
                    return
                self.accepted += 1
                with conn:
                    conn.sendall(f"{greeting}\n".encode())

        threading.Thread(target=serve, daemon=True).start()

    def close(self) -> None:
        self._server.close()


CONNECT = (
    "python3 -c 'import socket, sys\n"
    "try:\n"
    "    print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30).recv(64).decode().strip())\n"
    "except OSError as e:\n"
    "    print(type(e).__name__)' "
)


def test_each_phase_runs_under_its_own_policy_and_never_on_the_host_network(
    tmp_path: Path, env_name: str
) -> None:
    """The agent's allowlist reaches its host (a loopback server the entry's egress_allow opens, as a site profile
    would) and nothing else; the separate verifier runs with no network, which its test proves by scoring 1 only
    when it cannot reach that same host; a public task reaches nothing on the host the entry did not open."""
    listed, unlisted, closed = Greeter("listed"), Greeter("unlisted"), Greeter("closed")
    try:
        write_task(
            tmp_path,
            "allowlisted",
            f'[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["127.0.0.1:{listed.port}"]\n'
            '[verifier]\nnetwork_mode = "no-network"\n',
            test_sh=f"""
            if {CONNECT} 10.0.2.2 {listed.port} | grep -q listed; then echo 0; else echo 1; fi > /logs/verifier/reward.txt
            """,
        )
        write_task(tmp_path, "public")
        service = HarborService(
            dataset_dir=str(tmp_path),
            name=env_name,
            provider="docker",
            provider_options={"egress_allow": [f"127.0.0.1:{listed.port}", f"127.0.0.1:{unlisted.port}"]},
        )

        async def agent(task_id: str, *commands: str) -> tuple[Any, list[str], Any]:
            session = await service.open(
                await service.get_task(task_id), rollout_id=f"r-{uuid.uuid4().hex[:8]}"
            )
            try:
                outputs = [
                    (await session.call_tool("bash", {"command": c})).as_text().strip() for c in commands
                ]
                return session.network_isolated, outputs, await session.grade()
            finally:
                await session.close()

        isolated, seen, outcome = asyncio.run(
            agent("allowlisted", f"{CONNECT} 10.0.2.2 {listed.port}", f"{CONNECT} 10.0.2.2 {unlisted.port}")
        )
        assert isolated and seen == ["listed", "ConnectionRefusedError"]
        assert (outcome.status, outcome.rewards) == ("scored", {"reward": 1.0})  # the verifier had no network
        isolated, seen, _ = asyncio.run(
            agent("public", f"{CONNECT} 127.0.0.1 {closed.port}", f"{CONNECT} 10.0.2.2 {closed.port}")
        )
        assert isolated and seen == ["ConnectionRefusedError", "ConnectionRefusedError"]
        assert unlisted.accepted == closed.accepted == 0
    finally:
        for greeter in (listed, unlisted, closed):
            greeter.close()
