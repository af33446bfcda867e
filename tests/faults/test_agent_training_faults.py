"""The guarantee sheet's faults in a training run of a command-line agent on Harbor tasks in Docker: one
`platoon train` step of `platoon-bash` (placed in each task's sandbox, reaching the policy over HTTP through the
sandbox's route) on five tasks, four of which fail in the infrastructure, each in its own way:

- `answer`: a sound task; the policy solves it on one rollout and gives up on the other, so its group trains;
- `offline`: the verifier installs its test runner from the internet and the task has no network;
- `hangs`: the verifier never finishes (its `timeout_sec` is 5);
- `sampler`: the policy's sampler fails on one rollout's call and never answers another's (past
  `train.sample_timeout_seconds`);
- `killed`: the agent's sandbox is killed (`docker kill`) while the agent waits for its first answer.

The sampler is the testing kit's scripted policy (the gateway, the agent's HTTP calls and the sandbox route are the
real ones); its faults are an exception and a completion delayed past the timeout. The 5xx a real service answers,
retried by the real SDK, is `test_ors_faults.py`'s. Every guarantee is read from what the run left: the step's
metrics row, the rollouts' trajectory events, and the Docker engine's containers.

CI starts the Docker engine and builds `platoon-test/python:bookworm` first (`.ci/docker-engine start`).
"""

from __future__ import annotations

import collections
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from docker_cli import containers, docker

from platoon.cli import main
from platoon.testing import Completion, serve_policy, tool_call
from platoon.trajectory_events import by_collection, read_events

PYTHON_IMAGE = "platoon-test/python:bookworm"
GROUP_SIZE = 2
SAMPLE_TIMEOUT = 5
VERIFIER_TIMEOUT = 5
ANSWER = "echo 42 > /app/answer.txt"
GREP_TEST = """\
if grep -qx 42 /app/answer.txt; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
TASKS = {
    "answer": (GREP_TEST, ""),
    "offline": (
        """\
        python3 -c "import urllib.request as u; u.urlretrieve('https://astral.sh/uv/install.sh', '/tmp/uv.sh')"
        """
        + GREP_TEST,
        'network_mode = "no-network"\n',
    ),
    "hangs": ("sleep 3600\n" + GREP_TEST, f"[verifier]\ntimeout_sec = {VERIFIER_TIMEOUT}\n"),
    "sampler": (GREP_TEST, ""),
    "killed": (GREP_TEST, ""),
}


def _write_dataset(root: Path) -> Path:
    for name, (test_sh, extra) in TASKS.items():
        task = root / name
        (task / "tests").mkdir(parents=True)
        environment = f'[environment]\ndocker_image = "{PYTHON_IMAGE}"\nworkdir = "/app"\n'
        if extra.startswith("network_mode"):
            environment += extra
            extra = ""
        (task / "task.toml").write_text(environment + extra)
        (task / "instruction.md").write_text(f"Task {name}: write 42 to /app/answer.txt.\n")
        (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + textwrap.dedent(test_sh))
    return root


class FaultyPolicy:
    """The policy behind the agent, by task: `answer` is solved on its first rollout only; `sampler` fails or
    stalls; `killed` has its sandboxes killed before the answer comes back; the rest write the answer."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir.resolve()
        self.first_calls: collections.Counter[str] = collections.Counter()

    def __call__(self, prompt: str) -> str | Completion:
        if "<tool_response>" in prompt:  # the bash tool's result is in the conversation
            return "Done."
        task = next(name for name in TASKS if f"Task {name}:" in prompt)
        self.first_calls[task] += 1
        if task == "answer" and self.first_calls[task] > 1:
            return "I give up."
        if task == "sampler":
            if self.first_calls[task] == 1:
                raise RuntimeError("the sampler failed (injected)")
            return Completion("never sent", delay=3600)  # past train.sample_timeout_seconds
        if task == "killed":
            running = containers("platoon.task=killed", f"platoon.run={self.run_dir}", running_only=True)
            assert running, "no sandbox of the `killed` task is running while its agent waits for an answer"
            docker("kill", *running)
        return "\n" + tool_call("bash", {"command": ANSWER})


def _outcomes_by_task(run: Path) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for events in by_collection(
        read_events(sorted((run / "rollouts" / "train").glob("*/events/*.jsonl")))
    ).values():
        task = next(event for event in events if event["type"] == "trajectory_task_set")["task"]
        root = next(event for event in events if event["type"] == "trajectory_finished")
        found.setdefault(task["id"], []).append(root["misc"]["outcome"])
    return found


@pytest.mark.slow
@pytest.mark.guarantee(
    "The verifier loses its network or hangs, the sampler fails or never answers, the agent's sandbox is killed",
    "Harbor tasks in Docker, a command-line agent (`platoon-bash`), training",
    "each is an infrastructure outcome that trains nothing, in one step that finishes; the sound task's group "
    "trains; every rollout's record on disk; no container left",
)
def test_a_command_line_agent_s_faults_on_harbor_tasks_never_train_as_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for variable in ("TINKER_API_KEY", "TINKER_BASE_URL", "WANDB_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    dataset = _write_dataset(tmp_path / "tasks")
    logs = tmp_path / "logs"
    run = logs / "harbor-faults" / "run"
    overrides = [
        f"log_path={logs}",
        "stats.experiment_name=harbor-faults",
        f"environments.0.service_kwargs.dataset_dir={dataset}",
        "environments.0.service_kwargs.harbor_check=off",
        "environments.0.harness=platoon-bash",
        "train.max_training_steps=1",
        f"train.batch_size={len(TASKS)}",
        f"train.workflow_config.group_size={GROUP_SIZE}",
        f"train.sample_timeout_seconds={SAMPLE_TIMEOUT}",
        "train.max_infra_failure_rate=1.0",
    ]
    config = Path(__file__).resolve().parents[2] / "examples" / "harbor-dataset" / "train.yaml"
    with serve_policy(FaultyPolicy(run)):
        status = main(["train", str(config), *overrides])
    assert status == 0, capsys.readouterr().err[-4000:]

    outcomes = _outcomes_by_task(run)
    assert {task: len(found) for task, found in outcomes.items()} == dict.fromkeys(TASKS, GROUP_SIZE)
    assert sorted(o["rewards"]["reward"] for o in outcomes["answer"]) == [0.0, 1.0]
    assert {o["status"] for o in outcomes["answer"]} == {"scored"}
    assert {o["failure_kind"] for o in outcomes["offline"]} == {"verifier_network"}
    assert {o["failure_kind"] for o in outcomes["hangs"]} == {"verifier_timeout"}
    # The agent exits on the gateway's error answer (spec: a crash is infra `harness_crash`); its last words say why.
    assert {o["failure_kind"] for o in outcomes["sampler"]} == {"harness_crash"}
    reasons = [o["reason"] for o in outcomes["sampler"]]
    assert any("HTTP 500" in r and "the sampler failed (injected)" in r for r in reasons), reasons
    assert any("HTTP 504" in r and "sample timeout" in r for r in reasons), reasons
    # The first agent of `killed` to ask has every running sandbox of the task killed, which may catch a sibling
    # rollout whose agent is still being set up in its sandbox: that one ends as `harness_setup`, untrainable too.
    killed_kinds = [o["failure_kind"] for o in outcomes["killed"]]
    assert "sandbox_gone" in killed_kinds and set(killed_kinds) <= {"sandbox_gone", "harness_setup"}, (
        killed_kinds
    )
    for task in ("offline", "hangs", "sampler", "killed"):
        for outcome in outcomes[task]:
            assert outcome["status"] != "scored" and not outcome.get("rewards"), (task, outcome)

    [step] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert step["train/batch/outcome/scored"] == GROUP_SIZE
    assert step["train/datums/trajectories"] == GROUP_SIZE  # only the sound task's rollouts made datums
    assert step["train/batch/optimizer_updates"] == 1.0
    assert containers(f"platoon.run={run.resolve()}") == []
