"""Regenerate the trajectory viewer's screenshots in docs/images/ (SVG, from Textual) from real runs.

    uv run --frozen python scripts/viz_screenshots.py [--out docs/images] [--run RUN_DIR]

A real training run first: `platoon train examples/bandit/train.yaml` on the embedded local Tinker-compatible
server (the toy model learns to answer "C"; about 35 s on two idle cores), in a temporary directory, or the run
directory `--run` names (one that command made). The viewer follows its event files as `platoon viz tail --rdir
RUN_DIR` does: the steps newest first, the step where the policy learned opened, and a filter.

Then number-search rollouts, the viewer tests' (tests/platoon/viz/viz_runs.py): through `platoon.testing.run_episode`
with platoon-codeact, platoon-react, and a root that spawns a subagent and a verifier, each with a scripted
binary-search policy on the CPU; their event files are written as `platoon rollout` writes them.

The viewer runs headless (`App.run_test`) and each view is saved with `App.save_screenshot`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "platoon" / "viz"))

SIZE = (130, 38)
BANDIT = ROOT / "examples" / "bandit" / "train.yaml"


async def view(
    out: Path,
    name: str,
    argv: list[str],
    *,
    title: str,
    pick: Callable[[Any], str | None] = lambda app: None,
    keys: tuple[str, ...] = (),
) -> Path:
    """Open the viewer on `argv`, move to the node `pick` names, press `keys`, and save the screen."""
    from platoon.viz.cli import build

    with contextlib.ExitStack() as stack:
        app = build(argv, stack)
        app.sub_title = title
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()  # the first look at a finished run's files read them whole
            key = pick(app)
            if key is not None:
                app.select(key)
            if keys:
                await pilot.press(*keys)
            await pilot.pause()
            return Path(app.save_screenshot(f"{name}.svg", str(out)))


def learning_step(app: Any) -> str:
    """The first rollout that scored 1 in the newest step whose rollouts scored between 0 and 1 on average (the
    step where the policy learned): its step node, so its group, the rollout and its details are on screen."""
    for group in app.top:
        summary = group.details[0].content
        reward = summary.get("reward") or {}
        if group.kind == "group" and 0 < (reward.get("avg") or 0) < 1:
            for rollout in group.children:
                if "reward:1.000" in rollout.label:
                    trajectory = rollout.children[0]
                    return f"{trajectory.key}/steps/0"
    return app.top[0].key


async def shoot_training(out: Path, run_dir: Path) -> list[Path]:
    tail = ["tail", "--rdir", str(run_dir)]
    title = "tail --rdir runs/bandit/run"
    return [
        await view(out, "viz-training", tail, title=title, pick=learning_step),
        await view(
            out,
            "viz-training-filter",
            [*tail, "--filter", "reward>=1 step:..6"],
            title=title + " --filter 'reward>=1 step:..6'",
            pick=lambda app: app.top[0].children[0].key,
        ),
        await view(out, "viz-help", tail, title=title, keys=("question_mark",)),
    ]


async def shoot_rollouts(out: Path, events: dict[str, Path]) -> list[Path]:
    def node(suffix: str) -> Callable[[Any], str]:
        return lambda app: next(k for k in app.tree_nodes if k.endswith(suffix))

    codeact, tree, react = (str(events[name]) for name in ("codeact", "tree", "react"))
    return [
        await view(
            out,
            "viz-codeact",
            ["replay", codeact, "--delay", "0"],
            title=f"replay {Path(codeact).name} --delay 0",
            pick=node("/steps/6"),
        ),
        await view(
            out,
            "viz-tree",
            ["replay", tree, "--delay", "0"],
            title=f"replay {Path(tree).name} --delay 0",
            pick=lambda app: next(k for k in app.tree_nodes if "/fork:" in k),
        ),
        await view(
            out,
            "viz-search",
            ["replay", codeact, react, "--delay", "0"],
            title="replay codeact.jsonl react.jsonl --delay 0",
            keys=("ctrl+f", *"correctly", "enter"),
        ),
    ]


def train_bandit(scratch: Path) -> Path:
    """`platoon train examples/bandit/train.yaml`, its run and the local server's checkpoints under `scratch`."""
    from platoon.cli import main

    scratch.mkdir(parents=True, exist_ok=True)
    profile = scratch / "site.yaml"
    profile.write_text(f"cache: {scratch / 'cache'}\n")
    os.environ["PLATOON_SITE"] = str(profile)
    status = main(["train", str(BANDIT), f"log_path={scratch / 'runs'}"])
    if status != 0:
        raise SystemExit(f"platoon train {BANDIT} exited {status}")
    return scratch / "runs" / "bandit" / "run"


def main() -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    arguments.add_argument("--run", type=Path, help="a run directory of examples/bandit/train.yaml to show")
    options = arguments.parse_args()
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    import viz_runs

    with tempfile.TemporaryDirectory(prefix="platoon-viz-shots-") as scratch:
        base = Path(scratch)
        run_dir = options.run or train_bandit(base / "bandit")
        saved = asyncio.run(shoot_training(out, run_dir))
        events = {
            "codeact": viz_runs.codeact_run(base / "codeact"),
            "react": viz_runs.react_run(base / "react"),
            "tree": viz_runs.tree_run(base / "tree"),
        }
        saved += asyncio.run(shoot_rollouts(out, events))
        for path in saved:
            print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
