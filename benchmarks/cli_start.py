"""How long the command line takes to start: the median wall time of what users type most.

Run from the workspace root: `uv run --frozen python benchmarks/cli_start.py [--runs 20]`. Each command runs in
a fresh process (so imports are paid every time, as a user pays them); `python -c pass` is the baseline.
Target on the 2-core machine: `platoon --help` and `platoon extensions list` each under 0.3 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def platoon_script() -> str:
    script = Path(sys.executable).with_name("platoon")
    found = str(script) if script.exists() else shutil.which("platoon")
    if not found:
        raise SystemExit(
            "the platoon console script is not installed in this environment: run `uv sync` first"
        )
    return found


def median_seconds(argv: list[str], runs: int) -> tuple[float, float]:
    """(median, fastest) wall time over `runs` fresh processes, after one warm-up run."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "0"}
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per command (default 20)")
    args = parser.parse_args()
    platoon = platoon_script()
    commands = {
        "python -c pass (baseline)": [sys.executable, "-c", "pass"],
        'python -c "import platoon"': [sys.executable, "-c", "import platoon"],
        "platoon --help": [platoon, "--help"],
        "platoon extensions list": [platoon, "extensions", "list"],
    }
    print(f"{'command':<30} {'median':>9} {'fastest':>9}   ({args.runs} runs, {os.cpu_count()} cores)")
    for label, argv in commands.items():
        median, fastest = median_seconds(argv, args.runs)
        print(f"{label:<30} {median:>8.3f}s {fastest:>8.3f}s")


if __name__ == "__main__":
    main()
