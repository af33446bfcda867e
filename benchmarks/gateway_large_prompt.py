"""The gateway stays responsive while a large prompt renders: the worst and median `/healthz` latency while a 5 MB
Chat Completions request renders, and that request's own time, with the real Qwen3 tokenizer and the
`qwen3_instruct` renderer.

    uv run --frozen python benchmarks/gateway_large_prompt.py [--mb 5] [--tokenizer tokenizers|transformers|both]
        [--no-inline] [--no-window] [--no-gil-probe]

Target: no `/healthz` answer slower than 100 ms while the request renders. Each server runs in a child process (the
client's polling is not billed to it) over a sampler that answers one token, so the request's time is the gateway's
(body, render, record). `tokenizers` loads tokenizer.json through platoon's adapter, `transformers` through
`AutoTokenizer` (what a model name loads). Also printed:

- `inline`: the same request rendered on the event loop, as before 0.2.1 (`OFF_LOOP_CHARS` raised out of reach);
- `window`: the request against a 32768-token context window, refused by the cheap bound before it renders;
- the GIL probe: the longest pause of a thread ticking every millisecond while another thread encodes the text
  with tokenizers' `Tokenizer.encode` (which holds the GIL) and with `encode_batch_fast` (which releases it).

The tokenizer comes from `.cache/test-tokenizers/qwen3` (`uv run python scripts/fetch_test_tokenizers.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = (
    Path(os.environ.get("PLATOON_TEST_TOKENIZERS") or ROOT / ".cache" / "test-tokenizers") / "qwen3"
)
WORDS = [
    "def",
    "return",
    "self",
    "value",
    "index",
    "for",
    "in",
    "range(n)",
    "if",
    "else:",
    "print(x)",
    "data",
]
WINDOW = 32768
TARGET_MS = 100.0


def make_text(megabytes: float) -> str:
    """Code-like lines (indented, ordinary words): what a large tool result or file usually holds."""
    rng = random.Random(0)
    size = int(megabytes * 1_000_000)
    lines: list[str] = []
    total = 0
    while total < size:
        line = (
            " " * rng.choice((0, 4, 8))
            + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10)))
            + "\n"
        )
        lines.append(line)
        total += len(line)
    return "".join(lines)[:size]


def load_tokenizer(kind: str) -> Any:
    if not (TOKENIZER_DIR / "tokenizer.json").is_file():
        raise SystemExit(
            f"no Qwen3 tokenizer at {TOKENIZER_DIR}: run `uv run python scripts/fetch_test_tokenizers.py`"
        )
    if kind == "transformers":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR), use_fast=True)
        tokenizer.model_max_length = 10**9  # no too-long warning
        return tokenizer
    from platoon.renderers.tokenizers import TokenizersTokenizer

    return TokenizersTokenizer.from_directory(TOKENIZER_DIR, name_or_path="Qwen/Qwen3-8B")


# ---- the server (a child process) ----------------------------------------------------------------------------


class OneToken:
    """A sampler answering the end-of-turn token at once: the call's time is the gateway's own."""

    def __init__(self, eos: int) -> None:
        self.eos = eos

    async def sample_async(self, prompt: Any, num_samples: int, sampling_params: Any, **_: Any) -> Any:
        from platoon.testing import sample_response

        return sample_response([self.eos], logprob=-0.1)


async def serve(tokenizer_kind: str, inline: bool, window: int | None) -> None:
    import platoon.gateway.core as core
    from platoon.gateway.http import GatewayServer
    from platoon.renderers.base import get_renderer

    if inline:
        core.OFF_LOOP_CHARS = 1 << 62  # type: ignore[misc]
    renderer = get_renderer("qwen3_instruct", load_tokenizer(tokenizer_kind))
    sampler = OneToken(renderer.stop_token_ids()[0])
    gateway = core.ModelGateway(sampler, renderer, model_name="Qwen/Qwen3-8B", context_window_length=window)
    agent = gateway.open_agent(gateway.open_rollout())
    async with GatewayServer(gateway) as server:
        endpoint = server.endpoint(agent)
        print(server.base_url, endpoint.base_url, endpoint.api_key, flush=True)
        await asyncio.get_running_loop().run_in_executor(
            None, sys.stdin.read
        )  # until the parent closes stdin


# ---- the client ----------------------------------------------------------------------------------------------


async def drive(root: str, v1: str, key: str, text: str) -> dict[str, Any]:
    import httpx

    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    small = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    async with httpx.AsyncClient(timeout=900) as calls, httpx.AsyncClient(timeout=900) as health:
        for _ in range(3):  # warm: connections, the renderer's tables
            (await calls.post(f"{v1}/chat/completions", json=small, headers=headers)).raise_for_status()
            (await health.get(f"{root}/healthz")).raise_for_status()

        async def big() -> tuple[float, httpx.Response]:
            start = time.perf_counter()
            response = await calls.post(f"{v1}/chat/completions", content=body, headers=headers)
            return time.perf_counter() - start, response

        task = asyncio.create_task(big())
        latencies: list[float] = []
        while not task.done():
            start = time.perf_counter()
            (await health.get(f"{root}/healthz")).raise_for_status()
            latencies.append(time.perf_counter() - start)
            await asyncio.sleep(0.01)
        elapsed, response = await task
    reply = response.json()
    return {"elapsed": elapsed, "status": response.status_code, "reply": reply, "latencies": latencies}


def measure(
    tokenizer_kind: str, text: str, *, inline: bool = False, window: int | None = None
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--serve", "--tokenizer", tokenizer_kind]
    command += ["--inline"] if inline else []
    command += ["--window", str(window)] if window else []
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        root, v1, key = child.stdout.readline().split()
        return asyncio.run(drive(root, v1, key, text))
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=120)


def report(label: str, result: dict[str, Any], megabytes: float) -> None:
    ms = [x * 1e3 for x in result["latencies"]]
    reply = result["reply"]
    if result["status"] == 200:
        outcome = f"{reply['usage']['prompt_tokens']:,} prompt tokens"
    else:
        outcome = f"HTTP {result['status']}: {reply['error']['message'][:90]}"
    worst = max(ms) if ms else float("nan")
    verdict = "ok" if worst <= TARGET_MS else "OVER TARGET"
    print(
        f"{label:<28} {megabytes:g} MB request {result['elapsed']:6.2f} s ({outcome}); /healthz while it ran: "
        f"n={len(ms)} median {statistics.median(ms) if ms else float('nan'):.1f} ms, worst {worst:.1f} ms "
        f"[target <= {TARGET_MS:g} ms: {verdict}]",
        flush=True,
    )


# ---- the GIL probe -------------------------------------------------------------------------------------------


def gil_probe(text: str) -> None:
    import tokenizers

    def longest_pause(encode: Any) -> tuple[float, float]:
        done = threading.Event()
        times: dict[str, float] = {}

        def work() -> None:
            start = time.perf_counter()
            encode(text)
            times["encode"] = time.perf_counter() - start
            done.set()

        pauses: list[float] = []
        thread = threading.Thread(target=work)
        last = time.perf_counter()
        thread.start()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            pauses.append(now - last)
            last = now
        thread.join()
        return max(pauses), times["encode"]

    path = str(TOKENIZER_DIR / "tokenizer.json")
    held = tokenizers.Tokenizer.from_file(path)  # fresh instances: no word cache from the other run
    released = tokenizers.Tokenizer.from_file(path)
    pause, took = longest_pause(lambda t: held.encode(t, add_special_tokens=False).ids)
    print(
        f"GIL probe (tokenizers {tokenizers.__version__}): Tokenizer.encode          "
        f"longest pause of a 1 ms ticker {pause:6.3f} s during a {took:.2f} s encode",
        flush=True,
    )
    pause, took = longest_pause(lambda t: released.encode_batch_fast([t], add_special_tokens=False)[0].ids)
    print(
        f"GIL probe (tokenizers {tokenizers.__version__}): encode_batch_fast([text]) "
        f"longest pause of a 1 ms ticker {pause:6.3f} s during a {took:.2f} s encode",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=5.0, help="the large request's text, in MB (default 5)")
    parser.add_argument("--tokenizer", choices=("tokenizers", "transformers", "both"), default="both")
    parser.add_argument("--no-inline", action="store_true", help="skip the render-on-the-loop comparison")
    parser.add_argument("--no-window", action="store_true", help="skip the context-window refusal")
    parser.add_argument("--no-gil-probe", action="store_true", help="skip the GIL probe")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--inline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--window", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.tokenizer, args.inline, args.window))
        return
    text = make_text(args.mb)
    print(f"cpus {os.cpu_count()}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    kinds = ["tokenizers", "transformers"] if args.tokenizer == "both" else [args.tokenizer]
    for kind in kinds:
        report(f"{kind}, off the loop", measure(kind, text), args.mb)
    if not args.no_inline:
        report(f"{kinds[0]}, inline (before)", measure(kinds[0], text, inline=True), args.mb)
    if not args.no_window:
        report(f"{kinds[0]}, window {WINDOW}", measure(kinds[0], text, window=WINDOW), args.mb)
    if not args.no_gil_probe:
        gil_probe(text)


if __name__ == "__main__":
    main()
