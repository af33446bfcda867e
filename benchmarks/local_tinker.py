"""One RL step through the unmodified Tinker SDK against the local server, as `TINKER_BASE_URL=local`
runs it: the server in a child process, the default tiny model with the toy tokenizer.

A step = save weights and get a sampling client, sample 8 completions of 64 tokens, `forward_backward` with
`importance_sampling`, `optim_step`. Prints the median step (and each part) and the server process's peak memory.

    uv run --frozen python benchmarks/local_tinker.py [--steps 10] [--samples 8] [--tokens 64]

Target on the 2-core machine: a median step under 1 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("TINKER_TELEMETRY", "0")

import tinker
from tinker import types

from platoon.gateway import tinker_sdk
from platoon.local_server.process import start_local_server_process

MODEL = "platoon/toy"
# ChatML through the byte-level toy tokenizer: 257 <|im_start|>, 258 <|im_end|>.
PROMPT = [257, *b"user\nWrite a short story about a robot.", 258, 10, 257, *b"assistant\n"]


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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10, help="measured steps (after 2 warm-up steps)")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="platoon-bench-local-tinker-") as state_dir:
        started = time.perf_counter()
        url, key, stop = start_local_server_process(model=MODEL, state_dir=state_dir)
        try:
            service = tinker.ServiceClient(base_url=url, api_key=key)
            client = tinker_sdk.made(service.create_lora_training_client(base_model=MODEL, rank=8))
            print(f"server up and training client created in {time.perf_counter() - started:.1f} s")
            warm: dict[str, list[float]] = defaultdict(list)
            # The first steps pay torch's lazy initialisation and the first HTTP connections.
            for seed in range(2):
                rl_step(client, args.samples, args.tokens, seed, warm)
            times: dict[str, list[float]] = defaultdict(list)
            for seed in range(args.steps):
                rl_step(client, args.samples, args.tokens, 100 + seed, times)
        finally:
            stop()  # waits for the child, so its peak RSS is in RUSAGE_CHILDREN
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux

    print(
        f"{args.steps} RL steps ({args.samples} x {args.tokens} tokens, {MODEL}), first step {warm['step'][0]:.2f} s"
    )
    for name, values in times.items():
        print(f"  {name:<38} median {statistics.median(values):6.3f} s   max {max(values):6.3f} s")
    print(f"median RL step: {statistics.median(times['step']):.3f} s")
    print(f"server peak memory (max RSS): {peak_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
