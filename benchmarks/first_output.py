"""Time to first useful output: each command a new user runs first, in a fresh process, beside its target.

    uv run --frozen python benchmarks/first_output.py                  # every row (the bandit run takes minutes)
    uv run --frozen python benchmarks/first_output.py --quick          # without the end-to-end bandit run
    uv run --frozen python benchmarks/first_output.py --rows help,episodes --baseline-python /tmp/p020/bin/python

Rows: `train` (the README's bandit run end to end: wall and CPU time, when the first step finished, the longest
silence before it, its event files), `finished` (the same command on that finished run), `rollout`, `validate`,
`help` and `episodes` (`benchmarks/episodes.py`: `run_episode` episodes/s). Each command runs in a fresh process on
a copy of `examples/bandit/train.yaml` in a temporary directory, its runs there too (`log_path` and `--output-dir`
point there), so the user's `runs/` is never touched. CPU time is the children's user + system time
(`resource.getrusage(RUSAGE_CHILDREN)`), workers and the local server included. Each wall time is also given as a
multiple of a trivial `python -c pass` start measured in the same run.

Bytecode: the commands run with bytecode caching on, under a private `PYTHONPYCACHEPREFIX`, after one warm-up run
of each cheap command: what a user's second and later runs pay. `--no-bytecode-cache` compiles every module on
every start instead (`PYTHONDONTWRITEBYTECODE=1`, as some containers set).

`--baseline-python` names the Python of another installation (say platoon 0.2.0 in its own venv): `platoon --help`
and the episodes row also run there, in the same run, for the ratios the targets are stated in. With `--quick`,
the `finished` row first makes a finished one-step run (`train.max_training_steps=1`), not timed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BANDIT = ROOT / "examples" / "bandit" / "train.yaml"
ROWS = ["train", "finished", "rollout", "validate", "help", "episodes"]
TARGETS = {
    "train": "<= 60 s end to end; first step < 10 s; a line at least every 5 s while starting",
    "finished": "<= 3 s",
    "rollout": "<= 6 s",
    "validate": "<= 2 s",
    "help": "CPU <= 1/4 of 0.2.0's in the same run",
    "episodes": ">= 3x 0.2.0's episodes/s in the same run",
    "events": "<= 1 file per step and scope",
}


@dataclass
class Timing:
    """One command's runs: wall and CPU seconds of each, and what the last one printed, with timestamps."""

    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    lines: list[tuple[float, str]] = field(default_factory=list)
    returncode: int = 0

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpus)


def console_script(python: str) -> str:
    script = Path(python).with_name("platoon")
    if not script.exists():
        raise SystemExit(f"no platoon console script beside {python}: install platoon there (uv sync)")
    return str(script)


class Runner:
    """Runs commands in fresh processes with one environment, timing each."""

    def __init__(self, workdir: Path, *, bytecode_cache: bool) -> None:
        self.workdir = workdir
        env = {
            **os.environ,
            "OPENREWARD_DISABLE_UPDATE_CHECK": "1",
            "TINKER_TELEMETRY": "0",
            "COLUMNS": "100",
        }
        env.pop("PYTHONPYCACHEPREFIX", None)
        if bytecode_cache:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            # a private cache: the installation's folders are left as they are, and a read-only one still caches
            env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
        else:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.env = env

    def run(self, argv: list[str], *, repeats: int = 1, check: bool = True, stream: bool = False) -> Timing:
        timing = Timing()
        for _ in range(repeats):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            process = subprocess.Popen(
                argv,
                cwd=self.workdir,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            lines: list[tuple[float, str]] = []

            def read(out=process.stdout, lines=lines, start=start) -> None:  # type: ignore[no-untyped-def]
                for line in out:
                    lines.append((time.perf_counter() - start, line.rstrip("\n")))
                    if stream:
                        print(f"    {lines[-1][0]:7.2f}  {lines[-1][1]}", flush=True)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            code = process.wait()
            wall = time.perf_counter() - start
            reader.join()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            timing.walls.append(wall)
            timing.cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
            timing.lines, timing.returncode = lines, code
            if check and code != 0:
                tail = "\n".join(text for _, text in lines[-20:])
                raise SystemExit(f"`{' '.join(argv)}` exited {code}:\n{tail}")
        return timing


def silences(timing: Timing, until: float) -> float:
    """The longest time with no output line, from the start to `until`."""
    stamps = [0.0] + [at for at, _ in timing.lines if at <= until] + [until]
    return max(b - a for a, b in itertools.pairwise(stamps))


def first_step(timing: Timing) -> float | None:
    for at, text in timing.lines:
        if "step 1/" in text:
            return at
    return None


def event_files(run_dir: Path) -> tuple[int, int, int]:
    """(event files, their bytes, steps) of a finished training run: every file with `events` in its path."""
    files = [p for p in run_dir.rglob("*") if p.is_file() and "events" in p.relative_to(run_dir).as_posix()]
    steps = 0
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        steps = sum(1 for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip())
    return len(files), sum(p.stat().st_size for p in files), steps


def episodes_row(python: str, baseline: str | None, episodes: int, concurrency: int, repeats: int) -> dict:
    argv = [python, str(ROOT / "benchmarks" / "episodes.py"), "--json", "--episodes", str(episodes)]
    argv += ["--concurrency", str(concurrency), "--repeats", str(repeats)]
    if baseline:
        argv += ["--baseline-python", baseline]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"benchmarks/episodes.py failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {','.join(ROWS)}")
    parser.add_argument("--quick", action="store_true", help="skip the end-to-end bandit run (the train row)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each cheap command (default 5)")
    parser.add_argument(
        "--baseline-python", metavar="PATH", help="the Python of another installation to compare"
    )
    parser.add_argument(
        "--no-bytecode-cache", action="store_true", help="compile every module on every start"
    )
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--keep", action="store_true", help="keep the temporary directory and say where it is"
    )
    args = parser.parse_args()
    rows = [row.strip() for row in args.rows.split(",") if row.strip()]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {ROWS}")
    if args.quick and "train" in rows:
        rows.remove("train")

    python = sys.executable
    platoon = console_script(python)
    baseline = args.baseline_python
    workdir = Path(tempfile.mkdtemp(prefix="platoon-first-output-"))
    runner = Runner(workdir, bytecode_cache=not args.no_bytecode_cache)
    config = workdir / "train.yaml"
    shutil.copy(BANDIT, config)
    log_path = f"log_path={workdir / 'runs'}"
    load = os.getloadavg()[0]
    table: list[tuple[str, str, str]] = []
    notes: list[str] = []

    # the trivial start every wall time is compared with (after one warm-up run)
    runner.run([python, "-c", "pass"])
    trivial = runner.run([python, "-c", "pass"], repeats=max(args.repeats, 5)).wall

    def figure(timing: Timing) -> str:
        return f"{timing.wall:.2f} s wall, {timing.cpu:.2f} s CPU ({timing.wall / trivial:.0f}x `python -c pass`)"

    try:
        if "help" in rows:
            runner.run([platoon, "--help"])
            ours = runner.run([platoon, "--help"], repeats=max(args.repeats, 10))
            text = figure(ours)
            if baseline:
                base_script = console_script(baseline)
                runner.run([base_script, "--help"])
                base = runner.run([base_script, "--help"], repeats=max(args.repeats, 10))
                text += f"; baseline {base.cpu:.3f} s CPU, so {ours.cpu / base.cpu:.2f} of the baseline's"
            table.append(("`platoon --help`", text, TARGETS["help"]))

        if "validate" in rows:
            argv = [platoon, "config", "validate", str(config), "--tasks", log_path]
            runner.run(argv, check=False)
            timing = runner.run(argv, repeats=args.repeats, check=False)
            exit_note = "" if timing.returncode == 0 else f" (exit {timing.returncode})"
            table.append(
                ("`platoon config validate ... --tasks`", figure(timing) + exit_note, TARGETS["validate"])
            )

        if "rollout" in rows:
            argv = [platoon, "rollout", str(config), "--task", "bandit.train.0"]
            argv += ["--output-dir", str(workdir / "adhoc"), log_path]
            runner.run(argv)
            timing = runner.run(argv, repeats=max(1, min(args.repeats, 3)))
            table.append(("`platoon rollout ... --task bandit.train.0`", figure(timing), TARGETS["rollout"]))

        train_argv = [platoon, "train", str(config), log_path]
        if "train" in rows:
            print("the bandit run, end to end (its output, timestamped):", flush=True)
            timing = runner.run(train_argv, stream=True)
            step = first_step(timing)
            gap = silences(timing, step if step is not None else timing.wall)
            text = figure(timing) + (
                f"; first step at {step:.1f} s; longest silence before it {gap:.1f} s"
                if step is not None
                else "; no step line seen"
            )
            table.append(("`platoon train examples/bandit/train.yaml`", text, TARGETS["train"]))
            runs = list((workdir / "runs").glob("*/*"))
            if runs:
                count, size, steps = event_files(runs[0])
                table.append(
                    (
                        "event files of the bandit run",
                        f"{count} files ({size / 1e6:.1f} MB) for {steps} steps",
                        TARGETS["events"],
                    )
                )

        if "finished" in rows:
            argv = list(train_argv)
            if "train" not in rows:
                argv.append("train.max_training_steps=1")
                print("making a finished one-step run for the `finished` row (not timed)...", flush=True)
                runner.run(argv)
            timing = runner.run(argv, repeats=max(1, min(args.repeats, 3)))
            table.append(("the same on a finished run", figure(timing), TARGETS["finished"]))
            if timing.lines:
                notes.append(f"the finished run's last line: {timing.lines[-1][1]}")

        if "episodes" in rows:
            result = episodes_row(python, baseline, args.episodes, args.concurrency, 3)
            ours = result["ours"]
            text = f"{ours['episodes_per_s']:.1f} episodes/s ({ours['cpu'] / args.episodes * 1000:.1f} ms CPU each)"
            if "baseline" in result:
                base = result["baseline"]
                text += (
                    f"; baseline {base['episodes_per_s']:.1f}: "
                    f"{ours['episodes_per_s'] / base['episodes_per_s']:.2f}x"
                )
            table.append(
                (
                    f"number search, react, {args.episodes} `run_episode`s at concurrency {args.concurrency}",
                    text,
                    TARGETS["episodes"],
                )
            )
    finally:
        if args.keep:
            notes.append(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    bytecode = "off (compiled every start)" if args.no_bytecode_cache else "cached (after a warm-up run)"
    print()
    print(
        f"{os.cpu_count()} cores, load {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
        f"bytecode {bytecode}; `python -c pass` {trivial * 1000:.0f} ms"
    )
    print()
    print("| What a user runs | Measured | Target |")
    print("|---|---|---|")
    for what, measured, target in table:
        print(f"| {what} | {measured} | {target} |")
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
