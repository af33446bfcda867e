"""Running a TOML spec harness from core: the seam to the spec runner and the outcome rules of a spec run.

Core never imports the runner's package: it asks the `platoon.spec_runners` entry points (platoon-harnesses
declares `platoon-spec-runner`) the first time a spec runs, and keeps one runner instance per process, so the
runner can cache installs. `config validate` checks from metadata alone that a distribution declares one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from platoon import plugins
from platoon.envs.service import Outcome
from platoon.episode.outcomes import infra_from_exception
from platoon.harness.agent import AgentResult, AgentStatus
from platoon.harness.spec import HarnessSetupError, SpecError

if TYPE_CHECKING:
    from platoon.envs.service import SessionNeeds
    from platoon.episode.context import Agent
    from platoon.harness.spec import HarnessSpec

__all__ = ["SpecRollout", "failure_outcome", "open_spec_rollout", "spec_runner"]

_REASON_LIMIT = 500


class SpecRollout(Protocol):
    """One rollout's use of a spec, as the runner gives it to core.

    `needs()` runs before the session opens (only when placement is not `local` and the service's `open` takes
    `needs`); `run()` launches the root agent and answers with its `AgentResult` (raising `HarnessSetupError` or
    `SpecError` for what failed before the agent could run); `misc` is the root trajectory's `harness` record
    after the run (placement, exit code, timed out, logs path); `aclose()` releases what the rollout held.
    """

    misc: dict[str, Any]

    async def needs(self) -> SessionNeeds | None: ...

    async def run(
        self, agent: Agent, *, options: Mapping[str, Any], timeout: float | None
    ) -> AgentResult: ...

    async def aclose(self) -> None: ...


_runner: Any = None
_runner_lock = threading.Lock()


def spec_runner() -> Any:
    """The process's spec runner instance (its package imported now); ExtensionError (78) when none is installed."""
    global _runner
    with _runner_lock:
        if _runner is None:
            record = plugins.get_spec_runner()
            factory = plugins.resolve_target(record.runner)
            _runner = factory()
        return _runner


def open_spec_rollout(
    spec: HarnessSpec,
    *,
    gateway: Any,
    rollout: Any,
    route: Any,
    logs_dir: str | Path | None,
) -> SpecRollout:
    """The runner's handle on one rollout of `spec` (nothing is started until `needs()` or `run()`)."""
    handle: SpecRollout = spec_runner().open_rollout(
        spec,
        gateway=gateway,
        rollout=rollout,
        placement=getattr(route, "placement", "auto"),
        builtins=getattr(route, "builtins", "default"),
        logs_dir=None if logs_dir is None else Path(logs_dir),
    )
    return handle


def _short(text: str) -> str:
    return text if len(text) <= _REASON_LIMIT else text[: _REASON_LIMIT - 3] + "..."


def failure_outcome(exc: BaseException) -> Outcome:
    """What a failure of the runner itself (not of the agent) makes of the rollout: always untrainable, never 0.

    Setup errors are infra `harness_setup`; spec errors (a placeholder without a value, options the spec does not
    take, a built-ins knob it lacks) infra `harness_config`; anything else the kind the exception names
    (`sandbox_gone` for a sandbox killed under the agent), else infra `unexpected:<Type>`.
    """
    if isinstance(exc, HarnessSetupError):
        return Outcome.infra("harness_setup", reason=_short(str(exc)))
    if isinstance(exc, SpecError):
        return Outcome.infra("harness_config", reason=_short(str(exc)))
    return infra_from_exception(exc)


async def run_spec(
    handle: SpecRollout, agent: Agent, *, options: Mapping[str, Any], timeout: float | None
) -> tuple[AgentResult, Outcome | None]:
    """`handle.run(...)`, with a failure of the runner itself turned into (an error result, its infra outcome)."""
    try:
        return await handle.run(agent, options=options, timeout=timeout), None
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return AgentResult(AgentStatus.ERROR, error=f"{type(exc).__name__}: {exc}"), failure_outcome(exc)
