"""The whole contract between platoon's core and its plugins, as pluggy hookspecs.

A plugin is a distribution that declares entry points in the groups below. The entry point's *name* is the
component's name exactly as configs write it (without `@version`); its *value* is a light module carrying
`@platoon.hookimpl` functions (or, the 0.2.0 form, the component object itself). platoon imports that module
the first time a config or command names the component, registers it with the plugin manager and asks the hook
of that kind for the name.

Registration hooks are synchronous and cheap: they receive the requested `name` and return what the plugin
provides under it (or everything it provides; platoon keeps what carries that name), never a live service or
a started process. Example, a package `acme-agents` with

    [project.entry-points."platoon.harnesses"]
    acme-solver = "acme_agents.plugin"

and in `acme_agents/plugin.py`:

    import platoon

    @platoon.hookimpl
    def platoon_register_harnesses(name):
        from acme_agents.solver import solve   # an @platoon.harness("acme-solver") function
        return solve
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("platoon")
hookimpl = pluggy.HookimplMarker("platoon")

#: kind -> entry-point group
ENTRY_POINT_GROUPS: dict[str, str] = {
    "harness": "platoon.harnesses",
    "program": "platoon.programs",
    "environment": "platoon.environments",
    "reward_processor": "platoon.reward_processors",
    "service": "platoon.services",
    "sandbox_runtime": "platoon.sandbox_runtimes",
    "command": "platoon.commands",
    "spec_runner": "platoon.spec_runners",
}

#: kind -> the hook asked for components of that kind
REGISTRATION_HOOKS: dict[str, str] = {
    "harness": "platoon_register_harnesses",
    "program": "platoon_register_programs",
    "environment": "platoon_register_environments",
    "reward_processor": "platoon_register_reward_processors",
    "service": "platoon_register_services",
    "sandbox_runtime": "platoon_register_sandbox_runtimes",
    "command": "platoon_register_commands",
    "spec_runner": "platoon_register_spec_runners",
}

#: the spec runner core asks for when a TOML spec harness runs (platoon-harnesses provides it)
SPEC_RUNNER_NAME = "platoon-spec-runner"


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


@hookspec
def platoon_register_harnesses(name: str) -> Any:
    """Harnesses called `name` (`environments[].harness`, `ep.run(harness=...)`, `ctx.agents.spawn(harness=...)`).

    Return an `@platoon.harness` function, a `platoon.FunctionHarness`, a `HarnessSpec`, a path to a `.toml`
    spec or a directory of them, a module whose import registers harnesses, a list of these, or None.
    Several versions of one name may be returned together; `name@version` picks among them.
    """


@hookspec
def platoon_register_programs(name: str) -> Any:
    """Episode programs called `name` (`environments[].program`).

    Return an `@platoon.program` function, a list of them (versions), a module whose import registers them,
    or None.
    """


@hookspec
def platoon_register_environments(name: str) -> Any:
    """Named environments called `name` (`environments[].env`): a `platoon.EnvironmentEntry` or a list of versions."""


@hookspec
def platoon_register_reward_processors(name: str) -> Any:
    """The reward processor called `name`: a `RewardProcessor` or a plain callable `fn(trajectory_dict)`."""


@hookspec
def platoon_register_services(name: str) -> Any:
    """The environment service for `name` (a service name or a URI scheme): a `ServiceFactory`."""


@hookspec
def platoon_register_sandbox_runtimes(name: str) -> Any:
    """The sandbox provider called `name`: a `SandboxRuntime` (or the provider class itself)."""


@hookspec
def platoon_register_commands(name: str) -> Any:
    """The command group called `name`, mounted as `platoon <name>`: a `CommandGroup` (or a `typer.Typer`)."""


@hookspec
def platoon_register_spec_runners(name: str) -> Any:
    """The runner of TOML spec harnesses called `name`: a `SpecRunner` (or the runner class itself).

    Core asks for `SPEC_RUNNER_NAME` (`platoon-spec-runner`, declared by platoon-harnesses in the group
    `platoon.spec_runners`) the first time a rollout runs a TOML spec; nothing is imported before that, and
    `config validate` only checks from metadata that an installed distribution declares it. The runner class
    takes no arguments; its instance answers `open_rollout(spec, ...)` with an object that prepares the
    session's needs (`needs()`), runs the root agent (`run(agent, timeout=...)`) and cleans up (`aclose()`):
    see `platoon.episode.spec_runs.SpecRollout`. Example, in a plugin module:

        @platoon.hookimpl
        def platoon_register_spec_runners(name):
            if name == "platoon-spec-runner":
                return SpecRunner(name, "TOML spec harnesses", "acme_runner.runner:Runner")
    """


# Named seams: hooks that are not components. `platoon.hooks.hooks(name)` returns the functions
# registered with `platoon.hooks.register` and these hookimpls of loaded plugins together.


@hookspec
def platoon_rollout_worker_telemetry() -> Mapping[str, float] | None:
    """Counters every rollout host reports (`rollout_worker.telemetry`), e.g. `{"sandboxes_started": 3.0}`."""


@hookspec
def platoon_rollout_worker_diagnostics() -> Mapping[str, str] | None:
    """Short strings for a rollout worker's diagnostic marker (`rollout_worker.diagnostics`)."""


@hookspec
def platoon_trajectory_error_completion_ids(steps: list[Any]) -> set[str] | None:
    """Completion ids among `steps` whose actions failed (`trajectory.error_completion_ids`)."""


@hookspec
def platoon_trajectory_message_completion_ids(steps: list[Any]) -> set[str] | None:
    """Completion ids among `steps` that only sent a message (`trajectory.message_completion_ids`)."""


@dataclass(frozen=True)
class PrepareStep:
    """One step of `platoon prepare` a plugin performed: `status` is `current`, `done`, `missing` (a dry run would
    make it), `failed` or `none`; `detail` is the rest of the printed line."""

    step: str
    status: str
    detail: str


# The toolchain seams. Core asks them for the TOML specs a config names; the plugin that provides the `platoon
# toolchain` command group (platoon-harnesses) is loaded first, so its hookimpls answer. `spec` is a
# `platoon.harness.spec.HarnessSpec`; `root` is the toolchain root a run uses (None: the site's).


@hookspec
def platoon_toolchain_problems(spec: Any, root: str | None) -> list[str] | None:
    """The lines a run refuses with (exit 78) because the toolchain `spec` needs is not ready on this site.

    Each line names what is wrong and the command that fixes it (`platoon toolchain build <ref> --root <root>`).
    Return None (or nothing) when the spec is not yours to check.
    """


@hookspec
def platoon_toolchain_prepare(spec: Any, root: str | None, dry_run: bool) -> PrepareStep | None:
    """`platoon prepare`'s `toolchain <name>` step for `spec`: build what is missing (never forcing a rebuild of a
    toolchain of another recipe) or, with `dry_run`, only say what would be built."""


# The service seams. `platoon prepare` and the run-start check ask them for each entry that names a service; core
# first loads the plugin that declares the service's name (as a service, else as a command group), so its hookimpls
# answer. `service` is the entry's `service` as written; `options` its `service_kwargs` (site profile applied);
# `cache_root` the site's cache root (None: the default); `config` the config file as the user named it.


@hookspec
def platoon_service_prepare(
    service: str, options: Mapping[str, Any], cache_root: str | None, dry_run: bool, config: str | None
) -> Iterable[PrepareStep] | None:
    """`platoon prepare`'s steps for an entry of `service` (Harbor: `dataset`, `images`), each made when missing
    (with `dry_run`, only said): an iterable core prints step by step as it yields. None when not yours."""


@hookspec
def platoon_service_problems(
    service: str, options: Mapping[str, Any], cache_root: str | None, config: str | None
) -> list[str] | None:
    """The lines a run refuses with (`NotPrepared`, exit 78) because what an entry of `service` needs is not
    prepared on this site (a dataset not fetched, images not built). Runs never build: the command line names
    `platoon prepare`. None when not yours."""


#: seam name (as `platoon.hooks` names it) -> hookspec name
SEAM_HOOKS: dict[str, str] = {
    "rollout_worker.telemetry": "platoon_rollout_worker_telemetry",
    "rollout_worker.diagnostics": "platoon_rollout_worker_diagnostics",
    "trajectory.error_completion_ids": "platoon_trajectory_error_completion_ids",
    "trajectory.message_completion_ids": "platoon_trajectory_message_completion_ids",
    "toolchain.problems": "platoon_toolchain_problems",
    "toolchain.prepare": "platoon_toolchain_prepare",
    "service.prepare": "platoon_service_prepare",
    "service.problems": "platoon_service_problems",
}
