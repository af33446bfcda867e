"""`pt.gym`: `loop` against a fake agent context, `as_environment` with the real openreward SDK."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any, cast

import pytest

os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

from platoon import gym
from platoon.harness.agent import LIMIT_MESSAGE, AgentContext, AgentResult, ChatReply
from platoon.task import Task


class Counter:
    """Counts up to `target`: the action "inc" adds one (reward 1 at the target, else 0.25)."""

    instances: list[Counter] = []

    def __init__(self, target: int = 3) -> None:
        self.target = target
        self.value = 0
        self.task: Task | None = None
        self.closed = 0
        Counter.instances.append(self)

    async def reset(self, task: Task) -> str:
        self.task = task
        self.value = 0
        return f"count to {self.target}"

    async def step(self, action: str) -> tuple[str, float, bool]:
        if action == "inc":
            self.value += 1
        done = self.value >= self.target
        return f"value={self.value}", (1.0 if done else 0.25), done

    async def close(self) -> None:
        self.closed += 1


class SyncCloseCounter(Counter):
    def close(self) -> None:  # type: ignore[override]
        self.closed += 1


class _Budget:
    def __init__(self, steps: float = math.inf) -> None:
        self.steps = steps
        self.spent = 0

    def remaining(self) -> float:
        return self.steps - self.spent

    def used(self) -> int:
        return self.spent


def _agent(ctx: FakeContext) -> AgentContext:
    return cast(AgentContext, ctx)


class FakeContext:
    """Just enough of `AgentContext` for a harness loop: scripted replies, recorded misc."""

    def __init__(
        self, replies: Sequence[str], *, max_steps: int | None = None, budget: float = math.inf
    ) -> None:
        self.replies = list(replies)
        self.task = Task("count", id="t0")
        self.max_steps = max_steps
        self.budget = _Budget(budget)
        self.sent: list[list[dict[str, Any]]] = []
        self.misc: dict[str, Any] = {}
        self.steps: list[dict[str, Any]] = []

    async def chat(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> ChatReply:
        self.sent.append([dict(m) for m in messages])
        self.budget.spent += 1
        self.steps.append({})
        return ChatReply(
            f"call-{len(self.sent)}", {"role": "assistant", "content": self.replies.pop(0)}, "stop"
        )

    def annotate(self, **misc: Any) -> None:
        self.misc.update(misc)

    def annotate_step(self, **misc: Any) -> None:
        if not self.steps:
            raise RuntimeError("no call recorded yet")
        self.steps[-1].update(misc)


def test_gym_import_does_not_import_openreward() -> None:
    code = "import sys, platoon.gym; print(sorted(m for m in sys.modules if m.startswith(('openreward', 'pydantic'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_loop_plays_to_done() -> None:
    Counter.instances.clear()
    harness = gym.loop(lambda: Counter(2), system="You count.")
    ctx = FakeContext(["inc", "inc"])
    result = asyncio.run(harness(_agent(ctx)))
    assert result == AgentResult("completed", final_message="inc")
    assert ctx.sent[0] == [
        {"role": "system", "content": "You count."},
        {"role": "user", "content": "count to 2"},
    ]
    assert ctx.sent[1][2:] == [
        {"role": "assistant", "content": "inc"},
        {"role": "user", "content": "value=1"},
    ]
    assert ctx.misc == {"gym_return": 1.25}
    assert ctx.steps == [
        {"gym": {"action": "inc", "observation": "value=1", "reward": 0.25}},
        {"gym": {"action": "inc", "observation": "value=2", "reward": 1.0}},
    ]
    (env,) = Counter.instances
    assert env.task is ctx.task and env.closed == 1


def test_loop_records_a_zero_return_before_the_first_step() -> None:
    seen: list[Any] = []

    class Ctx(FakeContext):
        async def chat(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> ChatReply:
            seen.append(dict(self.misc))
            return await super().chat(messages, **kwargs)

    asyncio.run(gym.loop(lambda: Counter(1))(_agent(Ctx(["inc"]))))
    assert seen == [{"gym_return": 0.0}]


def test_loop_without_system_message() -> None:
    ctx = FakeContext(["inc"])
    asyncio.run(gym.loop(lambda: Counter(1))(_agent(ctx)))
    assert ctx.sent[0] == [{"role": "user", "content": "count to 1"}]


def test_loop_stops_at_max_turns() -> None:
    Counter.instances.clear()
    ctx = FakeContext(["noop"] * 5)
    result = asyncio.run(gym.loop(lambda: Counter(3), max_turns=2)(_agent(ctx)))
    assert result.status == "limit" and result.error == LIMIT_MESSAGE
    assert len(ctx.sent) == 2
    assert ctx.misc["gym_return"] == 0.5
    assert Counter.instances[0].closed == 1


def test_loop_stops_when_out_of_steps() -> None:
    ctx = FakeContext(["noop"] * 5, max_steps=1)
    result = asyncio.run(gym.loop(lambda: Counter(3))(_agent(ctx)))
    assert result == AgentResult("limit", error=LIMIT_MESSAGE)
    assert len(ctx.sent) == 1

    ctx = FakeContext(["noop"] * 5, budget=0)
    result = asyncio.run(gym.loop(lambda: Counter(3))(_agent(ctx)))
    assert result.status == "limit" and ctx.sent == []


def test_loop_closes_the_env_on_errors_and_with_sync_close() -> None:
    Counter.instances.clear()

    class Boom(FakeContext):
        async def chat(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> ChatReply:
            raise RuntimeError("model down")

    with pytest.raises(RuntimeError, match="model down"):
        asyncio.run(gym.loop(SyncCloseCounter)(_agent(Boom([]))))
    assert Counter.instances[0].closed == 1


def test_loop_accepts_an_async_factory_and_an_env_without_close() -> None:
    class NoClose:
        async def reset(self, task: Task) -> str:
            return "go"

        async def step(self, action: str) -> tuple[str, float, bool]:
            return "end", 2, True

    async def factory() -> NoClose:
        return NoClose()

    ctx = FakeContext(["x"])
    assert asyncio.run(gym.loop(factory)(_agent(ctx))).status == "completed"
    assert ctx.misc["gym_return"] == 2.0
    assert isinstance(NoClose(), gym.StepEnv)


def test_loop_refuses_a_bad_max_turns() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_turns"):
            gym.loop(Counter, max_turns=bad)  # type: ignore[arg-type]


def test_as_environment_without_openreward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openreward", None)
    monkeypatch.setitem(sys.modules, "openreward.environments", None)
    with pytest.raises(ImportError) as info:
        gym.as_environment(Counter, name="Counting")
    assert "pip install 'platoon-core[ors]'" in str(info.value)
    assert "\n" not in str(info.value)


# --- as_environment with the real SDK ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def ors() -> Any:
    import openreward.environments

    return openreward.environments


def _output(run: Any) -> Any:
    assert run.root.ok, run
    return run.root.output


def test_as_environment_builds_an_ors_class(ors: Any) -> None:
    cls: Any = gym.as_environment(Counter, name="Counting")
    assert cls.__name__ == "Counting" and issubclass(cls, ors.Environment)
    assert cls.__module__ == __name__
    assert cls.list_splits() == ["train"]
    assert cls.list_tasks("train") == [{"id": "0"}]
    with pytest.raises(ValueError, match="no split 'val'"):
        cls.list_tasks("val")
    tools = cls.list_tools()
    assert [t.name for t in tools.tools] == ["act"]
    assert tools.terminal_tool is None
    assert list(tools.tools[0].input_schema["properties"]) == ["action"]
    assert tools.tools[0].input_schema["required"] == ["action"]


def test_as_environment_plays_an_episode(ors: Any) -> None:
    Counter.instances.clear()
    tasks: dict[str, Any] = {"train": [{"id": 7, "goal": "count up", "level": 2}], "val": [{"id": "v"}]}
    cls: Any = gym.as_environment(lambda: Counter(2), name="Counting", tasks=tasks)
    assert cls.list_splits() == ["train", "val"]
    spec = cls.list_tasks("train")[0]

    async def play() -> None:
        env = cls(spec)
        await env.setup()
        prompt = await env.get_prompt()
        assert [b.text for b in prompt] == ["count to 2"]
        (step_env,) = Counter.instances
        assert step_env.task == Task(goal="count up", id="7", misc={"id": 7, "goal": "count up", "level": 2})

        first = _output(await env._call_tool("act", {"action": "inc"}))
        assert [b.text for b in first.blocks] == ["value=1"]
        assert (first.reward, first.finished) == (0.25, False)
        assert first.metadata == {"step_reward": 0.25, "return": 0.25}

        second = _output(await env._call_tool("act", {"action": "inc"}))
        assert (second.reward, second.finished) == (1.25, True)
        assert second.metadata == {"step_reward": 1.0, "return": 1.25}

        after = await env._call_tool("act", {"action": "inc"})
        assert not after.root.ok and after.root.reason == "episode_finished"
        # the tool itself, past the SDK's latch
        act_input = cls.act.__annotations__["params"]
        over = await env.act(act_input(action="inc"))
        assert [b.text for b in over.blocks] == ["The episode is over."]
        assert over.finished and over.reward == 1.25

        bad = await env._call_tool("act", {"nope": 1})
        assert not bad.root.ok

        await env.teardown()
        await env.teardown()
        assert step_env.closed == 1

    asyncio.run(play())


def test_as_environment_prompt_starts_the_episode_lazily(ors: Any) -> None:
    Counter.instances.clear()
    cls: Any = gym.as_environment(lambda: Counter(1), name="Lazy")

    async def play() -> None:
        env = cls(cls.list_tasks("train")[0])
        prompt, again = await asyncio.gather(env.get_prompt(), env.get_prompt())
        assert prompt[0].text == again[0].text == "count to 1"
        assert len(Counter.instances) == 1
        await env.teardown()

    asyncio.run(play())


def test_as_environment_copy_fork(ors: Any) -> None:
    Counter.instances.clear()
    cls: Any = gym.as_environment(lambda: Counter(2), name="Forky")

    async def play() -> None:
        env = cls({"id": "0"})
        await env.setup()
        _output(await env._call_tool("act", {"action": "inc"}))
        twin = env.platoon_copy()
        assert type(twin) is cls and twin is not env
        done = _output(await twin._call_tool("act", {"action": "inc"}))
        assert (done.reward, done.finished) == (1.25, True)
        # the original is untouched by the copy's step
        still = _output(await env._call_tool("act", {"action": "noop"}))
        assert (still.reward, still.finished, still.blocks[0].text) == (0.5, False, "value=1")
        assert [b.text for b in await twin.get_prompt()] == ["count to 2"]
        (original,) = Counter.instances
        copied = twin._gym_env
        assert copied is not original and copied.value == 2 and original.value == 1
        await twin.teardown()
        assert (copied.closed, original.closed) == (1, 0)
        await env.teardown()
        assert original.closed == 1

    asyncio.run(play())


def test_as_environment_validates_its_arguments(ors: Any) -> None:
    with pytest.raises(ValueError, match="name"):
        gym.as_environment(Counter, name="has space")
    with pytest.raises(ValueError, match="tasks"):
        gym.as_environment(Counter, name="X", tasks={})
    with pytest.raises(ValueError, match=r"tasks\['train'\]\[0\] must be a mapping"):
        gym.as_environment(Counter, name="X", tasks={"train": ["goal"]})  # type: ignore[list-item]
