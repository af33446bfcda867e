"""A run in which nothing trains because every rollout fails in the infrastructure with one kind, on the embedded
local server with the real Tinker SDK: after `train.max_infra_failed_steps` such steps in a row (3 by default) it
stops with one line naming the kind, exit 1, instead of stepping on with "(no update)". Each rollout fails with its
own message (as sampling errors carrying a request id do), so no one cause is shared by every group; the kind is.
Its checkpoints, metrics and rollout records stay, and the same command resumes once the cause is gone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.harness.agent import AgentResult
from platoon.harness.function import harness

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"
HARNESS = "test-nothing-trains"
_state = {"started": 0, "broken": True}


@harness(HARNESS)
async def _losing_its_connection(ctx: Any) -> AgentResult:
    """Samples, then (while broken) loses its connection with a message of its own; else answers C or A."""
    _state["started"] += 1
    number = _state["started"]
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=1)
    if _state["broken"]:
        raise ConnectionError(f"request req-{number:04d} lost its connection")
    await ctx.call_tool("answer", {"letter": "C" if number % 2 else "A"})
    return AgentResult(final_message=reply.text)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.guarantee(
    "Every rollout of 3 steps fails in the infrastructure with one kind, each with its own message",
    "bandit, training",
    "the run stops after `train.max_infra_failed_steps` (3) such steps with one line naming the kind, exit 1; "
    "checkpoints, metrics and rollout records kept; the same command resumes",
)
def test_a_run_whose_every_rollout_fails_in_the_infrastructure_stops_naming_the_kind(
    tmp_path, monkeypatch, capsys
):
    harness(HARNESS)(_losing_its_connection)  # again: another test may have cleared the registry
    _state.update(started=0, broken=True)
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    argv = [
        "train",
        str(BANDIT),
        f"log_path={tmp_path / 'logs'}",
        "train.batch_size=2",
        "train.workflow_config.group_size=2",
        "train.max_training_steps=10",
        "train.max_staleness=0",
        f"environments=[{{env: platoon-bandit, harness: {HARNESS}}}]",
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    said = [
        line for line in err.splitlines() if line.startswith(("platoon: step ", "platoon: training stopped"))
    ]
    assert len(said) == 4
    assert all("4 of 4 rollouts failed in the infrastructure (harness_crash 4)" in line for line in said[:3])
    # the line quotes one rollout of step 3 (the 9th to 12th started), whichever finished last
    number = re.search(r"req-(\d{4})", said[3])
    assert number is not None and 9 <= int(number.group(1)) <= 12
    assert said[3].replace(number.group(0), "req-N") == (
        "platoon: training stopped at step 3: every rollout of steps 1..3 failed in the infrastructure with "
        "harness_crash (the last: ConnectionError: request req-N lost its connection), so nothing trained "
        "(train.max_infra_failed_steps 3); fix that, then the same command resumes"
    )
    run = tmp_path / "logs" / "bandit" / "run"
    assert [row["step"] for row in _rows(run / "metrics.jsonl")] == [1, 2, 3]
    # nothing trained: the launch checkpoint is the resume point, so the failing steps are trained again
    assert [row["name"] for row in _rows(run / "checkpoints.jsonl")] == ["recovery-000000"]
    events = [
        json.loads(line)
        for path in (run / "rollouts").rglob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert events  # the failed rollouts' records are kept

    # The cause gone, the same command resumes at step 1 and trains.
    _state["broken"] = False
    assert main([*argv[:-3], "train.max_training_steps=2", *argv[-2:]]) == 0
    err = capsys.readouterr().err
    assert "resuming at step 1 from recovery-000000" in err
    assert [row["name"] for row in _rows(run / "checkpoints.jsonl")][-1] == "final"


@pytest.mark.slow
def test_the_stop_waits_for_the_configured_number_of_steps(tmp_path, monkeypatch, capsys):
    harness(HARNESS)(_losing_its_connection)
    _state.update(started=0, broken=True)
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    argv = [
        "train",
        str(BANDIT),
        f"log_path={tmp_path / 'logs'}",
        "train.batch_size=1",
        "train.workflow_config.group_size=2",
        "train.max_training_steps=10",
        "train.max_staleness=0",
        "train.max_infra_failed_steps=2",
        f"environments=[{{env: platoon-bandit, harness: {HARNESS}}}]",
    ]
    assert main(argv) == 1
    stopped = capsys.readouterr().err.splitlines()[-1]
    assert stopped.startswith("platoon: training stopped at step 2: every rollout of steps 1..2 failed")
    assert stopped.endswith("(train.max_infra_failed_steps 2); fix that, then the same command resumes")
