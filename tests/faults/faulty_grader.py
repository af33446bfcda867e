"""An ORS environment whose grader fails on purpose, one way per task, for the guarantee sheet.

`train` lists every task, `graded` only the graded ones. Imported in process (`python://faulty_grader:FaultyGrader`) or served by the openreward SDK's own server
(`python faulty_grader.py PORT`). Its `answer` tool grades the bandit's one-letter answer:

- `graded-*`: graded 0 then 1 (then 0 ...) for each task whatever the answer, so a group of two always has
  something to learn;
- `raises`: the grader raises;
- `hangs`: the grader never answers;
- `offline`: the grader's own service is gone (a connection refused on the loopback).
"""

import asyncio
import collections
import socket
import sys

from openreward.environments import Environment, Server, TextBlock, ToolOutput, tool
from pydantic import BaseModel

GRADED = [f"graded-{n}" for n in range(5)]
FAULTS = ["raises", "hangs", "offline"]
_graded_calls: collections.Counter[str] = collections.Counter()


def _closed_port() -> int:
    """A loopback port nothing listens on: the grader's database, gone."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Answer(BaseModel):
    letter: str


class FaultyGrader(Environment):
    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "graded"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, str]]:
        return [{"id": task} for task in (GRADED if split == "graded" else GRADED + FAULTS)]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Answer with one letter.")]

    @tool
    async def answer(self, params: Answer) -> ToolOutput:
        """Submit the answer."""
        task = self.task_spec["id"]
        if task == "raises":
            raise RuntimeError("grader crashed")
        if task == "hangs":
            await asyncio.Event().wait()
        if task == "offline":
            socket.create_connection(("127.0.0.1", _closed_port()), timeout=10).close()
        reward = float(_graded_calls[task] % 2)
        _graded_calls[task] += 1
        return ToolOutput(blocks=[TextBlock(text="graded")], reward=reward, finished=True)


if __name__ == "__main__":
    Server([FaultyGrader]).run(host="127.0.0.1", port=int(sys.argv[1]))
