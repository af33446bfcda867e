"""TextCraft-Synth episodes per second beside number search, measured the same way in the same run.

Both go through `platoon-codeact` with a scripted policy, the ORS environment in process, and
`platoon.testing.run_episode` (task resolved by id, gateway served, collection written), timed by episodes.py's
`time_episodes`: one warm-up episode, then `--episodes` at `--concurrency` on one event loop.

* TextCraft-Synth: the recipe's prompt builder (`textcraft-synth@1`'s harness defaults, the linear prompt), a
  policy that plays each task's gold trajectory one craft per cell and then finishes (reward 1).
* Number search: CodeAct's default prompt builder, a policy that plays a binary search one `guess` per cell (the
  right guess ends the episode).
* For reference, number search through `platoon-react` (benchmarks/episodes.py's path, tool calls instead of
  cells) is printed too; the ratio is taken against the CodeAct figure, the same harness.

Each repeat times the three in turn; the median repeat of each is reported.

    uv run --frozen python benchmarks/textcraft.py [--episodes 128] [--concurrency 32] [--split train-medium]
        [--crafts-per-cell step|all] [--profile]

Target, per model call: a TextCraft-Synth call costs at most twice a number-search call, measured the same way in
the same run (CodeAct, the scripted gold policy, concurrency 32, median of 3). A gold episode's length depends on the
split (`train-medium`, the RAO training tasks, median 18 crafts; `train-easy` median 3) and on how the policy writes
it (`--crafts-per-cell step`: one craft a cell, a model call each; `all`: every craft in one cell, two calls an
episode), and number search takes about 8 calls an episode, so a per-episode ratio would measure the task's length,
not platoon: the episode rates and their ratio are printed as information.
`--profile` times TextCraft-Synth once under cProfile instead and prints where the time goes
(`EPISODES_PROFILE_SORT=cumulative` sorts by cumulative time, `EPISODES_PROFILE_DUMP=file` keeps the stats).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from episodes import SERVICE as NUMBER_SEARCH
from episodes import run_episodes, time_episodes

SYNTH = "python://platoon_textcraft.env:TextCraftSynthEnvironment"
#: what `textcraft-synth@1` gives platoon-codeact, plus the single agent's arm (recipes/rao/single.yaml)
OPTIONS = {
    "prompt_builder": "platoon_textcraft.prompts:TextCraftPromptBuilder",
    "prompt_builder_options": {"synth": True, "variant": "linear"},
    "subagents": False,
}
#: the recipe's step budget (the gold episodes finish well inside it)
MAX_STEPS = 200
#: the most a TextCraft-Synth model call may cost, in number-search (CodeAct) calls
CALL_COST_TARGET = 2.0


def gold_cells(spec: dict[str, Any], per_cell: str = "step") -> list[str]:
    """The gold trajectory as CodeAct cells (a craft's count is the total produced, `result_count`), then finish:
    one craft per cell (`step`), or every craft in one cell (`all`)."""
    crafts = [
        f"craft({json.dumps(step['ingredients'])}, ({step['target'][0]!r}, {step['result_count']}))"
        for step in spec["misc"]["gold_trajectory"]
    ]
    finish = "<python>\nfinish('Crafted every target.')\n"
    if per_cell == "all":
        return ["<python>\n" + "\n".join(f"print({craft})" for craft in crafts) + "\n", finish]
    return [f"<python>\n{craft}\n" for craft in crafts] + [finish]


def binary_search_cell(prompt: str) -> str:
    """The next cell of a binary search: the range from the goal, then each earlier `guess` and its output."""
    from platoon.testing.number_search import codeact_guesses, open_range

    low, high = open_range(prompt, codeact_guesses(prompt))
    return f"<python>\nguess(number={(low + high) // 2})\n"


async def run_number_search(episodes: int, concurrency: int) -> dict[str, Any]:
    """`episodes` number-search episodes through platoon-codeact, each with its own binary-search policy."""
    from platoon.testing import ScriptedPolicy, run_episode

    async def play(index: int, output_dir: Path) -> Any:
        return await run_episode(
            f"train:{index}",
            service=NUMBER_SEARCH,
            harness="platoon-codeact",
            policy=ScriptedPolicy(binary_search_cell),
            harness_options={"subagents": False},
            max_steps=MAX_STEPS,
            output_dir=output_dir,
        )

    return await time_episodes(play, episodes, concurrency)


async def run_textcraft(
    episodes: int, concurrency: int, split: str, per_cell: str = "step", profiler: Any = None
) -> dict[str, Any]:
    """`episodes` gold-trajectory episodes of `split` (tasks in file order, wrapping), each with its own policy."""
    from platoon.testing import ScriptedPolicy, run_episode
    from platoon_textcraft.env import TextCraftSynthEnvironment

    specs = TextCraftSynthEnvironment.list_tasks(split)

    async def play(index: int, output_dir: Path) -> Any:
        task = index % len(specs)
        return await run_episode(
            f"{split}:{task}",
            service=SYNTH,
            harness="platoon-codeact",
            policy=ScriptedPolicy(gold_cells(specs[task], per_cell)),
            harness_options=OPTIONS,
            max_steps=MAX_STEPS,
            output_dir=output_dir,
        )

    return await time_episodes(play, episodes, concurrency, profiler)


def profile(args: argparse.Namespace) -> None:
    """One TextCraft-Synth run under cProfile (Python 3.12's cProfile sees every thread: the cell threads too)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    result = asyncio.run(
        run_textcraft(args.episodes, args.concurrency, args.split, args.crafts_per_cell, profiler)
    )
    print(f"textcraft-synth: {args.episodes / result['seconds']:.1f} episodes/s, {result['cpu']:.2f} s CPU")
    stats = pstats.Stats(profiler)
    if os.environ.get("EPISODES_PROFILE_DUMP"):
        stats.dump_stats(os.environ["EPISODES_PROFILE_DUMP"])
    stats.sort_stats(os.environ.get("EPISODES_PROFILE_SORT", "tottime")).print_stats(40)


def median(results: list[dict[str, Any]]) -> dict[str, Any]:
    result = dict(sorted(results, key=lambda r: r["seconds"])[len(results) // 2])
    result["all_seconds"] = [round(r["seconds"], 3) for r in results]
    return result


def report(label: str, result: dict[str, Any], episodes: int) -> None:
    seconds = result["seconds"]
    print(
        f"{label:<36} {episodes / seconds:7.1f} episodes/s  {result['calls'] / seconds:6.0f} calls/s  "
        f"{seconds:6.2f} s wall  {result['cpu']:6.2f} s CPU  solved {result['solved']}/{episodes}  "
        f"{result['calls'] / episodes:.1f} calls/episode  (runs: {result['all_seconds']} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each; the median is reported")
    parser.add_argument(
        "--split", default="train-medium", help="the TextCraft-Synth split the tasks come from"
    )
    parser.add_argument(
        "--crafts-per-cell",
        choices=["step", "all"],
        default="step",
        help="the gold trajectory one craft per cell (default), or every craft in one cell",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument(
        "--profile", action="store_true", help="profile one TextCraft-Synth run instead (cProfile)"
    )
    args = parser.parse_args()
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    if args.profile:
        profile(args)
        return
    load_before = os.getloadavg()
    if not args.json:
        print(
            f"{args.episodes} episodes at concurrency {args.concurrency}, median of {args.repeats}, "
            f"{os.cpu_count()} cores, load {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}"
        )
    runs: dict[str, list[dict[str, Any]]] = {
        "number_search": [],
        "number_search_react": [],
        "textcraft_synth": [],
    }
    for _ in range(args.repeats):
        runs["number_search"].append(asyncio.run(run_number_search(args.episodes, args.concurrency)))
        runs["number_search_react"].append(asyncio.run(run_episodes(args.episodes, args.concurrency)))
        runs["textcraft_synth"].append(
            asyncio.run(run_textcraft(args.episodes, args.concurrency, args.split, args.crafts_per_cell))
        )
    results = {name: median(results) for name, results in runs.items()}
    for result in results.values():
        result["episodes_per_s"] = args.episodes / result["seconds"]
        result["calls_per_s"] = result["calls"] / result["seconds"]
    baseline, textcraft = results["number_search"], results["textcraft_synth"]
    ratio = textcraft["episodes_per_s"] / baseline["episodes_per_s"]
    # the same ratio in CPU seconds per episode: less at the mercy of what else the machine runs
    cpu_ratio = baseline["cpu"] / textcraft["cpu"]
    # per model call: what is left when the episodes' lengths are set aside. The target is stated this way (a
    # TextCraft-Synth call costs at most twice a number-search call), since a train-medium episode makes 2.8 times
    # the calls of a number-search one and a per-episode ratio would measure the task's length, not platoon.
    call_ratio = textcraft["calls_per_s"] / baseline["calls_per_s"]
    call_cost = 1 / call_ratio  # a TextCraft-Synth call's time over a number-search call's
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.json:
        print(
            json.dumps(
                {
                    **results,
                    "ratio": ratio,
                    "cpu_ratio": cpu_ratio,
                    "call_ratio": call_ratio,
                    "call_cost": call_cost,
                    "call_cost_target": CALL_COST_TARGET,
                    "split": args.split,
                    "peak_mib": peak_mib,
                }
            )
        )
        return
    report("number search (codeact)", baseline, args.episodes)
    report("number search (react)", results["number_search_react"], args.episodes)
    report(f"textcraft-synth {args.split} ({args.crafts_per_cell})", textcraft, args.episodes)
    load_after = os.getloadavg()
    verdict = "met" if call_cost <= CALL_COST_TARGET else "NOT met"
    print(
        f"per model call: a TextCraft-Synth call costs {call_cost:.2f}x a number-search (codeact) call "
        f"(target <= {CALL_COST_TARGET:g}x: {verdict})"
    )
    print(
        f"per episode (information): {ratio:.2f}x number search's episodes/s, by CPU time {cpu_ratio:.2f}x; "
        f"{textcraft['calls'] / args.episodes:.1f} against {baseline['calls'] / args.episodes:.1f} calls an episode  "
        f"peak {peak_mib:.0f} MiB  load after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}"
    )


if __name__ == "__main__":
    main()
