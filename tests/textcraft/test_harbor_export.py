"""The Harbor export of TextCraft-Synth: layout, counts, task files, hard links,
and byte-stable output across two exports."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from platoon_textcraft.harbor import game
from platoon_textcraft.harbor.export import BASE_IMAGE, content_digest, export_dataset
from platoon_textcraft.synth_recipe_loader import RECIPES_SHA256

TASK_FILES = [
    "environment/Dockerfile",
    "environment/recipes.json",
    "environment/task.json",
    "environment/textcraft_game.py",
    "instruction.md",
    "solution/solve.sh",
    "task.toml",
    "tests/Dockerfile",
    "tests/recipes.json",
    "tests/task.json",
    "tests/test.sh",
    "tests/textcraft_game.py",
]


def tree_digest(root: Path) -> str:
    """sha256 over every path, kind, mode and content under `root`, and which files are one inode."""
    digest = hashlib.sha256()
    inodes: dict[tuple[int, int], str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        info = path.lstat()
        if path.is_dir():
            digest.update(f"d {rel}\n".encode())
            continue
        first = inodes.setdefault((info.st_dev, info.st_ino), rel)
        digest.update(f"f {rel} {oct(info.st_mode)} {first}\n".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    out = tmp_path_factory.mktemp("small") / "textcraft-synth"
    return out, export_dataset(out, limit=8, source_revision="0" * 40)


def test_the_layout_and_the_root_files(small):
    out, tasks = small
    assert sorted(p.name for p in out.iterdir()) == [
        "LICENSE",
        "README.md",
        "registry.json",
        "splits.json",
        "task-index.json",
        "tasks",
    ]
    assert len(tasks) == 16 and [t.split for t in tasks] == ["train"] * 8 + ["val"] * 8
    for task in tasks:
        files = sorted(
            p.relative_to(out / task.path).as_posix() for p in (out / task.path).rglob("*") if p.is_file()
        )
        assert files == TASK_FILES
    registry = json.loads((out / "registry.json").read_text())
    assert [d["name"] for d in registry] == ["textcraft-synth-train", "textcraft-synth-val"]
    assert registry[0]["version"] == "1.0"
    assert registry[0]["tasks"][0] == {
        "name": "textcraft-synth/train-medium-00000",
        "path": "tasks/textcraft-synth-train-medium-00000",
    }
    index = json.loads((out / "task-index.json").read_text())
    assert list(index) == sorted(index) and len(index) == 16
    row = index["textcraft-synth/train-medium-00000"]
    assert row["digest"] == content_digest(
        {rel: (out / row["task_path"] / rel).read_bytes() for rel in TASK_FILES}
    )
    assert (row["env_task_id"], row["env_split_task_id"], row["difficulty"]) == (
        "train:0",
        "train-medium:0",
        "medium",
    )
    splits = json.loads((out / "splits.json").read_text())
    assert list(splits)[:2] == ["train", "val"] and splits["train"] == [t.name for t in tasks[:8]]
    for name, names in splits.items():
        if "-" in name:
            split, difficulty = name.split("-")
            assert names == [t.name for t in tasks if (t.split, t.difficulty) == (split, difficulty)]
    for name in ("registry.json", "task-index.json", "splits.json"):
        text = (out / name).read_text(encoding="ascii")
        assert text.endswith("\n") and text.startswith("[\n {" if name == "registry.json" else '{\n "')
    card = (out / "README.md").read_text()
    assert card.startswith("---\npretty_name: TextCraft-Synth\nlicense: mit\n") and "viewer: false" in card
    assert "0" * 40 in card and RECIPES_SHA256 in card
    # the provenance names this release, the workspace's version (not the unrelated registry line's 0.1.0)
    assert f"Exported by platoon-textcraft {metadata.version('platoon-core')} from commit" in card
    assert (out / "LICENSE").read_text().startswith("MIT License")


def test_a_task_as_harbor_reads_it(small):
    out, _ = small
    task = out / "tasks" / "textcraft-synth-train-medium-00000"
    toml = tomllib.loads((task / "task.toml").read_text())
    assert toml["schema_version"] == "1.4" and toml["artifacts"] == ["/app/textcraft/actions.jsonl"]
    assert toml["task"] == {
        "name": "textcraft-synth/train-medium-00000",
        "description": "TextCraft-Synth: craft the following items: 3x a1_i5 (medium, crafting depth 5)",
        "keywords": ["textcraft", "textcraft-synth", "crafting", "planning"],
    }
    assert toml["metadata"] == {
        "environment": "textcraft-synth@1",
        "split": "train",
        "difficulty": "medium",
        "max_depth": 5,
        "num_craft_steps": 22,
        "goal": "Craft the following items: 3x a1_i5",
        "source_task_id": "textcraft_synth.train.0",
        "env_task_id": "train:0",
        "env_split_task_id": "train-medium:0",
    }
    assert toml["verifier"] == {"environment_mode": "separate", "timeout_sec": 180.0}
    assert toml["agent"] == {"timeout_sec": 840.0}  # 600 + 10 x 22 crafts = 820 s, up to whole minutes
    assert toml["environment"] == {
        "network_mode": "no-network",
        "cpus": 1,
        "memory_mb": 2048,
        "gpus": 0,
        "build_timeout_sec": 900.0,
    }
    task_json = (task / "environment" / "task.json").read_bytes()
    assert (task / "tests" / "task.json").read_bytes() == task_json
    # the task files are byte-stable, so their hashes are fixtures
    assert (
        hashlib.sha256(task_json).hexdigest()
        == "cf4f8d9c2808200a37552cb4bf4a6b08f62dd86128e68e08d1bdd5b1c4de9b50"
    )
    assert json.loads(task_json) == {
        "format": "textcraft-task/1",
        "name": "textcraft-synth/train-medium-00000",
        "world": "textcraft-synth",
        "goal": "Craft the following items: 3x a1_i5",
        "target_items": {"a1_i5": 3},
        "initial_inventory": {
            "raw_a1": 71,
            "raw_a9": 27,
            "raw_a4": 48,
            "raw_a0": 42,
            "raw_a3": 26,
            "raw_a2": 26,
            "raw_t0": 1,
        },
        "recipes_sha256": RECIPES_SHA256,
    }
    recipes = (task / "environment" / "recipes.json").read_bytes()
    assert hashlib.sha256(recipes).hexdigest() == RECIPES_SHA256 and len(recipes) == 154_513
    assert (task / "environment" / "textcraft_game.py").read_bytes() == Path(game.__file__).read_bytes()
    dockerfile = (task / "environment" / "Dockerfile").read_text().splitlines()
    assert dockerfile[0] == (
        "# textcraft-synth/train-medium-00000: task.json sha256:" + hashlib.sha256(task_json).hexdigest()
    )
    assert dockerfile[1] == f"FROM {BASE_IMAGE}"
    assert dockerfile[-4:] == [
        "WORKDIR /app",
        "ENV TEXTCRAFT_DIR=/app/textcraft",
        "COPY textcraft_game.py recipes.json /app/textcraft/",
        "COPY task.json /app/textcraft/",
    ]
    tests_dockerfile = (task / "tests" / "Dockerfile").read_text().splitlines()
    assert tests_dockerfile[:-1] == dockerfile[:-3]
    assert tests_dockerfile[-1] == "COPY test.sh textcraft_game.py recipes.json task.json /tests/"
    solve = (task / "solution" / "solve.sh").read_text().splitlines()
    assert solve[0] == "#!/bin/bash" and "set -euo pipefail" in solve
    assert solve[-1] == "textcraft finish 'Crafted 3x a1_i5'"
    assert sum(line.startswith("textcraft craft ") for line in solve) == 22
    assert solve[solve.index("fi") + 1] == "textcraft craft a9_i1 12 raw_a1=8"  # COUNT = the total produced
    for name in ("solution/solve.sh", "tests/test.sh"):
        assert os.stat(task / name).st_mode & 0o777 == 0o755
    assert os.stat(task / "task.toml").st_mode & 0o777 == 0o644
    instruction = (task / "instruction.md").read_text()
    assert "## Task\n\nCraft the following items: 3x a1_i5\n" in instruction
    assert "`textcraft craft m2_i2 2 m0_i1=2 m1_i1=1`" in instruction
    assert instruction.rstrip().endswith(
        "The game's state lives in `/app/textcraft` and changes only through the `textcraft` command."
    )


def test_the_instruction_opens_with_the_linear_prompts_game_description(small):
    from platoon_textcraft.prompts import _GAME

    out, _ = small
    instruction = (out / "tasks" / "textcraft-synth-train-medium-00000" / "instruction.md").read_text()
    assert instruction.startswith(_GAME + "\n\n## Task\n")


def test_shared_files_of_4_kib_or_more_are_hard_links_of_one_copy(small):
    out, tasks = small
    games = {
        os.stat(out / t.path / d / "textcraft_game.py").st_ino
        for t in tasks
        for d in ("environment", "tests")
    }
    recipes = {
        os.stat(out / t.path / d / "recipes.json").st_ino for t in tasks for d in ("environment", "tests")
    }
    assert len(games) == 1 and len(recipes) == 1
    assert os.stat(out / tasks[0].path / "tests" / "recipes.json").st_nlink == 2 * len(tasks)
    for task in tasks:  # small files are copies: editing one never edits another task
        for rel in ("task.toml", "environment/task.json", "tests/test.sh", "solution/solve.sh"):
            assert os.stat(out / task.path / rel).st_nlink == 1


def test_two_exports_are_byte_identical(small, tmp_path):
    out, _ = small
    again = tmp_path / "elsewhere" / "textcraft-synth"
    export_dataset(again, limit=8, source_revision="0" * 40)
    assert tree_digest(again) == tree_digest(out)


def test_an_existing_out_needs_force_and_unknown_splits_are_refused(tmp_path):
    out = tmp_path / "ds"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(FileExistsError, match=r"ds exists; pass force=True \(--force\) to replace it"):
        export_dataset(out, limit=1)
    with pytest.raises(
        ValueError, match=r"unknown splits \['test'\]; textcraft-synth@1 has \['train', 'val'\]"
    ):
        export_dataset(out, splits=["train", "test"], force=True)
    tasks = export_dataset(out, splits=["val"], limit=1, force=True)
    assert [t.name for t in tasks] == ["textcraft-synth/val-easy-00000"]
    assert not (out / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no staging directory left behind


def test_the_original_variant_stops_at_train_329(tmp_path):
    with pytest.raises(ValueError, match=r"^train 329: gold step \d+ needs \d+ of tag:planks"):
        export_dataset(tmp_path / "original", variant="original", splits=["train"])
    assert list(tmp_path.iterdir()) == []
    tasks = export_dataset(tmp_path / "original", variant="original", splits=["train"], limit=3)
    toml = tomllib.loads((tmp_path / "original" / tasks[0].path / "task.toml").read_text())
    assert (
        toml["task"]["name"] == "textcraft/train-00000" and toml["metadata"]["environment"] == "textcraft@1"
    )
    assert "difficulty" not in toml["metadata"]


def test_the_command_line(tmp_path):
    out = tmp_path / "cli"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "platoon_textcraft.harbor",
            "export",
            "--out",
            str(out),
            "--splits",
            "val",
            "--limit",
            "2",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"wrote 2 tasks to {out}\n" and done.stderr == "val: 2 tasks\n"
    again = subprocess.run(
        [sys.executable, "-m", "platoon_textcraft.harbor", "export", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert (
        again.returncode == 1
        and again.stderr == f"textcraft export: {out} exists; pass force=True (--force) to replace it\n"
    )


@pytest.mark.slow
def test_the_whole_dataset_counts_and_is_byte_stable(tmp_path):
    first = export_dataset(tmp_path / "a")
    assert len(first) == 3154
    registry = json.loads((tmp_path / "a" / "registry.json").read_text())
    assert [(d["name"], len(d["tasks"]), d["description"]) for d in registry] == [
        (
            "textcraft-synth-train",
            2522,
            "TextCraft-Synth train split: 2,522 crafting tasks (588 easy, 852 medium, 544 hard, 538 extreme)",
        ),
        (
            "textcraft-synth-val",
            632,
            "TextCraft-Synth val split: 632 crafting tasks (147 easy, 213 medium, 136 hard, 136 extreme)",
        ),
    ]
    splits = json.loads((tmp_path / "a" / "splits.json").read_text())
    assert {k: len(v) for k, v in splits.items()} == {
        "train": 2522,
        "val": 632,
        "train-easy": 588,
        "train-medium": 852,
        "train-hard": 544,
        "train-extreme": 538,
        "val-easy": 147,
        "val-medium": 213,
        "val-hard": 136,
        "val-extreme": 136,
    }
    assert "textcraft-synth/train-hard-00002" in splits["train-hard"]  # names count within the base split
    export_dataset(tmp_path / "b")
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
