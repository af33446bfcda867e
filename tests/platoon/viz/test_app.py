"""The viewer app through Textual's pilot on real number-search event files: replay stepping and the keys,
search with grouped results, details, tailing a file that grows and is then truncated, show-dump, and the
command line around it. No timing is asserted: the tests wait for conditions (with a hang guard)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.syntax import Syntax
from textual.pilot import Pilot
from textual.widgets import Input, Static, Tree

from platoon.cli import main as platoon_main
from platoon.viz.app import ViewerApp
from platoon.viz.cli import MISSING_TEXTUAL, build, main, parser

SIZE = (140, 45)


def viewer(argv: list[str], stack: contextlib.ExitStack) -> ViewerApp:
    return build(parser().parse_args(argv), stack)


def records_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def wait_for(pilot: Pilot, condition: Callable[[], bool], what: str) -> None:
    for _ in range(1000):  # a hang guard, not a timing claim
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"never happened: {what}")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_replay_steps_plays_pauses_and_restarts(runs):
    total = sum(len(records_of(p)) for p in (runs.codeact, runs.tree))
    root = min((records_of(p)[0] for p in (runs.codeact, runs.tree)), key=lambda r: r["ts"])["trajectory_id"]

    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            # A delay no test outlives: records arrive only when stepped.
            app = viewer(["replay", str(runs.codeact), str(runs.tree), "--delay", "3600"], stack)
            async with app.run_test(size=SIZE) as pilot:
                assert app.replay is not None and app.replay.position == 0 and app.labels() == []
                await pilot.press("n")
                assert app.replay.position == 1 and not app.playing  # stepping pauses
                # the collection, its first trajectory and its (empty) steps group
                assert [label.split(" ")[0] for label in app.labels()] == [
                    "collection:",
                    f"traj:{root[:8]}",
                    "steps",
                ]
                await pilot.press("right", "right")
                assert app.replay.position == 3
                await pilot.press("space")
                assert app.playing and "playing" in app.status_text()
                await pilot.press("space")
                assert not app.playing
                for _ in range(total - 3):
                    await pilot.press("n")
                assert app.replay.done and "done" in app.status_text()
                complete = app.labels()
                assert sum(label.startswith("collection:") for label in complete) == 2
                await pilot.press("r")
                assert app.replay.position == 0 and app.labels() == []
                for _ in range(total):
                    await pilot.press("n")
                assert app.labels() == complete
                await pilot.press("q")
            assert app.return_code == 0

    run(scenario())


def test_a_playing_replay_reaches_the_end_by_itself(runs):
    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            app = viewer(["replay", str(runs.react), "--delay", "0.001"], stack)
            async with app.run_test(size=SIZE) as pilot:
                assert app.replay is not None
                await wait_for(pilot, lambda: app.replay.done, "the replay played to its end")
                assert any("reward:1.000" in label for label in app.labels())

    run(scenario())


def test_search_groups_results_and_f3_walks_them(runs):
    target = next(r for r in records_of(runs.codeact) if r["type"] == "trajectory_task_set")["task"]["misc"][
        "target"
    ]

    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            app = viewer(["replay", str(runs.codeact), str(runs.react), "--delay", "0"], stack)
            async with app.run_test(size=SIZE) as pilot:
                tree = app.query_one("#tree", Tree)
                await pilot.press("ctrl+f")
                assert isinstance(app.focused, Input)
                # typed letters are text while the field has focus, not commands (q would quit, n step, ...)
                await pilot.press(*f"guess({target})")
                assert app.query_one("#search-input", Input).value == f"guess({target})"
                results = app.query_one("#results", Tree)
                [group] = results.root.children
                assert str(group.label).startswith("collection: task:number_search.train.3") and "(2)" in str(
                    group.label
                )
                await pilot.press("enter")
                await pilot.pause()
                assert tree.cursor_node is not None and tree.cursor_node.data.kind == "step"
                first = tree.cursor_node.data.key
                await pilot.press("f3")
                await pilot.pause()
                assert tree.cursor_node.data.kind == "code" and tree.cursor_node.data.key.startswith(first)
                await pilot.press("f3")  # wraps around
                await pilot.pause()
                assert tree.cursor_node.data.key == first
                await pilot.press("shift+f3")
                await pilot.pause()
                assert tree.cursor_node.data.kind == "code"
                assert "hit 2/2" in app.status_text()
                # the details pane shows the code highlighted
                details = app.query_one("#details", Static).content
                assert any(isinstance(part, Syntax) for part in details.renderables)
                await pilot.press("escape")
                assert not app.query_one("#search").has_class("open") and app.focused is tree

    run(scenario())


def test_mouse_capture_and_details_only_toggle(runs):
    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            app = viewer(["replay", str(runs.react), "--delay", "0", "--selectable-text"], stack)
            async with app.run_test(size=SIZE) as pilot:
                assert not app.mouse_reporting and "mouse off" in app.status_text()
                await pilot.press("m")
                assert app.mouse_reporting
                await pilot.press("d")
                assert app.screen.has_class("details-only")
                assert not app.query_one("#left").display or app.query_one("#left").region.width == 0
                await pilot.press("d")
                assert not app.screen.has_class("details-only") and app.query_one("#left").region.width > 0

    run(scenario())


def test_the_divider_drags_the_tree_pane_wider(runs):
    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            app = viewer(["replay", str(runs.react), "--delay", "0"], stack)
            async with app.run_test(size=SIZE) as pilot:
                left = app.query_one("#left")
                before = left.region.width
                await pilot.mouse_down("Divider")
                await pilot.hover("Divider", offset=(20, 0))
                await pilot.mouse_up("Divider", offset=(20, 0))
                await pilot.pause()
                assert left.region.width > before

    run(scenario())


def test_tail_follows_a_file_that_grows_and_starts_over_when_it_is_truncated(tmp_path, runs):
    lines = runs.codeact.read_text().splitlines(keepends=True)
    other = runs.react.read_text()
    [codeact_id, react_id] = (records_of(p)[0]["collection_id"] for p in (runs.codeact, runs.react))
    path = tmp_path / "live.jsonl"

    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            app = viewer(["tail", str(path)], stack)  # not there yet: waited for
            async with app.run_test(size=SIZE) as pilot:

                def steps_shown() -> int:
                    return sum(label.startswith("step ") for label in app.labels())

                path.write_text("".join(lines[:3]) + lines[3][:20])  # created, task, one step and half a line
                await wait_for(pilot, lambda: steps_shown() == 1, "the first step")
                assert not any("reward:1.000" in label for label in app.labels())
                with path.open("a") as handle:
                    handle.write(lines[3][20:] + "".join(lines[4:]))
                await wait_for(
                    pilot, lambda: any("reward:1.000" in label for label in app.labels()), "the finish"
                )
                assert steps_shown() == len(lines) - 3
                assert codeact_id in app.model.collections
                path.write_text(other)  # truncated and rewritten with another rollout
                await wait_for(pilot, lambda: react_id in app.model.collections, "the new rollout")
                await wait_for(pilot, lambda: codeact_id not in app.model.collections, "the old one gone")
                assert sum(label.startswith("collection:") for label in app.labels()) == 1
                await pilot.press("space")
                assert "paused" in app.status_text()

    run(scenario())


def test_show_dump_shows_collection_dumps_at_once(tmp_path, runs, capsys):
    dump = runs.dump_of(runs.tree)
    (tmp_path / "notes.txt").write_text("skipped")

    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            app = viewer(["show-dump", str(dump), str(tmp_path / "notes.txt")], stack)
            async with app.run_test(size=SIZE):
                assert app.replay is not None and app.replay.done
                labels = app.labels()
                assert any(label.startswith("fork from ") for label in labels)
                assert any(label.startswith("verifier:") for label in labels)
            converted = app.replay.files
            assert all(path.is_file() for path in converted)
        assert not any(path.exists() for path in converted)  # temporary files go with the viewer

    run(scenario())
    assert "skipped" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        ([], 64, "the following arguments are required"),
        (["bogus"], 64, "invalid choice"),
        (["tail"], 64, "platoon viz tail: name at least one file or --dir or --rdir"),
        (["replay", "nowhere.jsonl"], 64, "platoon viz replay: no such file: nowhere.jsonl"),
        (["replay", "--dir", "nowhere"], 64, "platoon viz replay: no such directory: nowhere"),
        (["replay", "--mode", "fancy", "x"], 64, "invalid choice: 'fancy'"),
        (["replay", "--delay", "-1", "x.jsonl"], 64, "--delay must be 0 or more"),
    ],
)
def test_bad_command_lines_are_usage_errors(tmp_path, monkeypatch, capsys, argv, status, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text("")
    assert platoon_main(["viz", *argv]) == status
    err = capsys.readouterr().err
    assert message in err


def test_a_dump_that_is_not_one_fails_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["show-dump", str(bad)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"platoon viz show-dump: {bad}: not a trajectory collection dump")


def test_help_of_platoon_viz_and_of_the_module():
    out = subprocess.run(
        [sys.executable, "-m", "platoon.viz", "replay", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("usage: python -m platoon.viz replay") and "--delay S" in out
    assert platoon_main(["viz", "--help"]) == 0


def test_without_textual_the_viewer_names_the_extra(tmp_path):
    code = (
        "import sys; sys.modules['textual'] = None\n"
        "from platoon.cli import main\n"
        f"sys.exit(main(['viz', 'replay', {str(tmp_path)!r}]))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"platoon viz: {MISSING_TEXTUAL}"]
    assert "pip install 'platoon-core[viz]'" in MISSING_TEXTUAL
