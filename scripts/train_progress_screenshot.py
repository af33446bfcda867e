"""Regenerate docs/images/train-progress.svg: `platoon train`'s terminal display during a real bandit run.

    uv run --frozen python scripts/train_progress_screenshot.py [--out docs/images/train-progress.svg] [--at 10]

Trains examples/bandit/train.yaml on the embedded local server (about a minute and a half on two cores) in a
temporary directory, with the terminal display drawing on a console that rich believes is a terminal. Every line
the display prints is kept, and so is its status line as it read while step `--at` was halfway through its groups;
the lines up to that moment and that status line are then printed on a recording console and exported with
`Console.export_svg`. The figures are the run's own: the reward curve differs from run to run (sampling is not
seeded).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "bandit" / "train.yaml"
WIDTH = 110


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "train-progress.svg")
    args.add_argument("--at", type=int, default=10, help="the step in progress on the screenshot")
    options = args.parse_args(argv)

    from rich.console import Console
    from rich.text import Text

    from platoon.cli import main as platoon
    from platoon.train.tinker import loop, progress

    shown: list[list[tuple[str, str]]] = []
    frozen: list[Any] = []  # the status line as it read at the chosen moment

    class Recorder(progress.LiveProgress):
        def show(self, parts: Sequence[tuple[str, str]]) -> None:
            super().show(parts)
            shown.append(list(parts))

        def groups(self, arrived: int, of: int) -> None:
            super().groups(arrived, of)
            if not frozen and self.done + 1 == options.at and arrived == of // 2:
                frozen.append((len(shown), self.status()))

    def recording(*, first_step: int, end_step: int, started_at: float) -> progress.TrainingProgress:
        screen = Console(file=io.StringIO(), force_terminal=True, width=WIDTH)
        return Recorder(screen, first_step=first_step, end_step=end_step, started_at=started_at)

    loop.open_progress = recording  # type: ignore[assignment]  # where the training loop gets its display
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "site.yaml").write_text(f"cache: {work / 'cache'}\n")
        os.environ["PLATOON_SITE"] = str(work / "site.yaml")
        os.chdir(work)
        status = platoon(["train", str(EXAMPLE)])  # log_path: runs, under the scratch directory
    if status != 0 or not frozen:
        print(f"the run ended with {status} before step {options.at} was halfway", file=sys.stderr)
        return 1

    count, status_line = frozen[0]
    shot = Console(file=io.StringIO(), record=True, force_terminal=True, width=WIDTH)
    shot.print(Text("$ platoon train examples/bandit/train.yaml", style="bold"))
    for parts in shown[:count]:
        # the run's directory as the user's working directory would show it
        shot.print(
            progress.LiveProgress.styled([(text.replace(scratch, "."), style) for text, style in parts])
        )
    shot.print(status_line)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    shot.save_svg(str(options.out), title="platoon train examples/bandit/train.yaml")
    print(f"wrote {options.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
