"""The Harbor dataset check (docs/harbor.md, "Checking a dataset") through the real rollout path: `platoon.testing.run_episode` with `service:
harbor` and the `platoon-oracle` / `platoon-noop` harnesses (platoon-harnesses), in Docker and on the process
provider. Here, not in tests/harbor, because it needs the harnesses and the testing extra beside platoon-harbor.

CI starts the Docker engine and builds `platoon-test/python:bookworm` first (`.ci/docker-engine start`).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from platoon.testing import run_episode

PYTHON_IMAGE = "platoon-test/python:bookworm"
EXAMPLE_TASKS = Path(__file__).resolve().parents[3] / "examples" / "harbor-dataset" / "tasks"


@pytest.mark.slow
@pytest.mark.parametrize(("harness", "expected"), [("platoon-oracle", 1.0), ("platoon-noop", 0.0)])
def test_the_example_dataset_scores_1_with_the_oracle_and_0_with_noop_on_every_task(
    harness, expected, env_name
):
    kwargs = {"dataset_dir": str(EXAMPLE_TASKS), "name": env_name}
    for task_id in ("fizzbuzz", "hello-file", "json-config", "word-count"):
        episode = run_episode(task_id, service="harbor", service_kwargs=kwargs, harness=harness)
        outcome = episode.outcome
        assert outcome is not None, task_id
        assert (outcome["status"], outcome["rewards"]["reward"]) == ("scored", expected), (task_id, outcome)


@pytest.mark.slow
def test_a_sandbox_that_cannot_start_is_an_untrainable_sandbox_start(tmp_path, env_name):
    task = tmp_path / "no-image"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text('[environment]\ndocker_image = "platoon-test/no-such-image:never"\n')
    (task / "instruction.md").write_text("Nothing.\n")
    (task / "tests" / "test.sh").write_text("echo 0 > /logs/verifier/reward.txt\n")
    episode = run_episode(
        "no-image",
        service="harbor",
        service_kwargs={"dataset_dir": str(tmp_path), "name": env_name},
        harness="platoon-noop",
    )
    assert episode.outcome is not None
    assert (episode.outcome["status"], episode.outcome["failure_kind"]) == ("error", "sandbox_start")


def test_the_oracle_on_the_process_provider(tmp_path):
    task = tmp_path / "tasks" / "answer"
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "task.toml").write_text("[agent]\ntimeout_sec = 60\n")
    (task / "instruction.md").write_text("Write 42 to /app/answer.txt.\n")
    # file contents are not translated on the process provider: scripts prefix paths with $PLATOON_SANDBOX_ROOT
    (task / "tests" / "test.sh").write_text(
        textwrap.dedent(
            """\
            R="${PLATOON_SANDBOX_ROOT:-}"
            if [ "$(cat "$R/app/answer.txt" 2>/dev/null)" = 42 ]; then echo 1 > "$R/logs/verifier/reward.txt"
            else echo 0 > "$R/logs/verifier/reward.txt"; fi
            """
        )
    )
    (task / "solution" / "solve.sh").write_text('echo 42 > "${PLATOON_SANDBOX_ROOT:-}/app/answer.txt"\n')
    kwargs = {
        "dataset_dir": str(tmp_path / "tasks"),
        "provider": "process",
        "provider_options": {"scratch_root": str(tmp_path)},
    }
    episode = run_episode("answer", service="harbor", service_kwargs=kwargs, harness="platoon-oracle")
    assert episode.outcome is not None
    assert (episode.outcome["status"], episode.outcome["rewards"]) == ("scored", {"reward": 1.0})
