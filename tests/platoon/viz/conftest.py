"""Fixtures of the viewer's tests: event files of real number-search rollouts, and a training run's rollouts
directory of real bandit rollouts written as the trainer writes them, made once per session."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

import viz_runs


@dataclass
class Runs:
    """The event files (and the collection dumps beside them) of the three rollouts, and a training run's
    directory (`viz_runs.training_layout`)."""

    codeact: Path
    react: Path
    tree: Path
    training: Path

    @staticmethod
    def dump_of(events: Path) -> Path:
        """`trajectory_collection.json`, which `run_episode` writes in the rollout's output dir."""
        return events.parent.parent / "trajectory_collection.json"


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    base = tmp_path_factory.mktemp("viz-runs")
    return Runs(
        codeact=viz_runs.codeact_run(base / "codeact"),
        react=viz_runs.react_run(base / "react"),
        tree=viz_runs.tree_run(base / "tree"),
        training=viz_runs.training_layout(base / "training"),
    )
