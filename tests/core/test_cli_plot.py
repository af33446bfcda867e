"""`platoon plot RUN_DIR`: the reward curve of metrics.jsonl as a PNG; bad input is one line and its exit code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from platoon.cli import main
from platoon.cli import plot as plot_module
from platoon.cli.plot import metric_label, read_series

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run_dir(tmp_path, rows, tail="", name="run"):
    run = tmp_path / name
    run.mkdir()
    text = "".join(json.dumps(row) + "\n" for row in rows) + tail
    (run / "metrics.jsonl").write_text(text, encoding="utf-8")
    return run


def _rows():
    rows = [
        {"step": s, "train/batch/task_reward/avg": r} for s, r in enumerate([0.0, 0.1, 0.5, 0.9], start=1)
    ]
    rows.insert(2, {"step": 2, "eval/step": 2, "eval/reward/avg": 0.25})
    return rows


def test_writes_a_png_of_the_train_and_eval_reward(tmp_path, capsys):
    run = _run_dir(tmp_path, _rows(), tail='{"step": 5, "train/ba')  # a torn last line: skipped
    assert main(["plot", str(run)]) == 0
    png = run / "reward.png"
    assert png.read_bytes().startswith(PNG_MAGIC)
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {png} (")
    assert "train/batch/task_reward/avg 0.9 at step 4" in out and "eval/reward/avg 0.25 at step 2" in out


@pytest.fixture
def figures(monkeypatch):
    """The figures `platoon plot` draws, kept for the test to read (titles, legends)."""
    drawn = []
    real = plot_module.draw

    def keep(series, *, title):
        drawn.append(real(series, title=title))
        return drawn[-1]

    monkeypatch.setattr(plot_module, "draw", keep)
    return drawn


def _title_and_labels(figure):
    axes = figure.axes[0]
    return axes.get_title(), [text.get_text() for text in axes.get_legend().get_texts()]


def test_the_png_is_titled_with_the_run_name_and_its_curves_labelled_in_words(tmp_path, figures):
    run = _run_dir(tmp_path, _rows(), name="anywhere")
    # the resolved config leaves out trial_name at its default, `run`
    (run / "config.resolved.yaml").write_text("stats:\n  experiment_name: bandit\n")
    assert main(["plot", str(run.resolve())]) == 0
    assert _title_and_labels(figures[-1]) == ("bandit/run", ["reward (mean)", "eval reward (mean)"])
    # without a resolved config, the run directory's last two parts (log_path/<experiment>/<trial>)
    (tmp_path / "runs" / "math").mkdir(parents=True)
    copied = _run_dir(tmp_path / "runs" / "math", _rows(), name="trial-3")
    assert main(["plot", str(copied)]) == 0
    assert _title_and_labels(figures[-1])[0] == "math/trial-3"


def test_any_metric_key_reads_as_words_and_its_statistic():
    assert metric_label("train/batch/task_reward/avg") == "reward (mean)"
    assert metric_label("train/batch/reward/reward/bonus/max") == "reward reward bonus (max)"
    assert metric_label("eval/reward/avg") == "eval reward (mean)"
    assert metric_label("time/step") == "time step"


def test_series_by_step_with_eval_rows_at_their_eval_step(tmp_path):
    run = _run_dir(tmp_path, [*_rows(), {"step": 3, "train/batch/task_reward/avg": 0.6}])
    series = read_series(run / "metrics.jsonl", ["train/batch/task_reward/avg", "eval/reward/avg"])
    # a later row for a step replaces the earlier one (a resumed run's rows)
    assert series["train/batch/task_reward/avg"] == [(1, 0.0), (2, 0.1), (3, 0.6), (4, 0.9)]
    assert series["eval/reward/avg"] == [(2, 0.25)]


def test_output_and_named_metrics(tmp_path, capsys):
    run = _run_dir(tmp_path, _rows())
    target = tmp_path / "plots" / "curve.png"
    assert main(["plot", str(run), "-o", str(target), "--metric", "eval/reward/avg"]) == 0
    assert target.read_bytes().startswith(PNG_MAGIC)
    assert "train/batch" not in capsys.readouterr().out


@pytest.mark.parametrize("make", ["missing", "file", "no-metrics"])
def test_a_bad_run_dir_is_one_line_and_a_usage_error(tmp_path, capsys, make):
    target = tmp_path / "run"
    if make == "file":
        target.write_text("x")
    elif make == "no-metrics":
        target.mkdir()
    assert main(["plot", str(target)]) == 64
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"platoon: {target} ")


def test_no_values_for_the_metric_is_one_line(tmp_path, capsys):
    run = _run_dir(tmp_path, _rows())
    assert main(["plot", str(run), "--metric", "train/loss"]) == 1
    err = capsys.readouterr().err
    assert err == f"platoon: {run / 'metrics.jsonl'} has no values for train/loss\n"
    empty = _run_dir(tmp_path, [{"step": 1, "time/step": 1.0}], name="no-rewards")
    assert main(["plot", str(empty)]) == 1
    assert "has no train/batch/task_reward/avg values yet" in capsys.readouterr().err


def test_without_matplotlib_one_line_names_the_extra(tmp_path, capsys, monkeypatch):
    run = _run_dir(tmp_path, _rows())
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without the extra sees
    assert main(["plot", str(run)]) == 1
    assert capsys.readouterr().err == (
        "platoon: platoon plot needs matplotlib, which is not installed: pip install 'platoon-core[plot]'\n"
    )
    assert not (run / "reward.png").exists()


def test_help_does_not_import_matplotlib():
    code = (
        "import sys; from platoon.cli import main; rc = main(['plot', '--help']); "
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'; sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "Usage: platoon plot [OPTIONS] RUN_DIR\n" in done.stdout
