"""docs/getting-started.md's config runs as written: the file the page shows is `examples/getting-started/train.yaml`,
`config validate --strict --tasks` passes it, and `platoon train` takes graded steps on the embedded local server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from platoon.cli import main

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "getting-started" / "train.yaml"
PAGE = REPO / "docs" / "getting-started.md"


def test_the_page_shows_the_example_config_and_its_row_format():
    page = PAGE.read_text()
    shown = re.search(r"```yaml\n# train\.yaml\n(.*?)```", page, re.S)
    assert shown is not None
    assert yaml.safe_load(shown.group(1)) == yaml.safe_load(EXAMPLE.read_text())
    row = re.search(r"```json\n(.*?)\n```", page, re.S)
    assert row is not None
    rows = [json.loads(line) for line in (EXAMPLE.parent / "tasks.jsonl").read_text().splitlines()]
    assert json.loads(row.group(1)) in rows


@pytest.mark.slow
def test_the_getting_started_config_validates_and_trains_as_written(tmp_path, monkeypatch, capsys):
    # From a fresh working directory (log_path: runs lands here), with no key and a cache of the test's own.
    monkeypatch.chdir(tmp_path)
    for variable in ("TINKER_API_KEY", "TINKER_BASE_URL", "WANDB_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))

    assert main(["config", "validate", "--strict", "--tasks", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "  training tasks: 40, drawn in epochs of 40 (5 batches of 8), 30 steps planned"
    )

    assert main(["train", str(EXAMPLE), "train.max_training_steps=2"]) == 0
    steps = [line for line in capsys.readouterr().err.splitlines() if line.startswith("platoon: step ")]
    assert len(steps) == 2
    for line in steps:
        # every rollout of the batch was graded (8 tasks x 4 rollouts): no "no scored rollout"
        assert re.match(r"platoon: step [12]/2: reward \d\.\d{3} over 32 rollouts", line), line
    run = tmp_path / "runs" / "getting-started" / "run"
    checkpoints = [json.loads(line) for line in (run / "checkpoints.jsonl").read_text().splitlines()]
    assert checkpoints[-1]["name"] == "final"
