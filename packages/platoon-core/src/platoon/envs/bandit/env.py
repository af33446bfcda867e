"""`BanditEnvironment`: "answer with one letter: A, B, C or D", where only `C` scores 1 (`platoon-bandit@1`).

Tasks are the 24 orders in which the prompt can list the four letters (split `train`) and the first four of them
again under `val` ids; the answer is `C` in every task. The class is built on first access so importing this module
does not import the openreward SDK; no `from __future__ import annotations`: the SDK reads tool signatures with
`get_type_hints`, which needs the real classes.
"""

import functools
import itertools
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    # Built on first access by the module's __getattr__.
    BanditEnvironment: type

__all__ = ["ANSWER", "LETTERS", "BanditEnvironment", "score", "task_specs"]

LETTERS = "ABCD"
ANSWER = "C"
SPLITS = ("train", "val")
VAL_TASKS = 4


def score(letter: str) -> float:
    """1.0 for the answer (surrounding whitespace ignored), else 0.0."""
    return 1.0 if letter.strip() == ANSWER else 0.0


@functools.cache
def task_specs(split: str) -> tuple[dict[str, Any], ...]:
    """The ORS task specs of `split` (`train`: 24, `val`: 4)."""
    if split not in SPLITS:
        raise ValueError(f"the bandit has no split {split!r} (splits: train, val)")
    orders = ["".join(order) for order in itertools.permutations(LETTERS)]
    if split == "val":
        orders = orders[:VAL_TASKS]
    return tuple(
        {
            "goal": f"Answer with one letter: {order[0]}, {order[1]}, {order[2]} or {order[3]}.",
            "id": f"bandit.{split}.{i}",
            "max_steps": 1,
            "misc": {"order": order},
        }
        for i, order in enumerate(orders)
    )


_build_lock = threading.Lock()


@functools.cache
def _build() -> type:
    from openreward.environments import Environment, Split, TextBlock, ToolOutput, terminal, tool
    from pydantic import BaseModel, Field

    class AnswerInput(BaseModel):
        letter: str = Field(description="The one-letter answer.")

    class BanditEnvironment(Environment):
        """Answer with one letter; `C` scores 1, anything else 0. The first answer ends the episode."""

        @classmethod
        def list_splits(cls) -> list[Split]:
            return [Split(name="train", type="train"), Split(name="val", type="validation")]

        @classmethod
        def list_tasks(cls, split: str) -> list[dict[str, Any]]:
            return list(task_specs(split))

        def get_prompt(self) -> list[TextBlock]:
            goal = self.task_spec.get("goal")
            return [TextBlock(text=goal if isinstance(goal, str) and goal else "Answer with one letter.")]

        # The SDK's `@terminal`: the tool is kept from the model, harnesses submit the model's plain reply to it,
        # and an answer that raised is an infrastructure error, never a 0.
        @terminal
        @tool
        async def answer(self, params: AnswerInput) -> ToolOutput:
            """Submit the one-letter answer; the episode ends with reward 1 for the right letter, else 0."""
            reward = score(params.letter)
            text = "Correct." if reward else "Wrong."
            return ToolOutput(blocks=[TextBlock(text=text)], reward=reward, finished=True)

    BanditEnvironment.__module__ = __name__
    BanditEnvironment.__qualname__ = "BanditEnvironment"
    AnswerInput.__module__ = __name__
    return BanditEnvironment


def __getattr__(name: str) -> Any:
    if name == "BanditEnvironment":
        with _build_lock:
            return _build()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
