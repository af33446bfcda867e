"""How long the command line takes to start: wall and CPU time of what users type most, each in a fresh process.

Run from the workspace root: `uv run --frozen python benchmarks/cli_start.py [--runs 20]`. `python -c pass` is the
baseline; `--baseline-python PATH` also times `platoon --help` of another installation (platoon 0.2.0, say) in
the same run. Bytecode is cached as for a user's second run (`--no-bytecode-cache` compiles every start), as in
`benchmarks/first_output.py`, whose runner this uses.
Targets on the 2-core machine: `platoon --help` at most a quarter of 0.2.0's CPU time in the same run;
`platoon extensions list` under 0.3 s.

`--metadata` compares entry-point discovery on the standard library's `importlib.metadata` with the
`importlib-metadata` backport (installed in the dev group): the import alone, the import plus the scan
`platoon.plugins` makes (every distribution's entry_points.txt, then the platoon ones' entry points, name, version
and requirements), and `platoon extensions list` with `platoon.plugins` on each (the backport aliased in
`sys.modules` before anything imports the standard one). docs/architecture.md ("Dependencies") records the result.
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

# What `platoon.plugins._scan` asks of the metadata library, written against either module as `m`.
_SCAN = """
n = 0
for dist in m.distributions():
    text = dist.read_text("entry_points.txt")
    if not text or "platoon." not in text:
        continue
    eps = [ep for ep in dist.entry_points if ep.group.startswith("platoon.")]
    n += len(eps) + len(dist.requires or []) + len(dist.metadata["Name"] or "") + len(dist.version)
assert n
"""
_EXTENSIONS_LIST = (
    "import sys; {alias}from platoon.cli import main; sys.argv = ['platoon', 'extensions', 'list']; main()"
)


def metadata_commands(python: str) -> dict[str, list[str]]:
    """stdlib vs backport: import, import + scan, `platoon extensions list`."""
    commands: dict[str, list[str]] = {
        "python -c pass (baseline)": [python, "-c", "pass"],
        # reads the entry_points.txt files itself where sys.path holds only folders: neither library is imported
        "platoon --help": [console_script(python), "--help"],
    }
    for label, module in (("stdlib", "importlib.metadata as m"), ("backport", "importlib_metadata as m")):
        commands[f"import ({label})"] = [python, "-c", f"import {module}"]
        commands[f"import + scan ({label})"] = [python, "-c", f"import {module}\n{_SCAN}"]
    alias = "import importlib_metadata; sys.modules['importlib.metadata'] = importlib_metadata; "
    commands["extensions list (stdlib)"] = [python, "-c", _EXTENSIONS_LIST.format(alias="")]
    commands["extensions list (backport)"] = [python, "-c", _EXTENSIONS_LIST.format(alias=alias)]
    return commands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per command (default 20)")
    parser.add_argument("--baseline-python", metavar="PATH", help="also time this Python's `platoon --help`")
    parser.add_argument(
        "--no-bytecode-cache", action="store_true", help="compile every module on every start"
    )
    parser.add_argument(
        "--metadata", action="store_true", help="importlib.metadata vs the importlib-metadata backport"
    )
    args = parser.parse_args()
    platoon = console_script(sys.executable)
    commands = (
        metadata_commands(sys.executable)
        if args.metadata
        else {
            "python -c pass (baseline)": [sys.executable, "-c", "pass"],
            'python -c "import platoon"': [sys.executable, "-c", "import platoon"],
            "platoon --help": [platoon, "--help"],
            "platoon extensions list": [platoon, "extensions", "list"],
        }
    )
    if args.baseline_python and not args.metadata:
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
