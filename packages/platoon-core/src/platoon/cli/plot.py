"""`platoon plot RUN_DIR`: a PNG of a training run's reward curve, read from the run's `metrics.jsonl`.

matplotlib (the `plot` extra) is imported only when the command runs, and drawn through its Agg canvas without
pyplot, so no display, no GUI backend and no global figure state are involved. The rows are read as the trainer
writes them: one JSON object a line, training rows keyed by `step`, evaluation rows by `eval/step`; a torn last
line (a run still writing, or killed mid-write) is skipped rather than refused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, TypeGuard

import typer

from platoon.errors import PlatoonError, UsageError

METRICS_FILE = "metrics.jsonl"
TRAIN_REWARD = "train/batch/task_reward/avg"
EVAL_REWARD = "eval/reward/avg"
# platoon-core's extra: a bare `platoon[plot]` would fetch the registry's unrelated `platoon`
MISSING_MATPLOTLIB = "platoon plot needs matplotlib, which is not installed: pip install 'platoon-core[plot]'"
#: what the legend calls the default curves
LABELS = {TRAIN_REWARD: "reward (mean)", EVAL_REWARD: "eval reward (mean)"}
#: the statistic a metrics key ends with, as the legend says it
_STATISTICS = {"avg": "mean", "min": "min", "max": "max", "count": "count", "std": "std"}


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_series(path: Path, metrics: list[str]) -> dict[str, list[tuple[int, float]]]:
    """metric -> (step, value) points in step order. An `eval/...` metric is placed at its row's `eval/step`,
    any other at `step`; a later row for the same step replaces an earlier one (a resumed run's rows)."""
    points: dict[str, dict[int, float]] = {metric: {} for metric in metrics}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn or blank line
        if not isinstance(row, dict):
            continue
        for metric in metrics:
            value = row.get(metric)
            step = row.get("eval/step" if metric.startswith("eval/") else "step", row.get("step"))
            if _number(value) and math.isfinite(value) and _number(step):
                points[metric][int(step)] = float(value)
    return {metric: sorted(found.items()) for metric, found in points.items()}


def metric_label(key: str) -> str:
    """A legend label a reader understands: `reward (mean)` for the task reward, else the key's words with its
    statistic in parentheses (`train/batch/reward/reward/bonus/max` -> `reward reward bonus (max)`)."""
    if key in LABELS:
        return LABELS[key]
    parts = [part for part in key.split("/") if part]
    statistic = _STATISTICS.get(parts[-1]) if parts else None
    if statistic is not None:
        parts = parts[:-1]
    if parts[:2] == ["train", "batch"]:
        parts = parts[2:]
    words = " ".join(parts).replace("_", " ") or key
    return f"{words} ({statistic})" if statistic else words


def run_name(run_dir: Path) -> str:
    """The run's name for a title: `experiment/trial` from its resolved config, else the directory's last two
    path parts (a run dir is `log_path/<experiment>/<trial>`)."""
    import yaml

    from platoon.config.training import StatsConfig

    try:
        config = yaml.safe_load((run_dir / "config.resolved.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        config = None  # no resolved config (a copied metrics file): the directory names the run
    if isinstance(config, dict):
        given = config.get("stats")
        stats = given if isinstance(given, dict) else {}
        # the resolved config leaves out the keys at their defaults
        names = [
            stats.get(key, StatsConfig.model_fields[key].default) for key in ("experiment_name", "trial_name")
        ]
        if all(isinstance(name, str) and name for name in names):
            return "/".join(str(name) for name in names)
    return "/".join(run_dir.resolve().parts[-2:])


def draw(series: dict[str, list[tuple[int, float]]], *, title: str) -> Any:
    """A matplotlib Figure of every non-empty series against the step, each labelled by `metric_label`."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlatoonError(MISSING_MATPLOTLIB) from None

    figure = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for metric, points in series.items():
        if points:
            steps, values = zip(*points, strict=True)
            label = metric_label(metric)
            axes.plot(steps, values, marker="o" if len(points) < 40 else None, markersize=3, label=label)
    axes.set_xlabel("step")
    axes.set_ylabel("reward")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="best")
    figure.tight_layout()
    return figure


def render_png(series: dict[str, list[tuple[int, float]]], output: Path, *, title: str) -> None:
    """Draw every non-empty series against the step and write the PNG."""
    figure = draw(series, title=title)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, format="png")


def plot(
    run_dir: Annotated[
        Path,
        typer.Argument(
            metavar="RUN_DIR", help="A training run's directory (it holds metrics.jsonl).", show_default=False
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="PNG", help="The PNG to write (default: RUN_DIR/reward.png)."),
    ] = None,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY",
            help=f"A metrics.jsonl key to draw; repeat for several (default: {TRAIN_REWARD} and, when the run "
            f"evaluated, {EVAL_REWARD}).",
        ),
    ] = None,
) -> int:
    """Write a PNG of a training run's reward per step (needs the `plot` extra: matplotlib)."""
    from platoon.cli.output import out

    metrics_path = run_dir / METRICS_FILE
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory (expected a training run's directory)")
    if not metrics_path.is_file():
        raise UsageError(
            f"{run_dir} has no {METRICS_FILE}: not a training run's directory, or no step logged yet"
        )
    named = list(metric or [])
    series = read_series(metrics_path, named or [TRAIN_REWARD, EVAL_REWARD])
    empty = [key for key, points in series.items() if not points]
    if named and empty:
        raise PlatoonError(f"{metrics_path} has no values for {', '.join(empty)}")
    if not named and not series[TRAIN_REWARD]:
        raise PlatoonError(f"{metrics_path} has no {TRAIN_REWARD} values yet")
    target = output if output is not None else run_dir / "reward.png"
    render_png(series, target, title=run_name(run_dir))
    drawn = {key: points for key, points in series.items() if points}
    last = "; ".join(f"{key} {points[-1][1]:.3g} at step {points[-1][0]}" for key, points in drawn.items())
    out(f"wrote {target} ({last})")
    return 0
