"""`platoon train` reads TINKER_API_KEY once: code that runs in the trainer's process during rollouts (in-process
harnesses and environments, and any process they start) finds no key in its environment, while training still
authenticates. Real Tinker SDK against the embedded local server.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from platoon.cli import main

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "bandit" / "train.yaml"
SECRET = "tml-trainer-secret-key-0123456789"

#: An environment whose finishing tool writes what it can see of the process environment (and a shell's) to disk.
ENV_MODULE = textwrap.dedent(
    """
    import json
    import os
    import subprocess

    from openreward.environments import Environment, TextBlock, ToolOutput, tool
    from pydantic import BaseModel


    class Answer(BaseModel):
        letter: str


    class EnvironmentReader(Environment):
        @classmethod
        def list_splits(cls):
            return ["train"]

        @classmethod
        def list_tasks(cls, split):
            return [{"id": "look", "goal": "Answer with one letter."}]

        def get_prompt(self):
            return [TextBlock(text=self.task_spec["goal"])]

        @tool
        def answer(self, params: Answer) -> ToolOutput:
            '''Submit the answer.'''
            shell = subprocess.run(["env"], capture_output=True, text=True).stdout
            with open(os.environ["PLATOON_TEST_SEEN"], "a") as seen:
                seen.write(json.dumps({"environ": dict(os.environ), "shell": shell}) + "\\n")
            return ToolOutput(blocks=[TextBlock(text="graded")], reward=1.0, finished=True)
    """
)


@pytest.mark.slow
@pytest.mark.guarantee(
    "Harness code reads the environment",
    "bandit, rollouts in the trainer",
    "the policy's key is not there, yet training authenticates",
)
def test_in_process_rollouts_never_find_the_tinker_key_yet_training_authenticates(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    seen_file = tmp_path / "seen.jsonl"
    monkeypatch.setenv("PLATOON_TEST_SEEN", str(seen_file))
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    (tmp_path / "environment_reader_env.py").write_text(ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = [
        "train",
        str(EXAMPLE),
        f"log_path={tmp_path}",
        "train.batch_size=1",
        "train.workflow_config.group_size=2",
        "train.workflow_config.rollout_isolation=inprocess",
        "train.max_training_steps=1",
        "checkpoint.every=0",
        "environments=[{service: 'python://environment_reader_env:EnvironmentReader', harness: platoon-bandit-answer}]",
    ]
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 0, err
    rows = [
        json.loads(line) for line in (tmp_path / "bandit" / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [row["step"] for row in rows] == [1]  # the step ran on the service, authenticated
    seen = [json.loads(line) for line in seen_file.read_text().splitlines()]
    assert len(seen) == 2  # both rollouts of the group reached the tool
    for view in seen:
        assert "TINKER_API_KEY" not in view["environ"]
        assert SECRET not in json.dumps(view["environ"]) and SECRET not in view["shell"]
    import os

    assert os.environ["TINKER_API_KEY"] == SECRET  # the caller's own environment is given back after the run
