"""`platoon train` on an ORS environment whose grader crashes, on the embedded local server with the real Tinker SDK:
crashed rollouts are error outcomes that never train as a reward of 0, and a group that crashed whole takes no
update. The environment is written as docs/environments.md shows (a finishing `@tool`, no terminal declaration).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from platoon.cli import main

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "bandit" / "train.yaml"

#: Two tasks. `down`'s grader always raises; `flaky`'s raises on its first two calls of every four and otherwise
#: gives 1 then 0, whatever the model answered, so a group of 4 holds two crashes and two different rewards.
ENV_MODULE = textwrap.dedent(
    '''
    import threading

    from openreward.environments import Environment, TextBlock, ToolOutput, tool
    from pydantic import BaseModel

    calls = {"down": 0, "flaky": 0}
    lock = threading.Lock()


    class Answer(BaseModel):
        letter: str


    class CrashingGrader(Environment):
        @classmethod
        def list_splits(cls):
            return ["train"]

        @classmethod
        def list_tasks(cls, split):
            return [{"id": "down", "goal": "Answer with one letter."}, {"id": "flaky", "goal": "Answer with one letter."}]

        def get_prompt(self):
            return [TextBlock(text=self.task_spec["goal"])]

        @tool
        def answer(self, params: Answer) -> ToolOutput:
            """Submit the answer."""
            task = self.task_spec["id"]
            with lock:
                n = calls[task]
                calls[task] += 1
            if task == "down" or n % 4 < 2:
                raise ConnectionError("grader unreachable")
            reward = 1.0 if n % 4 == 2 else 0.0
            return ToolOutput(blocks=[TextBlock(text="graded")], reward=reward, finished=True)
    '''
)


@pytest.mark.slow
@pytest.mark.guarantee(
    "A grader raises on some calls of a group, or on all",
    "ORS in process, training",
    "crashed rollouts are infrastructure `env_error`, never trained; a group that crashed whole takes no update; one log line per call, no traceback",
)
def test_crashed_rollouts_are_errors_never_trained_as_zero(tmp_path, monkeypatch, capfd, caplog):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    (tmp_path / "crashing_grader_env.py").write_text(ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = [
        "train",
        str(EXAMPLE),
        f"log_path={tmp_path}",
        "train.batch_size=1",
        "train.workflow_config.group_size=4",
        "train.max_training_steps=2",
        "train.max_staleness=0",
        "checkpoint.every=0",
        # 6 of its 8 rollouts crash: over the default rate, which would stop it (test_infra_accounting.py)
        "train.max_infra_failure_rate=1",
        "environments=[{service: 'python://crashing_grader_env:CrashingGrader', harness: platoon-bandit-answer}]",
    ]
    status = main(argv)
    err = capfd.readouterr().err
    assert status == 0, err
    # each crashed grade is logged as one line naming the exception, never with a traceback (docs/reliability.md)
    assert "Traceback" not in err
    failed = [r for r in caplog.records if r.getMessage().startswith("tool_call_failed")]
    assert len(failed) == 6  # down: 4 of 4, flaky: 2 of 4, over the two steps
    assert all(
        r.exc_info is None and "error='ConnectionError: grader unreachable'" in r.getMessage() for r in failed
    )
    rows = [
        json.loads(line) for line in (tmp_path / "bandit" / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [row["step"] for row in rows] == [1, 2]

    def seen(row: dict) -> dict[str, float]:
        keys = (
            "train/batch/outcome/scored",
            "train/batch/outcome/error",
            "train/rollout_completion/trainable_rollouts",
            "train/total_datums_per_batch",
            "train/batch/optimizer_updates",
        )
        return {key.rsplit("/", 1)[1]: row[key] for key in keys}

    by_task = sorted((seen(row) for row in rows), key=lambda found: found["error"])
    assert by_task == [
        # flaky: the two crashes are errors; the two graded answers (1 and 0) train, and an update is taken
        {
            "scored": 2.0,
            "error": 2.0,
            "trainable_rollouts": 2.0,
            "total_datums_per_batch": 2.0,
            "optimizer_updates": 1.0,
        },
        # down: every grade crashed, so nothing of the group trains and no update is taken
        {
            "scored": 0.0,
            "error": 4.0,
            "trainable_rollouts": 0.0,
            "total_datums_per_batch": 0.0,
            "optimizer_updates": 0.0,
        },
    ]
