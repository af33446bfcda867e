"""`harness_rollout`: one task through a function harness end to end — open the
session, run the episode program, build the trajectories, run finalizers, apply the entry's reward processor,
close the session.

`Route` is what an environment entry says about running its harness: harness, program, options, agents settings,
exit policies and reward processor.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon import plugins, rollout_progress
from platoon.config.environments import AgentsConfig, HarnessExitPolicy
from platoon.envs.service import EnvSetupError, Outcome, open_accepts_needs
from platoon.episode.deadlines import StepDeadlineSession, step_deadline_for
from platoon.episode.program import Episode, build_collection, run_finalizers, run_program
from platoon.episode.spec_runs import open_spec_rollout
from platoon.episode.subagents import resolve_harness
from platoon.errors import PlatoonError
from platoon.harness.spec import HarnessSetupError, HarnessSpec
from platoon.programs.registry import get_program

if TYPE_CHECKING:
    from platoon.config.environments import EnvironmentConfig
    from platoon.config_defs import RolloutConfig
    from platoon.envs.service import EnvironmentService
    from platoon.episode.spec_runs import SpecRollout
    from platoon.harness.function import FunctionHarness
    from platoon.task import Task
    from platoon.trajectory import TrajectoryCollection

__all__ = [
    "RewardProcessorError",
    "Route",
    "draw_harness",
    "harness_rollout",
    "process_rewards",
    "recorded_rollout",
    "score_trajectory",
]

log = logging.getLogger("platoon.episode")

_UNTRAINABLE = ("trajectory_invalid", "trajectory_timed_out", "trajectory_cancelled")


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            merged[key] = _deep_merge(below, value)
        else:
            merged[key] = value
    return merged


def draw_harness(weights: Mapping[str, float], *, seed: int, task_id: str) -> str:
    """The harness of a mixture for one task: deterministic from sha256("<seed>:<task id>")."""
    digest = hashlib.sha256(f"{seed}:{task_id}".encode()).digest()
    names = sorted(weights)
    total = sum(float(weights[name]) for name in names)
    point = int.from_bytes(digest[:8], "big") / 2**64 * total
    for name in names:
        point -= float(weights[name])
        if point < 0:
            return name
    return names[-1]  # float rounding at the very top of the range


@dataclass(frozen=True)
class Route:
    """How an entry runs its harness; `harness` is a ref or a `FunctionHarness`, `program` a ref or a record."""

    harness: str | FunctionHarness | Any | None = None
    program: str | Any = "single"
    harness_options: Mapping[str, Any] = field(default_factory=dict)
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    on_harness_exit: HarnessExitPolicy = field(default_factory=HarnessExitPolicy)
    on_context_overflow: str = "grade"
    reward_processor: str | None = None
    #: where a TOML spec harness runs (`auto`, `task_sandbox`, `local`) and what happens to its built-in tools
    placement: str = "auto"
    builtins: str = "default"

    @classmethod
    def from_entry(
        cls, entry: EnvironmentConfig, *, split: str = "train", task_id: str | None = None
    ) -> Route:
        """The route of an `environments` entry: a harness mixture draws per task (give `task_id`); non-train
        splits deep-merge `eval_overrides.harness_options` over `harness_options`."""
        harness: Any = entry.harness
        if isinstance(harness, Mapping):
            if task_id is None:
                raise ValueError("a harness mixture draws per task: give task_id")
            harness = draw_harness(harness, seed=entry.seed, task_id=str(task_id))
        options = dict(entry.harness_options)
        if split != "train" and entry.eval_overrides.harness_options:
            options = _deep_merge(options, entry.eval_overrides.harness_options)
        return cls(
            harness=harness,
            program=entry.program,
            harness_options=options,
            agents=entry.agents,
            on_harness_exit=entry.on_harness_exit,
            on_context_overflow=entry.on_context_overflow,
            reward_processor=entry.reward_processor,
            placement=entry.placement,
            builtins=entry.builtins,
        )


def _program_ref(program: Any) -> str:
    return str(getattr(program, "ref", None) or program)


def _harness_misc(
    harness: Any, route: Route, program: Any, spec_misc: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The root's misc `harness`: what ran (a function harness, or a TOML spec with the runner's record of it)."""
    if harness is None and route.harness is not None:
        harness = _route_harness(route)
    if isinstance(harness, HarnessSpec):
        return {
            "spec": harness.ref,
            "kind": "spec",
            "placement": None,
            "exit_code": None,
            "timed_out": False,
            "logs_path": None,
            **dict(spec_misc or {}),
            "program": _program_ref(program),
        }
    return {
        "spec": None if harness is None else harness.ref,
        "kind": "function",
        "runtime": None if harness is None else harness.runtime,
        "executes_model_code": False if harness is None else harness.executes_model_code,
        "program": _program_ref(program),
    }


def _route_harness(route: Route) -> Any:
    """The route's harness resolved (a FunctionHarness or a HarnessSpec), or None when it does not resolve (the
    program then fails on it, and the misc records what never ran)."""
    if route.harness is None:
        return None
    try:
        return resolve_harness(route.harness)
    except Exception:
        return None


class RewardProcessorError(PlatoonError):
    """A reward processor raised, or answered something other than `(score, components)` (exit 1)."""


def score_trajectory(
    processor: Callable[[dict[str, Any]], Any], trajectory: dict[str, Any], *, name: str
) -> tuple[float, dict[str, float]]:
    """`processor(trajectory)` as `(score, components)` with numbers; a failure is one line naming the processor."""
    try:
        answer = processor(trajectory)
    except Exception as exc:
        raise RewardProcessorError(f"reward processor {name} raised {type(exc).__name__}: {exc}") from exc
    try:
        score, components = answer
        return float(score), {str(key): float(value) for key, value in dict(components or {}).items()}
    except (TypeError, ValueError):
        raise RewardProcessorError(
            f"reward processor {name} returned {_short_repr(answer)}, not (score, components) with numbers"
        ) from None


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def process_rewards(
    processor: str | Callable[[dict[str, Any]], Any], collection: TrajectoryCollection
) -> dict[str, tuple[float, dict[str, float]]]:
    """Score each trainable trajectory with a reward processor (a reference, or the callable itself): trajectory
    id -> (score, components).

    Rollouts keep the rewards their outcomes gave; training conversion, evaluation reports and `platoon rollout`'s
    summary run the processor, so it is applied once, where its result is used. Untrainable
    trajectories are skipped: failures are not zeros to re-score.
    """
    if isinstance(processor, str):
        name, fn = repr(processor), plugins.get_reward_processor(processor)
    else:
        name, fn = repr(getattr(processor, "__qualname__", None) or type(processor).__name__), processor
    scores: dict[str, tuple[float, dict[str, float]]] = {}
    for trajectory_id, trajectory in collection.trajectories.items():
        if any(trajectory.misc.get(marker) for marker in _UNTRAINABLE):
            continue
        scores[trajectory_id] = score_trajectory(fn, trajectory.to_dict(), name=name)
    return scores


async def _close_session(session: Any) -> None:
    try:
        await session.close()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the trajectories are built; a failed teardown is the service's to report
        log.warning("closing the environment session failed: %s: %s", type(exc).__name__, exc)


async def harness_rollout(
    task: Task,
    *,
    service: EnvironmentService,
    route: Route,
    config: RolloutConfig,
    gateway: Any,
    rollout_id: str | None = None,
    output_dir: str | Path | None = None,
) -> TrajectoryCollection:
    """Run one task through the route's program and harness; returns the rollout's trajectories (root first)."""
    collection, _ = await recorded_rollout(
        task,
        service=service,
        route=route,
        config=config,
        gateway=gateway,
        rollout_id=rollout_id,
        output_dir=output_dir,
    )
    return collection


async def recorded_rollout(
    task: Task,
    *,
    service: EnvironmentService,
    route: Route,
    config: RolloutConfig,
    gateway: Any,
    rollout_id: str | None = None,
    output_dir: str | Path | None = None,
) -> tuple[TrajectoryCollection, Any]:
    """`harness_rollout`, also returning the gateway's `RolloutRecorder` (its interactions hold the exact tokens).

    `output_dir` is the rollout's own directory: a TOML spec harness writes its log under `<output_dir>/harness`
    (without one, under the rollout config's `output_dir`).
    """
    program = get_program(route.program) if isinstance(route.program, str) else route.program
    rollout = gateway.open_rollout(
        rollout_id,
        judges=bool(getattr(config, "judges", True)),
        sampling_precedence=getattr(config, "sampling_precedence", "request"),
        config_sampling=_config_sampling(config),
    )
    spec_rollout: SpecRollout | None = None
    try:
        spec = route_harness = _route_harness(route)
        if isinstance(spec, HarnessSpec):
            logs_dir = _logs_dir(output_dir, config)
            spec_rollout = open_spec_rollout(
                spec, gateway=gateway, rollout=rollout, route=route, logs_dir=logs_dir
            )
        else:
            spec, logs_dir = None, None
        try:
            open_kwargs: dict[str, Any] = {}
            if spec_rollout is not None and route.placement != "local" and open_accepts_needs(service.open):
                # Session needs (a private Unix-socket gateway for this rollout, toolchain mounts, memory): made
                # before the session opens so the service can put them into the task sandbox's spec.
                needs = await spec_rollout.needs()
                if needs is not None:
                    open_kwargs["needs"] = needs
            session = await service.open(task, rollout_id=rollout.rollout_id, **open_kwargs)
            rollout_progress.note()  # a sandbox started is progress too (the watchdog follows it)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # No session: the rollout still yields its root, marked untrainable (never a 0).
            if isinstance(exc, HarnessSetupError):
                outcome = Outcome.infra("harness_setup", reason=f"{exc}")
            else:
                kind = exc.failure_kind if isinstance(exc, EnvSetupError) else "env_setup"
                outcome = Outcome.infra(kind, reason=f"{type(exc).__name__}: {exc}")
            root = gateway.open_agent(rollout, role="policy", goal=task.goal, task=task)
            root.misc["harness"] = _harness_misc(spec, route, program)
            return build_collection(rollout, outcome), rollout
        deadline = await step_deadline_for(getattr(config, "step_timeout", None), service, session, task.id)
        episode: Episode | None = None
        try:
            episode = Episode(
                task=task,
                session=session if deadline is None else StepDeadlineSession(session, deadline),
                config=config,
                route=route,
                gateway=gateway,
                rollout=rollout,
                spec_rollout=spec_rollout,
                logs_dir=logs_dir,
                route_harness=route_harness,
            )
            outcome = await run_program(program, episode)
            if deadline is not None and deadline.expired is not None:
                outcome = deadline.expired  # whatever the harness made of its failed call: no reward for it
            spec_rollout = episode.spec_rollout  # the program may have run a spec the route did not name
            episode.root_record.misc["harness"] = _harness_misc(
                episode.harness, route, program, episode.spec_misc
            )
            collection = build_collection(rollout, outcome)
            if episode.finalizers:
                collection, failed = await run_finalizers(
                    episode.finalizers, collection, lambda o: build_collection(rollout, o)
                )
                outcome = failed or outcome
            if route.reward_processor and collection.root is not None:
                # Named for the consumers (trainer, evaluator) that run it: see process_rewards.
                collection.root.misc["reward_processor"] = route.reward_processor
            if getattr(config, "verbose", False):
                log.info(
                    "rollout %s task %s: %s%s",
                    rollout.rollout_id,
                    task.id,
                    outcome.status,
                    "" if outcome.reward is None else f" reward={outcome.reward:g}",
                )
            return collection, rollout
        finally:
            await _close_session(session)
            if episode is not None:
                episode.release()
    finally:
        if spec_rollout is not None:
            # The per-rollout gateway servers and socket dirs go, whatever happened (shielded from cancellation).
            await asyncio.shield(spec_rollout.aclose())
        gateway.release_rollout(rollout)


def _logs_dir(output_dir: str | Path | None, config: Any) -> Path | None:
    base = output_dir if output_dir is not None else getattr(config, "output_dir", None)
    return None if base is None else Path(base) / "harness"


def _config_sampling(config: Any) -> dict[str, Any] | None:
    params = getattr(config, "inference_params", None)
    if params is None:
        return None
    dump = getattr(params, "model_dump", None)
    return dump() if callable(dump) else dict(params)
