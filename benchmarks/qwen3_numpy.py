"""The numpy Qwen3 of the local server against transformers' on the same weights: training and decoding times.

Times (median of --repeats, after one warm-up) for the toy model (hidden 128, 2 layers, the toy vocabulary of 265):

- train: forward + backward of 16 sequences of 64 tokens under a loss linear in the target logprobs;
- decode: a 50-token prompt's prefill, its cache repeated for 8 samples, then 64 cached steps of one token each;
- adamw: one AdamW step over every weight (torch.optim.AdamW for torch).

The torch rows need torch and transformers (skipped without them); torch runs with the thread count the torch
backend sets (at most 4) unless --torch-threads says otherwise, numpy with its BLAS's own (OpenBLAS: all cores;
OPENBLAS_NUM_THREADS=1 in the environment gives it one, which is faster on a busy machine).

    uv run --frozen python benchmarks/qwen3_numpy.py [--repeats 20] [--torch-threads N]
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from platoon.local_server.backend import ModelShape
from platoon.local_server.qwen3_numpy import AdamW, Qwen3Dims, Qwen3Numpy, initial_weights

VOCAB = 265  # the toy tokenizer's
PAD = 256
BATCH, LENGTH = 16, 64
SAMPLES, NEW_TOKENS, PROMPT_LENGTH = 8, 64, 50


def interleaved_ms(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Each run's times in ms, the runs taking turns (after one warm-up each) so that a change in the machine's
    load reaches all of them alike."""
    for run in runs.values():
        run()  # first-call allocations, lazy imports
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--torch-threads", type=int, default=max(1, min(os.cpu_count() or 1, 4)))
    args = parser.parse_args()

    dims = Qwen3Dims.from_shape(ModelShape(), VOCAB, pad_token_id=PAD)
    weights = initial_weights(dims, seed=0)
    rng = np.random.default_rng(0)
    sequences = [rng.integers(0, PAD, LENGTH).tolist() for _ in range(BATCH)]
    targets = [rng.integers(0, PAD, LENGTH) for _ in range(BATCH)]
    coefficients = [rng.standard_normal(LENGTH).astype(np.float32) for _ in range(BATCH)]
    prompt = rng.integers(0, PAD, PROMPT_LENGTH).tolist()

    blas_threads = os.environ.get("OPENBLAS_NUM_THREADS", "unset")
    print(
        f"cpus {os.cpu_count()}, OPENBLAS_NUM_THREADS {blas_threads}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    model = Qwen3Numpy(dims, weights)

    def numpy_train() -> None:
        model.logprobs_backward(sequences, targets, lambda logprobs: coefficients)

    def numpy_decode() -> None:
        logits, cache = model.prefill(prompt)
        cache = cache.repeat(SAMPLES)
        tokens = np.full(SAMPLES, int(np.argmax(logits[-1])))
        for _ in range(NEW_TOKENS - 1):
            tokens = np.argmax(model.step(cache, tokens), axis=-1)

    optimizer = AdamW()
    hyper = {"lr": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0}

    def numpy_adamw() -> None:
        optimizer.step(model.weights, model.grads, **hyper)

    runs: dict[str, Callable[[], object]] = {
        "numpy train": numpy_train,
        "numpy decode": numpy_decode,
        "numpy adamw": numpy_adamw,
    }
    try:
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM
    except ImportError:
        print("torch or transformers not installed: numpy only")
    else:
        torch.set_num_threads(args.torch_threads)
        config = Qwen3Config(
            vocab_size=VOCAB, tie_word_embeddings=True, pad_token_id=PAD, **vars(ModelShape())
        )
        config._attn_implementation = "sdpa"
        reference = Qwen3ForCausalLM(config).float()
        reference.load_state_dict({name: torch.from_numpy(w) for name, w in weights.items()}, strict=False)
        batch = torch.tensor(sequences)
        target_batch = torch.from_numpy(np.stack(targets))[..., None]
        weight = torch.from_numpy(np.stack(coefficients))

        def torch_train() -> None:
            logits = reference(input_ids=batch, use_cache=False).logits
            logprobs = logits.gather(-1, target_batch).squeeze(-1) - torch.logsumexp(logits, dim=-1)
            (logprobs * weight).sum().backward()

        # transformers 5 renamed `past_key_values` to `cache` (the old name warns)
        cache_kwarg = (
            "cache" if "cache" in inspect.signature(reference.forward).parameters else "past_key_values"
        )

        def torch_decode() -> None:
            with torch.inference_mode():
                out = reference(input_ids=torch.tensor([prompt]), use_cache=True)
                cache = out.past_key_values if getattr(out, "cache", None) is None else out.cache
                cache.batch_repeat_interleave(SAMPLES)
                tokens = out.logits[:, -1].argmax(-1).expand(SAMPLES)
                for _ in range(NEW_TOKENS - 1):
                    out = reference(input_ids=tokens[:, None], use_cache=True, **{cache_kwarg: cache})
                    tokens = out.logits[:, -1].argmax(-1)

        torch_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-12)

        def torch_adamw() -> None:
            torch_optimizer.step()

        torch_name = f"torch ({args.torch_threads} threads)"
        runs |= {
            f"{torch_name} train": lambda: (reference.train(), torch_train()),
            f"{torch_name} decode": lambda: (reference.eval(), torch_decode()),
            f"{torch_name} adamw": torch_adamw,
        }
    times = interleaved_ms(runs, args.repeats)
    print(f"median (min) of {args.repeats} runs, in ms")
    print(f"{'engine':<22} {'train 16x64':>15} {'decode 8x64':>15} {'adamw':>15}")
    for engine in dict.fromkeys(name.rpartition(" ")[0] for name in runs):
        cells = [times[f"{engine} {part}"] for part in ("train", "decode", "adamw")]
        print(f"{engine:<22}" + "".join(f"{statistics.median(t):>8.1f} ({min(t):>5.1f})" for t in cells))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
