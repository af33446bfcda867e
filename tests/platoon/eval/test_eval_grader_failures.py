"""`platoon eval` on an ORS environment whose grader crashes for some tasks, written as docs/environments.md shows
(a finishing `@tool`, no terminal-tool declaration): crashed tasks are errored rollouts, not failures, and the
reward is over the scored ones; stdout is the JSON summary alone, the environment's tracebacks go to stderr.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from eval_support import HOSTED_KEY_ENV, only_dir

from platoon.cli import main
from platoon.testing import serve_policy, tool_call

#: Five tasks guessed between 0 and 2 (a policy guessing the middle answers 1): two right, one wrong, and two whose
#: grader is down. The environment also prints, as environment code does.
ENV_MODULE = textwrap.dedent(
    '''
    from openreward.environments import Environment, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    TASKS = [
        {"id": "right-a", "target": 1},
        {"id": "right-b", "target": 1},
        {"id": "wrong", "target": 2},
        {"id": "down-a", "target": 1, "crash": True},
        {"id": "down-b", "target": 1, "crash": True},
    ]


    class Guess(BaseModel):
        number: int


    class FlakyGrader(Environment):
        @classmethod
        def list_splits(cls):
            return ["test"]

        @classmethod
        def list_tasks(cls, split):
            return TASKS

        def get_prompt(self):
            return [TextBlock(text="Guess the number between 0 and 2.")]

        @tool
        def guess(self, params: Guess) -> ToolOutput:
            """Submit your guess."""
            print(f"grading {self.task_spec['id']}")
            if self.task_spec.get("crash"):
                raise RuntimeError("grader database unreachable")
            reward = 1.0 if params.number == self.task_spec["target"] else 0.0
            return ToolOutput(blocks=[TextBlock(text="graded")], reward=reward, finished=True)
    '''
)

SUMMARY = {
    "total_tasks": 5,
    "tasks_without_valid_rollouts": 2,
    "total_rollouts": 5,
    "valid_rollouts": 3,
    "successful_rollouts": 2,
    "failed_rollouts": 1,
    "errored_rollouts": 2,
    "outcome_status_counts": {"error": 2, "scored": 3},
    "reward_key_counts": {"reward": 3},
    "success_rate": 2 / 3,
    "success_at_k": 2 / 3,
    "reward_mean": 2 / 3,
    "reward_max": 1.0,
    "reward_min": 0.0,
    "reward_at_k_mean": 2 / 3,
    "reward_at_k_max": 2 / 3,
    "reward_at_k_min": 2 / 3,
}


def flaky_eval(workdir: Path, **inference: Any) -> dict[str, Any]:
    (workdir / "flaky_grader_env.py").write_text(ENV_MODULE)
    settings: dict[str, Any] = {
        "model_name": "platoon/toy",
        "renderer_name": "qwen3_instruct",
        "workflow": {
            "num_rollouts_per_task": 1,
            "num_concurrent_workers": 2,
            "rollout_config": {"verbose": False, "max_steps": 2},
        },
    }
    settings.update(inference)
    return {
        "inference": settings,
        "environments": [{"service": "python://flaky_grader_env:FlakyGrader", "harness": "platoon-react"}],
        "split": "test",
    }


def middle_guess(prompt: str) -> str:
    low, high = map(int, re.findall(r"between (\d+) and (\d+)", prompt)[-1])
    return "\n" + tool_call("guess", {"number": (low + high) // 2})


@pytest.mark.guarantee(
    "A grader raises",
    "ORS in process, `platoon eval`",
    "errored rollouts, left out of `reward_mean` and the success rate",
)
def test_crashed_grades_are_errored_rollouts_and_the_reward_is_over_scored_ones(
    workdir, write_config, capsys, monkeypatch
):
    monkeypatch.syspath_prepend(str(workdir))
    config = write_config(flaky_eval(workdir))
    with serve_policy(middle_guess):
        status = main(["eval", str(config)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    summary.pop("elapsed_seconds")
    assert summary == SUMMARY
    out_dir = only_dir(workdir / "runs" / "eval" / "platoon-toy")
    for task in ("test_3", "test_4"):
        meta = json.loads((out_dir / "rollouts" / task / "rollout_0" / "metadata.json").read_text())
        assert (meta["status"], meta["reward"]) == ("errored", None)
        # the agent retried the crashing tool once (max_steps 2): one failure, counted
        assert meta["error"] == (
            "Outcome error: tool 'guess' raised RuntimeError: grader database unreachable (2 times)"
        )
    # what the environment printed went to stderr, not into the JSON on stdout
    assert "grading down-a" in captured.err


def test_stdout_is_the_json_summary_alone_and_the_tracebacks_go_to_stderr(
    workdir, write_config, hosted_server
):
    # A real `platoon eval` process against the scripted hosted model: its stdout and stderr as a shell sees them.
    data = flaky_eval(
        workdir,
        model_name="my-hosted-model",
        renderer_name=None,
        hosted={"base_url": hosted_server.base_url, "api_key_env": HOSTED_KEY_ENV, "max_retries": 0},
    )
    config = write_config(data)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(workdir), os.environ.get("PYTHONPATH", "")])}
    env.pop("OPENREWARD_LOG_LEVEL", None)
    done = subprocess.run(
        [sys.executable, "-m", "platoon", "eval", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=workdir,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)  # all of stdout
    summary.pop("elapsed_seconds")
    assert summary == SUMMARY
    # one line per crashed call, naming the exception; its traceback only at OPENREWARD_LOG_LEVEL=DEBUG
    failed = [line for line in done.stderr.splitlines() if "tool_call_failed tool=guess" in line]
    assert failed and all("RuntimeError: grader database unreachable" in line for line in failed)
    assert "Traceback (most recent call last)" not in done.stderr
    assert "grading right-a" in done.stderr


def test_rollout_stdout_is_its_json_summary_alone(workdir, write_config, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(workdir))
    config = write_config(flaky_eval(workdir))
    with serve_policy(middle_guess):
        status = main(["rollout", str(config), "--task", "test:0", "--split", "test", "--json-output"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out)  # all of stdout
    assert summary["reward"] == 1.0
    assert "grading right-a" in captured.err  # the environment's print went to stderr
