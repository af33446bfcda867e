"""`platoon train` on the bandit with `train.loss_fn: stable_reinforce` and `gspo` against the embedded local
server (SDKs from 0.38): every step samples, builds its datums (stable_reinforce's naming the recorded sampled
sequences, which the server refuses otherwise) and applies an update with a gradient."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest
from tinker import types

from platoon.cli import main
from platoon.harness.agent import AgentResult
from platoon.harness.function import harness

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"
HALF_RIGHT = "test-new-losses-half-right"

pytestmark = pytest.mark.skipif(
    "stable_reinforce" not in typing.get_args(types.LossFnType), reason="SDKs before 0.38 have neither loss"
)

_started = [0]


@harness(HALF_RIGHT)
async def _half_right(ctx: Any) -> AgentResult:
    """Every other rollout answers right, so every group's rewards differ and its advantages are not zero."""
    _started[0] += 1
    number = _started[0]
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=2)
    await ctx.call_tool("answer", {"letter": "C" if number % 2 else "A"})
    return AgentResult(final_message=reply.text)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    return tmp_path / "logs"


@pytest.mark.parametrize("loss_fn", ["stable_reinforce", "gspo"])
def test_the_bandit_trains_two_steps(site: Path, loss_fn: str, capsys: pytest.CaptureFixture[str]) -> None:
    harness(HALF_RIGHT)(_half_right)  # again: another test may have cleared the registry since this loaded
    argv = [
        "train",
        str(BANDIT),
        f"log_path={site}",
        "train.batch_size=2",
        "train.workflow_config.group_size=4",
        "train.max_staleness=0",
        "train.max_training_steps=2",
        f"train.loss_fn={loss_fn}",
        f"environments=[{{env: platoon-bandit, harness: {HALF_RIGHT}}}]",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    run = site / "bandit" / "run"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in steps if "train/step" in row]
    assert [row["train/batch/skipped_optimizer"] for row in steps] == [0.0, 0.0]
    assert [row["train/batch/task_reward/avg"] for row in steps] == [0.5, 0.5]
    assert all(row["train/optim/grad_norm:mean"] > 0 for row in steps)
    saved = [json.loads(line)["name"] for line in (run / "checkpoints.jsonl").read_text().splitlines()]
    assert saved[-1] == "final"
