"""The attempt log on its own: what a start that resumes at step S keeps, supersedes, feeds again and skips, when
groups ran ahead of training (`train.max_staleness` > 0) and others were in flight as the last start died. The whole
trainer across a real SIGKILL is tested in tests/faults/test_trainer_faults.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from platoon.train.tinker.admission import Row
from platoon.train.tinker.attempt_log import ATTEMPTS_FILE, AttemptLog


def _row(batch: int, slot: int) -> Row:
    return Row(batch=batch, task_id=f"task-{batch}-{slot}", pool="pool", label=None, slot=slot)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _first_start(run: Path) -> None:
    """Batches of 2; step 1 trains batch 0; step 2 trains (1, 0) and (2, 0), which ran ahead, while (1, 1) and
    (2, 1) are still in flight; step 3 trains them, then the start dies before step 3's checkpoint."""
    log = AttemptLog(run, start_step=0)
    log.started([_row(0, 0), _row(0, 1)])
    log.consumed(1, [{"row": _row(0, 0), "state": "trained"}, {"row": _row(0, 1), "state": "dropped"}])
    log.started([_row(1, 0), _row(1, 1), _row(2, 0), _row(2, 1)])
    log.consumed(2, [{"row": _row(1, 0), "state": "trained"}, {"row": _row(2, 0), "state": "trained"}])
    log.consumed(3, [{"row": _row(1, 1), "state": "trained"}, {"row": _row(2, 1), "state": "trained"}])


@pytest.mark.guarantee(
    "A start dies with groups in flight or run ahead (`max_staleness` > 0)",
    "the attempt log",
    "the resume feeds again what its weights lack and skips what ran ahead into them",
)
def test_a_resume_feeds_again_what_its_weights_lack_and_skips_what_ran_ahead_into_them(tmp_path, capsys):
    _first_start(tmp_path)
    log = AttemptLog(tmp_path, start_step=2)  # the checkpoint of step 2 is the newest
    assert "2 group attempt(s) of an earlier start that its weights do not contain" in capsys.readouterr().err
    superseded = [row for row in _lines(tmp_path / ATTEMPTS_FILE) if row["state"] == "superseded"]
    assert [(row["batch"], row["slot"], row["was"]) for row in superseded] == [
        (1, 1, "trained"),
        (2, 1, "trained"),
    ]
    assert log.unfinished_batches == [1]
    plan = log.resume_plan([(1, 2)])
    # (1, 1) trained only into weights no checkpoint kept: fed again; (2, 0) is in step 2's weights: not again
    assert plan.carried == [(1, 1)] and plan.finished == {(2, 0)}
    log.started([_row(1, 1), _row(2, 1)])
    again = [row for row in _lines(tmp_path / ATTEMPTS_FILE)[-2:]]
    assert [(row["batch"], row["slot"], row["attempt"]) for row in again] == [(1, 1, 2), (2, 1, 2)]


def test_a_second_resume_at_the_same_step_supersedes_nothing_again(tmp_path, capsys):
    _first_start(tmp_path)
    AttemptLog(tmp_path, start_step=2)
    before = (tmp_path / ATTEMPTS_FILE).read_bytes()
    capsys.readouterr()
    again = AttemptLog(tmp_path, start_step=2)
    assert (tmp_path / ATTEMPTS_FILE).read_bytes() == before and capsys.readouterr().err == ""
    assert again.resume_plan([(1, 2)]).carried == [(1, 1)]


def test_a_row_a_killed_writer_left_half_written_is_cut_off(tmp_path):
    _first_start(tmp_path)
    with open(tmp_path / ATTEMPTS_FILE, "ab") as log:
        log.write(b'{"batch": 3, "slot": 0, "task_id": "task-3-0", "attem')
    AttemptLog(tmp_path, start_step=3)
    rows = _lines(tmp_path / ATTEMPTS_FILE)  # every line parses
    assert not [row for row in rows if row["state"] == "superseded"]  # step 3 is in the resumed weights
