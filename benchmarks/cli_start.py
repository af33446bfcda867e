"""How long the command line takes to start: wall and CPU time of what users type most, each in a fresh process.

Run from the workspace root: `uv run --frozen python benchmarks/cli_start.py [--runs 20]`. `python -c pass` is the
baseline; `--baseline-python PATH` also times `platoon --help` of another installation (platoon 0.2.0, say) in
the same run. Bytecode is cached as for a user's second run (`--no-bytecode-cache` compiles every start), as in
`benchmarks/first_output.py`, whose runner this uses.
Targets on the 2-core machine: `platoon --help` at most a quarter of 0.2.0's CPU time in the same run;
`platoon extensions list` under 0.3 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from first_output import Runner, console_script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per command (default 20)")
    parser.add_argument("--baseline-python", metavar="PATH", help="also time this Python's `platoon --help`")
    parser.add_argument(
        "--no-bytecode-cache", action="store_true", help="compile every module on every start"
    )
    args = parser.parse_args()
    platoon = console_script(sys.executable)
    commands = {
        "python -c pass (baseline)": [sys.executable, "-c", "pass"],
        'python -c "import platoon"': [sys.executable, "-c", "import platoon"],
        "platoon --help": [platoon, "--help"],
        "platoon extensions list": [platoon, "extensions", "list"],
    }
    if args.baseline_python:
        commands["platoon --help (--baseline-python)"] = [console_script(args.baseline_python), "--help"]
    workdir = Path(tempfile.mkdtemp(prefix="platoon-cli-start-"))
    try:
        runner = Runner(workdir, bytecode_cache=not args.no_bytecode_cache)
        print(
            f"{'command':<36} {'wall':>8} {'fastest':>8} {'CPU':>8}   "
            f"({args.runs} runs, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f})"
        )
        for label, argv in commands.items():
            runner.run(argv)  # warm-up: writes the bytecode cache
            timing = runner.run(argv, repeats=args.runs)
            print(f"{label:<36} {timing.wall:>7.3f}s {min(timing.walls):>7.3f}s {timing.cpu:>7.3f}s")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
