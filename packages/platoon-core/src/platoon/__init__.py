"""platoon: train LLM agents with reinforcement learning through a Tinker-compatible service.

`import platoon as pt` is cheap: every public name is imported on first use and then cached, so
importing platoon never pulls in torch, transformers, tinker, openreward, docker or mcp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from platoon._installation import diagnose, is_own_module, report_earlier_line
from platoon._lazy import lazy_exports

# The earlier, unrelated `platoon` line writes this same folder: say once how to separate the two (one directory
# listing; the full diagnosis runs only when one of platoon's own imports fails).
report_earlier_line()

_AGENT = "platoon.harness.agent"
_SERVICE = "platoon.envs.service"

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        [
            "AgentAPI",
            "AgentContext",
            "AgentFn",
            "AgentResult",
            "AgentStatus",
            "Budget",
            "CallKind",
            "ChatReply",
            "McpEndpoint",
            "ModelEndpoint",
            "SubagentResult",
            "ToolAccess",
        ],
        _AGENT,
    ),
    **dict.fromkeys(
        ["EnvSession", "EnvironmentService", "ForkMode", "Outcome", "SessionNeeds", "ToolResult", "ToolSpec"],
        _SERVICE,
    ),
    "EnvironmentEntry": "platoon.config.named",
    "EpisodeContext": "platoon.programs.context",
    "EpisodeProgram": "platoon.programs.registry",
    "program": "platoon.programs.registry",
    "FunctionHarness": "platoon.harness.function",
    "get_harness": "platoon.harness.registry",
    "PlatoonDeprecationWarning": "platoon.deprecations",
    "Task": "platoon.task",
    "Trajectory": "platoon.trajectory",
    "TrajectoryCollection": "platoon.trajectory",
    "hookimpl": "platoon.hookspecs",
}
#: public submodules: `pt.harness` (also the decorator) and `pt.gym`
_SUBMODULES = {"harness": "platoon.harness", "gym": "platoon.gym"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


_import_public, _public_names = lazy_exports(globals(), _EXPORTS, submodules=_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name == "__version__":
        # Resolved on first use: finding an installed distribution's version loads importlib.metadata, which
        # costs more than the rest of `import platoon` together.
        from platoon._version import running_version

        globals()[name] = version = running_version()
        return version
    try:
        return _import_public(name)
    except ImportError as exc:
        # One of platoon's own modules missing or foreign is a damaged installation: say how to repair it.
        problem = diagnose() if is_own_module(exc.name) else None
        if problem is None:
            raise
        raise ImportError(f"platoon: {problem}", name=exc.name) from None


def __dir__() -> list[str]:
    return sorted({*_public_names(), "__version__"})


if TYPE_CHECKING:
    __version__: str

    from platoon import gym as gym
    from platoon import harness as harness
    from platoon.config.named import EnvironmentEntry as EnvironmentEntry
    from platoon.deprecations import PlatoonDeprecationWarning as PlatoonDeprecationWarning
    from platoon.envs.service import EnvironmentService as EnvironmentService
    from platoon.envs.service import EnvSession as EnvSession
    from platoon.envs.service import ForkMode as ForkMode
    from platoon.envs.service import Outcome as Outcome
    from platoon.envs.service import SessionNeeds as SessionNeeds
    from platoon.envs.service import ToolResult as ToolResult
    from platoon.envs.service import ToolSpec as ToolSpec
    from platoon.harness.agent import AgentAPI as AgentAPI
    from platoon.harness.agent import AgentContext as AgentContext
    from platoon.harness.agent import AgentFn as AgentFn
    from platoon.harness.agent import AgentResult as AgentResult
    from platoon.harness.agent import AgentStatus as AgentStatus
    from platoon.harness.agent import Budget as Budget
    from platoon.harness.agent import CallKind as CallKind
    from platoon.harness.agent import ChatReply as ChatReply
    from platoon.harness.agent import McpEndpoint as McpEndpoint
    from platoon.harness.agent import ModelEndpoint as ModelEndpoint
    from platoon.harness.agent import SubagentResult as SubagentResult
    from platoon.harness.agent import ToolAccess as ToolAccess
    from platoon.harness.function import FunctionHarness as FunctionHarness
    from platoon.harness.registry import get_harness as get_harness
    from platoon.hookspecs import hookimpl as hookimpl
    from platoon.programs.context import EpisodeContext as EpisodeContext
    from platoon.programs.registry import EpisodeProgram as EpisodeProgram
    from platoon.programs.registry import program as program
    from platoon.task import Task as Task
    from platoon.trajectory import Trajectory as Trajectory
    from platoon.trajectory import TrajectoryCollection as TrajectoryCollection
