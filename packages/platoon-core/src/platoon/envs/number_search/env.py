"""`NumberSearchEnvironment`: guess a hidden integer, told "too low" / "too high".

Tasks are generated once per process, lazily, from `random.Random(42)`: each draw takes a target uniformly in
0..1024, then `low` uniformly below it and `high` uniformly above it (both within 0..1024; at the ends of the range,
where nothing lies below or above, `low` or `high` equals the target). Repeated triples are skipped. Each new triple
goes to `val` when `int(sha256("42:<low>:<target>:<high>").hexdigest()[:8], 16) / 0xFFFFFFFF < 1000 / 51000` (the
val share of all tasks), else to `train`; a triple whose split is already full is dropped, and drawing stops when
`train` holds 50,000 tasks and `val` 1,000. The order of a split is the order of the draws.

The class is built on first access (`NumberSearchEnvironment` is a lazy module attribute) so importing this module
does not import the openreward SDK. This module deliberately avoids `from __future__ import annotations`: the SDK
reads tool signatures with `get_type_hints`, which needs the real classes, not strings.
"""

import functools
import hashlib
import random
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    # Built on first access by the module's __getattr__.
    NumberSearchEnvironment: type

__all__ = [
    "MAX_TARGET",
    "SEED",
    "TRAIN_TASKS",
    "VAL_SHARE",
    "VAL_TASKS",
    "NumberSearchEnvironment",
    "generate_triples",
    "task_spec",
    "task_specs",
]

SEED = 42
TRAIN_TASKS = 50_000
VAL_TASKS = 1_000
MAX_TARGET = 1024
#: The share of val tasks among all tasks; the hash rule sends a triple to val below it.
VAL_SHARE = VAL_TASKS / (TRAIN_TASKS + VAL_TASKS)
FALLBACK_PROMPT = "Guess the correct number."
SPLITS = ("train", "val")


def is_val(low: int, target: int, high: int, *, seed: int = SEED) -> bool:
    """The split rule: the first 8 hex digits of sha256("<seed>:<low>:<target>:<high>") over 0xFFFFFFFF."""
    digest = hashlib.sha256(f"{seed}:{low}:{target}:{high}".encode()).hexdigest()
    return int(digest[:8], 16) / 0xFFFFFFFF < VAL_SHARE


@functools.cache
def generate_triples() -> dict[str, tuple[tuple[int, int, int], ...]]:
    """Every split's `(low, target, high)` triples, in task order (computed once per process)."""
    rng = random.Random(SEED)
    wanted = {"train": TRAIN_TASKS, "val": VAL_TASKS}
    out: dict[str, list[tuple[int, int, int]]] = {"train": [], "val": []}
    seen: set[tuple[int, int, int]] = set()
    while len(out["train"]) < TRAIN_TASKS or len(out["val"]) < VAL_TASKS:
        target = rng.randint(0, MAX_TARGET)
        low = rng.randint(0, target - 1) if target > 0 else target
        high = rng.randint(target + 1, MAX_TARGET) if target < MAX_TARGET else target
        triple = (low, target, high)
        if triple in seen:
            continue
        seen.add(triple)
        split = "val" if is_val(low, target, high) else "train"
        if len(out[split]) < wanted[split]:
            out[split].append(triple)
    return {split: tuple(triples) for split, triples in out.items()}


def task_spec(split: str, index: int) -> dict[str, Any]:
    """The ORS task spec of task `index` of `split`."""
    low, target, high = generate_triples()[split][index]
    return {
        "goal": f"Guess the correct number between {low} and {high}.",
        "id": f"number_search.{split}.{index}",
        "max_steps": 1,
        "misc": {"low": low, "high": high, "target": target},
    }


@functools.cache
def task_specs(split: str) -> tuple[dict[str, Any], ...]:
    """Every task spec of `split` (`train` or `val`)."""
    if split not in SPLITS:
        raise ValueError(f"number search has no split {split!r} (splits: train, val)")
    return tuple(task_spec(split, i) for i in range(len(generate_triples()[split])))


_build_lock = threading.Lock()


@functools.cache
def _build() -> type:
    from openreward.environments import Environment, Split, TextBlock, ToolOutput, tool
    from pydantic import BaseModel, Field

    class GuessInput(BaseModel):
        number: int = Field(description="The integer to guess.")

    class NumberSearchEnvironment(Environment):
        """Guess a hidden integer in a range; each wrong guess is answered "too low" or "too high"."""

        #: No terminal tool: `guess` ends the episode itself but is called many times; declaring none keeps
        #: platoon from learning it as terminal after a first win (which would hide it from subagents with
        #: `no_terminal` access). Any tool of an environment without a terminal tool may end the episode, so a
        #: `guess` that raised is an infrastructure error, never a 0.
        platoon_terminal_tools = ()

        def __init__(self, task_spec: dict[str, Any] = {}, secrets: dict[str, str] = {}) -> None:  # noqa: B006
            super().__init__(task_spec, secrets)
            misc = dict(task_spec.get("misc") or {})
            self.target = misc.get("target")

        @classmethod
        def list_splits(cls) -> list[Split]:
            return [Split(name="train", type="train"), Split(name="val", type="validation")]

        @classmethod
        def list_tasks(cls, split: str) -> list[dict[str, Any]]:
            return list(task_specs(split))

        def get_prompt(self) -> list[TextBlock]:
            goal = self.task_spec.get("goal")
            return [TextBlock(text=goal if isinstance(goal, str) and goal else FALLBACK_PROMPT)]

        @tool
        async def guess(self, params: GuessInput) -> ToolOutput:
            """Guess the hidden number; a wrong guess is answered with whether it is too low or too high."""
            number = params.number
            if number == self.target:
                text = f"You guessed the number {number} correctly!"
                return ToolOutput(blocks=[TextBlock(text=text)], reward=1.0, finished=True)
            hint = (
                "Too low, try again."
                if self.target is not None and number < self.target
                else "Too high, try again."
            )
            return ToolOutput(blocks=[TextBlock(text=hint)])

    NumberSearchEnvironment.__module__ = __name__
    NumberSearchEnvironment.__qualname__ = "NumberSearchEnvironment"
    GuessInput.__module__ = __name__
    return NumberSearchEnvironment


def __getattr__(name: str) -> Any:
    if name == "NumberSearchEnvironment":
        with _build_lock:
            return _build()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
