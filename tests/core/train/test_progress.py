"""`platoon train`'s progress display, driven directly: why a step took no update, the plain lines, the closing
summary, and the terminal display (rich, on a console forced to be a terminal) with a fake clock and fake steps.
The plain lines of a real run are asserted on the bandit run in test_trainer.py."""

from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

from platoon.train.tinker.admission import Row
from platoon.train.tinker.advantages import GroupResult, MemberCredit
from platoon.train.tinker.progress import (
    LiveProgress,
    StepReport,
    TrainingProgress,
    clock,
    group_fate,
    no_update_reason,
    open_progress,
)
from platoon.train.tinker.workflows import GroupOutput


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _group(rewards: list[float | None], *, datums: int = 1, rejection: str | None = None) -> GroupOutput:
    """A finished group whose members scored `rewards` (None: not scored), with `datums` datums."""
    members = [MemberCredit(collection=None, task_reward=r, task_reward_valid=r is not None) for r in rewards]
    return GroupOutput(
        row=Row(batch=0, task_id="t", pool="bandit", label=None),
        members=[],
        result=GroupResult(members=members, rejection=rejection),
        datums=[object()] * datums,  # type: ignore[list-item]  # only their number matters here
    )


def test_a_group_that_trained_nothing_says_why():
    assert group_fate(_group([1.0, 1.0, 1.0])) == "scored alike"
    assert (
        group_fate(_group([1.0, 0.0, None])) == "advantage 0"
    )  # datums left, every advantage 0 all the same
    assert group_fate(_group([1.0], datums=0)) == "gave nothing to train"
    assert group_fate(_group([None, None], datums=0, rejection="no_completed_root")) == (
        "dropped (no rollout was scored)"
    )


@pytest.mark.parametrize(
    ("fates", "said"),
    [
        (["scored alike"] * 8, "all 8 groups scored alike"),
        (["scored alike"], "the group scored alike"),
        (["stale"] * 2, "all 2 groups were stale (over train.max_staleness)"),
        (
            ["scored alike"] * 5 + ["stale"] * 2 + ["failed"],
            "groups: 5 scored alike, 2 stale, 1 failed",
        ),
        ([], "no group arrived"),
    ],
)
def test_a_step_without_update_says_why_in_a_few_words(fates, said):
    assert no_update_reason(fates) == said


def test_clock_reads_as_a_clock():
    assert [clock(s) for s in (0, 42.4, 725, 3723)] == ["0:00", "0:42", "12:05", "1:02:03"]


def _steps(display: TrainingProgress, fake: FakeClock) -> None:
    """Three steps of 10 s from t=100: no update (alike), an update, an update."""
    display.begin("training platoon/toy for steps 1..4 in /runs/bandit/run")
    for step, reward, updated in ((1, 0.0, False), (2, 0.75, True), (3, 0.5, True)):
        fake.now += 10
        display.step(
            StepReport(
                step=step,
                reward=reward,
                rollouts=16,
                seconds=10.0,
                updated=updated,
                no_update=None if updated else "all 2 groups scored alike",
            )
        )


def test_the_plain_lines_say_the_step_its_reward_why_no_update_elapsed_and_eta(capsys):
    fake = FakeClock()
    display = TrainingProgress(first_step=0, end_step=4, started_at=fake.now - 5, now=fake)
    _steps(display, fake)
    fake.now += 2
    display.say(display.summary("/runs/bandit/run/checkpoints.jsonl"))
    assert capsys.readouterr().err.splitlines() == [
        "platoon: training platoon/toy for steps 1..4 in /runs/bandit/run",
        "platoon: step 1/4: reward 0.000 over 16 rollouts (no update: all 2 groups scored alike); 10.0 s "
        "(elapsed 0:10, ETA 0:30)",
        "platoon: step 2/4: reward 0.750 over 16 rollouts; 10.0 s (elapsed 0:20, ETA 0:20)",
        "platoon: step 3/4: reward 0.500 over 16 rollouts; 10.0 s (elapsed 0:30, ETA 0:10)",
        # the start's whole time (its 5 s of preparation included); the best reward and its step
        "platoon: done: steps 1..3 in 0:37 (2 with an update); reward 0.500 at step 3 (best 0.750 at step 2); "
        "checkpoints in /runs/bandit/run/checkpoints.jsonl",
    ]


def test_the_terminal_display_draws_the_lines_above_a_status_line_and_gives_stderr_back():
    fake = FakeClock()
    screen = Console(file=io.StringIO(), force_terminal=True, record=True, width=120)
    display = LiveProgress(screen, first_step=0, end_step=4, started_at=fake.now, now=fake)
    stderr = sys.stderr
    try:
        _steps(display, fake)
        # while it is drawn, other lines on stderr go above the status line, never through it
        assert sys.stderr is not stderr
        print("platoon: a warning from elsewhere", file=sys.stderr)
        fake.now += 4
        display.groups(3, 8)
        display.evaluating(3)
        status = Console(file=io.StringIO(), force_terminal=True, record=True, width=120)
        status.print(display.status())
    finally:
        display.close()
    assert sys.stderr is stderr

    styled = status.export_text(styles=True, clear=False)
    text = status.export_text()
    for shown in ("3/4 steps", "reward 0.500", "elapsed 0:34", "ETA 0:06", "step 4: 3/8 groups"):
        assert shown in text, text
    assert "evaluating the policy of step 3..." in text
    assert "\x1b[1;36m0.500" in styled  # the reward stands out (bold cyan)

    styled = screen.export_text(styles=True, clear=False)
    printed = screen.export_text()
    assert "platoon: training platoon/toy for steps 1..4 in /runs/bandit/run" in printed
    # the lines without the elapsed time and ETA, which the status line shows
    assert (
        "platoon: step 1/4: reward 0.000 over 16 rollouts (no update: all 2 groups scored alike); 10.0 s\n"
        in (printed)
    )
    assert "platoon: a warning from elsewhere" in printed
    assert "\x1b[33m (no update: all 2 groups scored alike)" in styled
    # what reads the terminal's bytes (a pty, a `script` log) finds the step as in a plain log
    assert "platoon: step 1/4: reward \x1b[1;36m0.000" in styled


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_display_is_live_only_on_a_terminal_with_rich(monkeypatch):
    # not a terminal (a pipe, CI, a log file): the plain lines
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert type(open_progress(first_step=0, end_step=2, started_at=0.0)) is TrainingProgress
    monkeypatch.setattr(sys, "stderr", _Terminal())
    monkeypatch.setenv("TERM", "xterm-256color")
    assert isinstance(open_progress(first_step=0, end_step=2, started_at=0.0), LiveProgress)
    monkeypatch.setenv("TERM", "dumb")
    assert type(open_progress(first_step=0, end_step=2, started_at=0.0)) is TrainingProgress
    # rich missing: the plain lines, not an ImportError
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setitem(sys.modules, "rich.console", None)
    assert type(open_progress(first_step=0, end_step=2, started_at=0.0)) is TrainingProgress
