"""The `docker` sandbox provider's speed: start + exec + stop cycles per second, start, exec and stop p50/p95.

Needs a running engine and the test images: `.ci/docker-engine start`, source the env file it prints, then from
the workspace root: `uv run --frozen python benchmarks/sandbox_docker.py [--cycles 20] [--execs 40]
[--image docker://platoon-test/busybox]`. At concurrency 1 and 8 it runs `--cycles` full cycles (start, one exec of
`true`, stop) and, in one started sandbox per worker, `--execs` execs of `true` each. Every container carries a
label of this run; the benchmark checks that none is left and exits 1 otherwise.
Targets on the 2-core machine: start p50 <= 1 s, exec p50 <= 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid

from platoon_sandbox import SandboxSpec
from platoon_sandbox.docker import DockerProvider, docker_binary


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(values: list[float]) -> str:
    return f"p50 {1000 * statistics.median(values):7.1f} ms  p95 {1000 * pct(values, 0.95):7.1f} ms"


async def cycles(provider: DockerProvider, spec: SandboxSpec, n: int, concurrency: int) -> None:
    starts: list[float] = []
    execs: list[float] = []
    stops: list[float] = []
    queue = list(range(n))

    async def worker() -> None:
        while queue:
            queue.pop()
            t0 = time.perf_counter()
            sandbox = await provider.start(spec)
            t1 = time.perf_counter()
            result = await sandbox.exec(["true"])
            t2 = time.perf_counter()
            await sandbox.stop()
            t3 = time.perf_counter()
            assert result.exit_code == 0, result
            starts.append(t1 - t0)
            execs.append(t2 - t1)
            stops.append(t3 - t2)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - began
    print(f"  cycles     concurrency {concurrency}: {n / wall:6.2f} cycles/s ({n} in {wall:.1f} s)")
    print(f"    start  {ms(starts)}")
    print(f"    exec   {ms(execs)}")
    print(f"    stop   {ms(stops)}")


async def exec_round_trips(provider: DockerProvider, spec: SandboxSpec, n: int, concurrency: int) -> None:
    sandboxes = await asyncio.gather(*(provider.start(spec) for _ in range(concurrency)))
    times: list[float] = []
    try:

        async def worker(index: int) -> None:
            for _ in range(n):
                t0 = time.perf_counter()
                result = await sandboxes[index].exec(["true"])
                times.append(time.perf_counter() - t0)
                assert result.exit_code == 0, result

        began = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        wall = time.perf_counter() - began
    finally:
        await asyncio.gather(*(s.stop() for s in sandboxes))
    print(f"  exec only  concurrency {concurrency}: {len(times) / wall:6.1f} execs/s   {ms(times)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20, help="start+exec+stop cycles per concurrency")
    parser.add_argument("--execs", type=int, default=40, help="execs per worker in the exec-only phase")
    parser.add_argument("--image", default="docker://platoon-test/busybox")
    args = parser.parse_args()
    label = {"platoon.benchmark": f"sandbox-docker-{uuid.uuid4().hex[:12]}"}
    provider = DockerProvider()
    spec = SandboxSpec(image=args.image, workdir="/", labels=label)
    print(
        f"docker provider ({docker_binary()}, DOCKER_HOST={os.environ.get('DOCKER_HOST', '(unset)')}), {args.image}"
    )
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
    try:
        for concurrency in (1, 8):
            asyncio.run(cycles(provider, spec, args.cycles, concurrency))
            asyncio.run(exec_round_trips(provider, spec, args.execs, concurrency))
    finally:
        left = subprocess.run(
            [
                docker_binary(),
                "ps",
                "--all",
                "--quiet",
                "--filter",
                f"label=platoon.benchmark={label['platoon.benchmark']}",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if left:
            asyncio.run(provider.reap(label))
    print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")
    print(f"containers left: {len(left)}")
    sys.exit(1 if left else 0)


if __name__ == "__main__":
    main()
