"""Real ORS classes through the real harnesses: an `exclusive` submit is offered to the model, `@terminal` is not.

No `from __future__ import annotations`: the SDK reads tool signatures with `get_type_hints`.
"""

from typing import Any

from openreward.environments import Environment, Split, TextBlock, ToolOutput, terminal, tool
from pydantic import BaseModel

from platoon.envs.ors import InProcessOrsService
from platoon.testing import tool_call
from platoon.testing.episode import run_episode


class Answer(BaseModel):
    answer: str


class _Quiz(Environment):
    @classmethod
    def list_splits(cls) -> list[Split]:
        return [Split(name="train", type="train")]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"goal": "What is 3 + 4?"}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="What is 3 + 4?")]

    def _grade(self, answer: str) -> ToolOutput:
        reward = 1.0 if answer.strip() == "7" else 0.0
        return ToolOutput(blocks=[TextBlock(text=f"graded {reward}")], reward=reward, finished=True)


class ExclusiveSubmitQuiz(_Quiz):
    @tool(exclusive=True)
    async def submit(self, params: Answer) -> ToolOutput:
        """Submit the answer."""
        return self._grade(params.answer)


class HiddenSubmitQuiz(_Quiz):
    @terminal
    @tool
    async def submit(self, params: Answer) -> ToolOutput:
        """Submit the answer."""
        return self._grade(params.answer)


def _offered_tools(prompt: str) -> list[str]:
    # the Qwen3 system prompt lists the offered tools one JSON per line between "<tools>\n" and "\n</tools>"
    tools = prompt.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0] if "<tools>\n" in prompt else ""
    return [name for name in ("submit",) if f'"name": "{name}"' in tools]


def test_an_exclusive_submit_is_terminal_yet_offered_to_the_model_which_calls_it():
    seen: list[list[str]] = []

    def policy(prompt: str) -> str:
        seen.append(_offered_tools(prompt))
        return tool_call("submit", {"answer": "7"})

    service = InProcessOrsService(ExclusiveSubmitQuiz)
    run = run_episode("train:0", service=service, harness="platoon-react", policy=policy)
    assert seen == [["submit"]]  # the model was offered the tool the environment offers
    assert run.outcome is not None and run.outcome["status"] == "scored"
    assert run.reward == 1.0


def test_the_sdk_terminal_tool_is_kept_from_the_model_and_receives_its_plain_reply():
    seen: list[list[str]] = []

    def policy(prompt: str) -> str:
        seen.append(_offered_tools(prompt))
        return "7"

    service = InProcessOrsService(HiddenSubmitQuiz)
    run = run_episode("train:0", service=service, harness="platoon-react", policy=policy)
    assert seen == [[]]
    assert run.outcome is not None and run.outcome["status"] == "scored"
    assert run.reward == 1.0
