"""The MCP tool plane against the `mcp` SDK's: tool calls per second and p50 latency of both, in one run.

    uv run --frozen python benchmarks/mcp_plane.py [--calls 2000] [--concurrency 16] [--sequential 300] [--rounds 3]

Each plane is mounted on a `GatewayServer` in its own process (the client's work is not billed to it), serving one
agent bound to a session whose tool answers at once, so what is measured is the protocol layer: the hand-written
`platoon.gateway.mcp` and the SDK's stateless streamable-HTTP server (benchmarks/mcp_sdk_plane.py), which share
the tool shapes, filtering and recording. The client posts `tools/call` over raw httpx twice per plane: asking
for JSON (`Accept: application/json`) and as MCP clients do (`Accept: application/json, text/event-stream`,
which both planes answer as SSE). Adoption bar (docs/architecture.md, "Dependencies"): the SDK at >= 80 % of the
hand-written plane's calls/s and within +1 ms of its sequential p50.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PLANES = ("platoon", "sdk")
MODES = {"json": "application/json", "sse": "application/json, text/event-stream"}


# ---- the servers (child processes) ---------------------------------------------------------------------------


class InstantSession:
    """A session with one tool that answers at once; it gates itself, so calls run concurrently."""

    manages_concurrency = True

    async def tools(self) -> list[Any]:
        from platoon.envs.service import ToolSpec

        schema = {"type": "object", "properties": {"number": {"type": "integer"}}}
        return [ToolSpec("guess", "Guess a number.", schema)]

    async def call_tool(self, name: str, arguments: Mapping[str, Any], on_behalf_of: str = "") -> Any:
        from platoon.envs.service import ToolResult

        return ToolResult([{"type": "text", "text": "wrong"}], reward=0.0)


async def _serve(plane: str) -> None:
    from platoon.gateway.http import GatewayServer
    from platoon.gateway.mcp import bind_tools, mount_mcp
    from platoon.testing import make_gateway

    gateway = make_gateway(lambda prompt: "unused")
    agent = gateway.open_agent(gateway.open_rollout())
    bind_tools(agent, InstantSession())
    server = GatewayServer(gateway)
    if plane == "sdk":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from mcp_sdk_plane import mount_sdk_mcp

        mount_sdk_mcp(server)
    else:
        mount_mcp(server)
    async with server:
        print(server.base_url, agent.secret, flush=True)
        # Served until the parent closes our stdin.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


# ---- the load ------------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _load(base_url: str, key: str, accept: str, args: argparse.Namespace) -> dict[str, float]:
    import socket

    import httpx

    transport = httpx.AsyncHTTPTransport(
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        limits=httpx.Limits(
            max_connections=args.concurrency * 2, max_keepalive_connections=args.concurrency * 2
        ),
    )
    headers = {"Authorization": f"Bearer {key}", "Accept": accept, "MCP-Protocol-Version": "2025-06-18"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, transport=transport, timeout=60) as http:
        counter = iter(range(10**9))

        async def one() -> float:
            call = {
                "jsonrpc": "2.0",
                "id": next(counter),
                "method": "tools/call",
                "params": {"name": "guess", "arguments": {"number": 50}},
            }
            start = time.perf_counter()
            reply = await http.post(
                "/mcp", content=json.dumps(call), headers={"content-type": "application/json"}
            )
            text = reply.text
            elapsed = time.perf_counter() - start
            assert reply.status_code == 200 and '"platoon"' in text and "wrong" in text, (
                reply.status_code,
                text,
            )
            return elapsed

        for _ in range(30):  # warm up connections and caches
            await one()
        latencies: list[float] = []
        queue = iter(range(args.calls))

        async def worker() -> None:
            for _ in queue:
                latencies.append(await one())

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - start
        serial = [await one() for _ in range(args.sequential)]
    return {
        "calls_per_s": args.calls / elapsed,
        "p50_ms": _percentile(latencies, 0.5) * 1e3,
        "seq_calls_per_s": args.sequential / sum(serial),
        "seq_p50_ms": _percentile(serial, 0.5) * 1e3,
    }


def _start(plane: str) -> tuple[subprocess.Popen[str], str, str]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", plane], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    base_url, key = child.stdout.readline().split()
    return child, base_url, key


def _measure(args: argparse.Namespace) -> dict[str, dict[str, dict[str, float]]]:
    """Both servers up at once; each round measures both planes, alternating which goes first (the machine's
    load drifts); the median round of each figure is reported."""
    servers = {plane: _start(plane) for plane in PLANES}
    rounds: dict[str, dict[str, list[dict[str, float]]]] = {p: {m: [] for m in MODES} for p in PLANES}
    try:
        for index in range(args.rounds):
            order = PLANES if index % 2 == 0 else PLANES[::-1]
            for mode, accept in MODES.items():
                for plane in order:
                    _, base_url, key = servers[plane]
                    rounds[plane][mode].append(asyncio.run(_load(base_url, key, accept, args)))
    finally:
        for child, _, _ in servers.values():
            if child.stdin is not None:
                child.stdin.close()
            child.wait(timeout=60)
    return {
        plane: {
            mode: {
                name: sorted(r[name] for r in rounds[plane][mode])[args.rounds // 2]
                for name in rounds[plane][mode][0]
            }
            for mode in MODES
        }
        for plane in PLANES
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sequential", type=int, default=300)
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds, alternating the planes; medians reported"
    )
    parser.add_argument("--serve", choices=PLANES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return
    load = os.getloadavg()
    results = _measure(args)
    print(
        f"{args.calls} tools/call at concurrency {args.concurrency}, then {args.sequential} sequential, "
        f"median of {args.rounds} rounds "
        f"({os.cpu_count()} cores, load {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after)"
    )
    print(f"{'plane':8} {'reply':5} {'calls/s':>9} {'p50 ms':>8} | {'seq/s':>7} {'seq p50':>8}")
    for plane in PLANES:
        for mode in MODES:
            r = results[plane][mode]
            print(
                f"{plane:8} {mode:5} {r['calls_per_s']:9.0f} {r['p50_ms']:8.2f} | "
                f"{r['seq_calls_per_s']:7.0f} {r['seq_p50_ms']:8.2f}"
            )
    for mode in MODES:
        ours, sdk = results["platoon"][mode], results["sdk"][mode]
        ratio = sdk["calls_per_s"] / ours["calls_per_s"]
        delta = sdk["seq_p50_ms"] - ours["seq_p50_ms"]
        verdict = "meets" if ratio >= 0.8 and delta <= 1.0 else "misses"
        print(
            f"{mode}: sdk/platoon calls/s {ratio:.0%} (bar >= 80%), sequential p50 {delta:+.2f} ms (bar <= +1 ms): "
            f"{verdict} the bar"
        )


if __name__ == "__main__":
    main()
