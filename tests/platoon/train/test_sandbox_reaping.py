"""Nothing a killed trainer started keeps running: a rollout starts a docker sandbox and the trainer
is SIGKILLed, leaving the container behind; the same command started again reaps it by the run's label before it
trains, while another run's container survives.

Real components: `platoon train` on the bandit with the embedded local server, the docker provider against the
engine `.ci/docker-engine start` runs (DOCKER_HOST from the env file it prints).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from platoon.sandbox import SandboxSpec
from platoon.sandbox_runs import run_label
from platoon_sandbox.docker import DockerProvider, docker_binary

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"
IMAGE = "docker://platoon-test/busybox"

LEAKER = textwrap.dedent(
    '''
    """A harness the trainer imports by name: its first rollout starts a sandbox and SIGKILLs the trainer, once."""
    import os
    import signal

    from platoon.harness.agent import AgentResult
    from platoon.harness.function import harness
    from platoon.sandbox import SandboxSpec
    from platoon_sandbox.docker import DockerProvider


    @harness("test-sandbox-leaker")
    async def leaker(ctx):
        try:  # the rollouts run concurrently: exactly one claims the leak
            claim = os.open(os.environ["LEAKED"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            claim = None
        if claim is not None:
            sandbox = await DockerProvider().start(SandboxSpec(image=os.environ["LEAK_IMAGE"]))
            os.write(claim, sandbox.name.encode())
            os.kill(os.getpid(), signal.SIGKILL)  # the trainer dies with its sandbox running
        reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=1)
        await ctx.call_tool("answer", {"letter": "A"})
        return AgentResult(final_message=reply.text)
    '''
)


def container_exists(name: str) -> bool:
    listed = subprocess.run(
        [docker_binary(), "ps", "--all", "--quiet", "--filter", f"name=^{name}$"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return bool(listed.stdout.strip())


@pytest.mark.slow
def test_a_sigkilled_trainers_sandbox_is_reaped_by_the_next_start_and_another_runs_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        pytest.fail(
            "no Docker engine: run `.ci/docker-engine start` and source the env file it prints", pytrace=False
        )
    for variable in ("TINKER_API_KEY", "TINKER_BASE_URL", "PLATOON_SANDBOX_LABELS"):
        monkeypatch.delenv(variable, raising=False)
    # The site profile names docker, so the run's reap asks the docker provider (the config has no Harbor entry).
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\nprovider: docker\n")
    (tmp_path / "leaker_harness.py").write_text(LEAKER)
    env = dict(os.environ)
    env.update(
        PLATOON_SITE=str(profile),
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")])),
        LEAKED=str(tmp_path / "leaked"),
        LEAK_IMAGE=IMAGE,
    )
    logs = tmp_path / "logs"
    run_dir = logs / "bandit" / "run"
    command = [
        sys.executable,
        "-m",
        "platoon",
        "train",
        str(BANDIT),
        f"log_path={logs}",
        "train.batch_size=2",
        "train.workflow_config.group_size=4",
        "train.max_training_steps=1",
        "environments=[{env: platoon-bandit, harness: 'leaker_harness:leaker'}]",
    ]
    other_run = tmp_path / "another-run"
    other = asyncio.run(
        DockerProvider().start(SandboxSpec(image=IMAGE, labels={"platoon.run": run_label(other_run)}))
    )
    try:
        killed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        assert killed.returncode == -9, killed.stderr[-3000:]
        leaked = (tmp_path / "leaked").read_text()
        assert container_exists(leaked)  # SIGKILL gave the trainer no chance to stop it
        listed = subprocess.run(
            [sys.executable, "-m", "platoon", "sandbox", "list", str(run_dir)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert listed.returncode == 0, listed.stderr
        assert leaked in listed.stdout and "docker" in listed.stdout
        assert (
            f"1 sandbox(es) of {run_dir}" in listed.stderr
        )  # the killed run's container, not the other run's

        again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"reaped 1 sandbox(es) of {run_dir}" in again.stderr
        assert not container_exists(leaked)
        assert container_exists(other.name)  # another run's label: never this run's to reap
    finally:
        asyncio.run(other.stop())
        leftover = (tmp_path / "leaked").read_text() if (tmp_path / "leaked").exists() else None
        if leftover and container_exists(leftover):
            subprocess.run([docker_binary(), "rm", "--force", leftover], capture_output=True, timeout=60)
