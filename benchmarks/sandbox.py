"""Sandbox providers side by side: start, exec and stop latency, and start + exec + stop cycles per second.

    uv run --frozen python benchmarks/sandbox.py [--provider process[,docker]] [--cycles 100] [--execs 200]

For each provider and each concurrency (1 and 8): `--cycles` start + exec + stop cycles (start and stop p50/p95,
cycles per second), then `--execs` `true` commands in one sandbox per worker (exec round-trip p50/p95). The
`process/none` row is the process provider with `network: none`: a network namespace per sandbox (bubblewrap) and
every command joining it through nsenter; it is left out, saying why, where bubblewrap cannot make one. At the end
it checks that no sandbox directory and no sandboxed process is left, and exits 1 if one is. A provider is named as
configs name it (found through the `platoon.sandbox_runtimes` entry points), so a `docker` column appears once
that provider is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from platoon import plugins
from platoon_sandbox import SandboxSpec
from platoon_sandbox.procs import pids_with_marker

# start p50, exec p50 (seconds), issue 18; a network namespace must not push the process provider past its targets
TARGETS = {"process": (0.050, 0.010), "process/none": (0.050, 0.010), "docker": (1.0, 0.050)}


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def make_provider(name: str, scratch: Path) -> Any:
    cls = plugins.resolve_target(plugins.get_sandbox_runtime(name).provider)
    return cls(scratch_root=str(scratch)) if name == "process" else cls()


async def cycles(provider: Any, spec: SandboxSpec, n: int, concurrency: int) -> dict[str, float]:
    starts: list[float] = []
    stops: list[float] = []
    left = iter(range(n))

    async def worker() -> None:
        for _ in left:
            t0 = time.perf_counter()
            sandbox = await provider.start(spec)
            t1 = time.perf_counter()
            result = await sandbox.exec(["true"])
            t2 = time.perf_counter()
            await sandbox.stop()
            stops.append(time.perf_counter() - t2)
            starts.append(t1 - t0)
            assert result.ok, result

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"cycles/s": n / wall, "start p50": pct(starts, 0.5), "start p95": pct(starts, 0.95),
            "stop p50": pct(stops, 0.5)}  # fmt: skip


async def execs(provider: Any, spec: SandboxSpec, n: int, concurrency: int) -> dict[str, float]:
    sandboxes = [await provider.start(spec) for _ in range(concurrency)]
    times: list[float] = []
    try:

        async def worker(sandbox: Any) -> None:
            for _ in range(n // concurrency):
                t0 = time.perf_counter()
                result = await sandbox.exec(["true"])
                times.append(time.perf_counter() - t0)
                assert result.ok, result

        await asyncio.gather(*(worker(s) for s in sandboxes))
    finally:
        await asyncio.gather(*(s.stop() for s in sandboxes))
    return {"exec p50": pct(times, 0.5), "exec p95": pct(times, 0.95)}


def leftovers(scratch: Path) -> tuple[list[str], list[int]]:
    dirs = [str(p) for p in scratch.glob("platoon-sandboxes-*/*")]
    return dirs, pids_with_marker(
        [f"PLATOON_SANDBOX_ROOT={d}/fs".encode() for d in dirs] + [b"PLATOON_BENCH=1"]
    )


def docker_leftovers(bench: str) -> list[str]:
    """Containers of this benchmark still there (by its label)."""
    docker = os.environ.get("PLATOON_DOCKER", "docker")
    found = subprocess.run(
        [docker, "ps", "--all", "--quiet", "--filter", f"label=platoon.bench={bench}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [f"container {cid}" for cid in found.stdout.split()]


async def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--provider", default="process", help="comma-separated provider names (process,docker)"
    )
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--execs", type=int, default=200)
    parser.add_argument(
        "--docker-image",
        default="docker://platoon-test/busybox",
        help="the docker column's image (.ci/docker-engine)",
    )
    args = parser.parse_args()
    names = [n for n in args.provider.split(",") if n]
    # every command carries PLATOON_BENCH=1, so a process the benchmark left behind is found whatever its sandbox
    bench = f"bench-{os.getpid()}"
    specs = {
        "process": SandboxSpec(image="local", env={"PLATOON_BENCH": "1"}),
        # every container carries the benchmark's label, so one it left behind is found
        "docker": SandboxSpec(image=args.docker_image, workdir="/", labels={"platoon.bench": bench}),
    }
    rows: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="platoon-bench-sandbox-") as tmp:
        scratch = Path(tmp)
        for name in names:
            try:
                provider = make_provider(name, scratch)
            except Exception as exc:  # a provider not installed here: the other columns still print
                print(f"{name}: skipped ({type(exc).__name__}: {exc})")
                continue
            variants = [(name, specs.get(name, specs["process"]))]
            if name == "process":
                from platoon_sandbox import netns

                if (why := netns.unavailable()) is None:
                    variants.append(("process/none", replace(specs["process"], network="none")))
                else:
                    print(f"process/none: skipped (no network namespace here: {why})")
            for label, spec in variants:
                await cycles(provider, spec, 5, 1)  # warm-up: imports, first fork
                for concurrency in (1, 8):
                    row = await cycles(provider, spec, args.cycles, concurrency)
                    row.update(await execs(provider, spec, args.execs, concurrency))
                    rows[(label, concurrency)] = row
        dirs, pids = leftovers(scratch)
    if "docker" in names:
        dirs += docker_leftovers(bench)
    print(
        f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, {os.cpu_count()} cpus"
    )
    columns = ["cycles/s", "start p50", "start p95", "stop p50", "exec p50", "exec p95"]
    print(f"{'provider':<13}{'conc':>5}" + "".join(f"{c:>12}" for c in columns))
    for (name, concurrency), row in rows.items():
        cells = [f"{row[c]:.1f}" if c == "cycles/s" else f"{row[c] * 1000:.1f} ms" for c in columns]
        print(f"{name:<13}{concurrency:>5}" + "".join(f"{c:>12}" for c in cells))
    for name in dict.fromkeys(label for label, _ in rows):
        if name in TARGETS and (name, 1) in rows:
            start_target, exec_target = TARGETS[name]
            row = rows[(name, 1)]
            verdict = row["start p50"] <= start_target and row["exec p50"] <= exec_target
            print(f"{name}: target start p50 <= {start_target * 1000:.0f} ms, exec p50 <= {exec_target * 1000:.0f} ms"
                  f" at concurrency 1: {'met' if verdict else 'MISSED'}")  # fmt: skip
    print(f"left behind: {len(dirs)} sandbox dir(s) or container(s), {len(pids)} process(es)")
    return 1 if dirs or pids else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
