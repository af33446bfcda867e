"""The `textcraft` game command and its verifier: the command's texts are
the ORS environment's for the same actions, exit codes and the log's rules, and the verifier grades by replaying
the log with its own copies, refusing symlinks and any record the command could not have written.

The command runs in process through `game.main` (the same code path as `python3 -I textcraft_game.py`), and as a
real process for the shipped `solve.sh` / `test.sh` and under Python 3.8 when one is installed."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from platoon_textcraft.env import TextCraftEnvironment, TextCraftSynthEnvironment
from platoon_textcraft.harbor import game
from platoon_textcraft.harbor.export import export_dataset, json_text
from platoon_textcraft.recipe_loader import RecipeDatabase
from platoon_textcraft.synth_recipe_loader import recipes_document
from platoon_textcraft.synth_tasks import load_synth_tasks

MEDIUM = "tasks/textcraft-synth-train-medium-00000"  # train:0, 3x a1_i5, 22 gold crafts
EASY = "tasks/textcraft-synth-train-easy-00006"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("harbor") / "textcraft-synth"
    export_dataset(out, splits=["train"], limit=7)
    return out


def install(task: Path, root: Path) -> Path:
    """A sandbox-like root: the agent's copies in app/textcraft, the verifier's in tests/."""
    (root / "app" / "textcraft").mkdir(parents=True)
    for name in ("textcraft_game.py", "recipes.json", "task.json"):
        shutil.copyfile(task / "environment" / name, root / "app" / "textcraft" / name)
    shutil.copytree(task / "tests", root / "tests")
    return root


class Player:
    """Runs `textcraft` commands in process on one game directory."""

    def __init__(self, directory: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
        self.directory = directory
        self.monkeypatch = monkeypatch
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.monkeypatch.setenv("TEXTCRAFT_DIR", str(self.directory))
        self.capsys.readouterr()
        code = game.main(list(argv))
        captured = self.capsys.readouterr()
        return code, captured.out, captured.err

    @property
    def log(self) -> Path:
        return self.directory / "actions.jsonl"


@pytest.fixture
def root(dataset: Path, tmp_path: Path) -> Path:
    return install(dataset / MEDIUM, tmp_path / "sandbox")


@pytest.fixture
def player(root: Path, monkeypatch, capsys) -> Player:
    return Player(root / "app" / "textcraft", monkeypatch, capsys)


def solution_commands(task: Path) -> list[list[str]]:
    lines = (task / "solution" / "solve.sh").read_text().splitlines()
    return [shlex.split(line)[1:] for line in lines if line.startswith("textcraft ")]


def verify(root: Path, capsys) -> tuple[int, dict[str, Any], str]:
    out = root / "logs" / "verifier"
    out.mkdir(parents=True, exist_ok=True)
    capsys.readouterr()
    code = game.main(
        [
            "verify",
            "--task",
            str(root / "tests" / "task.json"),
            "--recipes",
            str(root / "tests" / "recipes.json"),
            "--root",
            f"{root}/",
            "--log",
            "app/textcraft/actions.jsonl",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr()
    verdict = json.loads((out / "textcraft-verdict.json").read_text()) if code == 0 else {}
    if code == 0:
        assert json.loads((out / "reward.json").read_text()) == {"reward": verdict["reward"]}
    return code, verdict, printed.out + printed.err


# ------------------------------------------------------------------------------ texts match the environment


def env_call(env: Any, tool: str, args: dict[str, Any]) -> str:
    result = asyncio.run(env._call_tool(tool, args)).root
    assert result.ok, result
    return result.output.blocks[0].text


def argv_of(tool: str, args: dict[str, Any]) -> list[str]:
    """The command line for an action: positional where the arguments allow it, else --json."""
    if tool == "craft":
        ingredients, target = args["ingredients"], args["target"]
        simple = (
            isinstance(ingredients, dict)
            and all(type(v) is int for v in ingredients.values())
            and isinstance(target, list)
            and len(target) == 2
            and isinstance(target[0], str)
            and type(target[1]) is int
        )
        if simple:
            return ["craft", target[0], str(target[1]), *(f"{k}={v}" for k, v in ingredients.items())]
        return ["craft", "--json", json.dumps(args)]
    if tool == "get_info":
        return ["info", *args["items"]]
    if tool == "view_inventory":
        return ["inventory"]
    return ["finish", *args["message"].split(" ")]


SYNTH_ACTIONS: list[tuple[str, dict[str, Any]]] = [
    ("view_inventory", {}),
    ("get_info", {"items": ["a1_i5", "a9_i1", "raw_a1", "no_such_item"]}),
    ("craft", {"ingredients": {"raw_a1": 8}, "target": ["a9_i1", 4]}),  # yield 3: not divisible
    ("craft", {"ingredients": {"raw_a1": 7}, "target": ["a9_i1", 12]}),  # wrong amount
    ("craft", {"ingredients": {"raw_a9": 8}, "target": ["a9_i1", 12]}),  # missing (and extra)
    ("craft", {"ingredients": {"raw_a1": 8, "raw_a9": 1}, "target": ["a9_i1", 12]}),  # extra
    ("craft", {"ingredients": {"raw_a1": 800}, "target": ["a9_i1", 1200]}),  # insufficient
    ("craft", {"ingredients": {}, "target": ["raw_a1", 1]}),  # no recipe
    ("craft", {"ingredients": {"raw_a1": 8}, "target": ["a9_i1", 0]}),
    ("craft", {"ingredients": {"raw_a1": -8}, "target": ["a9_i1", 12]}),
    ("craft", {"ingredients": [1], "target": ["a9_i1", 12]}),
    ("craft", {"ingredients": {}, "target": "a9_i1"}),
    ("craft", {"ingredients": {}, "target": ["a9_i1", 12, 1]}),
    ("craft", {"ingredients": {}, "target": [3, 12]}),
    ("craft", {"ingredients": {}, "target": ["a9_i1", 2.5]}),
    ("craft", {"ingredients": {"raw_a1": True}, "target": ["a9_i1", 12]}),
    ("craft", {"ingredients": {"raw_a1": 8}, "target": ["a9_i1", 12]}),  # the gold step
    ("craft", {"ingredients": {"raw_a9": 4}, "target": ["a2_i1_22", 8]}),
    ("view_inventory", {}),
    ("get_info", {"items": ["a9_i1", "a2_i1_22"]}),
    ("finish", {"message": "done for  now"}),
]


def test_the_commands_print_the_environments_texts_for_the_same_actions(player):
    spec = load_synth_tasks("train")[0]
    env = TextCraftSynthEnvironment(spec)
    for tool, args in SYNTH_ACTIONS:
        expected = env_call(env, tool, args)
        code, out, err = player(*argv_of(tool, args))
        assert (out, err) == (expected + "\n", ""), (tool, args)
        failed = tool == "craft" and expected.startswith("Error")
        assert code == (1 if failed else 0), (tool, args, out)
    records = [json.loads(line) for line in player.log.read_text().splitlines()]
    assert [r["seq"] for r in records] == list(range(1, len(SYNTH_ACTIONS) + 1))
    assert [r["tool"] for r in records] == [tool for tool, _ in SYNTH_ACTIONS]
    oks = [r["ok"] for r in records if r["tool"] == "craft"]
    assert oks.count(True) == 2 and len(oks) == 16


def test_minecraft_tags_print_the_environments_texts(tmp_path, monkeypatch, capsys):
    book = RecipeDatabase()
    recipes = recipes_document(book, "textcraft").encode("ascii")
    spec = {
        "goal": "Craft the following items: 4x stick",
        "id": "test.0",
        "max_steps": 50,
        "misc": {
            "target_items": {"stick": 4},
            "initial_inventory": {"oak_log": 2, "birch_planks": 3, "stick": 2},
        },
    }
    task = {
        "format": "textcraft-task/1",
        "name": "textcraft/test-00000",
        "world": "textcraft",
        "goal": spec["goal"],
        "target_items": spec["misc"]["target_items"],
        "initial_inventory": spec["misc"]["initial_inventory"],
        "recipes_sha256": __import__("hashlib").sha256(recipes).hexdigest(),
    }
    (tmp_path / "recipes.json").write_bytes(recipes)
    (tmp_path / "task.json").write_text(json_text(task))
    play = Player(tmp_path, monkeypatch, capsys)
    env = TextCraftEnvironment(spec)
    actions = [
        ("get_info", {"items": ["stick", "oak_planks", "torch"]}),
        ("craft", {"ingredients": {"oak_log": 2}, "target": ["stick", 4]}),  # not a planks member
        ("craft", {"ingredients": {"oak_log": 1, "birch_planks": 2}, "target": ["stick", 4]}),  # extra
        ("craft", {"ingredients": {"oak_log": 1}, "target": ["oak_planks", 4]}),  # tag:oak_logs
        ("craft", {"ingredients": {"birch_planks": 2}, "target": ["stick", 4]}),
        ("view_inventory", {}),
        ("finish", {"message": "sticks"}),
    ]
    for tool, args in actions:
        expected = env_call(env, tool, args)
        code, out, _ = play(*argv_of(tool, args))
        assert out == expected + "\n", (tool, args)
        assert code == (1 if expected.startswith("Error") else 0)
    assert env.evaluate("sticks")[0] == 1.0


def test_the_recipes_document_answers_as_the_environments_database():
    from platoon_textcraft.harbor.export import check_book
    from platoon_textcraft.synth_recipe_loader import load_synth_book

    for book, name in ((load_synth_book(), "textcraft-synth"), (RecipeDatabase(), "textcraft")):
        check_book(game.Book(json.loads(recipes_document(book, name))), book)  # raises on any difference


# ------------------------------------------------------------------------------------------ the command


def test_usage_version_help_and_exit_codes(player):
    assert player("--version")[:2] == (0, "textcraft 1.0\n")
    for flag in ("-h", "--help", "help"):
        code, out, _ = player(flag)
        assert code == 0 and out.startswith("usage: textcraft craft")
    assert player()[0] == 2
    for argv in (
        ["dance"],
        ["craft", "a9_i1"],
        ["craft", "a9_i1", "twelve", "raw_a1=8"],
        ["craft", "a9_i1", "12", "raw_a1"],
        ["craft", "a9_i1", "12", "raw_a1=8", "raw_a1=8"],
        ["craft", "--json", '{"ingredients": {}, "target": ["x", 1], "extra": 1}'],
        ["craft", "--json", '{"ingredients": {"a": NaN}, "target": ["x", 1]}'],
        ["craft", "--json", '{"ingredients": {}, "ingredients": {}, "target": ["x", 1]}'],
        ["info"],
        ["info", "--json", "[1]"],
        ["inventory", "now"],
        ["finish"],
        ["finish", ""],
    ):
        code, out, err = player(*argv)
        assert (code, out) == (2, ""), argv
        assert err.startswith("textcraft: ") and "usage: textcraft" in err, argv
    assert not player.log.exists()  # nothing was logged


def test_nothing_is_accepted_after_finish_and_a_rejected_craft_is_logged(player):
    assert player("craft", "a9_i1", "4", "raw_a1=8")[0] == 1
    assert player("finish", "Crafted", "nothing")[:2] == (0, "Crafted nothing\n")
    before = player.log.read_bytes()
    for argv in (["inventory"], ["craft", "a9_i1", "12", "raw_a1=8"], ["finish", "again"]):
        assert player(*argv)[:2] == (1, game.FINISHED_ERROR + "\n")
    assert player.log.read_bytes() == before
    assert [json.loads(line) for line in before.decode().splitlines()] == [
        {
            "seq": 1,
            "tool": "craft",
            "args": {"ingredients": {"raw_a1": 8}, "target": ["a9_i1", 4]},
            "ok": False,
        },
        {"seq": 2, "tool": "finish", "args": {"message": "Crafted nothing"}},
    ]


def test_a_full_log_accepts_no_command(player, monkeypatch):
    assert player("inventory")[0] == 0
    size = player.log.stat().st_size
    monkeypatch.setattr(game, "MAX_LOG_BYTES", size + 10)  # the next record does not fit
    code, out, _ = player("inventory")
    assert (code, out) == (1, game.FULL_ERROR + "\n")
    assert player.log.stat().st_size == size


def test_the_command_cannot_play_a_symlinked_foreign_or_mismatched_state(player, root, tmp_path):
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("")
    player.log.symlink_to(elsewhere)
    code, _, err = player("inventory")
    assert code == 3 and "is a symlink" in err
    player.log.unlink()
    player.log.mkdir()
    code, _, err = player("inventory")
    assert code == 3 and "cannot play" in err
    player.log.rmdir()
    player.log.write_text(
        '{"seq":1,"tool":"view_inventory","args":{}}\n{"seq":3,"tool":"view_inventory","args":{}}\n'
    )
    code, _, err = player("inventory")
    assert code == 3 and "no longer replays" in err and "record 2 has seq 3" in err
    player.log.unlink()
    recipes = player.directory / "recipes.json"
    recipes.write_bytes(recipes.read_bytes().replace(b'"result_count":3', b'"result_count":4', 1))
    code, _, err = player("inventory")
    assert code == 3 and "sha256" in err
    assert not player.log.exists()


# ------------------------------------------------------------------------------------------ the verifier


def play_solution(player: Player, task: Path) -> None:
    for argv in solution_commands(task):
        code, out, _ = player(*argv)
        assert code == 0, (argv, out)


def test_the_gold_actions_score_1_and_an_unfinished_or_short_episode_0(player, root, dataset, capsys):
    assert verify(root, capsys)[1]["reason"] == "no action log: no textcraft command ran"
    commands = solution_commands(dataset / MEDIUM)
    for argv in commands[:-1]:
        assert player(*argv)[0] == 0
    code, verdict, _ = verify(root, capsys)
    assert (code, verdict["reward"], verdict["reason"]) == (
        0,
        0.0,
        "the episode did not end with textcraft finish",
    )
    assert player(*commands[-1])[0] == 0
    code, verdict, printed = verify(root, capsys)
    assert verdict == {
        "reward": 1.0,
        "task": "textcraft-synth/train-medium-00000",
        "version": "1.0",
        "records": 23,
        "crafts": 22,
        "finished": True,
        "log_bytes": player.log.stat().st_size,
        "reason": "finished with every target crafted",
    }
    assert printed == "reward 1.0: finished with every target crafted (23 records, 22 crafts)\n"


def test_finishing_short_of_a_target_scores_0_with_the_missing_items(player, root, dataset, capsys):
    for argv in solution_commands(dataset / MEDIUM)[:-2]:  # the last craft is left out
        player(*argv)
    player("finish", "done")
    verdict = verify(root, capsys)[1]
    assert (verdict["reward"], verdict["reason"]) == (0.0, "finished without every target crafted")
    assert verdict["missing_items"] == {"a1_i5": 3}


@pytest.fixture(scope="module")
def gold_log(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The log the gold solution of MEDIUM writes (played once, in process)."""
    directory = install(dataset / MEDIUM, tmp_path_factory.mktemp("gold")) / "app" / "textcraft"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TEXTCRAFT_DIR", str(directory))
        for argv in solution_commands(dataset / MEDIUM):
            assert game.main(argv) == 0
    return (directory / "actions.jsonl").read_text().splitlines()


def genuine_log(player: Player, gold_log: list[str]) -> list[str]:
    player.log.write_text("\n".join(gold_log) + "\n")
    return list(gold_log)


def forge(lines: list[str], how: str) -> str:
    records = [json.loads(line) for line in lines]
    first = records[0]
    dump = game.dump_record
    if how == "refused craft claimed ok":
        forged = {"seq": 1, "tool": "craft", "args": {"ingredients": {}, "target": ["a1_i5", 3]}, "ok": True}
        return "\n".join([dump(forged), dump({"seq": 2, "tool": "finish", "args": {"message": "x"}})]) + "\n"
    if how == "successful craft claimed failed":
        lines = [dump({**first, "ok": False}), *lines[1:]]
    elif how == "a record deleted":
        lines = lines[:3] + lines[4:]
    elif how == "seq renumbered after a deletion":
        kept = records[:3] + records[4:]
        lines = [dump({**r, "seq": n}) for n, r in enumerate(kept, 1)]
    elif how == "a record after finish":
        lines = [*lines, dump({"seq": len(lines) + 1, "tool": "view_inventory", "args": {}})]
    elif how == "spaces in a record":
        lines = [json.dumps(first), *lines[1:]]
    elif how == "keys reordered":
        lines = [dump({"tool": first["tool"], "seq": 1, "args": first["args"], "ok": True}), *lines[1:]]
    elif how == "a duplicate key":
        lines = [lines[0][:-1] + ',"ok":true}', *lines[1:]]
    elif how == "an extra key":
        lines = [dump({**first, "note": 1}), *lines[1:]]
    elif how == "a missing ok":
        lines = [dump({k: v for k, v in first.items() if k != "ok"}), *lines[1:]]
    elif how == "NaN":
        lines = [*lines[:-1], f'{{"seq":{len(lines)},"tool":"get_info","args":{{"items":NaN}}}}', lines[-1]]
    elif how == "info items not names":
        lines = [
            *lines[:-1],
            dump({"seq": len(lines), "tool": "get_info", "args": {"items": [1]}}),
            lines[-1],
        ]
        lines[-1] = dump({**records[-1], "seq": len(lines)})
    elif how == "not ASCII":
        lines = [*lines[:-1], lines[-1].replace('"message":"', '"message":"\u00e9')]
    elif how == "an unknown tool":
        lines = [dump({"seq": 1, "tool": "teleport", "args": {}}), *lines[1:]]
    elif how == "a partial last line":
        return "\n".join(lines)
    else:
        raise AssertionError(how)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "how",
    [
        "refused craft claimed ok",
        "successful craft claimed failed",
        "a record deleted",
        "seq renumbered after a deletion",
        "a record after finish",
        "spaces in a record",
        "keys reordered",
        "a duplicate key",
        "an extra key",
        "a missing ok",
        "NaN",
        "info items not names",
        "not ASCII",
        "an unknown tool",
        "a partial last line",
    ],
)
def test_the_verifier_refuses_a_record_the_command_could_not_have_written(
    how, player, root, gold_log, capsys
):
    text = forge(genuine_log(player, gold_log), how)
    player.log.write_bytes(text.encode("utf-8"))
    code, verdict, printed = verify(root, capsys)
    assert code == 0 and verdict["reward"] == 0.0, (how, verdict)
    assert verdict["reason"].startswith("the action log is not one the game wrote: "), (how, verdict)
    assert printed.startswith("reward 0.0: the action log is not one the game wrote")


def test_a_refused_craft_claimed_ok_names_the_rules_answer(player, root, gold_log, capsys):
    player.log.write_text(forge(genuine_log(player, gold_log), "refused craft claimed ok"))
    reason = verify(root, capsys)[1]["reason"]
    assert reason == (
        "the action log is not one the game wrote: record 1 claims a craft succeeded that the rules answer: "
        "Error: All 1 recipe(s) failed for a1_i5. Errors:"
    )


def test_the_verifier_never_follows_a_symlink(player, root, gold_log, tmp_path, capsys):
    genuine = tmp_path / "genuine.jsonl"
    genuine.write_text("\n".join(genuine_log(player, gold_log)) + "\n")
    player.log.unlink()
    player.log.symlink_to(genuine)
    verdict = verify(root, capsys)[1]
    assert verdict["reward"] == 0.0 and verdict["reason"].endswith("app/textcraft/actions.jsonl is a symlink")
    # a symlinked directory on the way is refused too
    moved = tmp_path / "textcraft"
    player.log.unlink()
    shutil.copyfile(genuine, player.directory / "actions.jsonl")
    shutil.move(str(player.directory), moved)
    (root / "app" / "textcraft").symlink_to(moved)
    verdict = verify(root, capsys)[1]
    assert verdict["reward"] == 0.0 and verdict["reason"].endswith("app/textcraft is a symlink")
    # and a log that is not a regular file, or larger than the command ever writes
    (root / "app" / "textcraft").unlink()
    (root / "app" / "textcraft").mkdir()
    (root / "app" / "textcraft" / "actions.jsonl").mkdir()
    assert "is not a regular file" in verify(root, capsys)[1]["reason"]
    (root / "app" / "textcraft" / "actions.jsonl").rmdir()
    with open(root / "app" / "textcraft" / "actions.jsonl", "wb") as handle:
        handle.truncate(game.MAX_LOG_BYTES + 1)
    assert "larger than 33554432 bytes" in verify(root, capsys)[1]["reason"]


def test_the_verifier_trusts_only_its_own_copies(player, root, dataset, capsys):
    # The agent rewrites its own recipes (a1_i5 from one raw_a0) and task hash: its game then accepts the craft.
    recipes_path = player.directory / "recipes.json"
    document = json.loads(recipes_path.read_text())
    document["recipes"]["a1_i5"] = [{"result_count": 3, "ingredients": [["raw_a0", 1]]}]
    forged = json.dumps(document).encode("ascii")
    recipes_path.write_bytes(forged)
    task_path = player.directory / "task.json"
    task = json.loads(task_path.read_text())
    task["recipes_sha256"] = __import__("hashlib").sha256(forged).hexdigest()
    task_path.write_text(json.dumps(task))
    assert player("craft", "a1_i5", "3", "raw_a0=1")[:2] == (0, "Successfully crafted 3 a1_i5(s)\n")
    assert player("finish", "Crafted 3x a1_i5")[0] == 0
    verdict = verify(root, capsys)[1]
    assert verdict["reward"] == 0.0
    assert "record 1 claims a craft succeeded" in verdict["reason"]
    # the verifier's own copies must agree with each other, or it cannot grade (exit 1, no reward file)
    (root / "tests" / "recipes.json").write_bytes(forged)
    shutil.rmtree(root / "logs")
    code, _, printed = verify(root, capsys)
    assert code == 1 and printed.startswith("textcraft verify: cannot grade: ")
    assert not (root / "logs" / "verifier" / "reward.json").exists()


def test_an_empty_finish_message_in_the_log_scores_0(player, root, gold_log, capsys):
    lines = genuine_log(player, gold_log)
    last = json.loads(lines[-1])
    player.log.write_text(
        "\n".join([*lines[:-1], game.dump_record({**last, "args": {"message": ""}})]) + "\n"
    )
    verdict = verify(root, capsys)[1]
    assert (verdict["reward"], verdict["reason"]) == (0.0, "finished with an empty message")


# ------------------------------------------------------------------------------------------ real processes


def test_solve_sh_and_test_sh_as_shipped_score_1_and_the_noop_scores_0(dataset, tmp_path):
    """The shipped scripts as a process sandbox runs them: no `textcraft` on PATH (solve.sh's fallback), paths
    under PLATOON_SANDBOX_ROOT."""
    task = dataset / EASY
    for played in (True, False):
        root = install(task, tmp_path / f"root-{played}")
        env = {**os.environ, "PLATOON_SANDBOX_ROOT": str(root)}
        env.pop("TEXTCRAFT_DIR", None)
        if played:
            solved = subprocess.run(
                ["bash", str(task / "solution" / "solve.sh")], env=env, capture_output=True, text=True
            )
            assert solved.returncode == 0, solved.stderr
            goal = json.loads((task / "tests" / "task.json").read_text())["goal"]
            assert solved.stdout.splitlines()[-1] == "Crafted " + goal.removeprefix(
                "Craft the following items: "
            )
        graded = subprocess.run(
            ["bash", str(root / "tests" / "test.sh")], env=env, capture_output=True, text=True
        )
        assert graded.returncode == 0, graded.stderr
        reward = json.loads((root / "logs" / "verifier" / "reward.json").read_text())
        assert reward == {"reward": 1.0 if played else 0.0}
        assert graded.stdout.startswith(f"reward {1.0 if played else 0.0}: ")


def test_the_game_file_is_python_3_8_and_standard_library_only():
    source = Path(game.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    assert "platoon" not in source.replace("platoon-textcraft", "").replace("PLATOON_", "")


def test_the_game_runs_under_python_3_8_when_one_is_installed(dataset, tmp_path):
    candidates = [
        *map(str, Path("/root/.pyenv/versions").glob("3.8*/bin/python3.8")),
        shutil.which("python3.8"),
    ]
    python38 = next(
        (c for c in candidates if c and subprocess.run([c, "-c", ""], capture_output=True).returncode == 0),
        None,
    )
    if python38 is None:
        pytest.skip("no Python 3.8 on this machine")
    root = install(dataset / EASY, tmp_path / "root")
    game_file = root / "app" / "textcraft" / "textcraft_game.py"
    env = {"PATH": os.environ["PATH"], "TEXTCRAFT_DIR": str(game_file.parent)}
    for argv in solution_commands(dataset / EASY):
        done = subprocess.run(
            [python38, "-I", str(game_file), *argv], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    graded = subprocess.run(
        [
            python38,
            "-I",
            str(root / "tests" / "textcraft_game.py"),
            "verify",
            "--task",
            str(root / "tests/task.json"),
            "--recipes",
            str(root / "tests/recipes.json"),
            "--root",
            f"{root}/",
            "--log",
            "app/textcraft/actions.jsonl",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert graded.returncode == 0 and graded.stdout.startswith(
        "reward 1.0: finished with every target crafted"
    )


def test_concurrent_commands_take_turns_on_the_log(dataset, tmp_path):
    """The exclusive flock: commands started together each replay and append in turn, numbered 1..n."""
    root = install(dataset / EASY, tmp_path / "root")
    game_file = root / "app" / "textcraft" / "textcraft_game.py"
    running = [
        subprocess.Popen([sys.executable, "-I", str(game_file), "inventory"], stdout=subprocess.DEVNULL)
        for _ in range(8)
    ]
    assert [process.wait() for process in running] == [0] * 8
    records = [json.loads(line) for line in (game_file.parent / "actions.jsonl").read_text().splitlines()]
    assert [record["seq"] for record in records] == list(range(1, 9))
