"""`run_episode`: one task through the real harness rollout — environment session, episode program,
gateway over a scripted policy served over HTTP, grading, trajectory build, finalizers, and the reward processor
when one is given — on the CPU.

`ctx.chat` calls the gateway in process; `ctx.endpoint` (and command-line harnesses) reach it over loopback HTTP.

Code written for platoon 0.2.0, where `run_episode` was a coroutine function, runs unchanged: called with no event
loop running, `run_episode` runs the episode and returns its `EpisodeRun`, which `await` (or `asyncio.run`) gives
back as it is; called inside a running loop (an async test), it returns the episode as a coroutine to await there,
as 0.2.0 did. `arun_episode` is the coroutine function itself.
"""

from __future__ import annotations

import asyncio
import collections.abc
import json
import tempfile
from collections.abc import Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

from platoon import plugins
from platoon.config.environments import AgentsConfig
from platoon.config.loader import expand_named_environment
from platoon.config_defs import RolloutConfig
from platoon.envs.resolve import resolve_service
from platoon.episode.rollout import Route, process_rewards, recorded_rollout
from platoon.errors import ConfigError
from platoon.gateway.core import ModelGateway
from platoon.gateway.http.server import GatewayServer
from platoon.heap import freeze_after_first_episode
from platoon.task import Task
from platoon.testing.gateway import make_gateway

#: what json.dumps encodes a string with (its default ensure_ascii)
_encode_string = json.encoder.encode_basestring_ascii

if TYPE_CHECKING:
    from platoon.gateway.records import Interaction
    from platoon.trajectory import Trajectory, TrajectoryCollection

__all__ = ["EpisodeRun", "arun_episode", "resolve_service", "run_episode"]

COLLECTION_FILE = "trajectory_collection.json"
_UNTRAINABLE = ("trajectory_invalid", "trajectory_timed_out", "trajectory_cancelled")

#: a reward processor: a reference as `environments[].reward_processor` names one, or the callable itself
RewardProcessorArg = str | Callable[[dict[str, Any]], Any] | None


@dataclass(eq=False)
class EpisodeRun:
    """What one episode left: the trajectories, the exact tokens of every call, the gateway and the output dir,
    and with a reward processor its scores.

    Awaiting an `EpisodeRun` (or handing it to `asyncio.run`) gives it back: 0.2.0's `run_episode` was a
    coroutine function, and code that awaits its result keeps working.
    """

    collection: TrajectoryCollection
    interactions: dict[str, Interaction]
    gateway: ModelGateway
    output_dir: Path
    #: trajectory id -> (score, components) from the reward processor, for every trajectory it scored
    scores: dict[str, tuple[float, dict[str, float]]] = field(default_factory=dict)

    @property
    def trajectories(self) -> list[Trajectory]:
        """Every trajectory, root first."""
        return list(self.collection.trajectories.values())

    @property
    def root(self) -> Trajectory:
        root = self.collection.root
        if root is None:
            raise LookupError("the episode recorded no trajectories")
        return root

    @property
    def children(self) -> list[Trajectory]:
        """Every trajectory but the root, in opening order."""
        return self.trajectories[1:]

    @property
    def outcome(self) -> dict[str, Any] | None:
        """The root's misc `outcome` (`status`, `rewards`, `reason`, ...)."""
        outcome = self.root.misc.get("outcome")
        return outcome if isinstance(outcome, dict) else None

    @property
    def scored(self) -> bool:
        """Whether the episode was graded (its outcome status is `scored`): only then has it a reward."""
        outcome = self.outcome
        if outcome is None or outcome.get("status") != "scored":
            return False
        return not any(self.root.misc.get(marker) for marker in _UNTRAINABLE)

    @property
    def reward(self) -> float | None:
        """The root's reward, the reward processor's score when one was given; None when the episode was not
        scored (an error, a timeout, an invalid episode), so a failed episode never passes for a reward of 0."""
        if not self.scored:
            return None
        score = self.scores.get(self.root.id)
        return score[0] if score is not None else self.root.reward

    @property
    def reward_components(self) -> dict[str, float]:
        """The reward processor's components for the root (empty without a processor or a score)."""
        score = self.scores.get(self.root.id)
        return dict(score[1]) if score is not None and self.scored else {}

    @property
    def policy(self) -> Any:
        """The gateway's sampler (the `ScriptedPolicy`)."""
        return self.gateway.sampler

    # -- 0.2.0 compatibility: an already finished coroutine whose result is this run

    def __await__(self) -> Generator[Any, None, EpisodeRun]:
        return self
        yield  # unreachable: makes this a generator that finishes at once

    def send(self, value: Any) -> NoReturn:
        raise StopIteration(self)

    def throw(self, exc: Any, /, *rest: Any) -> NoReturn:
        if isinstance(exc, BaseException):
            raise exc
        raise rest[0] if rest and isinstance(rest[0], BaseException) else exc()

    def close(self) -> None:
        """Nothing to close: the episode has finished (part of the coroutine protocol)."""


# `asyncio.run(run_episode(...))`, as 0.2.0 code writes it, wants a coroutine.
collections.abc.Coroutine.register(EpisodeRun)

#: what an `EpisodeRun` offers, so that reading it off an episode still to await says what to write instead
_RUN_ATTRIBUTES = frozenset(
    name for name in [*EpisodeRun.__dataclass_fields__, *vars(EpisodeRun)] if not name.startswith("_")
) - {"send", "throw", "close"}


class _EpisodeToAwait(Coroutine[Any, Any, EpisodeRun]):
    """What `run_episode` gives inside a running event loop: the episode as a coroutine, to be awaited."""

    __slots__ = ("_coroutine",)

    def __init__(self, coroutine: Coroutine[Any, Any, EpisodeRun]) -> None:
        self._coroutine = coroutine

    def __await__(self) -> Generator[Any, None, EpisodeRun]:
        return self._coroutine.__await__()

    def send(self, value: Any) -> Any:
        return self._coroutine.send(value)

    def throw(self, exc: Any, /, *rest: Any) -> Any:
        return self._coroutine.throw(exc, *rest)

    def close(self) -> None:
        self._coroutine.close()

    def __getattr__(self, name: str) -> Any:
        if name in _RUN_ATTRIBUTES:
            raise AttributeError(
                f"run_episode(...) was called inside a running event loop, where it returns the episode to await, "
                f"not its EpisodeRun: write `run = await run_episode(...)` (or `await arun_episode(...)`), "
                f"then read run.{name}"
            )
        raise AttributeError(name)


def indented_json(value: Any) -> str:
    """`json.dumps(value, indent=2)`, character for character, in about a third of the time.

    With `indent`, the json module encodes in pure Python, through a generator per nesting level; writing an
    episode's collection that way was a tenth of the episode's cost. Here each string and number is still encoded
    by the json module's own functions; only the walk and the layout are done directly, and a scalar inside a
    container is written with its key or separator in one piece, without a call of its own (most of a
    collection's values are scalars).
    """
    parts: list[str] = []
    write = parts.append

    def key(k: Any) -> str:
        if isinstance(k, str):
            return _encode_string(k)
        if k is True or k is False or k is None:
            return f'"{json.dumps(k)}"'
        if isinstance(k, (int, float)):
            return f'"{_encode_number(k)}"'
        raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")

    def encode(o: Any, indent: str) -> None:
        if isinstance(o, dict):
            if not o:
                write("{}")
                return
            inner = indent + "  "
            separator = ",\n" + inner
            lead = "{\n" + inner
            for k, v in o.items():
                name = (_encode_string(k) if type(k) is str else key(k)) + ": "
                scalar = _scalar_text(v)
                if scalar is not None:
                    write(lead + name + scalar)
                else:
                    write(lead + name)
                    encode(v, inner)
                lead = separator
            write("\n" + indent + "}")
        elif isinstance(o, (list, tuple)):
            if not o:
                write("[]")
                return
            inner = indent + "  "
            separator = ",\n" + inner
            lead = "[\n" + inner
            for v in o:
                scalar = _scalar_text(v)
                if scalar is not None:
                    write(lead + scalar)
                else:
                    write(lead)
                    encode(v, inner)
                lead = separator
            write("\n" + indent + "]")
        else:
            scalar = _scalar_text(o)
            if scalar is None:
                raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")
            write(scalar)

    encode(value, "")
    return "".join(parts)


def _scalar_text(value: Any) -> str | None:
    """A string, number, bool or None as JSON; None for anything else (a container, or what JSON refuses)."""
    kind = type(value)
    if kind is str:
        return _encode_string(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if kind is int:
        return int.__repr__(value)
    if isinstance(value, str):  # a subclass: json encodes its text
        return _encode_string(value)
    if isinstance(value, (int, float)):
        return _encode_number(value)
    return None


def _encode_number(value: int | float) -> str:
    if isinstance(value, float):
        text = float.__repr__(value)
        return _FLOAT_TEXT.get(text, text)
    return int.__repr__(value)


_FLOAT_TEXT = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _route(
    harness: Any,
    *,
    harness_options: Mapping[str, Any] | None,
    program: Any,
    agents: Any,
    reward_processor: RewardProcessorArg,
    placement: str = "auto",
    builtins: str = "default",
) -> Any:
    if agents is None:
        agents = AgentsConfig()
    elif isinstance(agents, Mapping):
        agents = AgentsConfig(**agents)
    return Route(
        harness=harness,
        program=program,
        harness_options=dict(harness_options or {}),
        agents=agents,
        # a reference is recorded on the root as a run's is; a callable has no name to record
        reward_processor=reward_processor if isinstance(reward_processor, str) else None,
        placement=placement,
        builtins=builtins,
    )


def _named_environment(ref: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The episode's arguments with the named environment `ref` below them, expanded as the config loader expands
    `environments[].env` (so an episode and a run of the same entry agree). Objects (a service, a callable reward
    processor, an `AgentsConfig`) stay as given; only references and mappings go through the entry."""
    import importlib

    keys: dict[str, Any] = {"env": ref}
    for key, value in given.items():
        if isinstance(value, str | Mapping):
            keys[key] = dict(value) if isinstance(value, Mapping) else value
    try:
        expanded = expand_named_environment(keys)
    except ConfigError as exc:  # said of the arguments, not of a config's first entry
        raise ConfigError([problem.removeprefix("environments.0.") for problem in exc.problems]) from None
    if isinstance(expanded.get("harness"), Mapping):
        raise ValueError(
            f"the environment {ref} draws its harness from a mixture ({', '.join(expanded['harness'])}): "
            "name the one to run with harness="
        )
    if isinstance(expanded.get("package"), str):
        importlib.import_module(expanded["package"])  # its registrations, as a run imports it first
    resolved = {key: expanded.get(key) for key in given}
    for key, value in given.items():  # objects the entry cannot carry
        if value is not None and not isinstance(value, str | Mapping):
            resolved[key] = value
    if given["harness"] is not None and not isinstance(given["harness"], str):
        # the entry's harness defaults are for harnesses it names; a harness object takes only its own options
        resolved["harness_options"] = given["harness_options"]
    if isinstance(resolved["agents"], Mapping):
        resolved["agents"] = AgentsConfig(**resolved["agents"])
    return resolved


def _rollout_config(rollout: Any, max_steps: int | None) -> Any:
    if rollout is None:
        config = RolloutConfig(verbose=False)
    elif isinstance(rollout, Mapping):
        config = RolloutConfig(**{"verbose": False, **rollout})
    else:
        config = rollout
    if max_steps is not None:
        config = config.model_copy(update={"max_steps": max_steps})
    return config


async def arun_episode(
    task: Any,
    *,
    service: Any = None,
    harness: Any = None,
    policy: Any = (),
    service_kwargs: Mapping[str, Any] | None = None,
    harness_options: Mapping[str, Any] | None = None,
    program: Any = None,
    agents: Any = None,
    max_steps: int | None = None,
    rollout: Any = None,
    output_dir: str | Path | None = None,
    reward_processor: RewardProcessorArg = None,
    placement: str | None = None,
    builtins: str | None = None,
    env: str | None = None,
) -> EpisodeRun:
    """`run_episode` as a coroutine function, to await inside a running event loop (0.2.0's `run_episode`)."""
    given = {
        "service": service,
        "service_kwargs": service_kwargs,
        "harness": harness,
        "harness_options": harness_options,
        "program": program,
        "agents": agents,
        "reward_processor": reward_processor,
        "placement": placement,
        "builtins": builtins,
    }
    if env is not None:
        given = _named_environment(env, given)
    elif given["service"] is None:
        raise TypeError(
            "run_episode needs service= (a service reference or object) or env= (a named environment)"
        )
    if given["harness"] is None:
        raise TypeError(
            "run_episode needs harness=" + (f" (the environment {env} names none)" if env is not None else "")
        )
    service, service_kwargs, harness = given["service"], given["service_kwargs"], given["harness"]
    harness_options, agents, reward_processor = (
        given["harness_options"],
        given["agents"],
        given["reward_processor"],
    )
    program = given["program"] or "single"
    placement, builtins = given["placement"] or "auto", given["builtins"] or "default"

    if isinstance(reward_processor, str):
        plugins.get_reward_processor(
            reward_processor
        )  # resolves before the episode runs, as a run's start does
    session_service = resolve_service(service, service_kwargs)
    if not isinstance(task, Task):
        task = await session_service.get_task(str(task))
    gateway = policy if isinstance(policy, ModelGateway) else make_gateway(policy)
    config = _rollout_config(rollout, max_steps)
    route = _route(
        harness,
        harness_options=harness_options,
        program=program,
        agents=agents,
        reward_processor=reward_processor,
        placement=placement,
        builtins=builtins,
    )
    if output_dir is None:
        out = Path(tempfile.mkdtemp(prefix="platoon-episode-"))
    else:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
    # The gateway is served over HTTP for the episode (`ctx.endpoint`, command-line harnesses) from the first time
    # the endpoint is asked for; `ctx.chat` stays in process. On this loop, so HTTP and in-process calls share the
    # gateway's single-threaded state.
    server = GatewayServer(gateway).serve_on_demand()
    try:
        collection, recorder = await recorded_rollout(
            task, service=session_service, route=route, config=config, gateway=gateway, output_dir=out
        )
    finally:
        await server.astop()
    (out / COLLECTION_FILE).write_text(indented_json(collection.to_dict()) + "\n", encoding="utf-8")
    freeze_after_first_episode()  # once per process: later episodes' collections skip the loaded stack
    # Applied as training applies it: to every trajectory but the untrainable ones, after the files are written.
    scores = process_rewards(reward_processor, collection) if reward_processor is not None else {}
    return EpisodeRun(
        collection=collection,
        interactions=dict(recorder.interactions),
        gateway=gateway,
        output_dir=out,
        scores=scores,
    )


def run_episode(
    task: Any,
    *,
    service: Any = None,
    harness: Any = None,
    policy: Any = (),
    service_kwargs: Mapping[str, Any] | None = None,
    harness_options: Mapping[str, Any] | None = None,
    program: Any = None,
    agents: Any = None,
    max_steps: int | None = None,
    rollout: Any = None,
    output_dir: str | Path | None = None,
    reward_processor: RewardProcessorArg = None,
    placement: str | None = None,
    builtins: str | None = None,
    env: str | None = None,
) -> EpisodeRun:
    """Run one task through the harness rollout with a scripted policy; see the module docstring.

    `task` is a `Task` or an id the service resolves; `service` a service reference (with `service_kwargs`) or
    an `EnvironmentService`; `env` instead a named environment (`name[@version]` or `module:attr`), expanded as a
    config's `environments[].env` is: its service, harness, program, agents and reward processor are the
    defaults the other arguments override, and its harness defaults go under `harness_options`.
    `policy` a `ScriptedPolicy`, its script or a gateway from `make_gateway`; `agents`
    the entry's `agents` settings; `rollout` a `RolloutConfig` or its keys (default `verbose: false`);
    `output_dir` defaults to a kept temporary directory `platoon-episode-*`, where `trajectory_collection.json` is
    written; `reward_processor` (a name or import string as `environments[].reward_processor` takes, or the
    callable) scores the trajectories as training does: `EpisodeRun.reward` is then its score. `placement` and
    `builtins` are the entry keys of a TOML spec harness (`auto`/`task_sandbox`/`local`; `default`/`keep`/`disable`);
    its log goes to `<output_dir>/harness/`.

    With no event loop running it returns the finished `EpisodeRun`; inside a running loop it returns the episode
    to await (`run = await run_episode(...)`), as 0.2.0's coroutine function did.
    """
    episode = arun_episode(
        task,
        service=service,
        harness=harness,
        policy=policy,
        service_kwargs=service_kwargs,
        harness_options=harness_options,
        program=program,
        agents=agents,
        max_steps=max_steps,
        rollout=rollout,
        output_dir=output_dir,
        reward_processor=reward_processor,
        placement=placement,
        builtins=builtins,
        env=env,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(episode)
    # Typed as the run it resolves to: awaiting an EpisodeRun gives the run, so `await run_episode(...)` checks.
    return cast(EpisodeRun, _EpisodeToAwait(episode))
