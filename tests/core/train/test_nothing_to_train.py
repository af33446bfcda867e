"""A start of a run that already reached its last step says "nothing to train" and exits 0 knowing only the task
listing (from the cache) and the checkpoint log: no environment SDK, no Tinker SDK, no tokenizer, no local
server. A changed renderer is still refused (78) first, as on any resume.

The finished run is written as training leaves one (identity.json, a final checkpoint row); each start runs in a
fresh process that reports what it imported.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"

RUNNER = textwrap.dedent(
    """
    import json, sys
    from platoon.cli import main
    try:
        status = main(sys.argv[1:])
    except SystemExit as exc:
        status = exc.code
    heavy = ("openreward", "tinker", "torch", "tokenizers", "transformers")
    print(json.dumps({"status": status, "imported": [m for m in heavy if m in sys.modules]}))
    """
)


@pytest.fixture
def finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The bandit run under `tmp_path/runs` finished at step 2, and its listing in the site cache."""
    from platoon.config import load_config
    from platoon.rollouts.records import write_identity
    from platoon.train.tinker.checkpoints import CheckpointLog
    from platoon.train.tinker.task_order import list_training_tasks

    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    monkeypatch.delenv("PLATOON_TASK_CACHE")
    loaded = load_config(str(BANDIT), [f"log_path={tmp_path / 'runs'}"])
    asyncio.run(
        list_training_tasks(loaded.config, base_dir=BANDIT.parent)
    )  # fills the cache, as any start does
    run = tmp_path / "runs" / "bandit" / "run"
    run.mkdir(parents=True)
    write_identity(run, "platoon/toy", "qwen3_instruct", {})
    CheckpointLog(run).record(
        "final",
        kind="final",
        batch=2,
        state_path="tinker://local/weights/final",
        sampler_path="tinker://local/sampler_weights/final",
        task_order={"version": 1, "mode": "auto", "batch_size": 8, "next_batch": 2, "epoch": 0},
    )
    return tmp_path


def _train(project: Path, *overrides: str) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PLATOON_TASK_CACHE", "TINKER_BASE_URL")}
    env["PLATOON_SITE"] = str(project / "site.yaml")
    argv = ["train", str(BANDIT), f"log_path={project / 'runs'}", "train.max_training_steps=2", *overrides]
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, *argv],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.slow
def test_a_finished_run_says_nothing_to_train_before_loading_or_starting_anything(finished):
    checkpoints = (finished / "runs" / "bandit" / "run" / "checkpoints.jsonl").read_text()
    report, err = _train(finished)
    assert report["status"] == 0, err
    assert "nothing to train: " in err and "already reached step 2 of 2" in err
    # and how to go on: train further (the limit that ended it), or start afresh in another run directory
    assert (
        "platoon: to go on, raise train.max_training_steps (the run resumes after step 2); to start afresh, add "
        "stats.trial_name=NEW (another run directory) or delete this one"
    ) in err.splitlines()
    assert "local Tinker" not in err, "the local server is not started for a run with nothing to train"
    assert report["imported"] == [], "no SDK, tokenizer or torch is loaded to find there is nothing to train"
    run = finished / "runs" / "bandit" / "run"
    assert (run / "checkpoints.jsonl").read_text() == checkpoints
    assert not (run / "process.json").exists()


@pytest.mark.slow
def test_a_changed_renderer_is_still_refused_before_nothing_to_train(finished):
    report, err = _train(finished, "train.renderer_name=role_colon")
    assert report["status"] == 78, err
    assert "renderer" in err and "qwen3_instruct" in err and "role_colon" in err
    assert "nothing to train" not in err
