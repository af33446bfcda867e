"""The viewer app through Textual's pilot on real number-search event files and a training run's rollouts: replay
stepping and the keys, a run grouped by step, the keyboard driving the details pane, filters, help, labels cut at
word boundaries, search with grouped results, tailing a file that grows and is then truncated, following a finished
run on simulated time, show-dump, and the command line around it. No timing is asserted: the tests wait for
conditions (with a hang guard)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
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
from platoon.viz.app import HELP, HelpScreen, ViewerApp
from platoon.viz.cli import MISSING_TEXTUAL, build, main
from platoon.viz.sources import POLL_INTERVAL, POLL_LONGEST

SIZE = (140, 45)


def viewer(argv: list[str], stack: contextlib.ExitStack) -> ViewerApp:
    return build(argv, stack)


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
                # at its end nothing is left to wake the app
                await wait_for(pilot, lambda: app.timer is None, "the replay's timer stopped")

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
    ("argv", "message"),
    [
        ([], "Usage: platoon viz [OPTIONS] COMMAND [ARGS]..."),
        (["bogus"], "No such command 'bogus'"),
        (["tail"], "Error: name at least one file, --dir or --rdir"),
        (["replay", "nowhere.jsonl"], "Error: Invalid value for PATH: no such file: nowhere.jsonl"),
        (["replay", "--dir", "nowhere"], "Error: Invalid value for --dir: no such directory: nowhere"),
        (["replay", "--mode", "fancy", "x.jsonl"], "Invalid value for --mode: 'fancy' is not one of auto,"),
        (["replay", "--delay", "-1", "x.jsonl"], "Invalid value for --delay: must be 0 or more, not -1"),
        (
            ["replay", "--delay", "soon", "x.jsonl"],
            "Invalid value for '--delay': 'soon' is not a valid float",
        ),
        (["tail", "x.jsonl", "--filter", "rewrd>1"], "unknown filter term 'rewrd>1': use reward>=X"),
        (["tail", "--nope"], "No such option: --nope"),
    ],
)
def test_bad_command_lines_are_usage_errors(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text("")
    assert platoon_main(["viz", *argv]) == 64
    err = capsys.readouterr().err
    assert message in err
    if argv:  # a usage error as every platoon command prints one: the usage line and where the help is
        assert err.startswith(f"Usage: platoon viz {argv[0] if argv[0] != 'bogus' else ''}".rstrip())
        assert "Try 'platoon viz" in err and "-h' for help." in err


def test_a_dump_that_is_not_one_fails_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["show-dump", str(bad)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"platoon viz show-dump: {bad}: not a trajectory collection dump")


def test_help_is_platoon_s_own_for_the_group_each_command_and_the_module(capsys):
    assert platoon_main(["viz", "--help"]) == 0
    group = capsys.readouterr().out
    assert group.startswith("Usage: platoon viz [OPTIONS] COMMAND [ARGS]...")
    assert [line.split()[0] for line in group.split("Commands:\n", 1)[1].splitlines()] == [
        "tail",
        "replay",
        "show-dump",
    ]
    assert platoon_main(["config", "--help"]) == 0  # the layout every other command group prints
    other = capsys.readouterr().out
    assert [line for line in group.splitlines() if line.endswith(":")] == [
        line for line in other.splitlines() if line.endswith(":")
    ]
    assert platoon_main(["viz", "tail", "-h"]) == 0
    tail = capsys.readouterr().out
    assert tail.startswith("Usage: platoon viz tail [OPTIONS] [PATH]...")
    for option in (
        "--dir DIR",
        "--rdir DIR",
        "--mode MODE",
        "--selectable-text",
        "--filter TERMS",
        "-h, --help",
    ):
        assert f"  {option}" in tail
    out = subprocess.run(
        [sys.executable, "-m", "platoon.viz", "replay", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert (
        out.startswith("Usage: python -m platoon.viz replay [OPTIONS] [PATH]...") and "--delay SECONDS" in out
    )


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


# ---------------------------------------------------------------------------------------------------------------
# A training run: grouped by step, the keyboard, filters, help, labels that fit, idle at rest

TRAINING_ROLLOUTS = 4 * 8 + 2  # four steps of two groups of four, and an evaluation of two tasks after step 2


def cursor_label(app: ViewerApp) -> str:
    cursor = app.query_one("#tree", Tree).cursor_node
    assert cursor is not None and cursor.data is not None
    return cursor.data.label


def test_a_training_run_opens_grouped_by_step_newest_first_and_collapsed(runs):
    step4 = runs.training / "rollouts" / "train" / "3" / "events" / "events_train_3.jsonl"
    written = list(
        dict.fromkeys(r["collection_id"] for r in records_of(step4) if r.get("training_step") == 4)
    )

    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            app = viewer(["tail", "--rdir", str(runs.training)], stack)
            async with app.run_test(size=SIZE) as pilot:
                await wait_for(pilot, lambda: len(app.model.collections) == TRAINING_ROLLOUTS, "the run read")
                # one closed line per step, newest first; the evaluation after step 2 above step 2
                assert app.shown_labels() == [
                    "step 4 · policy v3 · 8 rollouts · reward avg 0.667 · error 2",
                    "step 3 · policy v2 · 8 rollouts · reward avg 0.667 · error 2",
                    "eval @ step 2 · 2 rollouts · reward avg 1.000",
                    "step 2 · policy v1 · 8 rollouts · reward avg 0.667 · error 2",
                    "step 1 · policy v0 · 8 rollouts · reward avg 0.667 · error 2",
                ]
                # the cursor starts on the newest step, whose summary the details pane shows
                details = app.details_text()
                assert details.startswith("step 4 · policy v3 · 8 rollouts")
                assert '"outcomes": {' in details and '"error": 2' in details and '"scored": 6' in details
                await pilot.press("enter")
                await pilot.pause()
                shown = app.shown_labels()
                rollouts = shown[1:9]
                assert all(label.startswith("collection: task:") for label in rollouts)
                # newest first, each closed (the next line is the next step)
                assert [label.rsplit("id:", 1)[1] for label in rollouts] == [
                    cid[:8] for cid in reversed(written)
                ]
                assert shown[9].startswith("step 3 ·")
                assert sum("outcome:error/harness_crash" in label for label in rollouts) == 2
                await pilot.click("#tree", offset=(0, 9))  # the mouse: a click on step 3's arrow opens it
                await pilot.pause()
                assert app.shown_labels()[10].startswith("collection: task:bandit.train.7")

    run(scenario())


def test_in_replay_the_keyboard_alone_drives_the_details_pane(runs):
    events = runs.training / "rollouts" / "train" / "1" / "events"

    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            app = viewer(["replay", "--dir", str(events), "--delay", "3600"], stack)
            async with app.run_test(size=SIZE) as pilot:
                for _ in range(len(records_of(next(events.iterdir())))):
                    await pilot.press("n")  # every record, one key at a time
                assert app.replay is not None and app.replay.done
                assert app.shown_labels()[0].startswith("step 2 · policy v1 · 8 rollouts")
                # open the step, its newest rollout, and walk down every line with the arrow keys alone
                await pilot.press("enter", "down", "enter")
                await pilot.pause()
                seen = []
                for _ in range(8):
                    await pilot.press("down")
                    await pilot.pause()
                    label = cursor_label(app)
                    seen.append(label.split(" ")[0])
                    assert app.details_text().startswith(label), label
                assert seen[:4] == [f"traj:{seen[0][5:]}", "task:bandit.train.5", "steps", "step"]
                # the step's details hold the model's message; back up to the rollout and its summary
                await pilot.press(*["up"] * 8)
                await pilot.pause()
                assert cursor_label(app).startswith("collection: task:bandit.train.")
                assert '"policy_version": 1' in app.details_text()

    run(scenario())


def test_filters_by_reward_outcome_task_and_label_from_the_keyboard(runs):
    label = next(
        r["label"] for r in records_of(next((runs.training / "rollouts" / "train" / "2").rglob("*.jsonl")))
    )

    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            app = viewer(["tail", "--rdir", str(runs.training)], stack)
            async with app.run_test(size=SIZE) as pilot:
                await wait_for(pilot, lambda: len(app.model.collections) == TRAINING_ROLLOUTS, "the run read")
                field = app.query_one("#filter-input", Input)

                async def apply(text: str) -> None:
                    await pilot.press("f")
                    assert app.focused is field
                    await pilot.press("ctrl+u", *text, "enter")  # ctrl+u: clear the field
                    await pilot.pause()

                await apply("outcome:error")
                assert app.focused is app.query_one("#tree", Tree)  # the bar closed
                assert [line.split(" · ")[2] for line in app.shown_labels()] == ["2 of 8 rollouts"] * 4
                assert "filter outcome:error: 8 of 34 rollouts" in app.status_text()
                await pilot.press("enter")
                await pilot.pause()
                assert all("outcome:error/harness_crash" in line for line in app.shown_labels()[1:3])

                await apply("reward>=1 task:train:6")  # the members of step 3 that answered right
                assert app.shown_labels() == ["step 3 · policy v2 · 2 of 8 rollouts · reward avg 1.000"]
                await apply(f"label:{label} reward<1")  # the label the run's label_by gave that task
                assert app.shown_labels() == ["step 3 · policy v2 · 1 of 8 rollouts · reward avg 0.000"]

                # a term it does not know: one line under the field, which stays open; the filter stays as it was
                await apply("rewrd>1")
                error = str(app.query_one("#filter-error", Static).content)
                assert error.startswith("unknown filter term 'rewrd>1': use reward>=X, reward<X, reward:A..B")
                assert app.focused is field and app.rule.text == f"label:{label} reward<1"
                await pilot.press("escape")
                assert app.focused is app.query_one("#tree", Tree)
                await apply("")  # nothing: everything again
                assert len(app.shown_labels()) == 5 and "filter" not in app.status_text()

            # the same filter from the command line
            app = viewer(["tail", "--rdir", str(runs.training), "--filter", "outcome:error step:4"], stack)
            async with app.run_test(size=SIZE) as pilot:
                await wait_for(pilot, lambda: len(app.model.collections) == TRAINING_ROLLOUTS, "the run read")
                assert app.shown_labels() == ["step 4 · policy v3 · 2 of 8 rollouts · error 2"]

    run(scenario())


def test_help_and_the_footer_name_the_keys_and_the_filter_terms(runs):
    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            app = viewer(
                ["replay", "--dir", str(runs.training / "rollouts" / "eval" / "step_2" / "events")], stack
            )
            async with app.run_test(size=SIZE) as pilot:
                footer = {b.binding.description for b in app.active_bindings.values() if b.binding.show}
                assert {"Filter", "Search", "Help", "Quit"} <= footer
                await pilot.press("question_mark")
                assert isinstance(app.screen, HelpScreen)
                text = str(app.screen.query_one("#help-text", Static).content)
                assert text == HELP
                for key in ("enter", "space", "right, n", "ctrl+f", "f3", "escape", "m", "d", "reward:A..B"):
                    assert key in text
                await pilot.press("escape")
                assert not isinstance(app.screen, HelpScreen)

    run(scenario())


def test_a_replay_tick_that_lands_while_the_viewer_quits_does_nothing(runs):
    # Textual takes the screens down before it stops the app's timers; a tick in between once failed a CI run with
    # a traceback (no '#tree' on the screen). Here the tick comes after the app has stopped.
    events = runs.training / "rollouts" / "eval" / "step_2" / "events"

    async def scenario() -> ViewerApp:
        with contextlib.ExitStack() as stack:
            app = viewer(["replay", "--dir", str(events), "--delay", "30"], stack)
            async with app.run_test(size=SIZE) as pilot:
                await pilot.press("q")
            return app

    app = run(scenario())
    assert app.replay is not None and not app.replay.done  # records were still to come
    app._tick()
    assert not app.replay.done


def test_labels_are_cut_at_a_word_boundary_to_fit_the_pane(runs):
    events = runs.training / "rollouts" / "train" / "0" / "events"

    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            app = viewer(["replay", "--dir", str(events), "--delay", "0"], stack)
            async with app.run_test(size=(90, 30)) as pilot:
                await pilot.press("enter", "down", "enter", "down", "down")  # a step, a rollout, its task
                await pilot.pause()
                tree = app.query_one("#tree", Tree)
                width = tree.scrollable_content_region.width
                assert tree.virtual_size.width <= width  # nothing runs off the pane
                cut = 0
                for y, (widget, _) in enumerate(app._widgets(open_only=True)):
                    line = tree.render_line(y).text.rstrip()
                    assert len(line) <= width
                    full = str(widget.label)
                    if not line.endswith("…"):
                        assert line.endswith(full)
                        continue
                    cut += 1
                    shown = line[line.index(full[:12]) : -1]
                    assert full.startswith(shown) and len(shown) < len(full)
                    # it ends where a word does: the full label goes on with a space, or the cut follows a comma
                    assert full[len(shown)] in " ·," or shown[-1] in ",(", (shown, full)
                assert cut >= 2
                # the details pane has the whole label of the highlighted node (its task, cut in the tree)
                assert app.details_text().startswith(cursor_label(app))
                assert "Answer with one letter:" in app.details_text().splitlines()[0]

    run(scenario())


def test_following_a_finished_run_backs_off_and_reads_nothing_again(runs, tmp_path, monkeypatch):
    """Ten minutes of a finished run on simulated time: the test stands in for the poll timer, so it counts the
    looks the viewer asks for and the files it reads, whatever the machine's speed."""
    run_dir = tmp_path / "run"
    shutil.copytree(runs.training / "rollouts", run_dir / "rollouts")
    step4 = run_dir / "rollouts" / "train" / "3" / "events" / "events_train_3.jsonl"
    first_rollout = records_of(step4)[:4]

    async def scenario() -> None:
        with contextlib.ExitStack() as stack:
            app = viewer(["tail", "--rdir", str(run_dir)], stack)
            asked: list[float] = []
            monkeypatch.setattr(app, "schedule_poll", asked.append)
            async with app.run_test(size=SIZE) as pilot:
                assert app.tailer is not None and len(app.model.collections) == TRAINING_ROLLOUTS
                reads = sum(tail.reads for tail in app.tailer.tails.values())
                clock = 0.0
                looks = 0
                while clock < 600:
                    clock += asked.pop()
                    app.poll()
                    looks += 1
                # a look every POLL_LONGEST seconds once the files stopped growing (not every 0.2 s: 3000 looks),
                # each one `stat` per file and no read
                assert looks <= 600 / POLL_LONGEST + 5
                assert sum(tail.reads for tail in app.tailer.tails.values()) == reads
                assert asked == [POLL_LONGEST]
                # the run goes on: the next look shows the new rollout, and looks come quickly again
                again = [{**record, "collection_id": "one-more"} for record in first_rollout]
                with step4.open("a") as handle:
                    handle.writelines(json.dumps(record) + "\n" for record in again)
                asked.pop()
                app.poll()
                assert "one-more" in app.model.collections and asked == [POLL_INTERVAL]
                await pilot.press("space")  # paused: no look is asked for
                asked.clear()
                app.poll()
                assert asked == []

    run(scenario())
