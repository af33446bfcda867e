"""`platoon-bash` through the TOML spec runner: episodes per second, and platoon's own overhead per episode and per
model call, on the host and in a `network: none` docker sandbox, at concurrency 1 and 8.

    . /tmp/platoon-docker-engine.env   # the docker rows need an engine (.ci/docker-engine start)
    uv run --frozen python benchmarks/cli_agents.py [--placement host,docker] [--episodes 32] \
        [--docker-episodes 16] [--calls 100] [--profile]

The task is number search (the in-process ORS environment; its `guess` tool reaches the agent over MCP) with a
scripted policy answering two model calls per episode: a `bash` command (`echo $((6 * 7))`), then a final answer.
Each episode is `harness_rollout` on one shared gateway, the path `platoon rollout` and training's rollout workers
take. In the docker rows the service starts a container per session from `python:bookworm` with `network: none`
and the rollout's session needs, as the runner tests do, so the agent reaches the gateway through the sandbox's
route (its forwarder to the rollout's Unix socket).

What is measured, per episode (p50 and p95 over the episodes of a row):

- `episode`: the wall time of `harness_rollout`, call to return (rollout opened, session opened (docker: the
  container started), the runner, grading, the trajectory built, session closed (docker: the container removed)).
- `agent`: the agent process's lifetime as the runner sees it: from entering the launch (host: `local.launch`,
  which spawns at once; docker: `sandboxed.launch`, which starts the `docker exec`) to the runner seeing the exit
  (entering the kill that follows every exit). It holds the agent's own start-up and its work, and its model
  calls (the gateway and the policy) and MCP calls.
- `CPU/ep`: this process's CPU time per episode (the runner, the gateway, the policy, the environment; the agents
  and docker are other processes).
- `policy`: the time in the scripted sampler (`sample_async`), per episode on average. It lies inside `agent` (the
  agent waits on its model call), so it is shown, not subtracted again.
- `overhead` = `episode` - `agent`: everything platoon does around the agent process, split into `before` (the
  runner up to the launch: the rollout's loopback gateway server, state dir and files; in docker the rollout's
  Unix-socket server, the route check, `pwd`, the state dir and upload), `after` (the runner after the exit: the
  kill by marker, the final message, the state dir removed, the rollout's servers stopped) and `rest` (outside
  the runner: session open and close, including the container's start and stop in docker, grading, the
  trajectory).
- `direct` (host): the same script with the same argv (rendered by the runner's own `plan`) and the same
  environment, spawned directly against the same gateway served on loopback with the same MCP tools, spawn to
  exit (and runs per second): the agent on its own, no runner around it. On 2 shared cores its concurrency-8
  figures move with the machine's load more than the per-episode `overhead`, which is paired episode by episode.

Per model call: a client calling the agent's own `chat()` (imported from `platoon_bash.py`, so the same HTTP code)
times `--calls` sequential `POST /v1/chat/completions` with an agent's key, one client per concurrent worker:
`direct` on the host against the gateway's own HTTP server (`GatewayServer`) on loopback; `host route` against
the runner's per-rollout loopback server, which the agent uses on the host; `docker route` inside a `network:
none` sandbox through its route. Each route's overhead is its p50 (p95) minus the direct p50 (p95) at the same
concurrency. The docker client runs the container's python3 (3.11), the others the host's.

Targets (issue 19): `overhead` p50 <= 150 ms on the host (at concurrency 1 and at 8); per model call <= 3 ms
beyond the direct call (p50, each route, each concurrency). Docker episodes have no target of their own: their
rows say what the container and the route cost. At the end it checks that no agent or client process, container,
state dir or socket dir of the run is left, and exits 1 if one is. `--profile` prints where the benchmark's
process spends its time in the host episodes at concurrency 1 (cProfile; the agents are other processes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from platoon.envs.number_search import SERVICE
from platoon.testing import ScriptedPolicy, make_gateway, tool_call

IMAGE = "docker://platoon-test/python:bookworm"
BASH = "\n" + tool_call("bash", {"command": "echo $((6 * 7))"})
FINAL = "The bash command printed 42."
OVERHEAD_TARGET_S = 0.150
CALL_TARGET_S = 0.003
BENCH = f"cli-agents-{os.getpid()}"  # every container's label and every client's environment carry it

#: The per-call client: the agent script's own `chat()`, timed call by call; prints the seconds as one JSON list.
PROBE = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import platoon_bash as agent
base_url, calls = sys.argv[2], int(sys.argv[3])
key = os.environ["PLATOON_API_KEY"]
messages = [{"role": "system", "content": agent.SYSTEM_PROMPT}, {"role": "user", "content": "What is 6 * 7?"}]
tools = [agent.bash_tool(120)]
for _ in range(5):  # warm-up: imports, the first connection's setup on every hop
    agent.chat(base_url, key, "policy", messages, tools)
seconds = []
for _ in range(calls):
    start = time.perf_counter()
    agent.chat(base_url, key, "policy", messages, tools)
    seconds.append(time.perf_counter() - start)
print(json.dumps(seconds))
"""


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def policy(prompt: str) -> str:
    """One bash command, then (once its result is in the prompt) a final answer."""
    return FINAL if "<tool_response>" in prompt else BASH


class TimedPolicy(ScriptedPolicy):
    """The scripted policy, adding up the time spent in it."""

    seconds = 0.0

    async def sample_async(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await super().sample_async(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


# ---- where an episode's time goes: the runner's steps, timed from outside --------------------------------------

#: the record of the episode the current task belongs to (tasks the episode starts share it)
CURRENT: contextvars.ContextVar[dict[str, float]] = contextvars.ContextVar("episode")
#: every launch marker the runner made in this run (the leftover check looks for them)
MARKERS: list[str] = []
#: the runner's steps, in the order they run
STEP_ORDER = [f"step:{name}" for name in (
    "socket server", "loopback server", "route check", "pwd", "files", "mkdir+upload", "kill", "final download",
    "state removed", "servers stopped",
)]  # fmt: skip


def _timed(
    fn: Callable[..., Any], start: str | None = None, end: str | None = None, step: str | None = None
) -> Callable[..., Any]:
    """`fn` writing into the current episode's record the time it was entered (`start`) and left (`end`), and adding
    its duration to `step:<step>`."""

    def enter() -> tuple[dict[str, float] | None, float]:
        record, now = CURRENT.get(None), time.perf_counter()
        if record is not None and start:
            record[start] = now
        return record, now

    def leave(record: dict[str, float] | None, entered: float) -> None:
        now = time.perf_counter()
        if record is not None and end:
            record[end] = now
        if record is not None and step:
            record[f"step:{step}"] = record.get(f"step:{step}", 0.0) + now - entered

    if not asyncio.iscoroutinefunction(
        fn
    ):  # a blocking step the runner runs in a thread (the context goes along)

        @functools.wraps(fn)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            record, entered = enter()
            try:
                return fn(*args, **kwargs)
            finally:
                leave(record, entered)

        return blocking

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        record, entered = enter()
        try:
            return await fn(*args, **kwargs)
        finally:
            leave(record, entered)

    return wrapper


def instrument() -> None:
    """Time the runner's steps by wrapping the functions it calls (looked up through their modules at call time),
    and keep every marker it makes. Fails loudly if the runner's layout changed."""
    from platoon_harnesses.spec_runner import local, runner, sandboxed

    def keep_marker(slug: str, _make: Callable[[str], str] = runner.new_marker) -> str:
        marker = _make(slug)
        MARKERS.append(marker)
        return marker

    runner.new_marker = keep_marker
    rollout = runner.SpecRollout
    rollout.run = _timed(rollout.run, "run", "run_end")  # type: ignore[method-assign]
    rollout.needs = _timed(rollout.needs, "needs", "needs_end", "socket server")  # type: ignore[method-assign]
    rollout.aclose = _timed(rollout.aclose, "aclose", "aclose_end", "servers stopped")  # type: ignore[method-assign]
    rollout._tcp_base_url = _timed(rollout._tcp_base_url, step="loopback server")  # type: ignore[method-assign]
    local.write_files = _timed(local.write_files, step="files")
    local.launch = _timed(local.launch, "launch")
    local.end_local = _timed(local.end_local, "exit", "killed", "kill")
    local.remove_state = _timed(local.remove_state, step="state removed")
    sandboxed.gateway_route = _timed(sandboxed.gateway_route, step="route check")
    sandboxed.workdir = _timed(sandboxed.workdir, step="pwd")
    sandboxed.prepare = _timed(sandboxed.prepare, step="mkdir+upload")
    sandboxed.launch = _timed(sandboxed.launch, "launch")
    sandboxed._finish = _timed(sandboxed._finish, "exit", "killed")
    sandboxed.kill_marked = _timed(sandboxed.kill_marked, step="kill")
    sandboxed._download = _timed(sandboxed._download, step="final download")


def phases(record: dict[str, float]) -> dict[str, float]:
    """An episode's record as durations: episode, agent, overhead and its parts."""
    episode = record["end"] - record["start"]
    agent = record["exit"] - record["launch"]
    needs = record.get("needs_end", 0.0) - record.get("needs", 0.0)
    before = needs + record["launch"] - record["run"]
    after = record["run_end"] - record["exit"] + record["aclose_end"] - record["aclose"]
    steps = {k: v for k, v in record.items() if k.startswith("step:")}
    return {
        **steps,
        "episode": episode,
        "agent": agent,
        "overhead": episode - agent,
        "before": before,
        "after": after,
        "rest": episode - agent - before - after,
    }


# ---- the docker placement: a container per session ---------------------------------------------------------------


class SandboxedSession:
    """An environment session with a task sandbox: the runner finds `sandbox` on it; it goes with the session."""

    def __init__(self, inner: Any, sandbox: Any) -> None:
        self._inner = inner
        self.sandbox = sandbox

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def close(self) -> None:
        try:
            await self._inner.close()
        finally:
            await self.sandbox.stop()


class SandboxedService:
    """Number search with a `network: none` container per session, built with the rollout's session needs."""

    def __init__(self, inner: Any, provider: Any) -> None:
        self._inner = inner
        self.provider = provider

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def open(self, task: Any, *, rollout_id: str, needs: Any = None) -> SandboxedSession:
        from platoon.sandbox import SandboxSpec

        spec = SandboxSpec(image=IMAGE, network="none", workdir="/app", labels={"platoon.bench": BENCH})
        sandbox = await self.provider.start(needs.apply(spec) if needs is not None else spec)
        try:
            session = await self._inner.open(task, rollout_id=rollout_id)
        except BaseException:
            await sandbox.stop()
            raise
        return SandboxedSession(session, sandbox)


# ---- episodes --------------------------------------------------------------------------------------------------


async def episodes(
    service: Any, count: int, concurrency: int, scratch: Path, profiler: Any = None
) -> dict[str, Any]:
    """`count` episodes, `concurrency` at a time, on one gateway; their phases, wall time and this process's CPU."""
    from platoon.config.environments import AgentsConfig
    from platoon.config_defs import RolloutConfig
    from platoon.episode.rollout import Route, harness_rollout

    gateway = make_gateway(TimedPolicy(policy))
    route = Route(harness="platoon-bash", program="single", harness_options={}, agents=AgentsConfig())
    config = RolloutConfig(verbose=False)
    tasks = [await service.get_task(f"train:{i}") for i in range(count)]
    limit = asyncio.Semaphore(concurrency)
    records: list[dict[str, float]] = []
    outcomes: list[Any] = []

    async def one(index: int, task: Any) -> None:
        async with limit:
            record: dict[str, float] = {}
            CURRENT.set(record)
            record["start"] = time.perf_counter()
            collection = await harness_rollout(
                task,
                service=service,
                route=route,
                config=config,
                gateway=gateway,
                output_dir=scratch / "out" / f"{concurrency}-{index}",
            )
            record["end"] = time.perf_counter()
            records.append(record)
            root = collection.root
            assert root is not None
            outcome = root.misc.get("outcome") or {}
            outcomes.append((outcome.get("status"), len(root.steps), root.misc["harness"]["placement"]))

    cpu = time.process_time()
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    await asyncio.gather(*(one(i, task) for i, task in enumerate(tasks)))
    if profiler is not None:
        profiler.disable()
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    placement = "task_sandbox" if isinstance(service, SandboxedService) else "local"
    bad = [o for o in outcomes if o != ("scored", 2, placement)]
    if bad:
        raise SystemExit(
            f"{len(bad)} episode(s) did not run as scripted (status, model calls, placement): {bad[:3]}"
        )
    sampler = gateway.sampler
    return {
        "count": count,
        "wall": wall,
        "cpu": cpu,
        "policy": sampler.seconds / count,
        "calls": len(sampler.calls) / count,
        "phases": [phases(r) for r in records],
    }


async def direct(service: Any, count: int, concurrency: int, scratch: Path) -> list[float]:
    """The agent without the runner: the same argv and environment, spawned against the gateway served on loopback
    with the MCP tools bound to a fresh session; spawn to exit, per run."""
    from platoon.gateway.http import GatewayServer
    from platoon.gateway.mcp import bind_tools, mount_mcp
    from platoon.harness.registry import get_harness
    from platoon_harnesses.spec_runner import local
    from platoon_harnesses.spec_runner.launch import launch_values, plan

    spec = get_harness("platoon-bash@1")
    gateway = make_gateway(TimedPolicy(policy))
    server = GatewayServer(gateway)
    mount_mcp(server)
    await server.astart()
    limit = asyncio.Semaphore(concurrency)
    lifetimes: list[float] = []

    async def one(index: int) -> None:
        async with limit:
            rollout = gateway.open_rollout()
            agent = gateway.open_agent(rollout)
            task = await service.get_task(f"train:{index}")
            session = await service.open(task, rollout_id=rollout.rollout_id)
            bind_tools(agent, session)
            state = scratch / "direct" / f"{concurrency}-{index}"
            (state / "work").mkdir(parents=True)
            values = launch_values(
                spec,  # type: ignore[arg-type]
                options={},
                instruction=str(session.instruction or task.goal),
                base_url=str(server.base_url),
                api_key=agent.secret,
                model=gateway.model_name,
                workdir=str(state / "work"),
                state_dir=str(state),
                max_steps=spec.max_steps,  # type: ignore[union-attr]
                toolchain=None,
            )
            launch = plan(spec, values, mcp=True, disable_builtins=False)  # type: ignore[arg-type]
            local.write_files(launch)
            env = {**local.base_env(), **launch.env, "PLATOON_BENCH": BENCH}
            start = time.perf_counter()
            process = await asyncio.create_subprocess_exec(
                *launch.argv,
                cwd=state / "work",
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            code = await process.wait()
            lifetimes.append(time.perf_counter() - start)
            await session.close()
            gateway.release_rollout(rollout)
            if code != 0 or len(agent.calls) != 2:
                raise SystemExit(f"the direct agent run exited {code} after {len(agent.calls)} model call(s)")

    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await server.astop()
    return lifetimes


# ---- per model call --------------------------------------------------------------------------------------------


def _probe_files(scratch: Path) -> Path:
    from platoon.harness.registry import get_harness

    folder = scratch / "probe"
    folder.mkdir(exist_ok=True)
    (folder / "probe.py").write_text(PROBE)
    spec = get_harness("platoon-bash@1")
    shutil.copyfile(spec.launch.assets["platoon_bash.py"], folder / "platoon_bash.py")  # type: ignore[union-attr]
    return folder


async def _host_probe(folder: Path, base_url: str, key: str, calls: int) -> list[float]:
    from platoon_harnesses.spec_runner import local

    env = {**local.base_env(), "PLATOON_API_KEY": key, "PLATOON_BENCH": BENCH}
    process = await asyncio.create_subprocess_exec(
        "python3", str(folder / "probe.py"), str(folder), f"{base_url}/v1", str(calls),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"the per-call client failed ({process.returncode}): {err.decode()[-2000:]}")
    return list(json.loads(out))


async def _sandbox_probe(sandbox: Any, folder: Path, base_url: str, key: str, calls: int) -> list[float]:
    await sandbox.upload(folder, "/tmp/probe")
    env = {"PLATOON_API_KEY": key, "PLATOON_BENCH": BENCH, "NO_PROXY": "127.0.0.1,localhost,::1"}
    result = await sandbox.exec(
        ["python3", "/tmp/probe/probe.py", "/tmp/probe", f"{base_url}/v1", str(calls)],
        env=env,
        cwd="/",
        timeout_s=600,
    )
    if result.exit_code != 0:
        raise SystemExit(
            f"the per-call client in the sandbox failed ({result.exit_code}): {result.stderr[-2000:]}"
        )
    return list(json.loads(result.stdout))


async def model_calls(
    placements: Sequence[str], provider: Any, calls: int, concurrency: int, scratch: Path
) -> dict[str, list[float]]:
    """Per-call seconds of `concurrency` clients at once: direct, and through each placement's route."""
    from platoon.episode.spec_runs import spec_runner
    from platoon.gateway.http import GatewayServer
    from platoon.harness.registry import get_harness
    from platoon.sandbox import SandboxSpec

    folder = _probe_files(scratch)
    spec = get_harness("platoon-bash@1")
    gateway = make_gateway(ScriptedPolicy(lambda prompt: FINAL))
    pairs = [
        (rollout, gateway.open_agent(rollout))
        for rollout in (gateway.open_rollout() for _ in range(concurrency))
    ]
    found: dict[str, list[float]] = {}
    server = GatewayServer(gateway)
    await server.astart()
    try:
        lists = await asyncio.gather(
            *(_host_probe(folder, server.base_url, a.secret, calls) for _, a in pairs)
        )
        found["direct"] = [s for one in lists for s in one]
    finally:
        await server.astop()
    handles = [spec_runner().open_rollout(spec, gateway=gateway, rollout=r) for r, _ in pairs]
    sandboxes: list[Any] = []
    try:
        if "host" in placements:
            urls = [await handle._tcp_base_url() for handle in handles]  # the server a host launch uses
            lists = await asyncio.gather(
                *(_host_probe(folder, url, a.secret, calls) for url, (_, a) in zip(urls, pairs, strict=True))
            )
            found["host route"] = [s for one in lists for s in one]
        if "docker" in placements and provider is not None:
            base = SandboxSpec(image=IMAGE, network="none", workdir="/app", labels={"platoon.bench": BENCH})
            for handle, (_, agent) in zip(handles, pairs, strict=True):
                sandboxes.append(await provider.start((await handle.needs()).apply(base)))
                gateway.restrict_to_policy(agent)  # as the runner does for a sandboxed root
            routes = []
            for sandbox in sandboxes:
                await sandbox.ensure_routes()
                routes.append(str(sandbox.routes["gateway"]).rstrip("/"))
            lists = await asyncio.gather(
                *(
                    _sandbox_probe(sandbox, folder, route, a.secret, calls)
                    for sandbox, route, (_, a) in zip(sandboxes, routes, pairs, strict=True)
                )
            )
            found["docker route"] = [s for one in lists for s in one]
    finally:
        await asyncio.gather(*(s.stop() for s in sandboxes), return_exceptions=True)
        await asyncio.gather(*(h.aclose() for h in handles))
    return found


# ---- leftovers -------------------------------------------------------------------------------------------------


def leftover_processes() -> list[str]:
    """Live processes carrying one of this run's launch markers or its client marker, and live children."""
    needles = [f"PLATOON_HARNESS_AGENT={m}\0".encode() for m in MARKERS] + [
        f"PLATOON_BENCH={BENCH}\0".encode()
    ]
    found = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes() + b"\0"
            stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] == "Z":
            continue
        if any(n in environ for n in needles) or int(stat[1]) == me:
            found.append(f"process {name}")
    return found


def leftover_dirs(scratch: Path) -> list[str]:
    uid = os.getuid()
    states = [str(p) for p in (scratch / f"platoon-harness-{uid}").glob("platoon-bash-*")]
    sockets = [str(p) for p in (scratch / f"pgw-{uid}").glob("*")]
    return states + sockets


def leftover_containers() -> list[str]:
    docker = os.environ.get("PLATOON_DOCKER", "docker")
    try:
        found = subprocess.run(
            [docker, "ps", "--all", "--quiet", "--filter", f"label=platoon.bench={BENCH}"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return []
    return [f"container {cid}" for cid in found.stdout.split()]


# ---- the report ------------------------------------------------------------------------------------------------


def ms(value: float) -> str:
    return f"{value * 1000:.0f}"


async def run(args: argparse.Namespace, scratch: Path) -> int:
    import cProfile
    import io
    import pstats

    from platoon.envs.resolve import resolve_service

    placements = [p for p in args.placement.split(",") if p]
    instrument()
    inner = resolve_service(SERVICE)
    provider = None
    services: dict[str, Any] = {}
    if "host" in placements:
        services["host"] = inner
    if "docker" in placements:
        try:
            from platoon_sandbox.docker import DockerProvider

            provider = DockerProvider()
            services["docker"] = SandboxedService(inner, provider)
            await episodes(services["docker"], 1, 1, scratch)  # a first container, the image's first use
        except Exception as exc:  # no engine here: the host rows still print
            print(f"docker: skipped ({type(exc).__name__}: {exc})")
            services.pop("docker", None)
            provider = None
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    directs: dict[int, tuple[float, list[float]]] = {}
    calls: dict[int, dict[str, list[float]]] = {}
    profiler = cProfile.Profile() if args.profile else None
    for name, service in services.items():
        await episodes(service, 2, 1, scratch)  # warm-up: imports, the first spawn
        for concurrency in (1, 8):
            count = args.episodes if name == "host" else args.docker_episodes
            count = max(count, concurrency)
            profile = profiler if name == "host" and concurrency == 1 else None
            rows[(name, concurrency)] = await episodes(service, count, concurrency, scratch, profile)
            if name == "host":
                began = time.perf_counter()
                lifetimes = await direct(inner, count, concurrency, scratch)
                directs[concurrency] = (count / (time.perf_counter() - began), lifetimes)
    for concurrency in (1, 8):
        calls[concurrency] = await model_calls(
            list(services), provider, args.calls if concurrency == 1 else max(1, args.calls // 2), concurrency,
            scratch,
        )  # fmt: skip
    left = leftover_processes() + leftover_dirs(scratch) + (leftover_containers() if provider else [])

    load = os.getloadavg()
    print(f"load: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cpus; times in ms, p50/p95")
    print(
        "episodes: number search, 2 model calls (bash, then a final answer), harness_rollout on one gateway"
    )
    head = ["placement", "conc", "n", "ep/s", "CPU/ep", "episode", "agent", "policy", "overhead", "before", "after",
            "rest"]  # fmt: skip
    print(
        f"{head[0]:<10}{head[1]:>5}{head[2]:>5}{head[3]:>7}{head[4]:>8}"
        + "".join(f"{h:>12}" for h in head[5:])
    )
    for (name, concurrency), row in rows.items():
        ph = row["phases"]
        cells = []
        for key in ("episode", "agent", "policy", "overhead", "before", "after", "rest"):
            if key == "policy":
                cells.append(ms(row["policy"]))
                continue
            values = [p[key] for p in ph]
            cells.append(f"{ms(pct(values, 0.5))}/{ms(pct(values, 0.95))}")
        print(
            f"{name:<10}{concurrency:>5}{row['count']:>5}{row['count'] / row['wall']:>7.1f}"
            f"{ms(row['cpu'] / row['count']):>8}" + "".join(f"{c:>12}" for c in cells)
        )
    for (name, concurrency), row in rows.items():
        names = sorted({k for p in row["phases"] for k in p if k.startswith("step:")}, key=STEP_ORDER.index)
        cells = [f"{k[5:]} {ms(pct([p.get(k, 0.0) for p in row['phases']], 0.5))}" for k in names]
        print(f"runner steps, {name} at concurrency {concurrency} (p50): " + ", ".join(cells))
    for concurrency, (rate, lifetimes) in directs.items():
        host = [p["episode"] for p in rows[("host", concurrency)]["phases"]]
        print(
            f"direct agent (no runner), concurrency {concurrency}: {rate:.1f} runs/s, {ms(pct(lifetimes, 0.5))}/"
            f"{ms(pct(lifetimes, 0.95))} spawn to exit; host episode p50 - direct p50 = "
            f"{ms(pct(host, 0.5) - pct(lifetimes, 0.5))}"
        )
    print(
        f"per model call ({args.calls} calls a client at concurrency 1, {max(1, args.calls // 2)} at 8), ms:"
    )
    for concurrency, found in calls.items():
        base = found["direct"]
        parts = [f"direct {pct(base, 0.5) * 1e3:.2f}/{pct(base, 0.95) * 1e3:.2f}"]
        for label, values in found.items():
            if label != "direct":
                parts.append(
                    f"{label} {pct(values, 0.5) * 1e3:.2f}/{pct(values, 0.95) * 1e3:.2f} "
                    f"({(pct(values, 0.5) - pct(base, 0.5)) * 1e3:+.2f}/{(pct(values, 0.95) - pct(base, 0.95)) * 1e3:+.2f})"
                )
        print(f"  concurrency {concurrency}: " + "; ".join(parts))
    for (name, concurrency), row in rows.items():
        if name != "host":
            continue
        overhead = pct([p["overhead"] for p in row["phases"]], 0.5)
        verdict = "met" if overhead <= OVERHEAD_TARGET_S else "MISSED"
        print(
            f"target: host runner overhead p50 <= 150 ms at concurrency {concurrency}: {ms(overhead)} ms, {verdict}"
        )
    for concurrency, found in calls.items():
        for label, values in found.items():
            if label == "direct":
                continue
            extra = pct(values, 0.5) - pct(found["direct"], 0.5)
            verdict = "met" if extra <= CALL_TARGET_S else "MISSED"
            print(
                f"target: {label} per model call p50 <= 3 ms beyond direct at concurrency {concurrency}: "
                f"{extra * 1e3:+.2f} ms, {verdict}"
            )
    print(
        f"left behind: {len(left)}"
        + (f" ({', '.join(left[:8])})" if left else " (no process, container, state or socket dir)")
    )
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(
            os.environ.get("PROFILE_SORT", "cumulative")
        ).print_stats(40)
        print(out.getvalue())
    return 1 if left else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--placement", default="host,docker", help="comma-separated: host, docker")
    parser.add_argument("--episodes", type=int, default=32, help="host episodes per concurrency")
    parser.add_argument("--docker-episodes", type=int, default=16, help="docker episodes per concurrency")
    parser.add_argument(
        "--calls", type=int, default=100, help="model calls per client at concurrency 1 (half at 8)"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the host episodes at concurrency 1")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="platoon-bench-cli-agents-") as tmp:
        scratch = Path(tmp)
        # State dirs, socket dirs and logs of this run go under its own scratch: the leftover check sees only them.
        os.environ["PLATOON_NODE_SCRATCH"] = str(scratch)
        return asyncio.run(run(args, scratch))


if __name__ == "__main__":
    sys.exit(main())
