"""An ORS environment server for the remote-service tests: `python ors_server.py PORT MARK_DIR [CERT KEY]`.

It runs the openreward SDK's own server (`Server([...]).run`) on 127.0.0.1:PORT, or with CERT and KEY (PEM files)
the same app on uvicorn over TLS, with:

- `NumberSearchEnvironment`: platoon's number search, served as is;
- `GuessEnv`: an acceptance-style guessing environment (a `guess` tool giving hints and partial reward, a terminal
  `submit` grading the answer); a task's `grader` of `raise` or `hang` makes `submit` raise or never answer;
- `BanditEnvironment`: platoon's bandit (a terminal `answer`), for a training run.

Every environment instance marks itself live with a file `<MARK_DIR>/<PORT>-<id>` from construction to teardown,
so a test sees how many sessions the server holds (`/delete` and the server's reaper tear sessions down).
"""

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

from openreward.environments import Environment, Server, TextBlock, ToolOutput, terminal, tool
from pydantic import BaseModel

from platoon.envs.bandit import env as bandit
from platoon.envs.number_search import env as number_search

PORT = int(sys.argv[1]) if __name__ == "__main__" else 0
MARKS = Path(sys.argv[2]) if __name__ == "__main__" else Path(".")

GUESS_TASKS = [
    {"id": "seven", "target": 7},
    {"id": "two", "target": 2},
    {"id": "nine", "target": 9},
    {"id": "raises", "target": 4, "grader": "raise"},
    {"id": "hangs", "target": 4, "grader": "hang"},
]


class Marked:
    """Marks the instance live from construction to teardown."""

    def __init__(self, task_spec: dict[str, Any] = {}, secrets: dict[str, str] = {}) -> None:  # noqa: B006
        super().__init__(task_spec, secrets)  # type: ignore[call-arg]
        self._mark = MARKS / f"{PORT}-{uuid.uuid4().hex}" if PORT else None  # imported in process: no marks
        if self._mark is not None:
            self._mark.touch()

    async def teardown(self) -> None:
        if self._mark is not None:
            self._mark.unlink(missing_ok=True)


class NumberSearchEnvironment(Marked, number_search.NumberSearchEnvironment):  # type: ignore[misc,name-defined]
    pass


class Guess(BaseModel):
    number: int


class Answer(BaseModel):
    answer: str


class GuessEnv(Marked, Environment):
    """Guess the target between 0 and 9; `submit` (terminal) grades the answer."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return GUESS_TASKS

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Find the number between 0 and 9, then submit it.")]

    @tool
    async def guess(self, params: Guess) -> ToolOutput:
        """Guess a number: told higher, lower or right."""
        target = self.task_spec["target"]
        if params.number == target:
            return ToolOutput(blocks=[TextBlock(text="right")], reward=0.5)
        return ToolOutput(
            blocks=[TextBlock(text="higher" if params.number < target else "lower")], reward=0.0
        )

    @terminal
    @tool
    async def submit(self, params: Answer) -> ToolOutput:
        """Submit the final answer."""
        grader = self.task_spec.get("grader")
        if grader == "raise":
            raise RuntimeError("grader database unreachable")
        if grader == "hang":
            await asyncio.sleep(3600)
        reward = 1.0 if params.answer.strip() == str(self.task_spec["target"]) else 0.0
        return ToolOutput(blocks=[TextBlock(text="graded")], reward=reward, finished=True)


class BanditEnvironment(Marked, bandit.BanditEnvironment):  # type: ignore[misc,name-defined]
    pass


if __name__ == "__main__":
    server = Server([NumberSearchEnvironment, GuessEnv, BanditEnvironment])
    if len(sys.argv) > 3:  # CERT KEY: the same app over TLS (`Server.run` serves plain HTTP only)
        import uvicorn

        uvicorn.run(
            server.app,
            host="127.0.0.1",
            port=PORT,
            ssl_certfile=sys.argv[3],
            ssl_keyfile=sys.argv[4],
            timeout_keep_alive=60,
            access_log=False,
        )
    else:
        server.run(host="127.0.0.1", port=PORT)
