"""ORS environment classes in process (`python://`): tasks, tools and hints, calls through the gate, grading, forks.

The environments here are written as a user would write them, with the real openreward SDK.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from typing import Any

import pytest
from openreward.environments import Environment, TextBlock, ToolOutput, terminal, tool
from pydantic import BaseModel

from platoon import plugins
from platoon.envs.ors.inprocess import InProcessOrsService, InProcessOrsSession, InvalidCall
from platoon.envs.service import EnvironmentService, EnvSession, EnvSetupError, Outcome
from platoon.task import Task

TASKS: dict[str, list[dict[str, Any]]] = {
    "train": [
        {"task_name": "small", "goal": "Guess a number between 1 and 10.", "target": 3, "misc": {"level": 1}},
        {"id": "big", "target": 70},
        {"target": 5},
    ],
    "test": [{"name": "only", "target": 1}],
}


class Guess(BaseModel):
    number: int


class Answer(BaseModel):
    answer: str


class Note(BaseModel):
    text: str


class GuessEnv(Environment):
    """Guess the target; `submit` (terminal) ends the episode with reward 1 or 0."""

    setups = 0

    def __init__(self, task_spec: dict[str, Any] = {}, secrets: dict[str, str] = {}) -> None:  # noqa: B006
        super().__init__(task_spec, secrets)
        self.target = task_spec["target"]
        self.secrets = dict(secrets)
        self.guesses: list[int] = []

    @classmethod
    def list_splits(cls) -> list[str]:
        return list(TASKS)

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return TASKS[split]

    def setup(self) -> None:
        type(self).setups += 1

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"Find the number (secret={self.secrets.get('token', '-')}).")]

    @tool
    async def guess(self, params: Guess) -> ToolOutput:
        """Guess a number."""
        self.guesses.append(params.number)
        if params.number == self.target:
            return ToolOutput(blocks=[TextBlock(text="right")], reward=0.5, metadata={"hits": 1})
        return ToolOutput(blocks=[TextBlock(text="wrong")], reward=0.0)

    @tool(concurrent=True)
    async def peek(self) -> ToolOutput:
        """How many guesses so far."""
        return ToolOutput(blocks=[TextBlock(text=str(len(self.guesses)))])

    @tool
    async def crash(self, params: Note) -> ToolOutput:
        """A tool that raises."""
        raise RuntimeError(f"crashed on {params.text}")

    @tool
    async def win(self) -> ToolOutput:
        """Finish the episode with reward 1 (a tool that ends it without being declared terminal)."""
        return ToolOutput(blocks=[TextBlock(text="won")], reward=1.0, finished=True)

    @terminal
    @tool
    async def submit(self, params: Answer) -> ToolOutput:
        """Submit the final answer."""
        if params.answer == "boom":
            raise ValueError("grader exploded")
        if params.answer == "invalid":
            return ToolOutput(
                blocks=[TextBlock(text="?")], finished=True, reward=0.0, metadata={"invalid": True}
            )
        if params.answer == "none":
            return ToolOutput(blocks=[TextBlock(text="no reward")], finished=True)
        correct = params.answer.strip() == str(self.target)
        return ToolOutput(blocks=[TextBlock(text="graded")], reward=1.0 if correct else 0.0, finished=True)


class NoTerminalEnv(Environment):
    """No terminal tool: `win` ends the episode and is learned as terminal."""

    def __init__(self, task_spec: dict[str, Any] = {}, secrets: dict[str, str] = {}) -> None:  # noqa: B006
        super().__init__(task_spec, secrets)
        self.state: list[str] = []

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"goal": "Win."}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Win the game.")]

    @tool
    async def note(self, params: Note) -> ToolOutput:
        """Write a note."""
        self.state.append(params.text)
        return ToolOutput(blocks=[TextBlock(text="noted")])

    @tool
    async def win(self) -> ToolOutput:
        """Win."""
        return ToolOutput(blocks=[TextBlock(text="won")], reward=1.0, finished=True)


class GradedEnv(NoTerminalEnv):
    """Grades itself from state, with platoon's class hooks."""

    platoon_read_only_tools = ("note",)
    platoon_tool_meta = {"note": {"kind": "memo"}}

    def platoon_grade(self) -> Any:
        if "raise" in self.state:
            raise RuntimeError("grader down")
        if "invalid" in self.state:
            return {"reward": 0.3, "invalid": True}
        return {"reward": float(len(self.state))}

    def platoon_fork(self, task_spec: dict[str, Any]) -> GradedEnv:
        child = GradedEnv(task_spec)
        child.state = self.state  # shares the parent's live state
        return child


class BrokenSetupEnv(NoTerminalEnv):
    def setup(self) -> None:
        raise OSError("no disk")


class TornDownEnv(NoTerminalEnv):
    teardowns = 0

    async def teardown(self) -> None:
        type(self).teardowns += 1


class CopyableEnv(TornDownEnv):
    def platoon_copy(self) -> CopyableEnv:
        twin = CopyableEnv(self.task_spec)
        twin.state = [*self.state, "copied"]
        return twin


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def opened(cls: type = GuessEnv, task_id: str = "train:0", **options: Any) -> InProcessOrsSession:
    service = InProcessOrsService(cls, **options)
    return await service.open(await service.get_task(task_id), rollout_id="r1")


def text(result: Any) -> str:
    return str(result.as_text())


# -- tasks ---------------------------------------------------------------------------------------------------------


def test_tasks_are_split_index_ids_with_names_and_references(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "acme_guess_env", sys.modules[__name__])
    service = InProcessOrsService("python://acme_guess_env:GuessEnv")
    assert isinstance(service, EnvironmentService)
    assert service.name == "GuessEnv"

    async def main() -> None:
        assert await service.list_splits() == ["train", "test"]
        assert await service.list_tasks("train") == ["train:0", "train:1", "train:2"]
        assert await service.list_task_names("train") == {
            "train:0": "small",
            "train:1": "big",
            "train:2": "task-2",
        }
        task = await service.get_task("train:0")
        assert (task.id, task.goal, task.max_steps) == ("train:0", "Guess a number between 1 and 10.", None)
        assert task.misc == {"level": 1, "ors": {"split": "train", "index": 0, "name": "small"}}
        assert (await service.get_task("big")).id == "train:1"
        assert (await service.get_task("test:0")).misc["ors"]["name"] == "only"
        ref = base64.urlsafe_b64encode(
            json.dumps({"environment": "guessenv", "split": "test", "index": 0}).encode()
        )
        assert (await service.get_task("openreward:v1:" + ref.decode().rstrip("="))).id == "test:0"
        with pytest.raises(ValueError, match="GuessEnv has no task 'nope'"):
            await service.get_task("nope")
        with pytest.raises(ValueError, match="split 'train' has 3 tasks"):
            await service.get_task("train:9")
        with pytest.raises(ValueError, match=r"GuessEnv has no split 'val' \(splits: train, test\)"):
            await service.list_tasks("val")

    run(main())


def test_task_names_and_indices_narrow_the_default_split():
    async def main() -> None:
        by_index = InProcessOrsService(GuessEnv, task_indices=[2, 0])
        assert await by_index.list_tasks("train") == ["train:2", "train:0"]
        assert await by_index.list_tasks("test") == ["test:0"]
        assert await by_index.list_task_names("train") == {
            "train:0": "small",
            "train:1": "big",
            "train:2": "task-2",
        }
        by_name = InProcessOrsService(GuessEnv, task_names=["big"])
        assert await by_name.list_tasks("train") == ["train:1"]
        with pytest.raises(ValueError, match=r"task_indices \[5\] are out of range"):
            await InProcessOrsService(GuessEnv, task_indices=[5]).list_tasks("train")

    run(main())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"urls": ["h:1"]}, "service_kwargs.urls applies to remote ors\\+http\\(s\\):// services"),
        ({"bogus": 1}, "service_kwargs.bogus is not an option of python:// services"),
        ({"task_names": ["a"], "task_indices": [0]}, "give task_names or task_indices, not both"),
        ({"max_tool_calls": -1}, "max_tool_calls must be a non-negative integer"),
        ({"queue_timeout_s": 0}, "queue_timeout_s must be a positive number"),
        ({"terminal_tools": ["nope"]}, "terminal_tools names unknown tools \\['nope'\\]"),
        ({"result_format": "bridge_json"}, "result_format 'bridge_json' is not served in process"),
    ],
)
def test_bad_options_are_one_line_errors(options: dict[str, Any], message: str):
    with pytest.raises(ValueError, match=message):
        InProcessOrsService(GuessEnv, **options)


def test_bad_references_are_one_line_errors(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "acme_guess_env", sys.modules[__name__])
    with pytest.raises(ValueError, match=r"write python://pkg\.module:Class"):
        InProcessOrsService("python://acme_guess_env")
    with pytest.raises(ValueError, match="cannot import 'acme_missing_mod'"):
        InProcessOrsService("python://acme_missing_mod:Env")
    with pytest.raises(ValueError, match="has no attribute 'Nope'"):
        InProcessOrsService("python://acme_guess_env:Nope")
    with pytest.raises(ValueError, match="is not an openreward Environment subclass"):
        InProcessOrsService("python://acme_guess_env:Guess")


def test_the_python_scheme_resolves_through_its_entry_point(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "acme_guess_env", sys.modules[__name__])
    factory = plugins.get_service(plugins.service_scheme("python://acme_guess_env:GuessEnv"))
    assert factory.name == "python"
    assert plugins.resolve_target(factory.factory) is InProcessOrsService
    # `log_dir` is the one path option: a config file's relative one is relative to that file's directory
    assert [o.name for o in plugins.get_service_path_options("python://acme_guess_env:GuessEnv")] == [
        "log_dir"
    ]
    service = plugins.resolve_target(factory.factory)("python://acme_guess_env:GuessEnv", split="test")
    assert run(service.list_tasks("test")) == ["test:0"]


# -- sessions and tools -------------------------------------------------------------------------------------------


def test_a_session_opens_with_secrets_setup_and_the_prompt():
    async def main() -> None:
        before = GuessEnv.setups
        session = await opened(secrets={"token": "s3"})
        assert isinstance(session, EnvSession)
        assert GuessEnv.setups == before + 1
        assert session.instruction == "Find the number (secret=s3)."
        assert session.prompt_blocks == [{"type": "text", "text": "Find the number (secret=s3)."}]
        assert session.task.id == "train:0"
        filtered = await opened(prompt_filter=lambda text: text.upper())
        assert filtered.instruction == "FIND THE NUMBER (SECRET=-)."
        # A task without a goal takes the instruction as its goal.
        assert (await opened(task_id="train:1")).task.goal == "Find the number (secret=-)."

    run(main())


def test_tools_carry_terminal_read_only_and_meta_hints():
    async def main() -> None:
        session = await opened(read_only_tools=["peek"], tool_meta={"guess": {"x": 1}})
        tools = {t.name: t for t in await session.tools()}
        assert sorted(tools) == ["crash", "guess", "peek", "submit", "win"]
        assert tools["submit"].terminal and not tools["submit"].read_only
        assert tools["submit"].meta == {"openreward.dev/terminal-tool": {"arg": "answer"}}
        assert tools["submit"].description == "Submit the final answer."
        assert tools["peek"].read_only and not tools["peek"].terminal
        assert tools["guess"].meta == {"x": 1}
        assert tools["guess"].input_schema == {
            "properties": {"number": {"type": "integer"}},
            "required": ["number"],
            "type": "object",
        }
        graded = await opened(GradedEnv, task_id="train:0")
        note = next(t for t in await graded.tools() if t.name == "note")
        assert note.read_only and note.meta == {"kind": "memo"}

    run(main())


def test_calls_run_through_the_sdk_and_finish_latches():
    async def main() -> None:
        session = await opened()
        wrong = await session.call_tool("guess", {"number": 1})
        assert (text(wrong), wrong.reward, wrong.finished, wrong.is_error) == ("wrong", 0.0, False, False)
        right = await session.call_tool("guess", {"number": 3})
        assert right.reward == 0.5 and right.metadata == {"hits": 1}
        bad = await session.call_tool("guess", {"number": "three"})
        assert bad.is_error and bad.metadata["error"] == "input_validation"
        unknown = await session.call_tool("fly", {})
        assert unknown.is_error and unknown.metadata["error"] == "not_found"
        not_a_mapping = await session.call_tool("guess", [1])  # type: ignore[arg-type]
        assert not_a_mapping.is_error and text(not_a_mapping).startswith("Invalid arguments")
        submitted = await session.call_tool("submit", {"answer": "3"})
        assert submitted.finished and submitted.reward == 1.0
        assert session.finished
        after = await session.call_tool("guess", {"number": 3})
        assert after.is_error and after.metadata["error"] == "environment_already_finished"
        assert (await session.grade()).rewards == {"reward": 1.0}

    run(main())


def test_max_tool_calls_ends_the_episode_with_the_last_reward():
    async def main() -> None:
        session = await opened(max_tool_calls=2)
        await session.call_tool("guess", {"number": 3})
        await session.call_tool("guess", {"number": 1})
        refused = await session.call_tool("guess", {"number": 3})
        assert refused.is_error and refused.metadata["error"] == "max_tool_calls_exceeded"
        assert session.finished
        outcome = await session.grade()
        assert (outcome.status, outcome.reward, outcome.reason) == ("scored", 0.0, "max_tool_calls")
        assert "platoon_zero" not in outcome.metadata  # the environment's own reward

    run(main())


def test_an_env_busy_call_is_not_run_and_does_not_count():
    async def main() -> None:
        session = await opened(queue_timeout_s=0.05)
        lease = session._lease
        holding, release = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            holding.set()
            await release.wait()

        blocker = asyncio.create_task(lease.gate.run(hold, "exclusive"))
        await holding.wait()  # the env is busy until released, past the call's queue timeout
        busy = await session.call_tool("guess", {"number": 3})
        assert busy.is_error and busy.metadata["error"] == "env_busy"
        assert "does not count" in text(busy)
        assert lease.turns == 0 and session.env.guesses == []
        release.set()
        await blocker

    run(main())


# -- grading -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "status", "reward", "failure_kind"),
    [
        ("3", "scored", 1.0, None),
        ("4", "scored", 0.0, None),
        ("invalid", "invalid", None, "env_invalid"),
        ("none", "invalid", None, "no_reward"),
    ],
)
def test_a_submit_decides_the_grade(answer: str, status: str, reward: float | None, failure_kind: str | None):
    async def main() -> Outcome:
        session = await opened()
        await session.call_tool("submit", {"answer": answer})
        return await session.grade()

    outcome = run(main())
    assert (outcome.status, outcome.reward, outcome.failure_kind) == (status, reward, failure_kind)
    assert "platoon_zero" not in outcome.metadata


def test_no_submit_is_a_flagged_zero_listing_tool_errors():
    async def main() -> Outcome:
        session = await opened()
        await session.call_tool("guess", {"number": 1})
        crashed = await session.call_tool("crash", {"text": "x"})
        assert crashed.is_error and crashed.metadata["error"] == "tool_raised"
        assert "RuntimeError: crashed on x" in text(crashed)
        assert (await session.call_tool("guess", {"number": 3})).reward == 0.5  # the session lives on
        return await session.grade()

    outcome = run(main())
    assert (outcome.status, outcome.rewards, outcome.reason) == ("scored", {"reward": 0.0}, "no_submit")
    assert outcome.metadata == {"platoon_zero": True, "tool_errors": ["crash: RuntimeError: crashed on x"]}


def test_a_terminal_tool_that_raised_is_an_infrastructure_error_not_a_zero():
    async def main() -> Outcome:
        session = await opened()
        result = await session.call_tool("submit", {"answer": "boom"})
        assert result.is_error and result.metadata["error"] == "env_error"
        return await session.grade()

    outcome = run(main())
    assert (outcome.status, outcome.failure_kind, outcome.trainable) == ("error", "env_error", False)
    assert "grader exploded" in (outcome.reason or "")


def test_an_invalid_call_raised_by_a_tool_is_an_error_result():
    class Picky(NoTerminalEnv):
        @tool
        async def pick(self, params: Note) -> ToolOutput:
            """Pick."""
            raise InvalidCall(f"{params.text!r} is not on the menu")

    async def main() -> Outcome:
        session = await opened(Picky)
        result = await session.call_tool("pick", {"text": "soup"})
        assert result.is_error and text(result) == "'soup' is not on the menu"
        assert result.metadata["error"] == "invalid_call"
        return await session.grade()

    outcome = run(main())
    assert outcome.reason == "no_submit" and "tool_errors" not in outcome.metadata


def test_the_platoon_grade_hook_grades_from_state():
    async def main() -> list[Outcome]:
        outcomes = []
        for notes in (["a", "b"], ["invalid"], ["raise"]):
            session = await opened(GradedEnv)
            for note in notes:
                await session.call_tool("note", {"text": note})
            outcomes.append(await session.grade())
        return outcomes

    scored, invalid, raised = run(main())
    assert (scored.status, scored.reward) == ("scored", 2.0)
    assert (invalid.status, invalid.failure_kind) == ("invalid", "env_invalid")
    assert (raised.status, raised.failure_kind) == ("error", "env_error")
    assert "grader down" in (raised.reason or "")


def test_a_tool_that_ends_an_undeclared_episode_is_learned_as_terminal():
    async def main() -> None:
        service = InProcessOrsService(NoTerminalEnv)
        first = await service.open(await service.get_task("train:0"), rollout_id="r1")
        assert not any(t.terminal for t in await first.tools())
        won = await first.call_tool("win", {})
        assert won.finished
        assert (await first.grade()).reward == 1.0
        second = await service.open(await service.get_task("train:0"), rollout_id="r2")
        assert [t.name for t in await second.tools() if t.terminal] == ["win"]

    run(main())


def test_a_session_whose_setup_raises_is_an_env_setup_error():
    with pytest.raises(EnvSetupError) as caught:
        run(opened(BrokenSetupEnv))
    assert caught.value.failure_kind == "env_setup"
    assert "setup raised OSError: no disk" in str(caught.value)
    with pytest.raises(EnvSetupError) as foreign:
        run(InProcessOrsService(GuessEnv).open(Task(goal="x", id="elsewhere"), rollout_id="r"))
    assert foreign.value.failure_kind == "env_config"


# -- forks and close ---------------------------------------------------------------------------------------------


def test_shared_forks_share_the_live_state_and_the_lease():
    async def main() -> None:
        session = await opened()
        child = await session.fork("shared")
        await child.call_tool("guess", {"number": 9})
        assert session.env is child.env and session.env.guesses == [9]
        await child.close()
        assert not session._lease.closed
        assert (await child.call_tool("guess", {"number": 1})).metadata["error"] == "session_closed"
        await session.call_tool("submit", {"answer": "3"})
        assert (await session.grade()).reward == 1.0
        await session.close()
        assert session._lease.closed

    run(main())


def test_a_shared_fork_with_a_task_uses_the_platoon_fork_hook():
    async def main() -> None:
        session = await opened(GradedEnv)
        await session.call_tool("note", {"text": "a"})
        child = await session.fork("shared", task=Task(goal="Help out.", id="c1"))
        assert child.env is not session.env and child.env.task_spec["goal"] == "Help out."
        assert child.instruction == "Help out."
        await child.call_tool("note", {"text": "b"})
        assert session.env.state == ["a", "b"]
        await session.close()
        assert not session._lease.closed  # the child keeps its parent alive
        await child.close()
        assert session._lease.closed

    run(main())


def test_copy_forks_snapshot_the_state_and_the_accounting():
    async def main() -> None:
        session = await opened(max_tool_calls=5)
        await session.call_tool("guess", {"number": 1})
        twin = await session.fork("copy")
        await twin.call_tool("guess", {"number": 2})
        assert session.env.guesses == [1] and twin.env.guesses == [1, 2]
        assert twin._lease.turns == 2 and session._lease.turns == 1
        copied = await (await opened(CopyableEnv)).fork("copy")
        assert copied.env.state == ["copied"]
        with pytest.raises(EnvSetupError, match="defines teardown but not platoon_copy"):
            await (await opened(TornDownEnv)).fork("copy")

    run(main())


def test_fresh_forks_open_a_new_session_of_the_task():
    async def main() -> None:
        session = await opened()
        await session.call_tool("guess", {"number": 1})
        fresh = await session.fork("fresh")
        assert fresh.env is not session.env and fresh.env.guesses == []
        assert fresh.task.id == "train:0"
        with pytest.raises(ValueError):
            await session.fork("sideways")

    run(main())


def test_close_tears_down_once_and_later_calls_are_refused():
    async def main() -> None:
        before = TornDownEnv.teardowns
        session = await opened(TornDownEnv)
        await session.close()
        await session.close()
        assert TornDownEnv.teardowns == before + 1
        refused = await session.call_tool("note", {"text": "late"})
        assert refused.is_error and refused.metadata["error"] == "session_closed"

    run(main())


def test_sync_tools_and_hooks_run_off_the_event_loop():
    import threading

    hooks: dict[str, bool] = {}

    class SyncEnv(NoTerminalEnv):
        def setup(self) -> None:
            hooks["setup"] = threading.current_thread().daemon

        def teardown(self) -> None:
            hooks["teardown"] = threading.current_thread().daemon

        @tool
        def slow(self) -> ToolOutput:
            """A sync tool."""
            return ToolOutput(blocks=[TextBlock(text=str(threading.current_thread().daemon))])

    async def main() -> None:
        session = await opened(SyncEnv)
        assert text(await session.call_tool("slow", {})) == "True"
        await session.close()

    run(main())
    assert hooks == {"setup": True, "teardown": True}


def test_the_sdks_tool_introspection_is_remembered_per_tool_and_answers_as_the_sdk_does():
    from openreward.environments import environment as sdk_environment

    from platoon.envs.ors import inprocess

    inprocess._sdk()
    # the SDK's own function, which platoon wrapped when it loaded the SDK
    original = sdk_environment._introspect_tool.__wrapped__
    computed: list[Any] = []

    def counting(fn: Any) -> Any:
        computed.append(fn)
        return original(fn)

    cached = inprocess._cached_introspection(counting)
    first, second = GuessEnv({"target": 1}), GuessEnv({"target": 2})
    for fn in (first.guess, second.guess, GuessEnv.guess, first.guess):
        real, hints, params = cached(fn)
        _, sdk_hints, sdk_params = original(fn)
        assert hints == sdk_hints and params == sdk_params
        assert real == fn  # each caller gets its own callable back, bound to its own instance
    assert len(computed) == 2  # once for the bound method, once for the plain function


class SlowEnv(NoTerminalEnv):
    """A slow submit, a slow serial tool and a concurrent tool, to watch the gate at work: the slow ones wait
    until the test sets the instance's `held` event."""

    async def _held(self) -> None:
        await self.held.wait()  # set by the test on session.env

    @tool
    async def work(self, params: Note) -> ToolOutput:
        """Slow serial work."""
        self.state.append(f"+{params.text}")
        await self._held()
        self.state.append(f"-{params.text}")
        return ToolOutput(blocks=[TextBlock(text=params.text)])

    @tool(concurrent=True)
    async def look(self) -> ToolOutput:
        """A concurrent read."""
        self.state.append("look")
        return ToolOutput(blocks=[TextBlock(text="seen")])

    @terminal
    @tool
    async def submit(self, params: Answer) -> ToolOutput:
        """Submit after a while."""
        self.state.append("submit")
        await self._held()
        return ToolOutput(blocks=[TextBlock(text="done")], reward=1.0, finished=True)


async def until(condition: Any, what: str) -> None:
    """Let the loop run until `condition()` holds; the timeout is a hang guard."""
    try:
        async with asyncio.timeout(60):
            while not condition():
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"never happened: {what}") from None


async def held(cls: type, **options: Any) -> InProcessOrsSession:
    """A session of `cls` whose slow tools wait for `session.env.held`."""
    session = await opened(cls, **options)
    session.env.held = asyncio.Event()
    return session


def test_agents_take_turns_and_concurrent_tools_pass_serial_ones():
    async def main() -> None:
        session = await held(SlowEnv)
        calls = [session.call_tool("work", {"text": f"a{i}"}, on_behalf_of="a") for i in range(3)]
        calls += [session.call_tool("work", {"text": f"b{i}"}, on_behalf_of="b") for i in range(2)]
        tasks = [asyncio.ensure_future(c) for c in calls]
        await until(lambda: "+a0" in session.env.state, "a0 is admitted")
        assert (await session.call_tool("look", {}, on_behalf_of="c")).as_text() == "seen"
        session.env.held.set()
        await asyncio.gather(*tasks)
        starts = [s[1:] for s in session.env.state if s.startswith("+")]
        # a1 joined the queue when a0 was admitted, before b0 arrived; from then on the agents alternate.
        assert starts == ["a0", "a1", "b0", "a2", "b1"]
        assert session.env.state.index("look") < session.env.state.index("-a0")  # ran beside a0

    run(main())


def test_a_grade_waits_for_a_submit_in_flight_or_reports_env_busy():
    async def main() -> None:
        session = await held(SlowEnv)
        submit = asyncio.ensure_future(session.call_tool("submit", {"answer": "0"}))
        await until(lambda: "submit" in session.env.state, "the submit runs")
        grading = asyncio.ensure_future(session.grade())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not grading.done()  # the grade waits behind the submit in flight
        session.env.held.set()
        assert (await grading).reward == 1.0
        await submit
        hurried = await held(SlowEnv, queue_timeout_s=0.02)
        slow = asyncio.ensure_future(hurried.call_tool("submit", {"answer": "0"}))
        await until(lambda: "submit" in hurried.env.state, "the submit runs")
        busy = await hurried.grade()  # the submit holds the env past the queue timeout
        assert (busy.status, busy.failure_kind) == ("error", "env_busy")
        hurried.env.held.set()
        await slow
        assert (await hurried.grade()).reward == 1.0

    run(main())
