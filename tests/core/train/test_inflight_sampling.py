"""`train.sampling_client_kind: inflight`: refused at start where the Tinker SDK cannot ask for it (0.16.1), and
refused with `max_staleness: 0`, where nothing is ever in flight."""

from __future__ import annotations

import inspect
from importlib.metadata import version
from pathlib import Path

import pytest

from platoon.cli import main

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"
INFLIGHT = ["train.sampling_client_kind=inflight", "train.max_staleness=1"]


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    return profile


def _sdk_has_inflight() -> bool:
    import tinker

    return "kind" in inspect.signature(tinker.TrainingClient.save_weights_and_get_sampling_client).parameters


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("platoon: train.")]


def test_inflight_is_refused_at_start_by_an_sdk_without_it(tmp_path, site, capsys):
    """Run with each SDK of the lock: 0.16.1 (`.venv-tinker-oldest`) refuses in one line, 0.38 accepts."""
    args = [str(BANDIT), f"log_path={tmp_path / 'runs'}", *INFLIGHT]
    if _sdk_has_inflight():
        assert main(["config", "validate", *args]) == 0
        assert "sampling_client_kind" not in capsys.readouterr().out
        return
    message = (
        "train.sampling_client_kind: inflight needs a Tinker SDK with in-flight sampling clients (0.38 has them); "
        f"this environment has tinker {version('tinker')}: upgrade it (pip install 'tinker>=0.38,<0.39'), or "
        "leave train.sampling_client_kind at snapshot"
    )
    assert main(["train", *args, "train.max_training_steps=1"]) == 78
    assert _error_lines(capsys.readouterr().err) == [f"platoon: {message}"]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("checkpoints.jsonl"))
    assert main(["config", "validate", *args]) == 78
    assert f"  {message}" in capsys.readouterr().out.splitlines()


def test_inflight_with_max_staleness_0_is_refused(tmp_path, site, capsys):
    args = [str(BANDIT), f"log_path={tmp_path / 'runs'}", "train.sampling_client_kind=inflight"]
    assert main(["config", "validate", *args, "train.max_staleness=0"]) == 78
    out = capsys.readouterr().out
    assert out.splitlines()[1] == (
        "  train.sampling_client_kind: ValueError: sampling_client_kind inflight needs max_staleness above 0 (or "
        "unset): with 0 every rollout ends before the weights change, so there is nothing in flight to update"
    )
