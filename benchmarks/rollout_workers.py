"""Rollout-worker start: the fork server's own start, then the time from a member's request to its worker's ready
file for the first and the hundredth worker forked from it, and for workers started by exec for comparison.

Each worker gets the real thing to load: a request with a pickled `tinker.SamplingClient` of the local server (in
a child process), the toy tokenizer's `qwen3_instruct` renderer, a task-table service; its harness returns at once,
so the figures are start-up, not rollout. Workers run one at a time (latency, not throughput).

    uv run --frozen python benchmarks/rollout_workers.py [--count 100] [--exec 3]

Target on the 2-core machine: a forked worker ready in under 100 ms. `measure_worker_starts()` returns the same
figures as a dict (benchmarks/train_step.py prints them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from platoon.harness.agent import AgentResult
from platoon.harness.function import harness

HERE = Path(__file__).resolve().parent
MODULE = Path(__file__).stem
MODEL = "platoon/toy"


@harness("bench-workers-return")
async def return_at_once(ctx: Any) -> AgentResult:
    """The benchmark's harness: no model call, no tool call."""
    return AgentResult()


def _member(rollout_number: int) -> Any:
    from platoon.config.environments import EnvironmentConfig
    from platoon.config_defs import RolloutConfig
    from platoon.rollouts.one_rollout import MemberRequest
    from platoon.task import Task

    entry = EnvironmentConfig(
        service="table", service_kwargs={"rows": ["x"]}, harness=f"{MODULE}:return_at_once"
    )
    return MemberRequest(
        task=Task(goal="x", id="0"),
        task_id="bench",
        label="bench",
        entry=entry,
        split="train",
        rollout_number=rollout_number,
        rollout_config=RolloutConfig(verbose=False, model_name=MODEL, return_dict=True, train=True),
    )


async def _ready_times(workers: Any, count: int) -> list[float]:
    """Seconds from each member's request to its worker's ready file, one member at a time."""
    times: list[float] = []
    for n in range(count):
        started = time.perf_counter()
        ready: list[float] = []
        outcome = await workers.run(
            _member(n), scope="train", on_ready=lambda ready=ready: ready.append(time.perf_counter())
        )
        if outcome.disposition != "completed":
            raise RuntimeError(f"a benchmark worker failed: {outcome.disposition}: {outcome.error}")
        times.append(ready[0] - started)
    return times


async def _measure(sampler: Any, run_dir: Path, count: int, exec_count: int) -> dict[str, Any]:
    from platoon.config.training import WorkflowConfig
    from platoon.rollouts.workers import RolloutWorkers

    def workers(method: str) -> RolloutWorkers:
        return RolloutWorkers(
            run_dir=run_dir,
            workflow=WorkflowConfig(rollout_isolation="process", worker_start_method=method),
            model_name=MODEL,
            renderer_name="qwen3_instruct",
            renderer_kwargs={},
            context_window_length=None,
            sample_timeout_seconds=60.0,
            environment_packages=[],
            labels={"platoon.run": str(run_dir)},
            services=["table"],
        )

    forked = workers("forkserver")
    started = time.perf_counter()
    await forked.start()
    server_start = time.perf_counter() - started
    if forked.fork_server is None:
        raise RuntimeError("the fork server did not start; see the warning above")
    prepare = forked.fork_server.seconds
    try:
        forked.publish(sampler, 1)
        fork_times = await _ready_times(forked, count)
    finally:
        await forked.close()
    figures: dict[str, Any] = {
        "fork_server_start_seconds": round(server_start, 3),
        "fork_server_prepare_seconds": round(prepare, 3),
        "forked_workers": count,
        "first_forked_ready_seconds": round(fork_times[0], 4),
        "last_forked_ready_seconds": round(fork_times[-1], 4),
        "median_forked_ready_seconds": round(statistics.median(fork_times), 4),
        "max_forked_ready_seconds": round(max(fork_times), 4),
    }
    if exec_count > 0:
        execed = workers("exec")
        await execed.start()
        try:
            execed.publish(sampler, 1)
            exec_times = await _ready_times(execed, exec_count)
        finally:
            await execed.close()
        figures["exec_workers"] = exec_count
        figures["median_exec_ready_seconds"] = round(statistics.median(exec_times), 3)
    return figures


def measure_worker_starts(count: int = 100, *, exec_count: int = 3, sampler: Any = None) -> dict[str, Any]:
    """The figures as a dict: the fork server's start, request-to-ready of the first and the `count`-th forked
    worker (and their median and max), and the median of `exec_count` exec starts.

    Without a `sampler`, a local Tinker server is started in a child process and its base-model sampling client
    is the one the workers load.
    """
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    # the workers import this module by name for its harness
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    with tempfile.TemporaryDirectory(prefix="platoon-bench-workers-") as scratch:
        run_dir = Path(scratch) / "run"
        stop = None
        if sampler is None:
            import tinker

            from platoon.gateway import tinker_sdk
            from platoon.local_server.process import start_local_server_process

            url, key, stop = start_local_server_process(model=MODEL, state_dir=Path(scratch) / "server")
            service = tinker.ServiceClient(base_url=url, api_key=key)
            sampler = tinker_sdk.made(service.create_sampling_client(base_model=MODEL))
        try:
            return asyncio.run(_measure(sampler, run_dir, count, exec_count))
        finally:
            if stop is not None:
                stop()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=100, help="workers forked, one after another")
    parser.add_argument("--exec", type=int, default=3, dest="exec_count", help="workers started by exec")
    args = parser.parse_args()
    figures = measure_worker_starts(args.count, exec_count=args.exec_count)
    print(
        f"fork server started in {figures['fork_server_start_seconds']:.2f} s "
        f"(imports, tokenizer and renderer: {figures['fork_server_prepare_seconds']:.2f} s)"
    )
    print(f"request to ready, forked worker #1: {1000 * figures['first_forked_ready_seconds']:.1f} ms")
    print(
        f"request to ready, forked worker #{args.count}: {1000 * figures['last_forked_ready_seconds']:.1f} ms "
        f"(median {1000 * figures['median_forked_ready_seconds']:.1f} ms, "
        f"max {1000 * figures['max_forked_ready_seconds']:.1f} ms)   (target < 100 ms)"
    )
    if "median_exec_ready_seconds" in figures:
        print(
            f"request to ready, exec start (median of {figures['exec_workers']}): "
            f"{figures['median_exec_ready_seconds']:.2f} s"
        )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
