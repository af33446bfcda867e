"""The local server's engines compared: one RL step through the unmodified Tinker SDK, and the bandit example whole.

Each engine's server is started as a user starts it, `platoon tinker serve --engine E`, in a process of its own
(the default tiny model, the toy tokenizer). A step = save weights and get a sampling client, sample 8 completions
of 64 tokens, `forward_backward` on those 8 sequences with `importance_sampling`, `optim_step`. After 2 warm-up
steps it prints the median step (and each part's) with its spread over `--steps` steps, and the server's peak
resident memory (VmHWM), for each engine, then the numpy/torch ratio against issue 41's target (at most 2x).

`--bandit` instead times `platoon train examples/bandit/train.yaml` end to end for each engine (wall time and the
final step's mean reward); issue 41's target is the numpy run at most 1.3x the torch run.

Without `--engine` it measures both engines where torch is installed, and the numpy engine alone (saying so) in the
dev environment, which has no torch. Both, in the torch engine's environment:

    UV_PROJECT_ENVIRONMENT=.venv-torch uv sync --frozen --all-packages --group torch-engine
    UV_PROJECT_ENVIRONMENT=.venv-torch uv run --frozen --all-packages --group torch-engine \\
        python benchmarks/local_tinker.py [--engine numpy] [--steps 10] [--bandit [--runs 3]]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("TINKER_TELEMETRY", "0")

import tinker
from tinker import types

from platoon.gateway import tinker_sdk

MODEL = "platoon/toy"
ENGINES = ("numpy", "torch")
#: issue 41's targets: the numpy engine's RL step at most 2x the torch engine's, the bandit run at most 1.3x
STEP_TARGET = 2.0
BANDIT_TARGET = 1.3
#: the dotted config key that picks the embedded server's engine
ENGINE_KEY = "local_server.engine"
REPO = Path(__file__).resolve().parents[1]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"
# ChatML through the byte-level toy tokenizer: 257 <|im_start|>, 258 <|im_end|>.
PROMPT = [257, *b"user\nWrite a short story about a robot.", 258, 10, 257, *b"assistant\n"]
#: seconds to wait for a server's base URL
START_TIMEOUT = 180.0


def platoon_command() -> list[str]:
    """The `platoon` command of the environment this runs in (as `uv run platoon` finds it)."""
    script = Path(sys.executable).parent / "platoon"
    return [str(script)] if script.exists() else [sys.executable, "-m", "platoon"]


class Server:
    """`platoon tinker serve --engine ENGINE` in a process of its own; `url` and `key` are its first two lines."""

    def __init__(self, engine: str, state_dir: str) -> None:
        self.errors = Path(state_dir) / "serve.stderr"
        with self.errors.open("w") as errors:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [*platoon_command(), "tinker", "serve", "--engine", engine, "--dir", state_dir],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
            )
        lines: queue.Queue[str | None] = queue.Queue()
        assert self.process.stdout is not None
        stdout = self.process.stdout

        def read_lines() -> None:
            for line in stdout:
                lines.put(line.strip())
            lines.put(None)  # the server exited: stop waiting for its URL

        threading.Thread(target=read_lines, daemon=True).start()
        first_two: list[str] = []
        with contextlib.suppress(queue.Empty):
            while len(first_two) < 2 and (line := lines.get(timeout=START_TIMEOUT)) is not None:
                first_two.append(line)
        if len(first_two) < 2:
            self.stop()
            last = (self.errors.read_text().strip().splitlines() or ["no output"])[-1]
            sys.exit(f"platoon tinker serve --engine {engine} did not start: {last}")
        self.url, self.key = first_two

    def peak_memory_mib(self) -> float:
        """The process's peak resident set size (VmHWM), read while it still runs."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
        return float("nan")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # serve stops on SIGTERM as on Ctrl-C
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def rl_step(
    client: tinker.TrainingClient, samples: int, tokens: int, seed: int, times: dict[str, list[float]]
) -> None:
    """One on-policy step; each part's wall time is appended to `times`."""
    t0 = time.perf_counter()
    sampler = tinker_sdk.made(client.save_weights_and_get_sampling_client())
    t1 = time.perf_counter()
    result = sampler.sample(
        types.ModelInput.from_ints(PROMPT),
        num_samples=samples,
        sampling_params=types.SamplingParams(max_tokens=tokens, seed=seed),
    ).result()
    t2 = time.perf_counter()
    n = len(PROMPT) - 1
    data = []
    for i, seq in enumerate(result.sequences):
        full = PROMPT + list(seq.tokens)
        completion = len(seq.tokens)
        advantage = 1.0 if i % 2 else -1.0  # any signal: the cost does not depend on it
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(full[:-1]),
                loss_fn_inputs={
                    "target_tokens": full[1:],
                    "logprobs": [0.0] * n + list(seq.logprobs or []),
                    "advantages": [0.0] * n + [advantage / completion] * completion,
                },
            )
        )
    client.forward_backward(data, "importance_sampling").result()
    t3 = time.perf_counter()
    client.optim_step(types.AdamParams(learning_rate=1e-4)).result()
    t4 = time.perf_counter()
    for name, seconds in (
        ("save_weights_and_get_sampling_client", t1 - t0),
        ("sample", t2 - t1),
        ("forward_backward", t3 - t2),
        ("optim_step", t4 - t3),
        ("step", t4 - t0),
    ):
        times[name].append(seconds)


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):6.3f} s  (min {min(values):.3f}, max {max(values):.3f})"


def time_steps(engine: str, args: argparse.Namespace) -> float:
    """The engine's median RL step, after printing its parts and the server's peak memory."""
    with tempfile.TemporaryDirectory(prefix=f"platoon-bench-local-{engine}-") as state_dir:
        started = time.perf_counter()
        server = Server(engine, state_dir)
        try:
            service = tinker.ServiceClient(base_url=server.url, api_key=server.key)
            client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL, rank=8))
            ready = time.perf_counter() - started
            warm: dict[str, list[float]] = defaultdict(list)
            # The first steps pay lazy imports and initialisation and the first HTTP connections.
            for seed in range(2):
                rl_step(client, args.samples, args.tokens, seed, warm)
            times: dict[str, list[float]] = defaultdict(list)
            for seed in range(args.steps):
                rl_step(client, args.samples, args.tokens, 100 + seed, times)
            peak = server.peak_memory_mib()
        finally:
            server.stop()
    print(
        f"{engine}: server up and training client created in {ready:.1f} s; {args.steps} RL steps "
        f"({args.samples} x {args.tokens} tokens) after 2 warm-up steps (the first {warm['step'][0]:.2f} s)"
    )
    for name, values in times.items():
        print(f"  {name:<38} {spread(values)}")
    print(f"  server peak memory (VmHWM)             {peak:.0f} MiB")
    return statistics.median(times["step"])


def bandit_run(engine: str) -> tuple[float, float, int]:
    """(wall seconds, the last step's mean reward, exit status) of one `platoon train` of the bandit example."""
    with tempfile.TemporaryDirectory(prefix=f"platoon-bench-bandit-{engine}-") as scratch:
        root = Path(scratch)
        # the local server keeps its checkpoints under the site cache: a profile points it into the scratch
        (root / "site.yaml").write_text(f"cache: {root / 'cache'}\n")
        env = {**os.environ, "PLATOON_SITE": str(root / "site.yaml")}
        command = [
            *platoon_command(),
            "train",
            str(BANDIT),
            f"log_path={root / 'runs'}",
            f"{ENGINE_KEY}={engine}",
        ]
        started = time.perf_counter()
        finished = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if finished.returncode != 0:
            last = (finished.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"{engine}: platoon train exited with {finished.returncode}: {last}")
            return wall, float("nan"), finished.returncode
        metrics = root / "runs" / "bandit" / "run" / "metrics.jsonl"
        rewards = [
            row["train/batch/task_reward/avg"]
            for row in map(json.loads, metrics.read_text().splitlines())
            if "train/batch/task_reward/avg" in row
        ]
    return wall, rewards[-1] if rewards else float("nan"), 0


def verdict(ratio: float, target: float) -> str:
    return f"{ratio:.2f}x (target at most {target}x: {'met' if ratio <= target else 'missed'})"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--engine", choices=ENGINES, action="append", help="an engine to measure (repeatable; default both)"
    )
    parser.add_argument("--steps", type=int, default=10, help="measured steps (after 2 warm-up steps)")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--bandit", action="store_true", help="time the bandit example end to end instead")
    parser.add_argument("--runs", type=int, default=1, help="bandit runs per engine")
    args = parser.parse_args()
    engines = list(dict.fromkeys(args.engine or ENGINES))
    if not args.engine and importlib.util.find_spec("torch") is None:
        engines = ["numpy"]
        print(
            "torch is not installed here: measuring the numpy engine only (both engines: UV_PROJECT_ENVIRONMENT="
            ".venv-torch uv run --frozen --all-packages --group torch-engine python benchmarks/local_tinker.py)"
        )

    measured: dict[str, float] = {}
    if args.bandit:
        for engine in engines:
            walls = []
            for _ in range(args.runs):
                wall, reward, status = bandit_run(engine)
                print(f"{engine}: bandit example {wall:.1f} s, final mean reward {reward:.2f}")
                if status != 0:
                    return 1
                walls.append(wall)
            measured[engine] = statistics.median(walls)
            print(f"{engine}: median wall time over {args.runs} run(s) {measured[engine]:.1f} s")
        target = BANDIT_TARGET
    else:
        for engine in engines:
            measured[engine] = time_steps(engine, args)
        target = STEP_TARGET
    if set(ENGINES) <= measured.keys():
        print(f"numpy/torch: {verdict(measured['numpy'] / measured['torch'], target)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
