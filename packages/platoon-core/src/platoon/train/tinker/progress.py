"""What `platoon train` shows while it trains: one line per step (step i/N, its reward, why a step took no update,
elapsed time and ETA), a line per evaluation, and a closing summary.

On stderr that is a terminal the same lines scroll above a live status line (a bar, elapsed, ETA, the last reward,
the groups of the step in progress), drawn with rich, which is imported only when a run starts and only if it is
installed; anywhere else (pipes, CI, log files) the lines are all there is, so nothing that reads them gets less.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from platoon.console import write_stderr

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.text import Text

    from platoon.train.tinker.workflows import GroupOutput

__all__ = [
    "FAILED",
    "NOTHING_TO_TRAIN",
    "SCORED_ALIKE",
    "STALE",
    "ZERO_ADVANTAGE",
    "LiveProgress",
    "StepReport",
    "TrainingProgress",
    "clock",
    "group_fate",
    "no_update_reason",
    "open_progress",
]

#: what became of a group that trained nothing, as a step's line counts it (see `group_fate`)
SCORED_ALIKE = "scored alike"
STALE = "stale"
FAILED = "failed"
NOTHING_TO_TRAIN = "gave nothing to train"
ZERO_ADVANTAGE = "advantage 0"

#: a group rejected whole by the credit step (`GroupResult.rejection`): why, in a few words
_REJECTIONS = {
    "reward_key_mismatch": "rewards under different keys",
    "no_results": "no rollout gave a result",
    "group_size_rejected": "too few scored rollouts for min_successful_group_size",
    "no_completed_root": "no rollout was scored",
}

#: how a fate reads after "all N groups" (or "the group"), plural then singular
_PREDICATES = {
    SCORED_ALIKE: ("scored alike", "scored alike"),
    STALE: ("were stale (over train.max_staleness)", "was stale (over train.max_staleness)"),
    FAILED: ("failed", "failed"),
    NOTHING_TO_TRAIN: ("gave nothing to train", "gave nothing to train"),
    ZERO_ADVANTAGE: ("had every advantage 0", "had every advantage 0"),
}


def clock(seconds: float) -> str:
    """`0:42`, `12:05`, `1:02:03`: a duration as a clock reads it."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def group_fate(group: GroupOutput) -> str:
    """Why `group`, consumed by a step that applied no update, trained nothing (one of the fates above, or
    `dropped (<why>)` for a group the credit step rejected whole)."""
    if group.failure is not None:
        return FAILED
    rejection = group.result.rejection
    if rejection is not None:
        return f"dropped ({_REJECTIONS.get(rejection, rejection)})"
    if not group.datums:
        return NOTHING_TO_TRAIN
    # Its datums went unsent, so every advantage in them was 0: the usual cause is that its scored rollouts all
    # got one same reward (nothing to prefer in the group).
    scored = {m.task_reward for m in group.result.members if m.task_reward_valid}
    completed = sum(1 for m in group.result.members if m.task_reward_valid)
    return SCORED_ALIKE if completed >= 2 and len(scored) == 1 else ZERO_ADVANTAGE


def no_update_reason(fates: Sequence[str]) -> str:
    """Why a step took no update, in a few words, from what became of each of its groups: `all 8 groups scored
    alike`, `the group was stale (...)`, `groups: 5 scored alike, 2 stale, 1 failed`."""
    counts = Counter(fates)
    if not counts:
        return "no group arrived"
    if len(counts) == 1:
        fate = next(iter(counts))
        many, one = _PREDICATES.get(fate, (f"were {fate}", f"was {fate}"))
        return f"the group {one}" if len(fates) == 1 else f"all {len(fates)} groups {many}"
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))  # ties by name: stable
    return "groups: " + ", ".join(f"{count} {fate}" for fate, count in ranked)


@dataclass(frozen=True)
class StepReport:
    """One finished step, as its line says it."""

    step: int  #: 1-based: the step just finished
    reward: float | None  #: the mean task reward of its scored rollouts (None: none was scored)
    rollouts: int  #: how many rollouts were scored
    seconds: float  #: the step's own wall time
    updated: bool  #: whether it applied an optimizer update
    no_update: str | None = None  #: why not, in a few words (when not updated)
    infra: str = ""  #: `; 2 of 8 rollouts failed in the infrastructure (...)`, or empty


class TrainingProgress:
    """The plain display: lines on stderr, prefixed `platoon: ` as every diagnostic is.

    Keeps what the closing summary needs (the rewards per step, how many updated the policy). `now` is injectable
    so that a test drives the clock.
    """

    #: whether a step's line ends with the elapsed time and ETA (the live display shows them on its status line)
    timing_in_lines = True

    def __init__(
        self, *, first_step: int, end_step: int, started_at: float, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.first_step = first_step  #: the step this start begins after (0 for a fresh run)
        self.end_step = end_step
        self.started_at = started_at  #: when this start began (its preparation included)
        self._now = now
        self.training_since = now()  #: when the first step began
        self.step_ended_at = self.training_since  #: when the last step ended
        self.rewards: dict[int, float] = {}
        self.updated = 0
        self.done = first_step
        self.evaluating_step: int | None = None
        self.arrived = 0
        self.batch = 0

    # -- events -----------------------------------------------------------------------------------------------

    def begin(self, line: str) -> None:
        """Training begins now; `line` says what it trains."""
        self.training_since = self.step_ended_at = self._now()
        self.say(line)

    def groups(self, arrived: int, of: int) -> None:
        """`arrived` of the `of` groups of the step in progress have arrived."""
        self.arrived, self.batch = arrived, of

    def step(self, report: StepReport) -> None:
        self.step_ended_at = self._now()
        self.done = report.step
        self.arrived = 0
        if report.reward is not None:
            self.rewards[report.step] = report.reward
        self.updated += report.updated
        self.show(self.step_parts(report))

    def evaluating(self, step: int) -> None:
        self.evaluating_step = step

    def evaluated(self, step: int, metrics: dict[str, float]) -> None:
        self.evaluating_step = None
        self.say(self.evaluation_line(step, metrics))

    def say(self, line: str) -> None:
        self.show([(line, "")])

    def show(self, parts: Sequence[tuple[str, str]]) -> None:
        """One line, given as (text, style) parts (the plain display keeps only the text)."""
        write_stderr("platoon: " + "".join(text for text, _ in parts) + "\n")

    def close(self) -> None:
        """Training is over (finished or stopped): nothing more is drawn."""

    # -- text -----------------------------------------------------------------------------------------------

    def elapsed(self) -> float:
        return self._now() - self.training_since

    def eta(self) -> float | None:
        """Seconds left at this start's mean step time, counting down between steps; None before the first step
        ends and after the last."""
        finished = self.done - self.first_step
        left = self.end_step - self.done
        if finished <= 0 or left <= 0:
            return None
        per_step = (self.step_ended_at - self.training_since) / finished
        return max(0.0, per_step * left - (self._now() - self.step_ended_at))

    def timing_text(self) -> str:
        eta = self.eta()
        return f"elapsed {clock(self.elapsed())}" + ("" if eta is None else f", ETA {clock(eta)}")

    def step_parts(self, report: StepReport) -> list[tuple[str, str]]:
        """The step's line as (text, style) parts: the plain line is their text, the terminal's their styles."""
        reward = (
            [("no scored rollout", "yellow")]
            if report.reward is None
            else [
                ("reward ", ""),
                (f"{report.reward:.3f}", "bold cyan"),
                (f" over {report.rollouts} rollouts", ""),
            ]
        )
        parts = [(f"step {report.step}/{self.end_step}: ", ""), *reward]
        if not report.updated:
            why = f": {report.no_update}" if report.no_update else ""
            parts.append((f" (no update{why})", "yellow"))
        if report.infra:
            parts.append((report.infra, "red"))
        timing = f" ({self.timing_text()})" if self.timing_in_lines else ""
        parts.append((f"; {report.seconds:.1f} s{timing}", "dim"))
        return parts

    def evaluation_line(self, step: int, metrics: dict[str, float]) -> str:
        reward = metrics.get("eval/reward/avg")
        count = int(metrics.get("eval/reward/count", 0))
        said = "no scored rollout" if reward is None else f"reward {reward:.3f} over {count} rollouts"
        seconds = metrics.get("eval/time")
        return f"evaluation of step {step}: {said}" + ("" if seconds is None else f"; {seconds:.1f} s")

    def summary(self, checkpoints: str) -> str:
        """The closing line of a start that trained to its end."""
        took = clock(self._now() - self.started_at)
        if self.rewards:
            last_step = max(self.rewards)
            best_step = max(self.rewards, key=lambda s: (self.rewards[s], -s))  # ties: the earliest
            reward = (
                f"reward {self.rewards[last_step]:.3f} at step {last_step} "
                f"(best {self.rewards[best_step]:.3f} at step {best_step})"
            )
        else:
            reward = "no scored rollout"
        if self.done <= self.first_step:  # a start that only evaluated the last step
            return f"done: evaluated step {self.done} in {took}; checkpoints in {checkpoints}"
        return (
            f"done: steps {self.first_step + 1}..{self.done} in {took} ({self.updated} with an update); {reward}; "
            f"checkpoints in {checkpoints}"
        )


class LiveProgress(TrainingProgress):
    """The terminal display: the same lines, styled, above a status line that rich redraws a few times a second.

    While it is drawn, whatever else writes to `sys.stderr` (the trainer's other lines, warnings) is printed
    above the status line too (rich's redirection), so nothing tears it.
    """

    timing_in_lines = False

    def __init__(
        self,
        console: Console,
        *,
        first_step: int,
        end_step: int,
        started_at: float,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(first_step=first_step, end_step=end_step, started_at=started_at, now=now)
        from rich.spinner import Spinner

        self.console = console
        self._spinner = Spinner("dots", style="cyan")
        self._live: Any = None

    def begin(self, line: str) -> None:
        from rich.live import Live

        self._live = Live(
            console=self.console,
            get_renderable=self.status,
            refresh_per_second=4,
            transient=True,  # the lines stay; the status line goes when training ends
            redirect_stderr=True,
            # stdout too, only where it is this same terminal (never pull piped data onto the screen)
            redirect_stdout=_is_terminal(sys.stdout),
        )
        self._live.start()
        super().begin(line)

    def show(self, parts: Sequence[tuple[str, str]]) -> None:
        # soft wrap: the terminal folds a long line, so a path in it copies whole
        self.console.print(self.styled(parts), soft_wrap=True)

    @staticmethod
    def styled(parts: Sequence[tuple[str, str]]) -> Text:
        """A line as the terminal shows it. `platoon: step 3/24: ` stays unstyled, so that what reads a terminal's
        output (a `script` log, a test on a pty) finds it as in a plain log."""
        from rich.text import Text

        return Text.assemble("platoon: ", *parts)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def status(self) -> RenderableType:
        """The status line as it reads now: spinner, bar, steps done, last reward, elapsed, ETA, the step in
        progress (and an evaluation in progress, on a line of its own)."""
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        total = self.end_step
        grid = Table.grid(padding=(0, 1))
        row: list[RenderableType] = [
            self._spinner,
            ProgressBar(total=total, completed=self.done, width=30),
            Text(f"{self.done}/{total} steps", style="bold"),
        ]
        last = self.rewards.get(self.done)
        if last is not None:
            row.append(Text.assemble("reward ", (f"{last:.3f}", "bold cyan")))
        eta = self.eta()
        row.append(Text(f"elapsed {clock(self.elapsed())}", style="dim"))
        if eta is not None:
            row.append(Text(f"ETA {clock(eta)}", style="dim"))
        if self.done < total and self.batch:
            row.append(Text(f"step {self.done + 1}: {self.arrived}/{self.batch} groups", style="dim"))
        grid.add_row(*row)
        if self.evaluating_step is None:
            return grid
        evaluating = Text(f"  evaluating the policy of step {self.evaluating_step}...", style="dim")
        outer = Table.grid()
        outer.add_row(grid)
        outer.add_row(evaluating)
        return outer


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError, OSError):  # a closed or replaced stream
        return False


def terminal_console() -> Console | None:
    """A rich console on this process's stderr when it is an interactive terminal and rich is installed, else
    None (the plain lines)."""
    if not _is_terminal(sys.stderr) or os.environ.get("TERM", "") in ("dumb", "unknown"):
        return None
    try:
        from rich.console import Console
    except ImportError:  # rich is optional for the trainer: the plain lines say the same
        return None
    return Console(file=sys.stderr)


def open_progress(*, first_step: int, end_step: int, started_at: float) -> TrainingProgress:
    """The display for this start: live at a terminal, plain lines anywhere else."""
    console = terminal_console()
    if console is None:
        return TrainingProgress(first_step=first_step, end_step=end_step, started_at=started_at)
    return LiveProgress(console, first_step=first_step, end_step=end_step, started_at=started_at)
