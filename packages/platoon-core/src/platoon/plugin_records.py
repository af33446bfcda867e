"""The plain records plugins' hooks answer with: command groups, services, sandbox runtimes, reward processors,
spec runners and `platoon prepare` steps.

Plugins import them from `platoon.hookspecs`, which re-exports them; they live here, importing nothing of platoon,
so the modules that build them sit below the hookspecs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CommandGroup", "PrepareStep", "RewardProcessor", "SandboxRuntime", "ServiceFactory", "SpecRunner"]


@dataclass(frozen=True)
class CommandGroup:
    """A command group mounted as `platoon <name> ...`.

    `app` is a `typer.Typer` or an import string `module:attr` naming one; the string form keeps the group's
    module unimported until the group runs.
    """

    name: str
    summary: str
    app: Any


@dataclass(frozen=True)
class ServiceFactory:
    """An environment service for a name (`harbor`, `table`) or a URI scheme (`python`, `ors+http`).

    `factory` is a callable or an import string `module:attr`; it is called with the entry's `service_kwargs`
    (and, for a URI scheme, the URI) to build the service when a rollout needs it.
    """

    name: str
    summary: str
    factory: Callable[..., Any] | str


@dataclass(frozen=True)
class SandboxRuntime:
    """A sandbox provider class, named as Harbor's `service_kwargs.provider` names it."""

    name: str
    summary: str
    provider: type | str


@dataclass(frozen=True)
class RewardProcessor:
    """A reward processor: `fn(trajectory_dict) -> (score, components)`, named by `environments[].reward_processor`."""

    name: str
    summary: str
    fn: Callable[[Mapping[str, Any]], tuple[float, Mapping[str, float]]] | str


@dataclass(frozen=True)
class SpecRunner:
    """The runner of TOML spec harnesses: what launches a command-line agent a spec describes.

    `runner` is a class or an import string `module:attr` naming one; core instantiates it (without arguments)
    once per process, the first time a spec runs, and keeps the instance (installs are cached per runner).
    """

    name: str
    summary: str
    runner: type | str


@dataclass(frozen=True)
class PrepareStep:
    """One step of `platoon prepare` a plugin performed: `status` is `current`, `done`, `missing` (a dry run would
    make it), `failed` or `none`; `detail` is the rest of the printed line."""

    step: str
    status: str
    detail: str
