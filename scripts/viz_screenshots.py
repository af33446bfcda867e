"""Regenerate the trajectory viewer's screenshots in docs/images/ (SVG, from Textual) from real number-search runs.

    uv run --frozen python scripts/viz_screenshots.py [--out docs/images]

The runs are the viewer tests' (tests/platoon/viz/viz_runs.py): number search through `platoon.testing.run_episode`
with platoon-codeact, platoon-react, and a root that spawns a subagent and a verifier, each with a scripted
binary-search policy on the CPU; their event files are written as `platoon rollout` writes them. The viewer then
runs headless (`App.run_test`) and each view is saved with `App.save_screenshot`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "platoon" / "viz"))

SIZE = (130, 38)


async def shoot(out: Path, events: dict[str, Path]) -> list[Path]:
    from platoon.viz.cli import build, parser

    saved: list[Path] = []

    async def view(name: str, argv: list[str], pick, keys: tuple[str, ...] = ()) -> None:
        with contextlib.ExitStack() as stack:
            app = build(parser().parse_args(argv), stack)
            app.sub_title = " ".join(argv[:1] + [Path(a).name if "/" in a else a for a in argv[1:]])
            async with app.run_test(size=SIZE) as pilot:
                await pilot.pause()
                key = pick(app)
                if key is not None:
                    app.select(key)
                if keys:
                    await pilot.press(*keys)
                await pilot.pause()
                saved.append(Path(app.save_screenshot(f"{name}.svg", str(out))))

    def node(suffix: str):
        return lambda app: next(k for k in app.tree_nodes if k.endswith(suffix))

    codeact = str(events["codeact"])
    tree = str(events["tree"])
    await view("viz-codeact", ["replay", codeact, "--delay", "0"], node("/steps/6"))
    await view(
        "viz-tree",
        ["replay", tree, "--delay", "0"],
        lambda app: next(k for k in app.tree_nodes if "/fork:" in k),
    )
    await view(
        "viz-search",
        ["replay", codeact, str(events["react"]), "--delay", "0"],
        lambda app: None,
        ("ctrl+f", *"correctly", "enter"),
    )
    return saved


def main() -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    out = arguments.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    import viz_runs

    with tempfile.TemporaryDirectory(prefix="platoon-viz-shots-") as scratch:
        base = Path(scratch)
        events = {
            "codeact": viz_runs.codeact_run(base / "codeact"),
            "react": viz_runs.react_run(base / "react"),
            "tree": viz_runs.tree_run(base / "tree"),
        }
        for path in asyncio.run(shoot(out, events)):
            print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
