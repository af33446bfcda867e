"""`pt.gym`: step environments (`reset`/`step`) as harnesses (`loop`) and as OpenReward environments (`as_environment`).

Importing this module is cheap: openreward (and pydantic) are imported only when `as_environment` is called.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from platoon.harness.agent import LIMIT_MESSAGE, AgentContext, AgentFn, AgentResult, AgentStatus, out_of_steps
from platoon.task import Task

__all__ = ["StepEnv", "as_environment", "loop"]

#: What `act` answers once the episode is over.
EPISODE_OVER = "The episode is over."


@runtime_checkable
class StepEnv(Protocol):
    """A gym-style environment: text observations, scalar rewards. An optional `close()` may be sync or async."""

    async def reset(self, task: Task) -> str:
        """Start an episode of `task`; returns the first observation."""
        ...

    async def step(self, action: str) -> tuple[str, float, bool]:
        """Apply `action`; returns `(observation, reward, done)`."""
        ...


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _make_env(env_factory: Callable[[], Any]) -> StepEnv:
    # A factory may be a class, a function, or an async function; all give a fresh env per episode.
    return await _maybe_await(env_factory())


async def _close(env: Any) -> None:
    close = getattr(env, "close", None)
    if close is not None:
        await _maybe_await(close())


def loop(
    env_factory: Callable[[], Any],
    *,
    max_turns: int | None = None,
    system: str | None = None,
) -> AgentFn:
    """A harness function that plays one episode of `env_factory()` with the agent's model.

    Resets with the task, sends the observation as a user message (after `system`, if given), then alternates
    `ctx.chat` and `env.step(reply.text)`. Records agent misc `gym_return` (the summed reward, from 0) and step
    misc `gym: {action, observation, reward}`. Ends `completed` when the env is done, `limit` (with
    `LIMIT_MESSAGE`) when out of steps or after `max_turns` turns; the env is always closed. Register the result
    with `@pt.harness` (`pt.harness("my-gym")(pt.gym.loop(MyEnv))`).
    """
    if max_turns is not None and (
        isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1
    ):
        raise ValueError(f"max_turns must be a positive int or None; got {max_turns!r}")

    async def gym_loop(ctx: AgentContext) -> AgentResult:
        env = await _make_env(env_factory)
        try:
            observation = await env.reset(ctx.task)
            messages: list[dict[str, Any]] = []
            if system is not None:
                messages.append({"role": "system", "content": system})
            messages.append({"role": "user", "content": str(observation)})
            total = 0.0
            ctx.annotate(gym_return=total)
            turns = 0
            while True:
                if out_of_steps(ctx, turns) or (max_turns is not None and turns >= max_turns):
                    return AgentResult(AgentStatus.LIMIT, error=LIMIT_MESSAGE)
                reply = await ctx.chat(messages)
                turns += 1
                # Fields the model left empty are dropped, as the react harness does, so the next prompt renders cleanly.
                messages.append(
                    {k: v for k, v in dict(reply.message).items() if v is not None} | {"role": "assistant"}
                )
                action = reply.text
                observation, reward, done = await env.step(action)
                reward = float(reward)
                total += reward
                ctx.annotate(gym_return=total)
                ctx.annotate_step(gym={"action": action, "observation": str(observation), "reward": reward})
                if done:
                    return AgentResult(AgentStatus.COMPLETED, final_message=action)
                messages.append({"role": "user", "content": str(observation)})
        finally:
            await _close(env)

    gym_loop.__qualname__ = gym_loop.__name__ = f"gym_loop[{getattr(env_factory, '__qualname__', 'env')}]"
    # The harness belongs to the caller's module: its source, and whether it may use a reserved name, follow that.
    gym_loop.__module__ = _caller_module()
    return gym_loop


def _caller_module() -> str:
    """The module that called the public function calling this (`loop`'s or `as_environment`'s caller)."""
    frame = sys._getframe(2)
    return str(frame.f_globals.get("__name__", __name__))


def as_environment(
    env_factory: Callable[[], Any],
    *,
    name: str,
    tasks: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> type:
    """An OpenReward `Environment` subclass called `name` that plays `env_factory()` through one tool `act(action)`.

    `tasks` maps split -> task specs (default: one `train` task `{"id": "0"}`); a spec's `goal` and `id` seed the
    `Task` given to `reset`, and the whole spec is its misc. The prompt is the first observation. Each `act`
    result's reward is the return so far, `finished` when the env is done, with metadata `step_reward` and
    `return`; acting after the end answers "The episode is over.". Copy forks deep-copy the step env
    (`platoon_copy`); teardown closes it. Needs the openreward SDK (`pip install 'platoon-core[ors]'`).
    """
    try:
        from openreward.environments import Environment, TextBlock, ToolOutput, tool
        from pydantic import BaseModel, Field
    except ImportError as exc:
        raise ImportError(
            f"pt.gym.as_environment needs the openreward SDK ({exc}); install it with: pip install 'platoon-core[ors]'"
        ) from exc

    # The name is the class name, and servers route by its lower case: it must be one clean URL path segment.
    if not isinstance(name, str) or not name or any(c.isspace() or c in "/?#%" for c in name):
        raise ValueError(f"as_environment needs a name without spaces or '/', '?', '#', '%'; got {name!r}")
    splits = _task_table(tasks)
    module = _caller_module()

    class ActInput(BaseModel):
        action: str = Field(description="The action to take.")

    def _task_of(spec: Mapping[str, Any]) -> Task:
        task_id = spec.get("id")
        return Task(goal=spec.get("goal"), id=None if task_id is None else str(task_id), misc=dict(spec))

    def __init__(self: Any, task_spec: Mapping[str, Any] = {}, secrets: Mapping[str, str] = {}) -> None:
        Environment.__init__(self, task_spec, dict(secrets))
        self._gym_task = _task_of(task_spec or {})
        self._gym_env = None
        self._gym_prompt = ""
        self._gym_return = 0.0
        self._gym_done = False
        self._gym_started = False
        self._gym_lock = None

    async def _gym_start(self: Any) -> None:
        # setup() and get_prompt() may race (the server runs setup in the background), so start under a lock.
        if self._gym_started:
            return
        if self._gym_lock is None:
            self._gym_lock = asyncio.Lock()
        async with self._gym_lock:
            if self._gym_started:
                return
            env = await _make_env(env_factory)
            self._gym_env = env
            self._gym_prompt = str(await env.reset(self._gym_task))
            self._gym_started = True

    async def setup(self: Any) -> None:
        await self._gym_start()

    async def teardown(self: Any) -> None:
        env, self._gym_env = self._gym_env, None
        if env is not None:
            await _close(env)

    async def get_prompt(self: Any) -> list[Any]:
        await self._gym_start()
        return [TextBlock(text=self._gym_prompt)]

    async def act(self: Any, params: ActInput) -> ToolOutput:
        """Take one action in the environment and observe the result."""
        await self._gym_start()
        if self._gym_done or self._gym_env is None:
            return ToolOutput(
                blocks=[TextBlock(text=EPISODE_OVER)],
                reward=self._gym_return,
                finished=True,
                metadata={"step_reward": 0.0, "return": self._gym_return},
            )
        observation, reward, done = await self._gym_env.step(params.action)
        reward = float(reward)
        self._gym_return += reward
        self._gym_done = bool(done)
        return ToolOutput(
            blocks=[TextBlock(text=str(observation))],
            reward=self._gym_return,
            finished=self._gym_done,
            metadata={"step_reward": reward, "return": self._gym_return},
        )

    # The SDK reads tool signatures with get_type_hints against the function's module globals, where these
    # local classes are not visible; real objects instead of strings make the hints resolvable.
    act.__annotations__ = {"params": ActInput, "return": ToolOutput}

    def platoon_copy(self: Any) -> Any:
        """A copy fork: a new instance of the class with a deep copy of the step env and the episode so far."""
        twin = type(self)(self.task_spec)
        twin._gym_env = copy.deepcopy(self._gym_env)
        twin._gym_prompt = self._gym_prompt
        twin._gym_return = self._gym_return
        twin._gym_done = self._gym_done
        twin._gym_started = self._gym_started
        twin._episode_finished = self._episode_finished
        return twin

    def list_splits(cls: type) -> list[str]:
        return list(splits)

    def list_tasks(cls: type, split: str) -> list[dict[str, Any]]:
        if split not in splits:
            raise ValueError(f"{name} has no split {split!r} (splits: {', '.join(splits)})")
        return copy.deepcopy(splits[split])

    namespace: dict[str, Any] = {
        "__module__": module,
        "__qualname__": name,
        "__doc__": f"The step environment {getattr(env_factory, '__qualname__', env_factory)!r} as an ORS environment.",
        "__init__": __init__,
        "_gym_start": _gym_start,
        "setup": setup,
        "teardown": teardown,
        "get_prompt": get_prompt,
        "act": tool(act),
        "platoon_copy": platoon_copy,
        "list_splits": classmethod(list_splits),
        "list_tasks": classmethod(list_tasks),
    }
    return type(name, (Environment,), namespace)


def _task_table(tasks: Mapping[str, Sequence[Mapping[str, Any]]] | None) -> dict[str, list[dict[str, Any]]]:
    if tasks is None:
        return {"train": [{"id": "0"}]}
    if not isinstance(tasks, Mapping) or not tasks:
        raise ValueError("tasks must be a non-empty mapping of split -> list of task specs")
    table: dict[str, list[dict[str, Any]]] = {}
    for split, specs in tasks.items():
        if isinstance(specs, (str, bytes)) or not isinstance(specs, Sequence):
            raise ValueError(f"tasks[{split!r}] must be a list of task specs (mappings)")
        for i, spec in enumerate(specs):
            if not isinstance(spec, Mapping):
                raise ValueError(f"tasks[{split!r}][{i}] must be a mapping; got {type(spec).__name__}")
        # Copied so later changes to the caller's lists cannot change a class that servers cache per class.
        table[str(split)] = [copy.deepcopy(dict(spec)) for spec in specs]
    return table
