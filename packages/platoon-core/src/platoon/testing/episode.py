"""`run_episode` (core.md 8.5): one task through the real harness rollout — environment session, episode program,
gateway over a scripted policy served over HTTP, grading, trajectory build, finalizers — on the CPU.

`ctx.chat` calls the gateway in process; `ctx.endpoint` (and command-line harnesses) reach it over loopback HTTP.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.envs.resolve import resolve_service

if TYPE_CHECKING:
    from platoon.gateway.core import ModelGateway
    from platoon.gateway.records import Interaction
    from platoon.trajectory import Trajectory, TrajectoryCollection

__all__ = ["EpisodeRun", "arun_episode", "resolve_service", "run_episode"]

COLLECTION_FILE = "trajectory_collection.json"


@dataclass
class EpisodeRun:
    """What one episode left: the trajectories, the exact tokens of every call, the gateway and the output dir."""

    collection: TrajectoryCollection
    interactions: dict[str, Interaction]
    gateway: ModelGateway
    output_dir: Path

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
    def reward(self) -> float:
        return self.root.reward

    @property
    def policy(self) -> Any:
        """The gateway's sampler (the `ScriptedPolicy`)."""
        return self.gateway.sampler


def _route(
    harness: Any,
    *,
    harness_options: Mapping[str, Any] | None,
    program: Any,
    agents: Any,
) -> Any:
    from platoon.config.environments import AgentsConfig
    from platoon.episode.rollout import Route

    if agents is None:
        agents = AgentsConfig()
    elif isinstance(agents, Mapping):
        agents = AgentsConfig(**agents)
    return Route(
        harness=harness,
        program=program,
        harness_options=dict(harness_options or {}),
        agents=agents,
    )


def _rollout_config(rollout: Any, max_steps: int | None) -> Any:
    from platoon.config_defs import RolloutConfig

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
    service: Any,
    harness: Any,
    policy: Any = (),
    service_kwargs: Mapping[str, Any] | None = None,
    harness_options: Mapping[str, Any] | None = None,
    program: Any = "single",
    agents: Any = None,
    max_steps: int | None = None,
    rollout: Any = None,
    output_dir: str | Path | None = None,
) -> EpisodeRun:
    """`run_episode` inside a running event loop."""
    from platoon.episode.rollout import recorded_rollout
    from platoon.gateway.http.server import GatewayServer
    from platoon.task import Task
    from platoon.testing.gateway import make_gateway

    env = resolve_service(service, service_kwargs)
    if not isinstance(task, Task):
        task = await env.get_task(str(task))
    gateway = make_gateway(policy)
    config = _rollout_config(rollout, max_steps)
    route = _route(harness, harness_options=harness_options, program=program, agents=agents)
    # The gateway is served over HTTP for the episode (`ctx.endpoint`, command-line harnesses); `ctx.chat` stays in
    # process. On this loop, so HTTP and in-process calls share the gateway's single-threaded state.
    server = GatewayServer(gateway)
    await server.astart()
    try:
        collection, recorder = await recorded_rollout(
            task, service=env, route=route, config=config, gateway=gateway
        )
    finally:
        await server.astop()
    out = Path(tempfile.mkdtemp(prefix="platoon-episode-")) if output_dir is None else Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / COLLECTION_FILE).write_text(json.dumps(collection.to_dict(), indent=2) + "\n", encoding="utf-8")
    return EpisodeRun(
        collection=collection,
        interactions=dict(recorder.interactions),
        gateway=gateway,
        output_dir=out,
    )


def run_episode(
    task: Any,
    *,
    service: Any,
    harness: Any,
    policy: Any = (),
    service_kwargs: Mapping[str, Any] | None = None,
    harness_options: Mapping[str, Any] | None = None,
    program: Any = "single",
    agents: Any = None,
    max_steps: int | None = None,
    rollout: Any = None,
    output_dir: str | Path | None = None,
) -> EpisodeRun:
    """Run one task through the harness rollout with a scripted policy; see the module docstring.

    `task` is a `Task` or an id the service resolves; `service` a service reference (with `service_kwargs`) or
    an `EnvironmentService`; `policy` a `ScriptedPolicy` or its script; `agents` the entry's `agents` settings;
    `rollout` a `RolloutConfig` or its keys (default `verbose: false`); `output_dir` defaults to a kept temporary
    directory `platoon-episode-*`, where `trajectory_collection.json` is written.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "run_episode runs its own event loop: inside a running loop, await arun_episode(...)"
        )
    return asyncio.run(
        arun_episode(
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
        )
    )
