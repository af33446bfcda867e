"""`platoon train` on an ORS environment whose grader never returns, on the embedded local server with the real
Tinker SDK (issue 35): under `rollout_config.step_timeout` the hung rollouts end as `timeout` outcomes, never a
reward of 0, in process and in rollout workers; with the step deadline off, the watchdog fires once no rollout has
made progress for its timeout, exits with its code and leaves no worker behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from platoon.cli import main

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "bandit" / "train.yaml"
#: generous bound on a whole `platoon train` start on a busy two-core machine (a hang guard, not a margin)
HANG_GUARD = 420.0

#: Two tasks: `hang`'s grader never returns, `ok`'s scores 1. With $HANG_MARKER set, only `hang`, whose grader writes
#: the id of the process it hangs in there.
ENV_MODULE = textwrap.dedent(
    '''
    import asyncio
    import os
    from pathlib import Path

    from openreward.environments import Environment, TextBlock, ToolOutput, tool
    from pydantic import BaseModel


    class Answer(BaseModel):
        letter: str


    class HangingGrader(Environment):
        @classmethod
        def list_splits(cls):
            return ["train"]

        @classmethod
        def list_tasks(cls, split):
            tasks = [{"id": "hang", "goal": "Answer with one letter."}, {"id": "ok", "goal": "Answer with one letter."}]
            return tasks[:1] if os.environ.get("HANG_MARKER") else tasks  # watched: only the one that hangs

        def get_prompt(self):
            return [TextBlock(text=self.task_spec["goal"])]

        @tool
        async def answer(self, params: Answer) -> ToolOutput:
            """Submit the answer."""
            if self.task_spec["id"] == "hang":
                marker = os.environ.get("HANG_MARKER")
                if marker:
                    Path(marker).write_text(str(os.getpid()))
                await asyncio.Event().wait()  # a grading service that never answers
            return ToolOutput(blocks=[TextBlock(text="graded")], reward=1.0, finished=True)
    '''
)
ENVIRONMENT = (
    "environments=[{service: 'python://hanging_grader_env:HangingGrader', harness: platoon-bandit-answer}]"
)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment module importable here and in workers, the local server's state under the test; returns
    the environment a child `platoon train` gets."""
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    (tmp_path / "hanging_grader_env.py").write_text(ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    )
    return dict(os.environ)


def _argv(tmp_path: Path, *overrides: str) -> list[str]:
    return [
        "train",
        str(EXAMPLE),
        f"log_path={tmp_path}",
        "train.batch_size=2",
        "train.workflow_config.group_size=2",
        "train.max_training_steps=1",
        "checkpoint.every=0",
        ENVIRONMENT,
        *overrides,
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "isolation",
    [
        pytest.param(
            isolation,
            marks=pytest.mark.guarantee(
                "A grader never returns",
                f"ORS in process, {where}",
                "an untrainable `timeout` outcome past `rollout_config.step_timeout`, never a 0; the other rollouts "
                "train",
            ),
        )
        # in the trainer's own process, tests/faults/test_ors_faults.py hangs a grader among other faults
        for isolation, where in [("process", "rollout workers")]
    ],
)
def test_a_hung_grader_ends_as_a_step_timeout_never_a_zero(site, tmp_path, capsys, isolation):
    status = main(
        _argv(
            tmp_path,
            f"train.workflow_config.rollout_isolation={isolation}",
            "train.workflow_config.rollout_config.step_timeout=3",
        )
    )
    err = capsys.readouterr().err
    assert status == 0, err
    (row,) = [
        json.loads(line) for line in (tmp_path / "bandit" / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert row["train/batch/outcome/timeout"] == 2.0  # both rollouts of `hang`
    assert row["train/batch/outcome/scored"] == 2.0  # both of `ok`, reward 1
    assert row["train/rollout_completion/trainable_rollouts"] == 2.0


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.guarantee(
    "Every rollout hangs, with `step_timeout` off",
    "ORS in process, rollout workers",
    "the watchdog fires after `watchdog.timeout_seconds` without progress: one line, exit 2, no worker left",
)
def test_without_a_step_timeout_the_watchdog_ends_a_run_whose_rollouts_all_hang(site, tmp_path):
    marker = tmp_path / "hanging_worker"
    env = dict(site, HANG_MARKER=str(marker))
    argv = _argv(
        tmp_path,
        "train.batch_size=1",
        "train.workflow_config.rollout_isolation=process",
        "train.workflow_config.rollout_config.step_timeout=null",
        "watchdog.timeout_seconds=20",
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "platoon", *argv], env=env, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    deadline = time.monotonic() + HANG_GUARD
    while not marker.exists() or not marker.read_text():
        assert child.poll() is None, f"the run ended before its grader hung:\n{child.stderr.read()}"
        assert time.monotonic() < deadline, "the grader was never reached"
        time.sleep(0.2)
    hung_worker = int(marker.read_text())
    assert hung_worker != child.pid  # the grader hangs in a rollout worker
    try:
        _, err = child.communicate(timeout=HANG_GUARD)
    except subprocess.TimeoutExpired:
        child.kill()
        raise AssertionError(f"the watchdog never fired:\n{child.communicate()[1]}") from None
    assert child.returncode == 2, err
    assert "platoon: watchdog: no progress for" in err and "exiting with 2" in err
    assert "Traceback" not in err
    # The watchdog's last wishes stop the workers; give the kernel a moment to reap, as a hang guard only.
    gone_by = time.monotonic() + 30
    while _alive(hung_worker) and time.monotonic() < gone_by:
        time.sleep(0.2)
    assert not _alive(hung_worker)
