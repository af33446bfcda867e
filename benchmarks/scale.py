"""Many rollouts in flight on one machine: episodes/s through `platoon train`'s rollout path against the limit that
sampling sets, and what platoon costs per model call (issue 42).

    uv run --frozen python benchmarks/scale.py [--concurrency 64,256,1024] [--latency fixed|longtail]
        [--latency-s 1.0] [--harness platoon-react,platoon-bash,platoon-codeact] [--calls 8] [--profile]
    uv run --frozen python benchmarks/scale.py --smoke     # the smallest size, what CI runs (tests/platoon/train)

What runs: `platoon train` itself, in process (`platoon.cli.main`, as benchmarks/train_step.py does), on the
quickstart example's number search (the ORS environment in process) on the embedded local Tinker-compatible server,
with `train.batch_size` x `train.workflow_config.group_size` = the concurrency (groups of 8) and one training step.
So every rollout goes the way a training run's rollouts go: the task order and admission queue, the trainer's group
workers (each runs its whole group), the rollout in the trainer's process (`rollout_isolation: inprocess`, the
default), the episode program and harness, the recording gateway (render -> sample -> parse -> record exact tokens),
the environment session, grading, then the group's advantages and datums and the step's accounting. The sampler is
a `platoon.testing.ScriptedPolicy` served with `serve_policy`, which is what an in-process `platoon train` samples
through when one is served; each answer then waits, asleep, the call's injected latency (what `Completion(delay=...)`
does), as a remote sampler's call would. The gateway binds each rollout it opens to the policy (`for_rollout`, as it
binds a rollout to its in-flight sampling client), which is how each rollout's own sleeping is counted.

The timed phase is the rollout phase only: from the first group's start to the last group's end (the trainer's
`_run_group`, wrapped here to note both), in a fresh process per configuration (this file run with `--worker`), so
one configuration's heap does not tilt the next. The step's training on the local server and the final checkpoint
come after it, untimed. The worker's process is the run's, as under the console script (`owned_by_the_command`), so
`platoon train` treats the garbage collector as it does there (platoon.heap: the loaded stack frozen once the session
opened, before the phase, and the training thresholds); `gc` shows what its collections cost in the phase.

The policy knows each task's answer (from the task's range; where two tasks share a range, a guess between their
answers tells them apart, and of two answers next to each other the first is tried a call early) and plays the game
to the end in `--calls` guesses: until the last, the binary search's midpoint of the range still open, moved off the
answer when it falls on it; the last guess is the answer. So every episode takes the same number of calls (27 of
the 50,000 train tasks one fewer), and a batch of them can reach the sampling-bound throughput a steady stream of
episodes would (with plain binary search the episodes take 1-11 calls and one batch ends with its longest).
`platoon-bash` runs its agent script as a process per rollout on the host, which reaches the gateway over HTTP and
the environment's tools over MCP; `platoon-codeact` runs each agent's cells in an IPython shell on a thread of its
own.

Latency per model call: `fixed` sleeps `--latency-s` on every call; `longtail` draws each call's sleep from a
lognormal distribution with mean `--latency-s` and sigma 1 (median 0.61x the mean, p90 2.2x, p99 6.2x, capped at 20x).

Columns (one row per harness and concurrency):

- `ep/s`: episodes finished over the rollout phase's wall time.
- `ideal`: the sampling-bound limit, concurrency / calls per episode x calls per second per rollout (1 / the mean
  latency); calls per episode (`calls`) is counted from the run: the policy's calls over the episodes.
- `ratio`, `90%`: `ep/s` / `ideal`, and whether it reaches the 90 % target.
- `floor`: the longest rollout's own sleeping (the sum of its calls' delays): no scheduler can end the batch sooner
  (with `longtail` that, not platoon, is what keeps one batch under the ideal); `phase`: the phase's seconds.
- `cpu/call`: the trainer process's CPU time (`time.process_time`, every thread) over the phase, less the scripted
  policy's own (it decodes each prompt and encodes each answer, work a remote sampler does), over the model calls;
  `tok/call`: the part of it spent tokenizing text the model did not write (the renderer's `_encode`: prompts,
  environment replies, templates; sampled tokens are never re-tokenized); `pol/call`: the policy's own.
- `MB/rollout`: (the peak resident memory of the trainer process during the phase, sampled every 10 ms - its
  resident memory before it) / concurrency. A `platoon-bash` row ends with its agent processes: the most alive at
  once, the memory of each (their proportional set size, PSS: a page shared by n processes counts 1/n in each; the
  peak of their sum over that count, sampled from /proc by this file's parent process every 0.25 s or more) and
  their CPU time per model call (`getrusage(RUSAGE_CHILDREN)` over the phase). A configuration whose agents would
  need more than half the memory available (7 MB each, as measured) is not run, and its row says so.
- `gc`: the seconds the garbage collector's collections took during the phase (`gc.callbacks`); they are part of
  `cpu/call` too.
- `lag-p99`: the event loop's lag, the 99th percentile of how late a probe task that sleeps 10 ms in a loop wakes
  (a loop that is always busy wakes it seldom: few samples, each late).
- `done`: rollouts that finished scored / rollouts started (every rollout is expected to finish).

What the benchmark adds to the trainer's process: the probe (100 wake-ups a second) and timing wrappers around the
renderer's `_encode` and the policy (about 3 us per model call together).

`--profile` runs cProfile over the phase in each configuration's process (the event loop's thread, where platoon's
per-call work runs) and prints its top 30 functions by own time (`SCALE_PROFILE_SORT=cumulative` for the callers'
view; `SCALE_PROFILE_DUMP=FILE` keeps the whole profile), then where that thread's CPU went by part of platoon: the
renderer, the gateway, the HTTP and MCP serving a command-line agent's calls go through, the environment, the
harness, the episode, the trainer's accounting, the event loop and the stand-in policy (`cpu_by_part`: each function's own time, a built-in's or library function's charged to the platoon
code that called it; time blocked in the loop's poll is left out). The profiler doubles the CPU time, so the row's
figures are then not comparable: read the parts' shares. `--json` prints each configuration's
figures as one JSON line instead of the table. The targets (issue 42, 2-core machine, 1 s per call): 90 % of the ideal
at 1,024 number-search rollouts and at 256 `platoon-bash` rollouts; CPU per model call at most 0.5 ms for number
search excluding tokenization; at most 2 MB per in-flight in-process rollout.

Measured (2026-12-07 evening, main at 8819619, 2 cores shared with other work, load average 1.1-2.6;
`--concurrency 64,256,1024`, then `--harness platoon-bash --concurrency 64,256` and `--harness platoon-codeact
--concurrency 256,1024`, fixed 1 s per call):

    harness          conc  ep/s  ideal  ratio  cpu/call  tok/call  MB/rollout  gc     lag-p99
    platoon-react      64   7.7    8.0   0.97   1.50 ms   0.02 ms        0.25  0.0 s    18 ms
    platoon-react     256  30.0   32.0   0.94   0.98 ms   0.01 ms        0.24  0.0 s    52 ms
    platoon-react    1024 107.3  128.1   0.84   0.81 ms   0.01 ms        0.24  0.5 s   171 ms
    platoon-bash       64   6.5    8.0   0.81   3.75 ms   0.02 ms        0.48  0.0 s    37 ms
    platoon-bash      256  16.7   32.0   0.52   3.49 ms   0.05 ms        0.44  0.4 s   326 ms
    platoon-codeact   256  23.2   32.1   0.72   3.11 ms   0.02 ms        0.43  0.1 s    58 ms
    platoon-codeact  1024  38.5  128.8   0.30   3.13 ms   0.01 ms        0.41  1.6 s  1000 ms

The machine's speed drifts over a day (the stand-in policy's own CPU, the same work in every run, read 0.17 ms a
call that afternoon and 0.19-0.24 ms that evening): compare a change with the tree before it in one sitting. The
tree before the last round of work (3eb859b), alternated with this one at 1,024 number-search rollouts: 0.75 and
0.79 against 0.84 and 0.84, 0.98 and 0.93 ms of CPU per call against 0.81 and 0.78. `platoon-bash`'s agents took
7.0 MB (PSS) and 5.8 ms of CPU per model call each. At 1,024 number-search rollouts the trainer's one thread needs
about 1 ms (platoon's 0.8 and the stand-in policy's 0.2) x 1,024 calls a second: the core it runs on. At 256
`platoon-bash` rollouts the agents' and the trainer's CPU together (5.8 + 3.5 ms x 256 calls a second) are more than
the machine's two cores. docs/performance.md sets these against issue 42's targets, with `--profile`'s parts; the
first run of this benchmark (main at 9fdf49d) gave 0.56 at 1,024 number-search rollouts and 0.25 at 256
`platoon-bash` ones.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import io
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart" / "train.yaml"
HARNESSES = ("platoon-react", "platoon-bash", "platoon-codeact")
#: what each harness is given beyond the quickstart's entry (CodeAct: number search's prompt builder, one agent)
HARNESS_OPTIONS: dict[str, str] = {
    "platoon-codeact": (
        "{prompt_builder: 'platoon.envs.number_search.prompts:NumberSearchPromptBuilder', "
        "include_reasoning: false, subagents: false}"
    ),
}
GROUP_SIZE = 8
LAG_PROBE_S = 0.010
AGENT_SAMPLE_S = 0.25
LONGTAIL_SIGMA = 1.0
LONGTAIL_CAP = 20.0
RATIO_TARGET = 0.9
#: a command-line agent's proportional memory, about (platoon-bash's script measured 6.9-7.0 MB PSS each here): a
#: configuration whose agents would take more than half the memory available is not run
AGENT_PSS_MB = 7
EXIT_USAGE = 64

# ---------------------------------------------------------------------------------------------- the policy

_RANGE = re.compile(r"between (-?\d+) and (-?\d+)")
_FEEDBACK = re.compile(r"Too (low|high), try again\.")
_GUESSES = {
    "tool": re.compile(r'"number": (-?\d+)'),  # platoon-react's and platoon-bash's `guess` tool calls
    "cell": re.compile(r"guess\((?:number=)?(-?\d+)\)"),  # platoon-codeact's cells
}


def answers_by_range() -> dict[tuple[int, int], list[int]]:
    """Every train task's answers, keyed by the range its goal names."""
    from platoon.envs.number_search.env import generate_triples

    answers: dict[tuple[int, int], list[int]] = defaultdict(list)
    for low, target, high in generate_triples()["train"]:
        answers[(low, high)].append(target)
    return answers


class PacedPlayer:
    """Plays number search to the end in exactly `calls` guesses (see the module docstring), as tool calls or as
    CodeAct cells; after the right guess (a harness that asks once more) it answers in words."""

    def __init__(self, calls: int, style: str) -> None:
        self.calls = calls
        self.style = style
        self.answers = answers_by_range()

    def __call__(self, prompt: str) -> str:
        if "correctly!" in prompt[-400:]:
            return "I found the number."
        found = _RANGE.search(prompt)
        if found is None:
            raise AssertionError(f"no range in the prompt: ...{prompt[-300:]}")
        low, high = int(found.group(1)), int(found.group(2))
        # after the goal: the system prompt's own example is no guess of this game
        guesses = [int(n) for n in _GUESSES[self.style].findall(prompt, found.end())]
        # a guess outside the range the answer is known to be in narrows nothing: max/min, not assignment
        for guess, word in zip(guesses, _FEEDBACK.findall(prompt, found.end()), strict=False):
            low, high = (max(low, guess + 1), high) if word == "low" else (low, min(high, guess - 1))
        candidates = sorted(
            t for t in self.answers.get((int(found.group(1)), int(found.group(2))), []) if low <= t <= high
        )
        if len(guesses) + 1 >= self.calls and candidates:
            guess = candidates[0]
        elif len(candidates) > 1 and candidates[0] + 1 not in candidates:
            # two tasks share this range: a guess between their answers tells them apart before the last call
            guess = candidates[0] + 1
        elif len(candidates) > 1 and len(guesses) + 2 >= self.calls:
            # answers next to each other: the first is tried a call early (a shorter episode ends no batch later)
            guess = candidates[0]
        else:
            guess = (low + high) // 2
            if guess in candidates:
                others = [n for n in (guess + 1, guess - 1) if low <= n <= high and n not in candidates]
                # only answers left in the range: a guess just outside it, which the feedback tells apart
                guess = others[0] if others else (low - 1 if low > 0 else high + 1)
        return self.say(guess)

    def say(self, guess: int) -> str:
        from platoon.testing import tool_call

        if self.style == "cell":
            return f"<python>\nguess({guess})\n"
        return "\n" + tool_call("guess", {"number": guess})


def delays(kind: str, mean: float, rng: random.Random) -> Any:
    """A function drawing one call's sleep, in seconds."""
    if kind == "fixed":
        return lambda: mean
    mu = math.log(mean) - LONGTAIL_SIGMA**2 / 2  # the lognormal's mean is exp(mu + sigma^2 / 2)
    return lambda: min(rng.lognormvariate(mu, LONGTAIL_SIGMA), LONGTAIL_CAP * mean)


def paced_policy(player: PacedPlayer, draw: Any) -> Any:
    """The scripted policy over `player`, each answer delayed by `draw()` seconds, counting its calls and its own
    CPU time. The gateway binds each rollout it opens to the policy (`for_rollout`, as it binds a rollout to its
    in-flight sampling client), so each rollout's sleeping is added up on its own."""
    from platoon.testing import ScriptedPolicy, toy_tokenizer

    class RolloutView:
        def __init__(self, policy: PacedPolicy) -> None:
            self.policy = policy
            self.slept = 0.0

        async def sample_async(self, *args: Any, **kwargs: Any) -> Any:
            return await self.policy.paced(self, *args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            # anything else the gateway asks of a rollout's sampler is the policy's
            if name.startswith("_"):
                raise AttributeError(name)
            return getattr(self.policy, name)

    class PacedPolicy(ScriptedPolicy):
        def __init__(self) -> None:
            super().__init__(player, tokenizer=toy_tokenizer())
            self.count = 0
            self.cpu = 0.0
            self.views: list[RolloutView] = []
            #: what calls that came through no rollout's view slept (none are expected)
            self.unbound = RolloutView(self)

        def for_rollout(self) -> RolloutView:
            view = RolloutView(self)
            self.views.append(view)
            return view

        async def sample_async(self, *args: Any, **kwargs: Any) -> Any:
            return await self.paced(self.unbound, *args, **kwargs)

        async def paced(self, view: RolloutView, *args: Any, **kwargs: Any) -> Any:
            # what `Completion(delay=...)` does, with the delay drawn here and counted for the rollout
            response = await super().sample_async(*args, **kwargs)
            delay = draw()
            view.slept += delay
            await asyncio.sleep(delay)
            return response

        def _answer(self, prompt: Any, num_samples: int, sampling_params: Any) -> Any:
            started = time.thread_time()
            try:
                return super()._answer(prompt, num_samples, sampling_params)
            finally:
                self.count += 1
                # the base class keeps every call for tests to read; a long run keeps only the prefix-reuse window
                del self.calls[:-64]
                self.cpu += time.thread_time() - started

    return PacedPolicy()


# ---------------------------------------------------------------------------------------------- the worker


def rss_bytes(pid: int | str = "self") -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


#: Where a function's own time is charged, by the path of its file (the first match wins). A function in no listed
#: file (a built-in, the standard library's json or dataclasses, pydantic, the tokenizer's bindings) is charged to its
#: callers, in proportion to the time each call site spent in it, up to the first caller in a listed file.
PARTS: tuple[tuple[str, str], ...] = (
    ("/platoon/gateway/http/", "HTTP and MCP serving (a command-line agent's requests)"),
    ("/platoon/gateway/mcp.py", "HTTP and MCP serving (a command-line agent's requests)"),
    ("/uvicorn/", "HTTP and MCP serving (a command-line agent's requests)"),
    ("/h11/", "HTTP and MCP serving (a command-line agent's requests)"),
    ("/starlette/", "HTTP and MCP serving (a command-line agent's requests)"),
    ("/mcp/", "HTTP and MCP serving (a command-line agent's requests)"),
    ("/anyio/", "HTTP and MCP serving (a command-line agent's requests)"),
    ("/platoon/gateway/", "gateway (prompt history, request, record)"),
    ("/platoon/renderers/", "renderer (render prompt, parse completion)"),
    ("/platoon/envs/", "environment (tool calls, gate, grading)"),
    ("/openreward/", "environment (tool calls, gate, grading)"),
    ("/platoon_harnesses/", "harness"),
    ("/platoon/harness/", "harness"),
    ("/platoon/episode/", "episode and rollout (program, context, deadlines)"),
    ("/platoon/programs/", "episode and rollout (program, context, deadlines)"),
    ("/platoon/rollouts/", "episode and rollout (program, context, deadlines)"),
    ("/platoon/train/", "trainer accounting (groups, datums, events)"),
    ("/platoon/trajectory_events.py", "trainer accounting (groups, datums, events)"),
    ("/platoon/testing/", "stand-in policy (not counted in cpu/call)"),
    ("/benchmarks/scale.py", "stand-in policy (not counted in cpu/call)"),
    ("/asyncio/", "event loop (asyncio scheduling, timers)"),
    ("/selectors.py", "event loop (asyncio scheduling, timers)"),
    ("/platoon/", "platoon, other"),
    ("<frozen importlib", "imports (a module's first use)"),
)


#: Built-ins whose time under the profiler is time the thread spent blocked (the event loop's poll, a lock).
WAITS = frozenset(
    {"<method 'poll' of 'select.epoll' objects>", "<method 'acquire' of '_thread.lock' objects>"}
)


def cpu_by_part(stats: Any) -> list[tuple[str, float]]:
    """The profiled thread's CPU time by part of platoon (`PARTS`), largest first: each function's own time, and that
    of the unlisted functions it calls. Shares are what to read: the profiler's overhead inflates every figure."""
    table = stats.stats  # (file, line, name) -> (primitive calls, calls, own time, cumulative time, callers)
    resolved: dict[Any, dict[str, float]] = {}
    in_progress: set[Any] = set()  # a call cycle (recursion) is cut where it closes

    def part_of(function: Any) -> str | None:
        return next((part for needle, part in PARTS if needle in function[0]), None)

    def shares(function: Any) -> dict[str, float]:
        """What fraction of `function`'s own time each part owns."""
        if function in resolved:
            return resolved[function]
        part = part_of(function)
        if part is not None:
            return {part: 1.0}
        in_progress.add(function)
        callers = table.get(function, (0, 0, 0.0, 0.0, {}))[4]
        weights = {caller: timing[2] for caller, timing in callers.items() if caller not in in_progress}
        total = sum(weights.values())
        if weights and not total:  # calls too short to time: count each call site alike
            weights, total = dict.fromkeys(weights, 1.0), float(len(weights))
        result: dict[str, float] = {} if total else {"other (not traced to a listed caller)": 1.0}
        for caller, weight in weights.items():
            for caller_part, fraction in shares(caller).items():
                result[caller_part] = result.get(caller_part, 0.0) + fraction * weight / total
        in_progress.discard(function)
        resolved[function] = result
        return result

    seconds: dict[str, float] = {}
    for function, (_primitive, _calls, own, _cumulative, _callers) in table.items():
        if function[2] in WAITS:  # the thread blocked, not computing
            continue
        for part, fraction in shares(function).items():
            seconds[part] = seconds.get(part, 0.0) + own * fraction
    return sorted(seconds.items(), key=lambda item: -item[1])


def parts_text(parts: list[tuple[str, float]], calls: int) -> str:
    """`cpu_by_part`'s table: the share of the profiled thread's CPU and its (profiled) microseconds per model call."""
    total = sum(seconds for _part, seconds in parts) or 1.0
    lines = [
        "where the trainer's event-loop thread spent its CPU (cProfile own time, built-ins charged to callers):"
    ]
    for part, seconds in parts:
        per_call = 1e6 * seconds / calls if calls else float("nan")
        lines.append(f"  {100 * seconds / total:5.1f} %  {per_call:7.1f} us/call (profiled)  {part}")
    return "\n".join(lines)


class Phase:
    """The rollout phase of the run: the first group's start to the last group's end, the CPU time, the resident
    memory and the event loop's lag over it, and each group's members."""

    def __init__(self, groups: int, profile: bool) -> None:
        self.groups = groups
        self.started = self.ended = 0.0
        self.cpu_before = self.cpu = 0.0
        self.children_cpu_before = self.children_cpu = 0.0
        self.rss_before = self.rss_peak = 0
        self.lags: list[float] = []
        self.finished_groups = 0
        self.members: list[Any] = []
        self.profiler: Any = None
        if profile:
            import cProfile

            self.profiler = cProfile.Profile()
        self._probe: asyncio.Task[None] | None = None
        self._running = False
        #: the garbage collector's pauses over the phase: their seconds, and how many were full collections
        self.gc_seconds = 0.0
        self.gc_full = 0
        self._gc_started = 0.0
        self.encode_cpu = 0.0
        self.policy_cpu_before = 0.0

    def begin(self, policy: Any) -> None:
        if self._running or self.started:
            return
        self._running = True
        print("\n@phase-start", flush=True)  # the parent samples the agent processes from now on
        self.rss_before = self.rss_peak = rss_bytes()
        self.policy_cpu_before = policy.cpu
        self.children_cpu_before = _children_cpu()
        self._probe = asyncio.get_running_loop().create_task(self._lag_probe())
        self.encode_cpu = 0.0
        gc.callbacks.append(self._gc_pause)
        self.cpu_before = time.process_time()
        self.started = time.perf_counter()
        if self.profiler is not None:
            self.profiler.enable()

    def group_done(self, output: Any) -> None:
        self.finished_groups += 1
        if output is not None:
            self.members += output.members
        if self.finished_groups == self.groups:
            self.end()

    def end(self) -> None:
        if not self._running:
            return
        self.ended = time.perf_counter()
        self.cpu = time.process_time() - self.cpu_before
        if self.profiler is not None:
            self.profiler.disable()
        self._running = False
        gc.callbacks.remove(self._gc_pause)
        self.children_cpu = _children_cpu() - self.children_cpu_before
        if self._probe is not None:
            self._probe.cancel()
        self.rss_peak = max(self.rss_peak, rss_bytes())
        print("\n@phase-end", flush=True)

    def _gc_pause(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        self.gc_seconds += time.perf_counter() - self._gc_started
        self.gc_full += info["generation"] == 2

    async def _lag_probe(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(LAG_PROBE_S)
            self.lags.append(time.perf_counter() - before - LAG_PROBE_S)
            self.rss_peak = max(self.rss_peak, rss_bytes())


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def instrument(phase: Phase, policy: Any) -> None:
    """Note the phase around the trainer's groups, and the renderer's tokenizing of text, on this process's own
    classes (nothing of platoon is changed on disk)."""
    from platoon.renderers import base
    from platoon.train.tinker.loop import Trainer

    run_group = Trainer._run_group

    async def timed_group(self: Any, row: Any) -> Any:
        phase.begin(policy)
        output = None
        try:
            output = await run_group(self, row)
            return output
        finally:
            phase.group_done(output)

    Trainer._run_group = timed_group  # type: ignore[method-assign]

    encode = base.Renderer._encode

    def timed_encode(self: Any, text: str) -> list[int]:
        # the wall clock, not the thread's CPU clock: a tokenization never waits, and reading the CPU clock is a
        # system call that would cost more than the cached encodings it times (~0.15 us a call this way)
        started = time.perf_counter()
        try:
            return encode(self, text)
        finally:
            phase.encode_cpu += time.perf_counter() - started

    base.Renderer._encode = timed_encode  # type: ignore[method-assign]


def run_configuration(options: dict[str, Any]) -> dict[str, Any]:
    """One `platoon train` run of one configuration, in this process; returns its figures."""
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    for variable in ("TINKER_API_KEY", "TINKER_BASE_URL", "WANDB_API_KEY"):
        os.environ.pop(variable, None)
    harness, concurrency = options["harness"], options["concurrency"]
    from platoon.cli import main as platoon
    from platoon.heap import owned_by_the_command
    from platoon.testing import serve_policy

    player = PacedPlayer(options["calls"], "cell" if harness == "platoon-codeact" else "tool")
    policy = paced_policy(player, delays(options["latency"], options["latency_s"], random.Random(7)))
    group_size = min(GROUP_SIZE, concurrency)
    phase = Phase(concurrency // group_size, options["profile"])
    instrument(phase, policy)
    # the parent made the scratch folder, and removes it whatever becomes of this process
    root = Path(options["scratch"])
    (root / "site.yaml").write_text(f"cache: {root / 'cache'}\n")
    os.environ["PLATOON_SITE"] = str(root / "site.yaml")
    argv = [
        "train",
        str(QUICKSTART),
        f"log_path={root / 'runs'}",
        f"train.batch_size={concurrency // group_size}",
        f"train.workflow_config.group_size={group_size}",
        "train.max_training_steps=1",
        f"train.workflow_config.rollout_config.max_steps={options['calls'] + 4}",
        "checkpoint.every=0",
        f"environments.0.harness={harness}",
    ]
    if harness in HARNESS_OPTIONS:
        argv.append(f"environments.0.harness_options={HARNESS_OPTIONS[harness]}")
    # This process is the run's, as the console script's is: `platoon train` then treats its heap as it does there
    # (platoon.heap: the loaded stack frozen, the training thresholds, a collection at each step's end).
    with serve_policy(policy), contextlib.redirect_stderr(io.StringIO()) as err, owned_by_the_command():
        status = platoon(argv)
    phase.end()  # a run that lost groups never reached the last one
    if status != 0:
        return {"error": f"platoon train exited with {status}: {_last_lines(err.getvalue())}"}
    return figures(options, phase, policy)


def _last_lines(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-3:])


def figures(options: dict[str, Any], phase: Phase, policy: Any) -> dict[str, Any]:
    seconds = phase.ended - phase.started
    episodes = len(phase.members)
    finished = sum(1 for m in phase.members if m.disposition == "completed" and m.status == "scored")
    calls = policy.count
    calls_per_episode = calls / episodes if episodes else float("nan")
    ideal = options["concurrency"] / calls_per_episode / options["latency_s"] if episodes else float("nan")
    achieved = episodes / seconds if seconds > 0 else float("nan")
    policy_cpu = policy.cpu - phase.policy_cpu_before
    lags = sorted(phase.lags)
    result: dict[str, Any] = {
        "harness": options["harness"],
        "concurrency": options["concurrency"],
        "latency": options["latency"],
        "latency_s": options["latency_s"],
        "rollouts": episodes,
        "finished": finished,
        "model_calls": calls,
        "calls_per_episode": calls_per_episode,
        "phase_s": seconds,
        "floor_s": max((view.slept for view in policy.views), default=0.0),
        "unbound_calls_s": policy.unbound.slept,
        "episodes_per_s": achieved,
        "ideal_episodes_per_s": ideal,
        "ratio": achieved / ideal,
        "target_met": achieved / ideal >= RATIO_TARGET,
        "cpu_s": phase.cpu,
        "cpu_ms_per_call": 1000 * (phase.cpu - policy_cpu) / calls if calls else float("nan"),
        "tokenize_ms_per_call": 1000 * phase.encode_cpu / calls if calls else float("nan"),
        "policy_ms_per_call": 1000 * policy_cpu / calls if calls else float("nan"),
        "children_cpu_ms_per_call": 1000 * phase.children_cpu / calls if calls else float("nan"),
        "rss_before_mb": phase.rss_before / 2**20,
        "rss_peak_mb": phase.rss_peak / 2**20,
        "mb_per_rollout": (phase.rss_peak - phase.rss_before) / 2**20 / options["concurrency"],
        "gc_s": phase.gc_seconds,
        "gc_full": phase.gc_full,
        "lag_p99_ms": 1000 * lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else float("nan"),
        "lag_max_ms": 1000 * lags[-1] if lags else float("nan"),
        "lag_samples": len(lags),
    }
    if phase.profiler is not None:
        import pstats

        text = io.StringIO()
        stats = pstats.Stats(phase.profiler, stream=text)
        if os.environ.get("SCALE_PROFILE_DUMP"):  # the whole profile, for pstats' callers and callees views
            stats.dump_stats(os.environ["SCALE_PROFILE_DUMP"])
        stats.sort_stats(os.environ.get("SCALE_PROFILE_SORT", "tottime")).print_stats(30)
        result["profile"] = text.getvalue() + parts_text(cpu_by_part(stats), calls) + "\n"
    return result


def worker_main(options: dict[str, Any]) -> None:
    result = run_configuration(options)
    print("@result " + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------------- the parent


class AgentSampler:
    """Samples the proportional set size (PSS: each shared page divided among the processes sharing it) of the
    worker's child processes that started during the phase (the command-line agents), from this process: the peak
    of their sum and the most alive at once. It waits 4x as long as a sample took, at least `AGENT_SAMPLE_S`, so
    that reading /proc for a thousand agents does not take a core from the worker."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before: set[int] = set()
        self.peak_bytes = 0
        self.peak_count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.before = _descendants(self.pid)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        pause = AGENT_SAMPLE_S
        while not self._stop.wait(pause):
            started = time.perf_counter()
            agents = _descendants(self.pid) - self.before
            sizes = [pss_bytes(pid) for pid in agents]
            self.peak_bytes = max(self.peak_bytes, sum(sizes))
            self.peak_count = max(self.peak_count, sum(1 for size in sizes if size))
            pause = max(AGENT_SAMPLE_S, 4 * (time.perf_counter() - started))


def pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def _descendants(pid: int) -> set[int]:
    """The processes under `pid` (children, their children...), from /proc."""
    parents: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(fields[1])].append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def run_worker(options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One configuration in a fresh process (this file with `--worker`), in a session of its own so that a timeout
    ends it with the local server and the agents under it."""
    result: dict[str, Any] | None = None
    # stderr to a file: the agents inherit it, and a pipe nobody reads while they write would stop them
    with (
        tempfile.TemporaryDirectory(prefix="platoon-bench-scale-") as scratch,
        tempfile.TemporaryFile("w+") as errors,
    ):
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            json.dumps({**options, "scratch": scratch}),
        ]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, start_new_session=True
        )
        sampler = AgentSampler(process.pid)
        timer = threading.Timer(timeout, _kill_session, (process.pid,))
        timer.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                if "@phase-start" in line:
                    sampler.start()
                elif "@phase-end" in line:
                    sampler.stop()
                elif line.startswith("@result "):
                    result = json.loads(line.removeprefix("@result "))
            process.wait()
        finally:
            timer.cancel()
            sampler.stop()
        errors.seek(0)
        stderr = errors.read()
    if result is None:
        why = "timed out" if process.returncode == -signal.SIGKILL else f"exited with {process.returncode}"
        return {"error": f"the worker {why}: {_last_lines(stderr)}"}
    if sampler.peak_count:
        result["agent_processes"] = sampler.peak_count
        result["agent_mb"] = sampler.peak_bytes / 2**20 / sampler.peak_count
        result["agent_cpu_ms_per_call"] = result.pop("children_cpu_ms_per_call")
    return result


def _kill_session(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


COLUMNS = (
    ("harness", 16, "{harness}"),
    ("conc", 5, "{concurrency}"),
    ("calls", 5, "{calls_per_episode:.2f}"),
    ("ep/s", 7, "{episodes_per_s:.1f}"),
    ("ideal", 7, "{ideal_episodes_per_s:.1f}"),
    ("ratio", 6, "{ratio:.2f}"),
    ("90%", 4, "{met}"),
    ("phase", 7, "{phase_s:.1f}s"),
    ("floor", 7, "{floor_s:.1f}s"),
    ("cpu/call", 9, "{cpu_ms_per_call:.2f}ms"),
    ("tok/call", 9, "{tokenize_ms_per_call:.2f}ms"),
    ("pol/call", 9, "{policy_ms_per_call:.2f}ms"),
    ("MB/rollout", 10, "{mb_per_rollout:.2f}"),
    ("gc", 6, "{gc_s:.1f}s"),
    ("lag-p99", 8, "{lag_p99_ms:.1f}ms"),
    ("done", 10, "{finished}/{concurrency}"),
)


def header() -> str:
    return "  ".join(
        name.rjust(width) if i else name.ljust(width) for i, (name, width, _) in enumerate(COLUMNS)
    )


def row(result: dict[str, Any]) -> str:
    values = {**result, "met": "yes" if result["target_met"] else "no"}
    cells = [fmt.format(**values) for _, _, fmt in COLUMNS]
    line = "  ".join(
        c.rjust(w) if i else c.ljust(w) for i, (c, (_, w, _)) in enumerate(zip(cells, COLUMNS, strict=True))
    )
    if "agent_mb" in result:
        line += (
            f"  agents: {result['agent_processes']} at peak, {result['agent_mb']:.1f} MB each, "
            f"{result['agent_cpu_ms_per_call']:.2f} ms CPU/call"
        )
    return line


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} CPUs"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--concurrency", default="64,256,1024", help="comma-separated rollouts in flight")
    parser.add_argument("--latency", choices=("fixed", "longtail"), default="fixed")
    parser.add_argument("--latency-s", type=float, default=1.0, help="seconds per model call (the mean)")
    parser.add_argument("--harness", default=",".join(HARNESSES), help="comma-separated harnesses")
    parser.add_argument("--calls", type=int, default=8, help="model calls the policy plays each episode in")
    parser.add_argument("--profile", action="store_true", help="cProfile the phase; print the top functions")
    parser.add_argument("--json", action="store_true", help="one JSON line per configuration")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="the most one configuration may take")
    parser.add_argument(
        "--smoke", action="store_true", help="the smallest size: concurrency 8, 0.05 s per call, 3 calls"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def configurations(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.smoke:
        args.concurrency, args.latency_s, args.calls = "8", 0.05, 3
    problems: list[str] = []
    try:
        levels = [int(part) for part in args.concurrency.split(",") if part.strip()]
    except ValueError:
        levels = [1]
        problems.append(f"--concurrency takes whole numbers separated by commas; got {args.concurrency!r}")
    harnesses = [part.strip() for part in args.harness.split(",") if part.strip()]
    problems += [
        f"unknown harness {h!r} (one of {', '.join(HARNESSES)})" for h in harnesses if h not in HARNESSES
    ]
    problems += [
        f"concurrency {n} is not a multiple of the group size {GROUP_SIZE}"
        for n in levels
        if n < 1 or (n > GROUP_SIZE and n % GROUP_SIZE)
    ]
    if args.latency_s <= 0 or args.calls < 1 or not levels or not harnesses:
        problems.append("--latency-s, --calls, --concurrency and --harness need positive values")
    if problems:
        print(f"scale.py: {'; '.join(problems)}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    return [
        {
            "harness": harness,
            "concurrency": level,
            "latency": args.latency,
            "latency_s": args.latency_s,
            "calls": args.calls,
            "profile": args.profile,
        }
        for harness in harnesses
        for level in levels
    ]


def _too_big(options: dict[str, Any]) -> str | None:
    """Why a configuration of process agents is not run on this machine (their memory), or None."""
    if options["harness"] != "platoon-bash":
        return None
    needed = options["concurrency"] * AGENT_PSS_MB * 2**20
    available = _mem_available()
    if available is None or needed <= available / 2:
        return None
    return (
        f"{options['harness']} at {options['concurrency']}: not run: its agents would need about "
        f"{needed / 2**30:.1f} GB ({AGENT_PSS_MB} MB each), more than half of the {available / 2**30:.1f} GB "
        "available"
    )


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker_main(json.loads(args.worker))
        return 0
    runs = configurations(args)
    if not args.json:
        print(
            f"platoon train's rollout phase, number search, {args.latency} latency, mean {args.latency_s:g} s per "
            f"call, {args.calls} calls an episode, groups of {GROUP_SIZE}; {load()}",
            flush=True,
        )
        print(header(), flush=True)
    failed = 0
    for options in runs:
        too_big = _too_big(options)
        if too_big:
            print(json.dumps({**options, "skipped": too_big}) if args.json else too_big, flush=True)
            continue
        result = run_worker(options, args.timeout_s)
        if "error" in result:
            failed += 1
            message = f"{options['harness']} at {options['concurrency']}: {result['error']}"
            print(json.dumps({**options, **result}) if args.json else message, flush=True)
            continue
        profile = result.pop("profile", None)
        print(json.dumps(result) if args.json else row(result), flush=True)
        if profile:
            print(profile, flush=True)
    if not args.json:
        print(f"done; {load()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
