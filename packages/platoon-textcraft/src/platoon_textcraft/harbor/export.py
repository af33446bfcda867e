"""The Harbor export of TextCraft-Synth (and of TextCraft): one Harbor task directory per shipped task.

Each task carries the standard-library game (`textcraft_game.py`, from `game.py`), the world's `recipes.json`
and its `task.json`, in `environment/` (the agent's image) and again in `tests/` (the verifier's own copies, the
only ones it trusts). The agent plays through the `textcraft` command; `tests/test.sh` grades by replaying the
action log. Every solution is played with the game before it is written and the export fails unless it scores 1.

The output is deterministic (nothing depends on time, host or directory order) and built in a temporary
directory beside `out`, then renamed into place; identical files of 4 KiB or more are hard links of one copy.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import shutil
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from platoon_textcraft.harbor import card, game

# Variant, VARIANTS, variant() and ExportedTask live in `variants` (which the card imports too); their names here
# are kept for the callers that import them from `export`.
from platoon_textcraft.harbor.variants import VARIANTS, ExportedTask, Variant, variant
from platoon_textcraft.recipe_loader import DATA_DIR, TAG_PREFIX, RecipeBook
from platoon_textcraft.synth_recipe_loader import RECIPES_SHA256, recipes_document

__all__ = ["DEFAULT_REPO_ID", "ExportedTask", "Variant", "export_dataset", "variant"]

DEFAULT_REPO_ID = "apurvaga/textcraft-synth"
GAME_FILE = Path(game.__file__)
TEMPLATES = Path(__file__).resolve().parent / "templates"
BASE_IMAGE = "docker.io/library/python:3.12-slim@sha256:a6e34c598f2467ed0e9a8d349809fcd8b5c603269512df273a0bb1784edc11b1"
#: The image's one RUN: the `textcraft` command and tmux (for agents that drive a terminal); no python3 link.
IMAGE_RUN = (
    "RUN printf '#!/bin/sh\\nexec python3 -I /app/textcraft/textcraft_game.py \"$@\"\\n' > /usr/local/bin/textcraft"
    " \\\n && chmod 0755 /usr/local/bin/textcraft"
    " \\\n && apt-get -o APT::Sandbox::User=root update"
    " \\\n && DEBIAN_FRONTEND=noninteractive apt-get -o APT::Sandbox::User=root install -y --no-install-recommends tmux"
    " \\\n && rm -rf /var/lib/apt/lists/*"
)
LINK_MIN_BYTES = 4096
KEYWORDS = ["textcraft", "textcraft-synth", "crafting", "planning"]
DIFFICULTY_ORDER = ("easy", "medium", "hard", "extreme")


# ------------------------------------------------------------------------------------------------ writing


def json_text(value: Any, *, sort_keys: bool = False) -> str:
    """The export's JSON files: indent 1, ASCII, a trailing newline."""
    return json.dumps(value, indent=1, ensure_ascii=True, sort_keys=sort_keys) + "\n"


class _Writer:
    """Writes files under a root with fixed modes; identical contents of LINK_MIN_BYTES or more are hard links of
    the first copy written."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.copies: dict[str, Path] = {}

    def write(self, relative: str, data: bytes, *, executable: bool = False) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(data).hexdigest()
        first = self.copies.get(digest) if len(data) >= LINK_MIN_BYTES and not executable else None
        if first is not None:
            os.link(first, path)
            return
        path.write_bytes(data)
        path.chmod(0o755 if executable else 0o644)
        if len(data) >= LINK_MIN_BYTES and not executable:
            self.copies[digest] = path


def content_digest(files: Mapping[str, bytes]) -> str:
    """Harbor's content hash (packager v1) of a task's files: sha256 over `relpath\\0sha256(file)\\n`, path order."""
    counted = ("task.toml", "instruction.md", "README.md", "trajectory.json")
    folders = ("environment/", "tests/", "solution/", "steps/")
    digest = hashlib.sha256()
    for relative in sorted(files):
        if relative in counted or relative.startswith(folders):
            digest.update(f"{relative}\0{hashlib.sha256(files[relative]).hexdigest()}\n".encode())
    return "sha256:" + digest.hexdigest()


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=True)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def toml_text(top: Mapping[str, Any], tables: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    lines = [f"{key} = {_toml_value(value)}" for key, value in top.items()]
    for name, table in tables:
        lines += ["", f"[{name}]", *(f"{key} = {_toml_value(value)}" for key, value in table.items())]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ recipes check


def check_book(recipes: game.Book, book: RecipeBook) -> None:
    """`recipes.json` must answer exactly as the environment's database, for every item and an unknown one."""
    for item in [*sorted(book.items), "no_such_item"]:
        expected = (
            book.can_craft(item),
            book.is_base_item(item),
            book.get_crafting_depth(item),
            [(r.result_count, list(r.ingredients.items())) for r in book.get_recipes(item)],
        )
        got = (
            recipes.can_craft(item),
            recipes.is_base_item(item),
            recipes.get_crafting_depth(item),
            recipes.get_recipes(item),
        )
        if got != expected:
            raise RuntimeError(f"recipes.json answers {got!r} for {item}, the environment {expected!r}")
    named = {i for rs in book.recipes.values() for r in rs for i in r.ingredients if i.startswith(TAG_PREFIX)}
    for tag in sorted(named):
        if recipes.get_tag_members(tag) != book.get_tag_members(tag):
            raise RuntimeError(f"recipes.json's members of {tag} differ from the environment's")


# ---------------------------------------------------------------------------------------------- one task


def _solution(
    spec: Mapping[str, Any], task: game.Task, recipes: game.Book, where: str
) -> tuple[list[dict[str, Any]], str]:
    """The gold trajectory as game commands (a tag ingredient resolved to the first member held in enough quantity
    and not already used in the step), played with the game: (craft arguments, finish message). ValueError when a
    step cannot be written or the played solution does not score 1."""
    played = game.Game(task, recipes)
    crafts: list[dict[str, Any]] = []
    log: list[str] = []
    for number, step in enumerate(spec["misc"]["gold_trajectory"], 1):
        item, total = step["target"][0], step["result_count"]
        ingredients: dict[str, int] = {}
        for name, amount in step["ingredients"].items():
            if name.startswith(TAG_PREFIX):
                member = next(
                    (
                        m
                        for m in recipes.get_tag_members(name)
                        if played.inventory.get(m, 0) >= amount
                        and m not in ingredients
                        and m not in step["ingredients"]
                    ),
                    None,
                )
                if member is None:
                    raise ValueError(
                        f"{where}: gold step {number} needs {amount} of {name} and no held item covers it"
                    )
                name = member
            ingredients[name] = amount
        arguments = {"ingredients": ingredients, "target": [item, total]}
        text, ok, record = played.run("craft", arguments)
        if not ok:
            raise ValueError(f"{where}: gold step {number} fails in the game: {text}")
        crafts.append(arguments)
        log.append(record)
    message = "Crafted " + ", ".join(f"{count}x {item}" for item, count in task.targets.items())
    log.append(played.run("finish", {"message": message})[2])
    verdict = game.finish_verdict(
        {}, game.replay(task, recipes, "".join(f"{r}\n" for r in log).encode("ascii"))
    )
    if verdict.get("reward") != 1.0:
        raise ValueError(f"{where}: the solution does not score 1 ({verdict['reason']})")
    return crafts, message


def _solve_sh(name: str, crafts: Iterable[Mapping[str, Any]], message: str) -> str:
    lines = [
        "#!/bin/bash",
        f"# The gold solution of {name}: the shipped task's gold trajectory, played with the game by the export.",
        "set -euo pipefail",
        "if ! command -v textcraft >/dev/null 2>&1; then",
        '  textcraft() { python3 -I "${PLATOON_SANDBOX_ROOT:-}/app/textcraft/textcraft_game.py" "$@"; }',
        "fi",
    ]
    for craft in crafts:
        item, total = craft["target"]
        words = [
            "textcraft",
            "craft",
            item,
            str(total),
            *(f"{n}={a}" for n, a in craft["ingredients"].items()),
        ]
        lines.append(" ".join(shlex.quote(w) for w in words))
    lines.append(f"textcraft finish {shlex.quote(message)}")
    return "\n".join(lines) + "\n"


def _instruction(goal: str, synth: bool) -> str:
    text = (TEMPLATES / "instruction.md").read_text(encoding="utf-8")
    if synth:
        craft, info, note = "textcraft craft m2_i2 2 m0_i1=2 m1_i1=1", "textcraft info m2_i2 raw_m0", ""
    else:
        craft, info = "textcraft craft stick 4 oak_planks=2", "textcraft info stick oak_planks"
        note = (
            '   A tag ingredient is shown as {"tag:X": {"count": N, "use_one_of": [...]}}: provide a CONCRETE item '
            "from that category, in that count.\n"
        )
    replaced = {"@@GOAL@@": goal, "@@CRAFT_EXAMPLE@@": craft, "@@INFO_EXAMPLE@@": info, "@@TAG_NOTE@@": note}
    for placeholder, value in replaced.items():
        text = text.replace(placeholder, value)
    return text


def _dockerfiles(name: str, task_sha256: str) -> tuple[str, str]:
    head = f"# {name}: task.json sha256:{task_sha256}\nFROM {BASE_IMAGE}\n{IMAGE_RUN}\nWORKDIR /app\n"
    environment = (
        head + "ENV TEXTCRAFT_DIR=/app/textcraft\n"
        "COPY textcraft_game.py recipes.json /app/textcraft/\n"
        "COPY task.json /app/textcraft/\n"
    )
    tests = head + "COPY test.sh textcraft_game.py recipes.json task.json /tests/\n"
    return environment, tests


def _task_files(
    v: Variant,
    spec: Mapping[str, Any],
    split: str,
    index: int,
    split_index: int | None,
    recipes_bytes: bytes,
    recipes: game.Book,
) -> tuple[ExportedTask, dict[str, bytes]]:
    misc = spec["misc"]
    difficulty = misc.get("difficulty") if v.synth else None
    label = f"{split}-{difficulty}" if difficulty else split
    name = f"{v.world}/{label}-{index:05d}"
    directory = f"tasks/{v.world}-{label}-{index:05d}"
    targets = dict(misc["target_items"])
    task_doc = {
        "format": game.TASK_FORMAT,
        "name": name,
        "world": v.world,
        "goal": spec["goal"],
        "target_items": targets,
        "initial_inventory": dict(misc["initial_inventory"]),
        "recipes_sha256": hashlib.sha256(recipes_bytes).hexdigest(),
    }
    task_bytes = json_text(task_doc).encode("ascii")
    task = game.Task(json.loads(task_bytes), task_doc["recipes_sha256"])
    crafts, message = _solution(spec, task, recipes, f"{split} {index}")
    max_depth = misc.get("max_depth")
    if max_depth is None:
        max_depth = max(recipes.get_crafting_depth(item) for item in targets)
    goal = spec["goal"]
    detail = f"{difficulty}, crafting depth {max_depth}" if difficulty else f"crafting depth {max_depth}"
    metadata: dict[str, Any] = {"environment": v.environment, "split": split}
    if difficulty:
        metadata["difficulty"] = difficulty
    metadata.update(
        max_depth=max_depth,
        num_craft_steps=misc.get("num_craft_steps", len(misc["gold_trajectory"])),
        goal=goal,
        source_task_id=spec["id"],
        env_task_id=f"{split}:{index}",
    )
    if difficulty:
        metadata["env_split_task_id"] = f"{label}:{split_index}"
    agent_timeout = float(math.ceil((600 + 10 * len(crafts)) / 60) * 60)
    task_toml = toml_text(
        {"schema_version": "1.4", "artifacts": ["/app/textcraft/actions.jsonl"]},
        [
            (
                "task",
                {
                    "name": name,
                    "description": f"{v.title}: {goal[:1].lower()}{goal[1:]} ({detail})",
                    "keywords": KEYWORDS if v.synth else [k for k in KEYWORDS if k != "textcraft-synth"],
                },
            ),
            ("metadata", metadata),
            ("verifier", {"environment_mode": "separate", "timeout_sec": 180.0}),
            ("agent", {"timeout_sec": agent_timeout}),
            (
                "environment",
                {
                    "network_mode": "no-network",
                    "cpus": 1,
                    "memory_mb": 2048,
                    "gpus": 0,
                    "build_timeout_sec": 900.0,
                },
            ),
        ],
    )
    environment_dockerfile, tests_dockerfile = _dockerfiles(name, hashlib.sha256(task_bytes).hexdigest())
    game_bytes = GAME_FILE.read_bytes()
    files = {
        "task.toml": task_toml.encode("ascii"),
        "instruction.md": _instruction(goal, v.synth).encode("utf-8"),
        "environment/Dockerfile": environment_dockerfile.encode("ascii"),
        "environment/textcraft_game.py": game_bytes,
        "environment/recipes.json": recipes_bytes,
        "environment/task.json": task_bytes,
        "tests/test.sh": (TEMPLATES / "test.sh").read_bytes(),
        "tests/Dockerfile": tests_dockerfile.encode("ascii"),
        "tests/textcraft_game.py": game_bytes,
        "tests/recipes.json": recipes_bytes,
        "tests/task.json": task_bytes,
        "solution/solve.sh": _solve_sh(name, crafts, message).encode("ascii"),
    }
    exported = ExportedTask(
        name=name,
        path=directory,
        split=split,
        index=index,
        difficulty=difficulty,
        digest=content_digest(files),
        crafts=len(crafts),
        metadata=metadata,
    )
    return exported, files


# ---------------------------------------------------------------------------------------------- dataset


def _description(v: Variant, split: str, tasks: Sequence[ExportedTask]) -> str:
    text = f"{v.title} {split} split: {len(tasks):,} crafting task{'s' if len(tasks) != 1 else ''}"
    if v.synth:
        counts = [(d, sum(t.difficulty == d for t in tasks)) for d in DIFFICULTY_ORDER]
        text += " (" + ", ".join(f"{n:,} {d}" for d, n in counts) + ")"
    return text


def export_dataset(
    out: str | os.PathLike[str],
    *,
    variant: str = "synth",
    version: str = "1.0",
    splits: Sequence[str] | None = None,
    limit: int | None = None,
    repo_id: str = DEFAULT_REPO_ID,
    source_revision: str | None = None,
    force: bool = False,
    log: Callable[[str], None] | None = None,
) -> list[ExportedTask]:
    """Write the Harbor dataset of `variant` to `out` (a new directory; `force` replaces one) and return its tasks.

    `splits` names base splits (default all), `limit` keeps the first N tasks of each. Nothing in the output
    depends on time, host or directory order. Raises FileExistsError for an existing `out` without `force`,
    ValueError for unknown splits or a task whose solution cannot be written or does not score 1.
    """
    v = VARIANTS.get(variant)
    if v is None:
        raise ValueError(f"unknown variant {variant!r}; one of {list(VARIANTS)}")
    chosen = list(v.splits) if splits is None else list(splits)
    unknown = [s for s in chosen if s not in v.splits]
    if unknown:
        raise ValueError(f"unknown splits {unknown}; {v.environment} has {list(v.splits)}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    out = Path(out)
    if (out.exists() or out.is_symlink()) and not force:
        raise FileExistsError(f"{out} exists; pass force=True (--force) to replace it")

    book = v.book()
    recipes_bytes = recipes_document(book, v.world).encode("ascii")
    recipes_sha256 = hashlib.sha256(recipes_bytes).hexdigest()
    if v.synth and recipes_sha256 != RECIPES_SHA256:
        raise RuntimeError(
            f"the synthetic world's recipes.json hashes to {recipes_sha256}, not {RECIPES_SHA256}"
        )
    recipes = game.Book(json.loads(recipes_bytes))
    check_book(recipes, book)

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.{uuid.uuid4().hex[:8]}.tmp"
    staging.mkdir()
    try:
        writer = _Writer(staging)
        by_split: dict[str, list[ExportedTask]] = {}
        for split in chosen:
            specs = v.tasks(split)
            seen: dict[str, int] = {}
            exported: list[ExportedTask] = []
            for index, spec in enumerate(specs):
                difficulty = spec["misc"].get("difficulty") if v.synth else None
                split_index = seen.get(difficulty or "", 0)
                seen[difficulty or ""] = split_index + 1
                if limit is not None and index >= limit:
                    break
                task, files = _task_files(v, spec, split, index, split_index, recipes_bytes, recipes)
                for relative, data in files.items():
                    writer.write(f"{task.path}/{relative}", data, executable=relative.endswith(".sh"))
                exported.append(task)
            by_split[split] = exported
            if log is not None:
                log(f"{split}: {len(exported)} tasks")
        tasks = [task for split in chosen for task in by_split[split]]
        registry = [
            {
                "name": f"{v.world}-{split}",
                "version": version,
                "description": _description(v, split, by_split[split]),
                "tasks": [{"name": t.name, "path": t.path} for t in by_split[split]],
            }
            for split in chosen
        ]
        index_rows = {t.name: {**t.metadata, "task_path": t.path, "digest": t.digest} for t in tasks}
        split_lists: dict[str, list[str]] = {split: [t.name for t in by_split[split]] for split in chosen}
        if v.synth:
            for split in chosen:
                for difficulty in DIFFICULTY_ORDER:
                    names = [t.name for t in by_split[split] if t.difficulty == difficulty]
                    if names:
                        split_lists[f"{split}-{difficulty}"] = names
        sources = {v.source_files()[split]: _source_sha256(v.source_files()[split]) for split in chosen}
        writer.write("registry.json", json_text(registry).encode("ascii"))
        writer.write("task-index.json", json_text(index_rows, sort_keys=True).encode("ascii"))
        writer.write("splits.json", json_text(split_lists).encode("ascii"))
        writer.write("LICENSE", (TEMPLATES / "LICENSE").read_bytes())
        readme = card.dataset_card(
            v,
            by_split,
            version=version,
            repo_id=repo_id,
            source_revision=source_revision,
            sources=sources,
            recipes_sha256=recipes_sha256,
        )
        writer.write("README.md", readme.encode("utf-8"))
        if out.exists() or out.is_symlink():
            aside = out.parent / f".{out.name}.{uuid.uuid4().hex[:8]}.old"
            out.rename(aside)
            staging.rename(out)
            if aside.is_dir() and not aside.is_symlink():
                shutil.rmtree(aside)
            else:
                aside.unlink()
        else:
            staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return tasks


def _source_sha256(file_name: str) -> str:
    return hashlib.sha256((DATA_DIR / file_name).read_bytes()).hexdigest()
