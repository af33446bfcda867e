"""Episodes per second: number search, platoon-react, a scripted binary-search policy (about 8 model calls an
episode), many episodes at once on one event loop.

Two paths, each everything but sampling as it runs for real (the ORS environment in process, the episode program,
the harness, the recording gateway: render -> sample -> parse -> record exact tokens, the trajectory build):

* `--path run_episode` (default): each episode through `platoon.testing.run_episode` with a scripted policy of its
  own, as a user's test calls it: the task resolved by id, the gateway served over HTTP, the collection written to
  the episode's output directory. `--baseline-python` runs the same episodes under another installation (platoon
  0.2.0's `run_episode` takes the same arguments) in the same run, for a ratio; `--before-python` a third
  installation beside them (this tree before a change), for a before/after in the same run.
* `--path rollout`: `harness_rollout` directly with one shared gateway and no HTTP server, the path training's
  rollout workers take (this installation only).

    uv run --frozen python benchmarks/episodes.py [--episodes 128] [--concurrency 32] [--profile]
    uv run --frozen python benchmarks/episodes.py --baseline-python /tmp/p020/bin/python
    uv run --frozen python benchmarks/episodes.py --baseline-python /tmp/p020/bin/python --before-python PATH
    uv run --frozen python benchmarks/episodes.py --remote [--path rollout]

`--remote` measures number search three ways in the same run: in process (`python://`), on one local ORS server
and on a pool of two (`ors+http://`, each server the openreward SDK's `Server` in a process of its own on
127.0.0.1, started here). Target: one server at least 60 % of the in-process episodes/s. It times them round by
round (`--repeats` rounds; each round the three one after the other, each in a fresh process that resolves its
service once), and gives the median of the rounds' ratios: the machine's speed drifts over a minute, and a
process that has run remote episodes runs in-process ones 5-10 % slower afterwards, so neither may tilt the
comparison. Each measurement prints the CPU time per episode of the client (harness, gateway, ORS client) and of
the server(s) over the same timed episodes, since on this machine they share two cores; `--pin` puts the client
on the first core and the servers on the others (`os.sched_setaffinity`).

    uv run --frozen python benchmarks/episodes.py --remote [--pin] [--sdk-client] [--no-freeze]

`--sdk-client` sends every request of the remote sessions through the SDK's aiohttp client instead of platoon's
wire (`PLATOON_ORS_WIRE=0`), for the comparison.

`--path rollout` and `--remote` freeze the heap after their warm-up episode, as `platoon train` and `platoon eval`
do once their stack is loaded (`platoon.heap`); `--no-freeze` leaves the collector as a library caller has it (a
full collection then walks half a million objects, 0.4-0.5 s here, about once per process and 128 episodes). The
plain `run_episode` path is a user's own loop and never freezes anything itself: platoon's `run_episode` freezes
the loaded stack once per process after its first episode (`PLATOON_FREEZE_HEAP=0` turns that off), and 0.2.0
never does. Every path prints the garbage collector's pauses over the timed episodes.

Measured (2026-12-05, 2 cores shared with other work, load 0.7-1.3; run_episode, 128 episodes, concurrency 32,
3 rounds; each line one run, its median and its rounds' ratios):

    one server, % of in process     rounds           client + server CPU per episode (in process)
    64                              64, 64, 65       10.4 + 9.8 ms (8.3 ms)
    73                              55, 73, 75       10.2 + 10.5 ms (8.9 ms)
    67                              59, 67, 76       10.5 + 10.5 ms (9.0 ms)
    63                              56, 63, 66       10.5 + 11.2 ms (8.4 ms)
    70, pinned                      65, 70, 76       10.4 + 9.8 ms (8.8 ms)
    63, --no-freeze                 56, 63, 66       11.9 + 9.8 ms (8.8 ms)
    59, --sdk-client                58, 59, 59       13.4 + 10.9 ms (9.1 ms)
    82, --episodes 512              79, 82, 83       11.3 + 10.4 ms (11.2 ms)

Earlier methods and code, for the record: timing each kind's repeats together in this one process, in process
first, the same code gave 54-74 % (median 63, six runs); before the freeze and the tool listing beside the prompt,
57-65 % (median 59); before platoon's wire, 52-57 %.

What limits it: the two processes' CPU, about 10 ms each per episode where a whole in-process episode costs 9 (the
last line of the output gives the cap a core per process allows from CPU alone), and the end of each batch: a
remote episode takes longer from start to end (0.3-0.45 s against 0.25 s at concurrency 32), and when fewer than
32 are left the client and the server stop overlapping their work. An episode on a server is an in-process
episode's harness and gateway plus about 14 requests, 1.5-2 ms of the client's CPU on the wire (4-5 ms through
the SDK's client). The server (the SDK's FastAPI app on uvicorn, httptools) spends 10 ms per episode, a
third of it in its garbage collector: it keeps each call's task and answer for 60 s so that a cut stream can be
resumed, so its heap grows with the call rate. Two servers beside the client are three processes on two cores,
no faster than one.

Targets on the 2-core machine: `run_episode` at least 4x platoon 0.2.0's episodes/s in the same run (issue 42: a
user's loop, nothing frozen by the benchmark); `rollout` at least 100 episodes/s. `--profile` prints where the time goes (cProfile, this installation only).

`--records` asks whether attrs (`@frozen`/`@define` with slots) would pay on this path: it counts the hot value
types built per episode on the rollout path, times building each as the dataclass it is and as an attrs twin with
the same fields, sizes both, and prints the most either could save per episode against the episode's CPU time
(docs/architecture.md, "Dependencies").

This file imports nothing of platoon at module level: `--baseline-python` runs it as the worker under the other
installation (`--worker`), and prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

SORT = os.environ.get("EPISODES_PROFILE_SORT", "tottime")
SERVICE = "python://platoon.envs.number_search.env:NumberSearchEnvironment"
SYSTEM_PROMPT = (
    "You are playing a number guessing game: find the hidden integer in the range the task gives. Call the guess "
    "tool with one integer per turn; after each guess you are told whether it was too low or too high."
)


def binary_search(prompt: str) -> str:
    """The next guess of a binary search, replaying the range and the feedback the prompt shows.

    `platoon.testing.number_search.react_binary_search`, written out: `--baseline-python` runs this file
    under platoon 0.2.0, which has no such module."""
    from platoon.testing import tool_call

    low, high = map(int, re.search(r"between (\d+) and (\d+)", prompt).groups())  # type: ignore[union-attr]
    guesses = [int(n) for n in re.findall(r'"number": (\d+)', prompt)]
    for guess, word in zip(guesses, re.findall(r"Too (low|high), try again\.", prompt), strict=False):
        low, high = (guess + 1, high) if word == "low" else (low, guess - 1)
    return "\n" + tool_call("guess", {"number": (low + high) // 2})


def _solved(reward: Any) -> bool:
    return reward == 1.0


#: `--no-freeze` sets it False: the collector left as a process that calls platoon as a library has it
FREEZE = True


def settle_heap() -> None:
    """After the warm-up: collect, then freeze what is alive, as `platoon train` and `platoon eval` do once their
    stack is loaded (`platoon.heap`; written out here, since `--baseline-python` runs this file under 0.2.0)."""
    if FREEZE:
        gc.collect()
        gc.freeze()


class GcPauses:
    """The cyclic garbage collector's pauses inside a `with` block (`gc.callbacks`): their total, the number of
    full collections, the longest."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self.longest = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        self.seconds += pause
        self.longest = max(self.longest, pause)
        self.full += info["generation"] == 2

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        gc.callbacks.remove(self._callback)

    def figures(self) -> dict[str, Any]:
        return {"gc_seconds": self.seconds, "gc_full": self.full, "gc_longest": self.longest}


async def time_episodes(
    play: Callable[[int, Path], Awaitable[Any]],
    episodes: int,
    concurrency: int,
    profiler: Any = None,
    other_cpu: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """`episodes` calls of `play(index, output_dir)` (each an `EpisodeRun`), `concurrency` at a time, timed after
    one warm-up episode (index `episodes`). benchmarks/textcraft.py times its episodes with this too.

    `other_cpu`: the CPU seconds so far of other processes the episodes use (the ORS servers), read around the
    timed episodes as this process's own CPU time is (`server_cpu` in the result)."""
    limit = asyncio.Semaphore(concurrency)
    with tempfile.TemporaryDirectory(prefix="platoon-bench-episodes-") as scratch:

        async def one(index: int) -> Any:
            async with limit:
                return await play(index, Path(scratch) / str(index))

        # one warm-up episode: imports and first-use caches are not what a long run pays per episode
        await one(episodes)
        settle_heap()
        others_before = other_cpu() if other_cpu else 0.0
        cpu_before = time.process_time()
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        with GcPauses() as pauses:
            runs = await asyncio.gather(*(one(i) for i in range(episodes)))
        if profiler:
            profiler.disable()
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu_before
        others = other_cpu() - others_before if other_cpu else 0.0
    calls = sum(len(run.policy.calls) for run in runs)
    return {
        "seconds": seconds,
        "cpu": cpu,
        "server_cpu": others,
        "solved": sum(1 for run in runs if _solved(run.reward)),
        "calls": calls,
        **pauses.figures(),
    }


async def run_episodes(
    episodes: int,
    concurrency: int,
    profiler: Any = None,
    service: Any = SERVICE,
    other_cpu: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """`episodes` calls of `run_episode`, `concurrency` at a time, each with its own scripted policy.

    `service` is a reference (each episode resolves it, as a user's test does) or a service object shared by all.
    """
    from platoon.testing import ScriptedPolicy, run_episode

    async def play(index: int, output_dir: Path) -> Any:
        return await run_episode(
            f"train:{index}",
            service=service,
            harness="platoon-react",
            policy=ScriptedPolicy(binary_search),
            harness_options={"system_prompt": SYSTEM_PROMPT},
            output_dir=output_dir,
        )

    return await time_episodes(play, episodes, concurrency, profiler, other_cpu)


async def run_rollouts(
    episodes: int,
    concurrency: int,
    profiler: Any = None,
    service_ref: Any = SERVICE,
    other_cpu: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """`episodes` calls of `harness_rollout` on one shared gateway, no HTTP server."""
    from platoon.config.environments import AgentsConfig
    from platoon.config_defs import RolloutConfig
    from platoon.envs.resolve import resolve_service
    from platoon.episode.rollout import Route, harness_rollout
    from platoon.testing import make_gateway

    service = resolve_service(service_ref) if isinstance(service_ref, str) else service_ref
    gateway = make_gateway(binary_search)
    route = Route(
        harness="platoon-react",
        program="single",
        harness_options={"system_prompt": SYSTEM_PROMPT},
        agents=AgentsConfig(),
    )
    config = RolloutConfig(verbose=False)
    tasks = [await service.get_task(f"train:{i}") for i in range(episodes)]
    await harness_rollout(tasks[0], service=service, route=route, config=config, gateway=gateway)
    settle_heap()
    calls_before = len(gateway.sampler.calls)
    limit = asyncio.Semaphore(concurrency)

    async def one(task: Any) -> Any:
        async with limit:
            return await harness_rollout(task, service=service, route=route, config=config, gateway=gateway)

    others_before = other_cpu() if other_cpu else 0.0
    cpu_before = time.process_time()
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    with GcPauses() as pauses:
        collections = await asyncio.gather(*(one(task) for task in tasks))
    if profiler:
        profiler.disable()
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu_before
    others = other_cpu() - others_before if other_cpu else 0.0
    return {
        "seconds": seconds,
        "cpu": cpu,
        "server_cpu": others,
        "solved": sum(1 for c in collections if c.root is not None and _solved(c.root.reward)),
        "calls": len(gateway.sampler.calls) - calls_before,
        **pauses.figures(),
    }


def measure(
    path: str,
    episodes: int,
    concurrency: int,
    repeats: int,
    profile: bool = False,
    service: Any = SERVICE,
    other_cpu: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """The median run of `repeats` (by seconds), in this process, with the peak memory and the version."""
    import cProfile
    import io
    import pstats

    from platoon import __version__

    profiler = cProfile.Profile() if profile else None
    results = []
    runner = run_episodes if path == "run_episode" else run_rollouts
    for _ in range(repeats):
        # only the timed episodes are profiled: imports and the warm-up are paid once per process
        results.append(asyncio.run(runner(episodes, concurrency, profiler, service, other_cpu)))
    result = sorted(results, key=lambda r: r["seconds"])[len(results) // 2]
    result["all_seconds"] = [r["seconds"] for r in results]
    result["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["version"] = __version__
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(SORT).print_stats(40)
        if os.environ.get("EPISODES_PROFILE_CALLERS"):
            pstats.Stats(profiler, stream=out).sort_stats(SORT).print_callers(
                os.environ["EPISODES_PROFILE_CALLERS"]
            )
        if os.environ.get("EPISODES_PROFILE_CALLEES"):
            pstats.Stats(profiler, stream=out).sort_stats(SORT).print_callees(
                os.environ["EPISODES_PROFILE_CALLEES"]
            )
        result["profile"] = out.getvalue()
    return result


def in_fresh_process(
    python: str,
    path: str,
    episodes: int,
    concurrency: int,
    repeats: int,
    *,
    service: str | None = None,
    server_pids: Sequence[int] = (),
    profile: bool = False,
) -> dict[str, Any]:
    """`measure` in a process of its own under `python` (this installation's or another's), from the JSON line its
    worker prints. `service`: a reference the worker resolves once for all its episodes (default: number search
    in process); `server_pids`: the processes whose CPU time it reads around the timed episodes."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    argv = [python, __file__, "--worker", "--path", path, "--episodes", str(episodes)]
    argv += ["--concurrency", str(concurrency), "--repeats", str(repeats)]
    if not FREEZE:
        argv.append("--no-freeze")
    if service is not None:
        argv += ["--service", service, "--server-pids", ",".join(map(str, server_pids))]
    if profile:
        argv.append("--profile")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"the worker under {python} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


SERVER_CODE = (
    "import sys; from openreward.environments import Server; "
    "from platoon.envs.number_search.env import NumberSearchEnvironment; "
    "Server([NumberSearchEnvironment]).run(host='127.0.0.1', port=int(sys.argv[1]))"
)


def start_servers(count: int, cores: set[int] | None = None) -> list[tuple[subprocess.Popen[bytes], str]]:
    """`count` local ORS servers serving number search, each ready (answering /health), on `cores` if given."""
    import socket
    import sys
    import urllib.request

    started = []
    for _ in range(count):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        # The SDK's server logs every request at INFO; an environment server run for throughput logs warnings.
        env = {**os.environ, "OPENREWARD_DISABLE_UPDATE_CHECK": "1", "OPENREWARD_LOG_LEVEL": "WARNING"}
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER_CODE, str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if cores:
            os.sched_setaffinity(
                proc.pid, cores
            )  # before it has imported anything: all its threads inherit it
        started.append((proc, f"127.0.0.1:{port}"))
    for proc, host in started:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the ORS server on {host} exited ({proc.returncode})")
            try:
                with urllib.request.urlopen(f"http://{host}/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
    return started


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process so far, all its threads (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


IN_PROCESS = "in process (python://)"


def remote(args: argparse.Namespace) -> None:
    """In process, one server, two servers: the same episodes, the same path, one run.

    Each measurement reports the CPU time of this process (the client: harness, gateway, ORS client) and of the
    servers it used, over the same timed episodes: on a machine whose cores the client and the servers share,
    the episodes/s of a remote run is bounded by their CPU per episode, which these figures show."""
    if args.sdk_client:
        os.environ["PLATOON_ORS_WIRE"] = "0"
    cores = sorted(os.sched_getaffinity(0))
    client_cores: set[int] | None = None
    server_cores: set[int] | None = None
    if args.pin:
        if len(cores) < 2:
            raise SystemExit(f"--pin needs two cores; this process may use {len(cores)}")
        # the client (and the in-process run) on the first core, the servers on the others
        client_cores, server_cores = {cores[0]}, set(cores[1:])
    servers = start_servers(2, server_cores)
    hosts = [host for _, host in servers]
    pids = [proc.pid for proc, _ in servers]
    if client_cores:
        os.sched_setaffinity(0, client_cores)
    where = (
        f"pinned: this process on core {cores[0]}, the servers on {', '.join(map(str, sorted(server_cores or ())))}"
        if args.pin
        else "not pinned: the client and the servers share the cores"
    ) + ("; requests through the SDK's client" if args.sdk_client else "")
    try:
        print(
            f"{args.path}: {args.episodes} episodes at concurrency {args.concurrency}, {args.repeats} round(s) "
            f"(fresh processes), {os.cpu_count()} cores ({where}), load {os.getloadavg()[0]:.2f}"
        )
        services = {
            IN_PROCESS: (SERVICE, []),
            "one ORS server": (f"ors+http://{hosts[0]}/NumberSearchEnvironment", pids[:1]),
            "two ORS servers": (f"ors+http://{','.join(hosts)}/NumberSearchEnvironment", pids),
        }
        # Round by round, each round timing the three one after the other, each in a fresh process (one service
        # object shared by its episodes, as a run's rollouts share theirs). The machine's speed drifts over a run
        # (other tenants of its cores): a ratio of two measurements seconds apart drifts less than one of
        # measurements a minute apart. And a process that ran one kind of episode runs the next kind slower (in
        # process after remote: 5-10 % here), which fresh processes keep out of the comparison.
        rounds: list[dict[str, dict[str, Any]]] = []
        for _ in range(args.repeats):
            rounds.append(
                {
                    label: in_fresh_process(
                        sys.executable,
                        args.path,
                        args.episodes,
                        args.concurrency,
                        1,
                        service=ref,
                        server_pids=used,
                        profile=args.profile,
                    )
                    for label, (ref, used) in services.items()
                }
            )
        results = {
            label: sorted((r[label] for r in rounds), key=lambda r: r["seconds"])[len(rounds) // 2]
            for label in services
        }
    finally:
        if client_cores:
            os.sched_setaffinity(0, cores)
        for proc, _ in servers:
            proc.terminate()
            proc.wait()
    for label, result in results.items():
        report(label, result, args.episodes)
        client_ms = 1000 * result["cpu"] / args.episodes
        if label == IN_PROCESS:
            print(f"{'':<34} CPU per episode: {client_ms:.1f} ms in this process")
        else:
            server_ms = 1000 * result["server_cpu"] / args.episodes
            ceiling = 1000 / max(client_ms, server_ms / (1 if label == "one ORS server" else 2))
            print(
                f"{'':<34} CPU per episode: {client_ms:.1f} ms in this process + {server_ms:.1f} ms in the "
                f"server(s) = {client_ms + server_ms:.1f} ms; a core for each process would allow at most "
                f"{ceiling:.0f} episodes/s"
            )
        if result.get("profile"):
            print(result["profile"])
    base = results[IN_PROCESS]
    for label in ("one ORS server", "two ORS servers"):
        result = results[label]
        server_ms = 1000 * result["server_cpu"] / args.episodes
        # each round's ratio, of the two measurements it took seconds apart; the median of those is the figure
        ratios = sorted(100 * r[IN_PROCESS]["seconds"] / r[label]["seconds"] for r in rounds)
        print(
            f"{label}: {ratios[len(ratios) // 2]:.0f} % of the in-process episodes/s (rounds: "
            f"{', '.join(f'{ratio:.0f}' for ratio in ratios)} %; its server(s) alone use "
            f"{server_ms / (1000 * base['cpu'] / args.episodes):.2f}x the CPU of a whole in-process episode)"
        )
    # The same comparison from CPU time alone, which other load on the machine disturbs far less than wall time:
    # in process, an episode is one process's CPU; remote, the busier of the two processes bounds the rate.
    one = results["one ORS server"]
    in_process_ms = 1000 * base["cpu"] / args.episodes
    busier_ms = 1000 * max(one["cpu"], one["server_cpu"]) / args.episodes
    print(
        f"target: one ORS server >= 60 %; from CPU per episode (in process {in_process_ms:.1f} ms; one server: "
        f"the busier process {busier_ms:.1f} ms), a core for each process caps it at "
        f"{100 * in_process_ms / busier_ms:.0f} % of one in-process core"
    )
    print(f"load after: {os.getloadavg()[0]:.2f}")


def report(label: str, result: dict[str, Any], episodes: int) -> None:
    seconds = result["seconds"]
    print(
        f"{label:<34} {episodes / seconds:7.1f} episodes/s  {result['calls'] / seconds:6.0f} calls/s  "
        f"{seconds:6.2f} s wall  {result['cpu']:6.2f} s CPU  solved {result['solved']}/{episodes}  "
        f"{result['calls'] / episodes:.1f} calls/episode  peak {result['peak_mib']:.0f} MiB"
    )
    if "gc_seconds" in result:  # a 0.2.0 worker before this field
        print(
            f"{'':<34} garbage collector: {result['gc_seconds']:.3f} s, {result['gc_full']} full "
            f"collection(s), the longest pause {1000 * result['gc_longest']:.0f} ms"
        )


def _record_types() -> list[type]:
    from platoon.envs.service import Outcome, ToolResult
    from platoon.gateway.records import AgentRecord, CallRecord, Interaction
    from platoon.harness.agent import AgentResult
    from platoon.task import Task
    from platoon.trajectory import Trajectory, TrajectoryStep

    return [
        Interaction,
        CallRecord,
        AgentRecord,
        TrajectoryStep,
        Trajectory,
        ToolResult,
        Outcome,
        AgentResult,
        Task,
    ]


def _attrs_twin(cls: type) -> type:
    """An attrs class with `cls`'s fields and defaults, slotted, frozen where `cls` is (no validators)."""
    import dataclasses

    import attrs

    fields = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.default_factory is not dataclasses.MISSING:
            fields[f.name] = attrs.field(default=attrs.Factory(f.default_factory))
        elif f.default is not dataclasses.MISSING:
            fields[f.name] = attrs.field(default=f.default)
        else:
            fields[f.name] = attrs.field()
    frozen = cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    return attrs.make_class(f"{cls.__name__}Attrs", fields, slots=True, frozen=frozen, eq=True)


def _size(obj: Any) -> int:
    return sys.getsizeof(obj) + (sys.getsizeof(obj.__dict__) if hasattr(obj, "__dict__") else 0)


def records(args: argparse.Namespace) -> None:
    """Instances per episode of the hot value types, and what attrs twins would cost instead."""
    import dataclasses
    import timeit
    from collections import Counter

    built: Counter[str] = Counter()
    samples: dict[type, Any] = {}
    originals = {}
    for cls in _record_types():
        init = cls.__init__  # type: ignore[misc]
        originals[cls] = init

        def counting(self: Any, *a: Any, __init: Any = init, __cls: type = cls, **k: Any) -> None:
            __init(self, *a, **k)
            if type(self) is __cls:
                built[__cls.__name__] += 1
                samples.setdefault(__cls, self)

        cls.__init__ = counting  # type: ignore[misc]
    try:
        counted = asyncio.run(run_rollouts(args.episodes, args.concurrency))
    finally:
        for cls, init in originals.items():
            cls.__init__ = init  # type: ignore[misc]
    plain = asyncio.run(run_rollouts(args.episodes, args.concurrency))
    cpu_per_episode_us = plain["cpu"] / args.episodes * 1e6
    print(
        f"rollout path: {args.episodes} episodes at concurrency {args.concurrency}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.2f}; {cpu_per_episode_us:.0f} us CPU per episode ({counted['calls']} calls)"
    )
    print(f"{'type':16} {'per ep':>7} {'dc ns':>7} {'attrs ns':>8} {'dc B':>6} {'attrs B':>7}")
    saved_ns = saved_b = 0.0
    for cls in _record_types():
        count = built[cls.__name__] / args.episodes
        sample = samples.get(cls)
        if sample is None:
            print(f"{cls.__name__:16} {count:7.1f}  (none built)")
            continue
        values = {f.name: getattr(sample, f.name) for f in dataclasses.fields(cls) if f.init}
        twin = _attrs_twin(cls)
        number = 20000
        dc_ns = min(timeit.repeat(lambda c=cls, v=values: c(**v), number=number, repeat=5)) / number * 1e9
        at_ns = min(timeit.repeat(lambda t=twin, v=values: t(**v), number=number, repeat=5)) / number * 1e9
        dc_b, at_b = _size(cls(**values)), _size(twin(**values))
        saved_ns += count * (dc_ns - at_ns)
        saved_b += count * (dc_b - at_b)
        print(f"{cls.__name__:16} {count:7.1f} {dc_ns:7.0f} {at_ns:8.0f} {dc_b:6d} {at_b:7d}")
    print(
        f"attrs twins would save {saved_ns / 1e3:+.1f} us CPU ({saved_ns / 1e3 / cpu_per_episode_us:+.2%} of the "
        f"episode) and {saved_b:+.0f} bytes of instances per episode (peak RSS {plain_peak_mib():.0f} MiB)"
    )


def plain_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=["run_episode", "rollout"], default="run_episode")
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="runs; the median is reported")
    parser.add_argument("--profile", action="store_true", help="print the top functions by own time")
    parser.add_argument(
        "--baseline-python",
        metavar="PATH",
        help="also run the run_episode path under this Python's platoon (e.g. a venv with platoon==0.2.0)",
    )
    parser.add_argument(
        "--before-python",
        metavar="PATH",
        help="also run the run_episode path under this Python's platoon as it was before a change (a checkout of "
        "main put first on its PYTHONPATH), for a before/after beside the baseline in one run",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line: {ours, baseline?, before?}")
    parser.add_argument(
        "--remote", action="store_true", help="in process beside one and two local ORS servers (ors+http://)"
    )
    parser.add_argument(
        "--sdk-client",
        action="store_true",
        help="with --remote: remote sessions' requests through the SDK's aiohttp client (PLATOON_ORS_WIRE=0)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="with --remote: this process on the first core, the ORS servers on the others (os.sched_setaffinity)",
    )
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="leave the garbage collector as it is after the warm-up (the run commands freeze: platoon.heap)",
    )
    parser.add_argument("--records", action="store_true", help="the hot value types: dataclasses vs attrs")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    # a worker's service reference, and the servers whose CPU time it reads
    parser.add_argument("--service", help=argparse.SUPPRESS)
    parser.add_argument("--server-pids", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global FREEZE
    # the plain run_episode path is a user's loop: the benchmark freezes nothing there (platoon may, on its own);
    # a remote measurement's workers (`--service`) freeze as before
    FREEZE = not args.no_freeze and (args.path != "run_episode" or args.remote or bool(args.service))
    if args.records:
        records(args)
        return
    if args.worker:
        service: Any = SERVICE
        other_cpu = None
        if args.service:
            from platoon.envs.resolve import resolve_service

            service = resolve_service(args.service)
            pids = [int(pid) for pid in args.server_pids.split(",") if pid]
            other_cpu = lambda: sum(process_cpu(pid) for pid in pids)  # noqa: E731
        result = measure(
            args.path, args.episodes, args.concurrency, args.repeats, args.profile, service, other_cpu
        )
        print(json.dumps(result))
        return
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    if args.remote:
        remote(args)
        return
    if not args.json:
        print(
            f"{args.path}: {args.episodes} episodes at concurrency {args.concurrency}, median of {args.repeats}, "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"
        )
    results = {"ours": measure(args.path, args.episodes, args.concurrency, args.repeats, args.profile)}
    if args.baseline_python and args.path == "run_episode":
        results["baseline"] = in_fresh_process(
            args.baseline_python, args.path, args.episodes, args.concurrency, args.repeats
        )
    if args.before_python and args.path == "run_episode":
        results["before"] = in_fresh_process(
            args.before_python, args.path, args.episodes, args.concurrency, args.repeats
        )
    for result in results.values():
        result["episodes_per_s"] = args.episodes / result["seconds"]
    if args.json:
        print(json.dumps(results))
        return
    ours = results["ours"]
    report(f"this tree (platoon {ours['version']})", ours, args.episodes)
    if "baseline" in results:
        base = results["baseline"]
        report(f"baseline (platoon {base['version']})", base, args.episodes)
        print(f"ratio: {base['seconds'] / ours['seconds']:.2f}x the baseline's episodes/s (target >= 4x)")
    if "before" in results:
        before = results["before"]
        report(f"before (platoon {before['version']})", before, args.episodes)
        if "baseline" in results:
            print(
                f"ratio before: {results['baseline']['seconds'] / before['seconds']:.2f}x the baseline's episodes/s"
            )
    if ours.get("profile"):
        print(ours["profile"])


if __name__ == "__main__":
    main()
