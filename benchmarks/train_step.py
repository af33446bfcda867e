"""Training steps per second of `platoon train` on number search against the local Tinker-compatible server, with a
scripted policy sampling in process, and how much of a step is platoon's own time.

A step here is the production path end to end: the quickstart example's number search (ORS in process, the
platoon-react harness, the recording gateway, the trajectory build), group advantages, prefix-merged datums, then
`forward_backward` + `optim_step` + the next sampler on the local server (a child process, the toy model).

platoon's own time = the step's wall time - the time the step loop waited for the service (forward_backward,
optim_step, the sampler save) - the time the scripted policy spent sampling. It is measured with
`train.max_staleness: 0` (no prefetch), so a step's rollouts and its training do not overlap and the three parts
add up; steps/s is also measured in the default mode, where the next batch's rollouts run while a step trains.
Tokens sent per step before and after prefix merging come from the run's `datums/tokens_*_merge` metrics. Worker
start times come from `benchmarks/rollout_workers.py`.

    uv run --frozen python benchmarks/train_step.py [--steps 8] [--batch-size 4] [--group-size 8] [--workers 100]

Targets on the 2-core machine: platoon's own time under 10% of a step; a forked worker ready in under 100 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TINKER_TELEMETRY", "0")

from platoon.cli import main as platoon
from platoon.renderers.toy import toy_tokenizer
from platoon.testing import ScriptedPolicy, serve_policy, tool_call
from platoon.testing.number_search import open_range, react_guesses

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart" / "train.yaml"


def searcher(rng: random.Random) -> Any:
    """Half the turns a binary-search guess (replaying the feedback so far), half a random one in range, so the
    rewards of a group differ and every step trains."""

    def play(prompt: str) -> str:
        low, high = open_range(prompt, react_guesses(prompt))
        guess = (low + high) // 2 if rng.random() < 0.5 else rng.randint(low, high)
        return "\n" + tool_call("guess", {"number": guess})

    return play


class TimedPolicy(ScriptedPolicy):
    """The scripted policy, adding up the wall time its samples take (the union of overlapping calls)."""

    def __init__(self, script: Any) -> None:
        super().__init__(script, tokenizer=toy_tokenizer())
        self.intervals: list[tuple[float, float]] = []

    async def sample_async(self, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return await super().sample_async(*args, **kwargs)
        finally:
            self.intervals.append((started, time.monotonic()))

    def busy_seconds(self, start: float, end: float) -> float:
        """Seconds within [start, end] during which at least one sample was in flight."""
        spans = sorted((max(a, start), min(b, end)) for a, b in self.intervals if b > start and a < end)
        total, edge = 0.0, start
        for a, b in spans:
            if b > edge:
                total += b - max(a, edge)
                edge = b
        return total


#: per run, the monotonic time each step's metrics row was logged (see `_note_step_ends`)
STEP_ENDS: list[list[float]] = []


def _note_step_ends() -> None:
    """Record when each training row is logged, on the clock the policy's sample intervals use."""
    from platoon.train.tinker import metrics_log

    log = metrics_log.MetricsLog.log

    def timed(self: Any, step: int, metrics: Any, *, timing: bool = True) -> Any:
        if "train/step" in metrics:
            STEP_ENDS[0].append(time.monotonic())
        return log(self, step, metrics, timing=timing)

    metrics_log.MetricsLog.log = timed  # type: ignore[method-assign]


def run(
    log_path: Path, *, steps: int, batch_size: int, group_size: int, prefetch: bool
) -> tuple[list[dict[str, Any]], TimedPolicy]:
    """One `platoon train` run; returns its step rows and the policy (with its sample intervals)."""
    policy = TimedPolicy(searcher(random.Random(7)))
    STEP_ENDS.insert(0, [])
    argv = [
        "train",
        str(QUICKSTART),
        f"log_path={log_path}",
        f"train.batch_size={batch_size}",
        f"train.workflow_config.group_size={group_size}",
        f"train.max_training_steps={steps}",
        "train.workflow_config.rollout_config.max_steps=10",
        "checkpoint.every=0",
    ]
    if not prefetch:
        argv.append("train.max_staleness=0")
    with serve_policy(policy), contextlib.redirect_stderr(io.StringIO()) as err:
        status = platoon(argv)
    if status != 0:
        sys.exit(f"platoon train exited with {status}:\n{err.getvalue()[-3000:]}")
    rows = [
        json.loads(line)
        for line in (log_path / "quickstart" / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    return [row for row in rows if "train/step" in row], policy


def _steps_per_second(ends: list[float]) -> float:
    """Throughput between the first and the last step's end (the first step pays the start-up)."""
    return (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 else float("nan")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=100, help="rollout workers forked for the start times")
    args = parser.parse_args()
    _note_step_ends()

    with tempfile.TemporaryDirectory(prefix="platoon-bench-") as scratch:
        root = Path(scratch)
        (root / "site.yaml").write_text(f"cache: {root / 'cache'}\n")
        os.environ["PLATOON_SITE"] = str(root / "site.yaml")
        os.environ.pop("TINKER_API_KEY", None)

        shape = dict(steps=args.steps, batch_size=args.batch_size, group_size=args.group_size)
        rows, policy = run(root / "sequential", prefetch=False, **shape)
        measured = rows[1:]  # the first step pays the imports and first-use caches
        totals = [r["timing/batch_total"] for r in measured]
        service = [r["timing/service_wait"] for r in measured]
        # Each step's window on the policy's clock: it ends when its row is logged, batch_total after it began.
        windows = [
            (end - row["timing/batch_total"], end) for row, end in zip(rows, STEP_ENDS[0], strict=True)
        ]
        sampling = [policy.busy_seconds(a, b) for a, b in windows[1:]]
        own = [t - s - p for t, s, p in zip(totals, service, sampling, strict=True)]
        share = [o / t for o, t in zip(own, totals, strict=True)]
        before = [r["train/datums/tokens_before_merge"] for r in measured]
        after = [r["train/datums/tokens_after_merge"] for r in measured]
        calls = [r["train/workload/batch/total_model_calls"] for r in measured]

        sequential_rate = _steps_per_second(STEP_ENDS[0])
        run(root / "prefetch", prefetch=True, **shape)
        prefetch_rate = _steps_per_second(STEP_ENDS[0])

    print(
        f"number search, batch {args.batch_size} x group {args.group_size}, {args.steps} steps "
        f"(the first one not counted), scripted policy, local server (toy model)"
    )
    print(f"model calls per step (median): {median(calls):.0f}")
    print(
        f"step, no prefetch (median): {median(totals):.3f} s = service {median(service):.3f} s + sampling "
        f"{median(sampling):.3f} s + platoon {median(own):.3f} s"
    )
    print(f"platoon's own share of a step (median): {100 * median(share):.1f}%   (target < 10%)")
    print(f"steps/s, no prefetch: {sequential_rate:.2f}   default (prefetch): {prefetch_rate:.2f}")
    print(
        f"tokens sent per step (median): {median(before):.0f} before prefix merging, {median(after):.0f} after "
        f"({100 * (1 - median(after) / median(before)):.0f}% fewer)"
    )
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from rollout_workers import measure_worker_starts
    except ImportError as exc:
        print(f"rollout worker starts: not measured ({exc})")
        return
    starts = measure_worker_starts(count=args.workers)
    print(f"rollout worker starts: {json.dumps(starts)}")


if __name__ == "__main__":
    main()
