"""Where a training run's metrics go: `metrics.jsonl` in the run directory, always, and a Weights &
Biases run when `stats.wandb.mode` is `online` or `offline`.

The W&B project defaults to the experiment name, the run name to the trial name and the group to
`<experiment>_<trial>` (config_defs fills them); the full config is logged. A resumed run continues its W&B run
(`resume="must"`) by the id its checkpoint rows carry. Without the `wandb` package installed the run goes on with
`metrics.jsonl` alone and says so once.

`metrics.jsonl` holds one history: a start moves the rows of steps after its start step (logged by a start that
ended before a checkpoint kept them, so this start redoes those steps) to `metrics_superseded.jsonl`, and cuts off a
row a dead writer left half-written, so every line parses and a plot of the file shows each step once.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.rollouts.records import (
    append_jsonl,
    append_jsonl_rows,
    parse_row,
    repair_jsonl,
    replace_jsonl_rows,
    torn_path,
)

if TYPE_CHECKING:
    from platoon.config.training import PlatoonTinkerRLTrainerConfig

__all__ = ["METRICS_FILE", "SUPERSEDED_FILE", "MetricsLog", "supersede_redone_steps"]

log = logging.getLogger("platoon.train")

METRICS_FILE = "metrics.jsonl"
#: where the rows of steps a later start redid go
SUPERSEDED_FILE = "metrics_superseded.jsonl"


def _step_of(row: Mapping[str, Any], key: str = "step") -> int | None:
    value = row.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def supersede_redone_steps(run_dir: str | os.PathLike[str], start_step: int) -> int:
    """Before a start logs anything: cut off a half-written last row, then move the rows this start will log again
    out of `metrics.jsonl` into `metrics_superseded.jsonl`; returns how many rows moved.

    A row is redone when its `step` is after `start_step`, except an evaluation of a step at or before it (the policy
    it measured is the one this start resumes). Rows are in step order, so only the tail after the last training row
    at or before `start_step` is read row by row; `metrics.jsonl` is replaced atomically.
    """
    path = Path(run_dir) / METRICS_FILE
    repair_jsonl(path)
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError:
        return 0  # no metrics yet (or unreadable: the first append says why)
    tail_from = len(lines)
    for index in range(len(lines) - 1, -1, -1):
        row = parse_row(lines[index])
        step = _step_of(row) if row is not None else None
        if row is not None and "eval/step" not in row and step is not None and step <= start_step:
            break
        tail_from = index
    kept: list[dict[str, Any]] = []
    moved: list[dict[str, Any]] = []
    torn: list[bytes] = []
    for line in lines[tail_from:]:
        if not line.strip():
            continue
        row = parse_row(line)
        if row is None:
            torn.append(line)  # a cut-off row an older platoon terminated: not a row anyone can plot
            continue
        step, evaluated = _step_of(row), _step_of(row, "eval/step")
        redone = step is not None and step > start_step and (evaluated is None or evaluated > start_step)
        (moved if redone else kept).append(row)
    if not moved and not torn:
        return 0
    if moved:
        when = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        marker = {"superseded_by_start_at_step": start_step, "superseded_at": when}
        append_jsonl_rows(Path(run_dir) / SUPERSEDED_FILE, [{**row, **marker} for row in moved])
    if torn:
        with contextlib.suppress(OSError), open(torn_path(path), "ab") as aside:
            aside.write(b"".join(line + b"\n" for line in torn))
    head = b"".join(line + b"\n" for line in lines[:tail_from])
    replace_jsonl_rows(path, head, kept)
    if moved:
        steps = sorted({_step_of(row) or 0 for row in moved})
        print(
            f"platoon: {path.name}: this start redoes steps after {start_step}, so the {len(moved)} row(s) an "
            f"earlier start logged for steps {steps[0]}..{steps[-1]} moved to {SUPERSEDED_FILE}",
            file=sys.stderr,
            flush=True,
        )
    return len(moved)


class MetricsLog:
    """Append one row per logged step to `metrics.jsonl` (and to W&B); `time/elapsed_seconds` and `time/step`
    are added to every training row. Opening it for a start at `start_step` supersedes the rows of the steps this
    start redoes (`supersede_redone_steps`)."""

    def __init__(
        self,
        run_dir: Path,
        config: PlatoonTinkerRLTrainerConfig,
        *,
        resume_run_id: str | None = None,
        start_step: int = 0,
    ) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        supersede_redone_steps(run_dir, start_step)
        self._started = time.monotonic()
        self._last_step_time = self._started
        self._wandb_run: Any = None
        self._wandb_step = -1
        settings = config.stats.wandb
        if settings.mode == "disabled":
            return
        try:
            import wandb
        except ImportError:
            print(
                f"platoon: stats.wandb.mode is {settings.mode} but the wandb package is not installed: metrics go to "
                f"{self.path} only (pip install wandb, or set stats.wandb.mode: disabled)",
                file=sys.stderr,
                flush=True,
            )
            return
        run_id = resume_run_id or settings.resume_run_id
        if settings.api_key:
            os.environ.setdefault("WANDB_API_KEY", settings.api_key)
        if settings.base_url:
            os.environ.setdefault("WANDB_BASE_URL", settings.base_url)
        try:
            self._wandb_run = wandb.init(
                mode=settings.mode,
                project=settings.project,
                entity=settings.entity,
                name=settings.name,
                group=settings.group,
                tags=list(settings.tags) or None,
                notes=settings.notes,
                dir=str(run_dir),
                id=run_id,
                resume="must" if run_id else None,
                config=config.model_dump(mode="json"),
            )
        except Exception as exc:  # a logging backend never stops training: metrics.jsonl has everything
            print(
                f"platoon: W&B did not start ({type(exc).__name__}: {exc}); metrics go to {self.path} only",
                file=sys.stderr,
                flush=True,
            )
            self._wandb_run = None

    @property
    def wandb_run_id(self) -> str | None:
        """The W&B run's id (recorded in `checkpoints.jsonl` so a resume continues it), None without W&B."""
        return None if self._wandb_run is None else str(self._wandb_run.id)

    def log(self, step: int, metrics: Mapping[str, Any], *, timing: bool = True) -> dict[str, Any]:
        """Append `{"step": step, **metrics}` (plus the timing keys when `timing`); returns the row written."""
        now = time.monotonic()
        row: dict[str, Any] = {"step": step, **metrics}
        if timing:
            row["time/elapsed_seconds"] = now - self._started
            row["time/step"] = now - self._last_step_time
            self._last_step_time = now
        append_jsonl(self.path, row)
        if self._wandb_run is not None:
            # W&B steps only go forward: an evaluation logged at an earlier step than the last is logged at it.
            self._wandb_step = max(self._wandb_step, step)
            values = {key: value for key, value in row.items() if key != "step"}
            try:
                self._wandb_run.log(values, step=self._wandb_step)
            except Exception as exc:  # a logging backend never stops training
                log.warning("W&B logging failed at step %d: %s", step, exc)
        return row

    def finish(self) -> None:
        """Close the W&B run (idempotent)."""
        run, self._wandb_run = self._wandb_run, None
        if run is not None:
            try:
                run.finish()
            except Exception as exc:
                log.warning("finishing the W&B run failed: %s", exc)
