"""benchmarks/scale.py at its smallest size (`--smoke`: 8 rollouts, 0.05 s per call, 3 calls an episode), so the
benchmark cannot rot: each harness's configuration runs `platoon train`'s rollout phase in a process of its own,
every rollout finishes, and the figures it prints are the ones its docstring explains. Its speed is not checked."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "scale.py"
HARNESSES = ["platoon-react", "platoon-bash", "platoon-codeact"]


def benchmark_module() -> Any:
    found = importlib.util.spec_from_file_location("scale_benchmark_under_test", SCRIPT)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_smallest_size_runs_every_harness_to_the_end_and_prints_each_figure(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["harness"] for r in results] == HARNESSES
    for result in results:
        assert "error" not in result, result
        assert result["concurrency"] == 8 and result["latency"] == "fixed" and result["latency_s"] == 0.05
        # every rollout finished, scored, and the policy played each game to the end in its 3 guesses (2 where two
        # tasks' answers sit next to each other)
        assert result["rollouts"] == result["finished"] == 8
        assert 2 * 8 <= result["model_calls"] <= 3 * 8
        assert result["calls_per_episode"] == result["model_calls"] / 8
        assert result["ideal_episodes_per_s"] == pytest.approx(8 / result["calls_per_episode"] / 0.05)
        assert result["ratio"] == pytest.approx(result["episodes_per_s"] / result["ideal_episodes_per_s"])
        assert isinstance(result["target_met"], bool)
        assert result["phase_s"] > 0 and result["floor_s"] == pytest.approx(0.05 * 3, abs=0.051)
        assert result["unbound_calls_s"] == 0  # every call was made by a rollout the gateway opened
        for key in (
            "cpu_ms_per_call",
            "tokenize_ms_per_call",
            "policy_ms_per_call",
            "mb_per_rollout",
            "gc_s",
        ):
            assert math.isfinite(result[key]) and result[key] >= 0, key
        assert result["tokenize_ms_per_call"] < result["cpu_ms_per_call"]
        assert result["rss_peak_mb"] >= result["rss_before_mb"] > 0
        assert result["lag_samples"] > 0 and result["lag_max_ms"] >= result["lag_p99_ms"] >= 0

    # the table a person reads: a header and one row per configuration, each column where the header puts it
    scale = benchmark_module()
    header = scale.header()
    assert header.split() == [name for name, _, _ in scale.COLUMNS]
    for result in results:
        line = scale.row(result)
        assert line.startswith(result["harness"]) and line.split()[1] == "8"
        assert "8/8" in line


def test_a_configuration_it_cannot_run_is_one_line_with_the_usage_status(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--concurrency", "12", "--harness", "platoon-nope"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 64
    assert done.stdout == ""
    assert done.stderr.strip() == (
        "scale.py: unknown harness 'platoon-nope' (one of platoon-react, platoon-bash, platoon-codeact); "
        "concurrency 12 is not a multiple of the group size 8"
    )
