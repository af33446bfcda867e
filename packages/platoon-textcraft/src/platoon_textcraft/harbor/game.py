#!/usr/bin/env python3
"""textcraft: the TextCraft game as one command, and its verifier (Python >= 3.8, standard library only).

The Harbor export of platoon-textcraft copies this file into every task as `textcraft_game.py`; `textcraft` in the
task image runs it. The game's state is its action log, `actions.jsonl` in `$TEXTCRAFT_DIR` (default: this file's
directory): under an exclusive flock each command replays the log from the task's starting inventory, runs, and
appends one compact ASCII record `{"seq","tool","args"}` (+ `"ok"` for a craft). The texts are those of
platoon-textcraft's ORS environment, character for character.

    textcraft craft TARGET COUNT ING=N ...   craft COUNT (the total produced) of TARGET
    textcraft info ITEM ...                  recipes and holdings (alias get_info)
    textcraft inventory                      the inventory (alias view_inventory)
    textcraft finish MESSAGE...              end the episode

Exit codes: 0 done, 1 game error (a rejected craft, a command after finish, a full log), 2 usage error (nothing
logged), 3 cannot play (task or recipes unloadable or mismatched, the log a symlink or not a regular file, or a log
that no longer replays).

`textcraft_game.py verify --task T --recipes R --root ROOT --log REL --out DIR` grades an episode: it trusts only
the task and recipes it is given, opens ROOT/REL without following any symlink, replays the log strictly (any
record this command could not have written fails the episode) and writes `reward.json` and
`textcraft-verdict.json` to DIR.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import re
import stat
import sys
from typing import Any

VERSION = "1.0"
LOG_NAME = "actions.jsonl"
MAX_LOG_BYTES = 33554432  # 32 MiB: the command never lets the log grow past this
RECIPES_FORMAT = "textcraft-recipes/1"
TASK_FORMAT = "textcraft-task/1"
TAG_PREFIX = "tag:"
TOOLS = ("craft", "get_info", "view_inventory", "finish")
RECORD_KEYS = {
    "craft": ["seq", "tool", "args", "ok"],
    "get_info": ["seq", "tool", "args"],
    "view_inventory": ["seq", "tool", "args"],
    "finish": ["seq", "tool", "args"],
}
ARG_KEYS = {
    "craft": ["ingredients", "target"],
    "get_info": ["items"],
    "view_inventory": [],
    "finish": ["message"],
}
FINISHED_ERROR = (
    "Error: the episode is finished (textcraft finish was called); no command is accepted after it"
)
FULL_ERROR = f"Error: the action log is full ({MAX_LOG_BYTES} bytes); no command is accepted"

USAGE = """\
usage: textcraft craft TARGET COUNT [INGREDIENT=N ...]
           craft COUNT of TARGET in total (a multiple of the recipe's yield) from exactly these ingredients
       textcraft craft --json '{"ingredients": {"ITEM": N, ...}, "target": ["ITEM", COUNT]}'
       textcraft info ITEM [ITEM ...]         recipes, depth and holdings of items (alias get_info; --json '[...]')
       textcraft inventory                    the inventory as JSON (alias view_inventory)
       textcraft finish MESSAGE...            end the episode; no command is accepted after it
       textcraft --version | --help"""

_INT = re.compile(r"-?[0-9]+\Z")


class CannotPlay(Exception):
    """The task, the recipes or the log cannot be used (exit 3; `verify`: cannot grade)."""


class UsageError(Exception):
    """A command line the game does not understand (exit 2; nothing logged)."""


class LogError(Exception):
    """The action log is not one this command wrote."""


# --------------------------------------------------------------------------------------------- the world


class Book:
    """A `textcraft-recipes/1` document: what the ORS environment's recipe database answers."""

    def __init__(self, document: Any) -> None:
        if not isinstance(document, dict) or document.get("format") != RECIPES_FORMAT:
            raise CannotPlay(f"the recipes are not a {RECIPES_FORMAT} document")
        try:
            self.name = str(document["name"])
            self.base_items = set(document["base_items"])
            self.depths = {str(k): int(v) for k, v in document["depths"].items()}
            self.tags = {str(k): [str(m) for m in v] for k, v in document["tags"].items()}
            self.recipes = {
                str(item): [
                    (int(r["result_count"]), [(str(name), int(n)) for name, n in r["ingredients"]])
                    for r in recipes
                ]
                for item, recipes in document["recipes"].items()
            }
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CannotPlay(f"the recipes document is malformed ({exc})") from None
        self.items = self.base_items | set(self.recipes)

    def can_craft(self, item: str) -> bool:
        return bool(self.recipes.get(item))

    def is_base_item(self, item: str) -> bool:
        return item in self.items and item not in self.recipes

    def get_recipes(self, item: str) -> list[tuple[int, list[tuple[str, int]]]]:
        return list(self.recipes.get(item, ()))

    def get_tag_members(self, tag: str) -> list[str]:
        name = tag[len(TAG_PREFIX) :] if tag.startswith(TAG_PREFIX) else tag
        return list(self.tags.get(name, ()))

    def get_crafting_depth(self, item: str) -> int:
        return self.depths.get(item, 0)


def _type_name(value: Any) -> str:
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def craft(book: Book, inventory: dict[str, int], ingredients: Any, target: Any) -> tuple[str, bool]:
    """Apply one craft to `inventory` in place: (the tool's text, whether it succeeded)."""
    if not isinstance(ingredients, dict):
        return f"Error: ingredients must be a dict, got {_type_name(ingredients)}", False
    if not isinstance(target, (tuple, list)) or len(target) != 2:
        return "Error: target must be a tuple of (item_name, count)", False
    item, total = target
    if not isinstance(item, str):
        return f"Error: target item must be a string, got {_type_name(item)}", False
    if not _is_int(total):
        return f"Error: target count must be an int, got {_type_name(total)}", False
    if total <= 0:
        return f"Error: target count must be positive, got {total}", False
    for name, amount in ingredients.items():
        if not isinstance(name, str):
            return f"Error: ingredient name must be a string, got {_type_name(name)}", False
        if not _is_int(amount):
            return f"Error: ingredient count for {name} must be an int, got {_type_name(amount)}", False
        if amount <= 0:
            return f"Error: ingredient count for {name} must be positive, got {amount}", False
    recipes = book.get_recipes(item)
    if not recipes:
        return f"Error: No recipe found for {item}", False
    errors = []
    for number, (result_count, needs) in enumerate(recipes, 1):
        problem, used = _match(book, result_count, needs, ingredients, inventory, total)
        if problem is None:
            for name, amount in used.items():
                inventory[name] -= amount
                if inventory[name] == 0:
                    del inventory[name]
            inventory[item] = inventory.get(item, 0) + total
            return f"Successfully crafted {total} {item}(s)", True
        errors.append(f"Recipe {number}: {problem}")
    head = f"Error: All {len(recipes)} recipe(s) failed for {item}. Errors:\n"
    return head + "\n".join(errors), False


def _match(
    book: Book,
    result_count: int,
    needs: list[tuple[str, int]],
    provided: dict[str, int],
    inventory: dict[str, int],
    total: int,
) -> tuple[str | None, dict[str, int]]:
    if total % result_count:
        return f"Target count {total} is not divisible by recipe result count {result_count}", {}
    crafts = total // result_count
    used: dict[str, int] = {}
    for name, count in needs:
        need = count * crafts
        if name.startswith(TAG_PREFIX):
            members = book.get_tag_members(name)
            chosen = next((p for p, n in provided.items() if p in members and n == need), None)
            if chosen is None:
                return f"No ingredient provided for {name}. Expected one of: {members}", {}
            used[chosen] = need
        elif name not in provided:
            return f"Missing required ingredient {name}", {}
        elif provided[name] != need:
            return f"Wrong amount of {name}. Need {need}, provided {provided[name]}", {}
        else:
            used[name] = need
    extra = [name for name in provided if name not in used]
    if extra:
        return "Extra ingredients not required: {}".format(", ".join(extra)), {}
    short = [f"{n}: need {a}, have {inventory.get(n, 0)}" for n, a in used.items() if inventory.get(n, 0) < a]
    if short:
        return "Insufficient ingredients in inventory: {}".format(", ".join(short)), {}
    return None, used


def item_info(book: Book, inventory: dict[str, int], items: list[str]) -> list[dict[str, Any]]:
    """`get_info`'s list for `items`."""
    info = []
    for item in items:
        recipes = []
        for result_count, needs in book.get_recipes(item):
            shown: dict[str, Any] = {}
            for name, count in needs:
                if name.startswith(TAG_PREFIX):
                    shown[name] = {"count": count, "use_one_of": book.get_tag_members(name)}
                else:
                    shown[name] = count
            recipes.append({"ingredients": shown, "result_count": result_count})
        info.append(
            {
                "item": item,
                "can_craft": book.can_craft(item),
                "is_base": book.is_base_item(item),
                "in_inventory": inventory.get(item, 0),
                "crafting_depth": book.get_crafting_depth(item),
                "recipes": recipes,
            }
        )
    return info


# ---------------------------------------------------------------------------------------- task and files


class Task:
    """A `textcraft-task/1` document: the targets and the starting inventory (in the task's own order)."""

    def __init__(self, document: Any, recipes_sha256: str) -> None:
        if not isinstance(document, dict) or document.get("format") != TASK_FORMAT:
            raise CannotPlay(f"the task is not a {TASK_FORMAT} document")
        try:
            self.name = str(document["name"])
            self.goal = str(document["goal"])
            self.targets = {str(k): int(v) for k, v in document["target_items"].items()}
            self.initial = {str(k): int(v) for k, v in document["initial_inventory"].items()}
            expected = str(document["recipes_sha256"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CannotPlay(f"the task document is malformed ({exc})") from None
        if expected != recipes_sha256:
            raise CannotPlay(f"the recipes' sha256 {recipes_sha256} is not the task's {expected}")


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise CannotPlay(f"cannot read the {what} {path}: {exc.strerror or exc}") from None


def load_world(task_path: str, recipes_path: str) -> tuple[Task, Book]:
    """The task and its recipes; the recipes must hash to the sha256 the task names."""
    raw = _read(recipes_path, "recipes")
    try:
        book = Book(json.loads(raw.decode("utf-8")))
        task_doc = json.loads(_read(task_path, "task").decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CannotPlay(f"not JSON: {exc}") from None
    return Task(task_doc, hashlib.sha256(raw).hexdigest()), book


# --------------------------------------------------------------------------------- the log and its replay


def dump_record(record: dict[str, Any]) -> str:
    """A log record as the command writes it: compact ASCII JSON, one line."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=True)


def _strict_json(text: str) -> Any:
    """JSON without duplicate keys, NaN or infinities."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise LogError(f"duplicate key {json.dumps(key)}")
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise LogError(f"{name} is not a JSON number")

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise LogError(f"{text} is not a finite number")
        return value

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_float=number)
    except LogError:
        raise
    except ValueError as exc:  # JSONDecodeError, and integers too long to convert
        raise LogError(f"not JSON ({exc})") from None


class Game:
    """The state the log describes: the inventory, how many records and crafts, whether finish was called."""

    def __init__(self, task: Task, book: Book) -> None:
        self.task = task
        self.book = book
        self.inventory = dict(task.initial)
        self.records = 0
        self.crafts = 0
        self.finished = False
        self.message: str | None = None

    def run(self, tool: str, args: dict[str, Any]) -> tuple[str, bool, str]:
        """Run one command: (its text, ok, the record line to log). The caller checks `finished` first."""
        record: dict[str, Any] = {"seq": self.records + 1, "tool": tool, "args": args}
        ok = True
        if tool == "craft":
            text, ok = craft(self.book, self.inventory, args["ingredients"], args["target"])
            record["ok"] = ok
            self.crafts += ok
        elif tool == "get_info":
            text = json.dumps(item_info(self.book, self.inventory, args["items"]))
        elif tool == "view_inventory":
            text = json.dumps(dict(self.inventory))
        else:
            text = args["message"]
            self.finished = True
            self.message = args["message"]
        self.records += 1
        return text, ok, dump_record(record)

    def replay_record(self, line: str) -> None:
        """Check one logged record strictly and apply it; LogError when the command could not have written it."""
        where = f"record {self.records + 1}"
        record = _strict_json(line)
        if not isinstance(record, dict):
            raise LogError(f"{where} is not an object")
        if self.finished:
            raise LogError(f"{where} comes after finish")
        tool = record.get("tool")
        if tool not in TOOLS:
            raise LogError(f"{where} names no tool of the game")
        if list(record) != RECORD_KEYS[tool]:
            raise LogError(f"{where} has the keys {list(record)} (a {tool} record has {RECORD_KEYS[tool]})")
        seq = record["seq"]
        if not _is_int(seq) or seq != self.records + 1:
            raise LogError(f"{where} has seq {json.dumps(seq)}")
        args = record["args"]
        if not isinstance(args, dict) or list(args) != ARG_KEYS[tool]:
            raise LogError(f"{where} has arguments the command never writes")
        if tool == "get_info" and not (
            isinstance(args["items"], list) and all(isinstance(item, str) for item in args["items"])
        ):
            raise LogError(f"{where}: get_info items must be a list of names")
        if tool == "finish" and not isinstance(args["message"], str):
            raise LogError(f"{where}: the finish message must be a string")
        if tool == "craft" and not isinstance(record["ok"], bool):
            raise LogError(f"{where}: ok must be true or false")
        if dump_record(record) != line:
            raise LogError(f"{where} is not written as the command writes it")
        text, ok, _ = self.run(tool, args)
        if tool == "craft" and ok != record["ok"]:
            claimed = "succeeded" if record["ok"] else "failed"
            raise LogError(
                "{} claims a craft {} that the rules answer: {}".format(where, claimed, text.split("\n")[0])
            )


def replay(task: Task, book: Book, data: bytes, game: Game | None = None) -> Game:
    """The game after every record of `data` (the whole log); LogError at the first record the game refuses
    (`game`, when given, is the one replayed, so its counts say how far the replay went)."""
    game = Game(task, book) if game is None else game
    if len(data) > MAX_LOG_BYTES:
        raise LogError(f"the log is larger than {MAX_LOG_BYTES} bytes")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise LogError("the log is not ASCII") from None
    if text and not text.endswith("\n"):
        raise LogError("the last record is not a whole line")
    for line in text.split("\n")[:-1]:
        game.replay_record(line)
    return game


# ---------------------------------------------------------------------------------------- the command


def _int_argument(text: str, what: str) -> int:
    if not _INT.match(text):
        raise UsageError(f"{what} must be an integer, got {text!r}")
    return int(text)


def _json_argument(text: str) -> Any:
    try:
        return _strict_json(text)
    except LogError as exc:
        raise UsageError(f"--json: {exc}") from None


def parse_command(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """(tool, arguments) of a command line; UsageError when it is not one."""
    command, rest = argv[0], argv[1:]
    if command == "craft":
        if rest[:1] == ["--json"]:
            if len(rest) != 2:
                raise UsageError("craft --json takes one JSON object")
            value = _json_argument(rest[1])
            if not isinstance(value, dict) or sorted(value) != ["ingredients", "target"]:
                raise UsageError('craft --json needs an object with exactly "ingredients" and "target"')
            return "craft", {"ingredients": value["ingredients"], "target": value["target"]}
        if len(rest) < 2:
            raise UsageError("craft needs TARGET and COUNT")
        ingredients: dict[str, int] = {}
        for word in rest[2:]:
            name, sep, amount = word.partition("=")
            if not sep or not name:
                raise UsageError(f"an ingredient is INGREDIENT=N, got {word!r}")
            if name in ingredients:
                raise UsageError(f"the ingredient {name} is given twice")
            ingredients[name] = _int_argument(amount, f"the amount of {name}")
        return "craft", {"ingredients": ingredients, "target": [rest[0], _int_argument(rest[1], "COUNT")]}
    if command in ("info", "get_info"):
        if rest[:1] == ["--json"]:
            if len(rest) != 2:
                raise UsageError("info --json takes one JSON list")
            items = _json_argument(rest[1])
            if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
                raise UsageError("info --json needs a list of item names")
            return "get_info", {"items": items}
        if not rest:
            raise UsageError("info needs at least one ITEM")
        return "get_info", {"items": list(rest)}
    if command in ("inventory", "view_inventory"):
        if rest:
            raise UsageError("inventory takes no arguments")
        return "view_inventory", {}
    if command == "finish":
        message = " ".join(rest)
        if not message:
            raise UsageError("finish needs a MESSAGE")
        return "finish", {"message": message}
    raise UsageError(f"unknown command {command!r}")


def _open_log(path: str) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CannotPlay(f"the action log {path} is a symlink") from None
        raise CannotPlay(f"cannot open the action log {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CannotPlay(f"the action log {path} is not a regular file")
    return fd


def _read_fd(fd: int, limit: int) -> bytes:
    chunks = []
    size = 0
    offset = 0
    while size <= limit:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def play(argv: list[str]) -> int:
    """One `textcraft` command: replay the log under the lock, run, log, print."""
    try:
        tool, args = parse_command(argv)
    except UsageError as exc:
        sys.stderr.write(f"textcraft: {exc}\n{USAGE}\n")
        return 2
    directory = os.environ.get("TEXTCRAFT_DIR") or os.path.dirname(os.path.abspath(__file__))
    recipes = os.environ.get("TEXTCRAFT_RECIPES") or os.path.join(directory, "recipes.json")
    try:
        task, book = load_world(os.path.join(directory, "task.json"), recipes)
        fd = _open_log(os.path.join(directory, LOG_NAME))
    except CannotPlay as exc:
        sys.stderr.write(f"textcraft: cannot play: {exc}\n")
        return 3
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = _read_fd(fd, MAX_LOG_BYTES)
        try:
            game = replay(task, book, data)
        except LogError as exc:
            sys.stderr.write(f"textcraft: cannot play: the action log no longer replays: {exc}\n")
            return 3
        if game.finished:
            print(FINISHED_ERROR)
            return 1
        text, ok, line = game.run(tool, args)
        record = (line + "\n").encode("ascii")
        if len(data) + len(record) > MAX_LOG_BYTES:
            print(FULL_ERROR)
            return 1
        written = 0
        while written < len(record):  # the record is on disk before its answer is shown
            written += os.write(fd, record[written:])
    finally:
        os.close(fd)  # also releases the lock
    print(text)
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------- the verifier


def _open_below(root: str, relative: str) -> int | None:
    """A read-only fd of ROOT/RELATIVE reached through no symlink; None when it does not exist."""
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise CannotPlay("--log must be a relative path below --root without '..'")
    directory = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for number, part in enumerate(parts):
            last = number == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            flags |= os.O_NONBLOCK if last else getattr(os, "O_DIRECTORY", 0)
            where = "/".join(parts[: number + 1])
            try:
                fd = os.open(part, flags, dir_fd=directory)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return None
                try:  # O_NOFOLLOW | O_DIRECTORY on a symlink says ENOTDIR: tell a symlink apart
                    link = stat.S_ISLNK(os.stat(part, dir_fd=directory, follow_symlinks=False).st_mode)
                except OSError:
                    link = False
                if link or exc.errno == errno.ELOOP:
                    raise LogError(f"{where} is a symlink") from None
                if exc.errno == errno.ENOTDIR:
                    raise LogError(f"{where} is not a directory") from None
                raise LogError(f"{where} cannot be opened: {exc.strerror}") from None
            os.close(directory)
            directory = fd
        if not stat.S_ISREG(os.fstat(directory).st_mode):
            raise LogError(f"{relative} is not a regular file")
        fd, directory = directory, -1
        return fd
    finally:
        if directory >= 0:
            os.close(directory)


def grade(task: Task, book: Book, root: str, relative: str) -> dict[str, Any]:
    """The verdict on the log at ROOT/RELATIVE: reward, reason, counts."""
    verdict: dict[str, Any] = {
        "reward": 0.0,
        "task": task.name,
        "version": VERSION,
        "records": 0,
        "crafts": 0,
        "finished": False,
        "log_bytes": 0,
        "reason": "",
    }
    try:
        fd = _open_below(root, relative)
        if fd is None:
            verdict["reason"] = "no action log: no textcraft command ran"
            return verdict
        try:
            size = os.fstat(fd).st_size
            verdict["log_bytes"] = size
            if size > MAX_LOG_BYTES:
                raise LogError(f"the log is larger than {MAX_LOG_BYTES} bytes")
            data = _read_fd(fd, MAX_LOG_BYTES)
        finally:
            os.close(fd)
        verdict["log_bytes"] = len(data)
        game = Game(task, book)
        try:
            replay(task, book, data, game)
        finally:
            verdict["records"], verdict["crafts"] = game.records, game.crafts
    except LogError as exc:
        verdict["reason"] = f"the action log is not one the game wrote: {exc}"
        return verdict
    return finish_verdict(verdict, game)


def finish_verdict(verdict: dict[str, Any], game: Game) -> dict[str, Any]:
    """Fill in the verdict of a log that replayed: the reward rule (gain over the starting inventory)."""
    verdict.update(records=game.records, crafts=game.crafts, finished=game.finished)
    if not game.finished:
        verdict["reason"] = "the episode did not end with textcraft finish"
        return verdict
    if not game.message:
        verdict["reason"] = "finished with an empty message"
        return verdict
    missing = {}
    for item, count in game.task.targets.items():
        gain = game.inventory.get(item, 0) - game.task.initial.get(item, 0)
        if gain < count:
            missing[item] = count - gain
    if missing or not game.task.targets:
        verdict["reason"] = "finished without every target crafted"
        verdict["missing_items"] = missing
        return verdict
    verdict["reward"] = 1.0
    verdict["reason"] = "finished with every target crafted"
    return verdict


def _write_atomically(directory: str, name: str, text: str) -> None:
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="ascii") as handle:
        handle.write(text)
    os.replace(temporary, os.path.join(directory, name))


def verify(argv: list[str]) -> int:
    """`verify`: grade the episode with the trusted task and recipes; exit 1 only when it cannot grade."""
    import argparse

    parser = argparse.ArgumentParser(prog="textcraft_game.py verify")
    for option in ("--task", "--recipes", "--root", "--log", "--out"):
        parser.add_argument(option, required=True)
    options = parser.parse_args(argv)
    try:
        task, book = load_world(options.task, options.recipes)
        verdict = grade(task, book, options.root, options.log)
        _write_atomically(options.out, "textcraft-verdict.json", json.dumps(verdict, indent=1) + "\n")
        _write_atomically(options.out, "reward.json", json.dumps({"reward": verdict["reward"]}) + "\n")
    except (CannotPlay, OSError) as exc:
        sys.stderr.write(f"textcraft verify: cannot grade: {exc}\n")
        return 1
    print(
        "reward {}: {} ({} records, {} crafts)".format(
            verdict["reward"], verdict["reason"], verdict["records"], verdict["crafts"]
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write(f"textcraft: no command\n{USAGE}\n")
        return 2
    if args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if args[0] == "--version":
        print(f"textcraft {VERSION}")
        return 0
    if args[0] == "verify":
        return verify(args[1:])
    return play(args)


if __name__ == "__main__":
    sys.exit(main())
