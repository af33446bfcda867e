"""Episodes per second through the full rollout path, in process: number search, platoon-react, a scripted
binary-search policy (about 8 model calls an episode), many episodes at once on one event loop.

Everything but sampling is the production path: the ORS environment in process, the episode program, the harness,
the recording gateway (render -> sample -> parse -> record exact tokens) and the trajectory build.

    uv run --frozen python benchmarks/episodes.py [--episodes 128] [--concurrency 32] [--profile]

Target on the 2-core machine: at least 100 episodes/s. `--profile` prints where the time goes (cProfile).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import re
import resource
import time

from platoon.config.environments import AgentsConfig
from platoon.config_defs import RolloutConfig
from platoon.envs.number_search import REACT_SYSTEM_PROMPT, SERVICE
from platoon.episode.rollout import Route, harness_rollout
from platoon.testing import tool_call
from platoon.testing.episode import resolve_service
from platoon.testing.gateway import make_gateway


def binary_search(prompt: str) -> str:
    """The next guess of a binary search, replaying the feedback the prompt shows."""
    low, high = map(int, re.search(r"between (\d+) and (\d+)", prompt).groups())  # type: ignore[union-attr]
    guesses = [int(n) for n in re.findall(r'"number": (\d+)', prompt)]
    for guess, word in zip(guesses, re.findall(r"Too (low|high), try again\.", prompt), strict=False):
        low, high = (guess + 1, high) if word == "low" else (low, guess - 1)
    return "\n" + tool_call("guess", {"number": (low + high) // 2})


async def run(episodes: int, concurrency: int) -> tuple[float, int, int]:
    """(seconds, episodes solved, model calls) for `episodes` rollouts, `concurrency` at a time."""
    service = resolve_service(SERVICE)
    gateway = make_gateway(binary_search)
    route = Route(
        harness="platoon-react",
        program="single",
        harness_options={"system_prompt": REACT_SYSTEM_PROMPT},
        agents=AgentsConfig(),
    )
    config = RolloutConfig(verbose=False)
    tasks = [await service.get_task(f"train:{i}") for i in range(episodes)]
    # one warm-up episode: imports and first-use caches are not what a long run pays per episode
    await harness_rollout(tasks[0], service=service, route=route, config=config, gateway=gateway)
    calls_before = len(gateway.sampler.calls)
    limit = asyncio.Semaphore(concurrency)

    async def one(task):  # type: ignore[no-untyped-def]
        async with limit:
            return await harness_rollout(task, service=service, route=route, config=config, gateway=gateway)

    start = time.perf_counter()
    collections = await asyncio.gather(*(one(task) for task in tasks))
    seconds = time.perf_counter() - start
    solved = sum(1 for c in collections if c.root is not None and c.root.reward == 1.0)
    return seconds, solved, len(gateway.sampler.calls) - calls_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="runs; the median is reported")
    parser.add_argument("--profile", action="store_true", help="print the top functions by cumulative time")
    args = parser.parse_args()
    results = []
    profiler = cProfile.Profile() if args.profile else None
    for _ in range(args.repeats):
        if profiler:
            profiler.enable()
        results.append(asyncio.run(run(args.episodes, args.concurrency)))
        if profiler:
            profiler.disable()
    seconds, solved, calls = sorted(results)[len(results) // 2]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"episodes: {args.episodes} at concurrency {args.concurrency}, solved {solved}/{args.episodes}")
    print(f"model calls: {calls} ({calls / args.episodes:.1f} per episode)")
    print(
        f"episodes/s: {args.episodes / seconds:.1f}   model calls/s: {calls / seconds:.0f}   ({seconds:.3f} s)"
    )
    print(f"peak memory (max RSS): {peak_mb:.0f} MiB")
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())


if __name__ == "__main__":
    main()
