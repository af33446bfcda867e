"""The HTTP gateway's overhead: the same `openai` async-client load against platoon's Chat Completions endpoint
(a scripted sampler answering one tool call per reply: render -> sample -> parse -> record) and against a trivial
starlette endpoint on the same uvicorn settings returning a fixed chat completion.

    uv run --frozen python benchmarks/gateway.py [--calls 2000] [--concurrency 16] [--sequential 300] [--profile]

Each server runs in its own process (the client's work is not billed to it). Targets: platoon's throughput at least
70% of the trivial endpoint's, sequential p50 within 2 ms of it. `--profile` prints where platoon's server spends
its time (cProfile of the server process).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import subprocess
import sys
import time
from typing import Any

MESSAGES = [
    {"role": "system", "content": "You are a careful agent. Use the tools."},
    {"role": "user", "content": "Guess the number between 1 and 100."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "guess",
            "description": "Guess a number.",
            "parameters": {"type": "object", "properties": {"number": {"type": "integer"}}},
        },
    }
]
FIXED = {
    "id": "chatcmpl-fixed",
    "object": "chat.completion",
    "created": 0,
    "model": "trivial",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "guess", "arguments": '{"number": 50}'},
                    }
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
}


# ---- the servers (run in child processes) --------------------------------------------------------------------


async def _serve_platoon(profile: bool) -> None:
    from platoon.gateway.http import GatewayServer
    from platoon.testing import make_gateway, tool_call

    reply = "\n" + tool_call("guess", number=50)
    gateway = make_gateway(lambda prompt: reply)
    agent = gateway.open_agent(gateway.open_rollout())
    async with GatewayServer(gateway) as server:
        endpoint = server.endpoint(agent)
        await _announce_and_wait(endpoint.base_url, endpoint.api_key, profile)


async def _serve_trivial(profile: bool) -> None:
    import json
    import socket

    import uvicorn
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route, Router

    body = json.dumps(FIXED).encode()

    async def completions(request: Request) -> Response:
        await request.body()
        return Response(body, media_type="application/json")

    app = Router(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # as platoon's server binds
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        http="h11",
        proxy_headers=False,
        server_header=False,
        date_header=False,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    await _announce_and_wait(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", "unused", profile)
    server.should_exit = True
    await task


async def _announce_and_wait(base_url: str, key: str, profile: bool) -> None:
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    print(base_url, key, flush=True)
    # Served until the parent closes our stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    if profiler is not None:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue(), file=sys.stderr, flush=True)


# ---- the load ------------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _load(base_url: str, key: str, calls: int, concurrency: int, sequential: int) -> dict[str, float]:
    import socket

    import httpx2 as httpx  # the HTTP library this openai client is built on
    import openai

    # TCP_NODELAY on the client: it writes headers and body separately, and Nagle's algorithm against the server's
    # delayed ACK would add ~40 ms to every call on both servers alike, hiding the difference measured here.
    transport = httpx.AsyncHTTPTransport(
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        limits=httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2),
    )
    http_client = openai.DefaultAsyncHttpxClient(transport=transport)
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key=key, max_retries=0, http_client=http_client
    ) as client:

        async def one() -> float:
            start = time.perf_counter()
            reply = await client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)
            assert reply.choices[0].message.tool_calls, reply
            return time.perf_counter() - start

        for _ in range(20):  # warm up connections and caches
            await one()
        latencies: list[float] = []
        queue = iter(range(calls))

        async def worker() -> None:
            for _ in queue:
                latencies.append(await one())

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
        serial = [await one() for _ in range(sequential)]
    return {
        "calls_per_s": calls / elapsed,
        "p50_ms": _percentile(latencies, 0.5) * 1e3,
        "p99_ms": _percentile(latencies, 0.99) * 1e3,
        "seq_calls_per_s": sequential / sum(serial),
        "seq_p50_ms": _percentile(serial, 0.5) * 1e3,
        "seq_p99_ms": _percentile(serial, 0.99) * 1e3,
    }


def _measure(kind: str, args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, __file__, "--serve", kind] + (
        ["--profile"] if args.profile and kind == "platoon" else []
    )
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        base_url, key = child.stdout.readline().split()
        return asyncio.run(_load(base_url, key, args.calls, args.concurrency, args.sequential))
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sequential", type=int, default=300)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--serve", choices=("platoon", "trivial"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve: Any = _serve_platoon if args.serve == "platoon" else _serve_trivial
        asyncio.run(serve(args.profile))
        return
    trivial = _measure("trivial", args)
    platoon = _measure("platoon", args)
    print(f"{args.calls} calls at concurrency {args.concurrency}, then {args.sequential} sequential calls")
    print(f"{'':10} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} | {'seq/s':>7} {'seq p50':>8} {'seq p99':>8}")
    for name, r in (("trivial", trivial), ("platoon", platoon)):
        print(
            f"{name:10} {r['calls_per_s']:9.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} | "
            f"{r['seq_calls_per_s']:7.0f} {r['seq_p50_ms']:8.2f} {r['seq_p99_ms']:8.2f}"
        )
    ratio = platoon["calls_per_s"] / trivial["calls_per_s"]
    delta = platoon["seq_p50_ms"] - trivial["seq_p50_ms"]
    print(f"throughput ratio platoon/trivial: {ratio:.0%} (target >= 70%)")
    print(f"sequential p50 difference: {delta:+.2f} ms (target <= 2 ms)")
    print(f"concurrent p50 ratio: {platoon['p50_ms'] / trivial['p50_ms']:.2f}x")


if __name__ == "__main__":
    main()
