"""`platoon train` end to end: the bandit example learns on the embedded local server; key refusals come first.

The bandit's answer is one token of a 265-token vocabulary, so a random toy model starts near 0 reward; group
baselines must lift it to near 1 within the run.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from platoon.cli import main

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "bandit" / "train.yaml"


def _run_dir(log_path: Path) -> Path:
    return log_path / "bandit" / "run"


@pytest.mark.slow
def test_the_bandit_example_learns_on_the_local_server(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    # The local server keeps its checkpoints under the site cache: a profile points it into the test's directory.
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    started = time.monotonic()
    status = main(["train", str(EXAMPLE), f"log_path={tmp_path}", "train.max_training_steps=20"])
    seconds = time.monotonic() - started
    err = capsys.readouterr().err
    assert status == 0, err
    run = _run_dir(tmp_path)
    assert (tmp_path / "cache" / "local-tinker").is_dir()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    curve = [row["train/batch/task_reward/avg"] for row in rows]
    print(f"{seconds:.1f} s; reward per step: {' '.join(f'{r:.2f}' for r in curve)}")
    assert [row["step"] for row in rows] == list(range(1, 21))
    assert curve[0] < 0.1, f"a random model rarely answers C: {curve}"
    assert statistics.fmean(curve[-3:]) >= 0.9, f"the reward did not reach near 1: {curve}"
    assert rows[-1]["train/optim/updates_total"] >= 1
    for name in ("config.resolved.yaml", "lock.json", "checkpoints.jsonl"):
        assert (run / name).is_file(), name
    assert not (run / "process.json").exists()  # released at the end
    checkpoints = [json.loads(line) for line in (run / "checkpoints.jsonl").read_text().splitlines()]
    assert checkpoints[0]["name"] == "recovery-000000" and checkpoints[-1]["name"] == "final"
    assert all(c["sampler_path"].startswith("tinker://") for c in checkpoints)
    assert "step 20/20" in err


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (None, "TINKER_API_KEY is not set: the policy is sampled through Tinker, which needs it"),
        ("sk-wrong", "TINKER_API_KEY must start with tml-, as the Tinker client requires"),
    ],
)
def test_a_missing_or_malformed_key_is_one_line_and_78_before_anything_is_written(
    tmp_path, monkeypatch, capsys, key, message
):
    if key is None:
        monkeypatch.delenv("TINKER_API_KEY", raising=False)
    else:
        monkeypatch.setenv("TINKER_API_KEY", key)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    argv = ["train", str(EXAMPLE), f"log_path={tmp_path}", "tinker_base_url=http://127.0.0.1:9"]
    assert main(argv) == 78
    lines = [line for line in capsys.readouterr().err.splitlines() if "site profile" not in line]
    assert lines == [f"platoon: {message}"]
    assert list(tmp_path.iterdir()) == []


def test_a_config_without_a_length_of_training_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert main(["train", str(EXAMPLE), f"log_path={tmp_path}", "train.max_training_steps=null"]) == 78
    assert "set num_epochs or max_training_steps" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_run_dir_in_use_is_refused(tmp_path, monkeypatch, capsys):
    import socket
    import subprocess

    run = _run_dir(tmp_path)
    run.mkdir(parents=True)
    holder = subprocess.Popen(["sleep", "60"])
    try:
        record = {"command": ["platoon", "train"], "host": socket.gethostname(), "pid": holder.pid}
        (run / "process.json").write_text(json.dumps(record))
        assert main(["train", str(EXAMPLE), f"log_path={tmp_path}"]) == 78
    finally:
        holder.kill()
        holder.wait()
    assert "is in use" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["process.json"]
