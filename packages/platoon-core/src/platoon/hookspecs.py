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

Every hookspec's docstring is the plugin author's reference and follows one form (pytest's `hookspec.py` is the
model), which `tests/core/test_hookspec_docs.py` holds each of them to: a summary; a `:param NAME:` line for each
parameter; `:returns:` what to answer; a paragraph opening `Called:` (when core calls it, how often, and which
plugins answer); one opening `First result: yes` or `First result: no` (pluggy's `firstresult` option) with what core
does with several answers; `Example::` and an indented hookimpl; and `.. versionadded:: X.Y.Z`.
docs/extending.md lists every hook with these facts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

# The records hooks answer with live in a low module that imports no hookspec, so the modules that build them
# (`harness.function` needs `PrepareStep`) stay below this one; they are re-exported here, where plugins import them.
from platoon.plugin_records import CommandGroup as CommandGroup
from platoon.plugin_records import PrepareStep as PrepareStep
from platoon.plugin_records import RewardProcessor as RewardProcessor
from platoon.plugin_records import SandboxRuntime as SandboxRuntime
from platoon.plugin_records import ServiceFactory as ServiceFactory
from platoon.plugin_records import SpecRunner as SpecRunner

if TYPE_CHECKING:
    from typer import Typer

    # The versioned records a registration hook answers with, each from its low record module.
    from platoon.config.environment_entry import EnvironmentEntry
    from platoon.harness.function import FunctionHarness
    from platoon.harness.spec import HarnessSpec
    from platoon.programs.record import EpisodeProgram

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


# Registration hooks: one per kind, `platoon_register_<plural>(name)`. A plugin module is registered with the
# plugin manager when one of its entry points is first named, and from then on its hookimpls answer every name
# asked of that kind, its own or not: answer None for a name that is not yours. Core flattens lists and tuples,
# skips None and modules (a module answers through what its import registered), and turns every other answer into
# its kind's record in one function per kind (`harness_records`, `program_record`, `environment_record`,
# `reward_processor_record`), which lands in the one registry (`platoon.registry`) beside code's registrations.


@hookspec
def platoon_register_harnesses(
    name: str,
) -> (
    FunctionHarness
    | HarnessSpec
    | Callable[..., Any]
    | str
    | os.PathLike[str]
    | ModuleType
    | Sequence[FunctionHarness | HarnessSpec | Callable[..., Any] | str | os.PathLike[str] | ModuleType]
    | None
):
    """Harnesses called `name` (`environments[].harness`, `ep.run(harness=...)`, `ctx.agents.spawn(harness=...)`).

    :param name: the harness's name as a config writes it, without `@version` (`acme-solver`).
    :returns: an `@platoon.harness` function, a `platoon.FunctionHarness`, a `HarnessSpec`, the path of a `.toml`
        spec or of a directory of them, a module whose import registers harnesses, a list of these, or None.
        Several versions of one name may be returned together; `name@version` picks among them. Each answer
        becomes a `FunctionHarness` or a `HarnessSpec` record (`platoon.harness.registry.harness_records`);
        anything else is an error naming the entry point. The path and module forms are the 0.2.0 shapes and
        stay accepted.

    Called: each time core resolves a harness name that an installed `platoon.harnesses` entry point declares:
    when a run or `platoon config validate` checks its config, for every rollout and every subagent that starts
    the harness, by `platoon prepare`, `platoon harness show` and `platoon extensions show|check`. So it is called
    many times in one process for one name: answer cheaply and alike each time, and import heavy modules only in
    the branch for your name. A name no entry point declares makes core load every harness entry point and ask
    each for its own name (with a warning to name entry points after their harnesses).

    First result: no. Every loaded plugin's hookimpl is called; core registers each harness it is given, and the
    versions of `name` among them answer the lookup.

    Example::

        @platoon.hookimpl
        def platoon_register_harnesses(name):
            if name == "acme-solver":
                from acme_agents.solver import solve  # an @platoon.harness("acme-solver") function

                return solve

    .. versionadded:: 0.2.0
    """


@hookspec
def platoon_register_programs(
    name: str,
) -> EpisodeProgram | Callable[..., Any] | ModuleType | Sequence[EpisodeProgram | Callable[..., Any]] | None:
    """Episode programs called `name` (`environments[].program`).

    :param name: the program's name as a config writes it, without `@version`.
    :returns: an `@platoon.program` function called `name` (or its `platoon.EpisodeProgram` record), a list of
        them (its versions), a module whose import registers them (the 0.2.0 shape, still accepted), or None.
        Each answer becomes an `EpisodeProgram` record (`platoon.programs.registry.program_record`). A program of
        another name is an error naming the entry point: an entry point is named after the program it provides.

    Called: each time core resolves a program name that an installed `platoon.programs` entry point declares:
    for every rollout of an entry naming it, when an evaluation sets up its entries, and by `platoon program show`
    and `platoon extensions show|check`. So it is called many times in one process for one name: answer cheaply
    and alike each time.

    First result: no. Every loaded plugin's hookimpl is called; every program given must be called `name`, and
    all of them are registered as its versions.

    Example::

        @platoon.hookimpl
        def platoon_register_programs(name):
            if name == "acme-best-of-two":
                from acme_agents.programs import best_of_two  # an @platoon.program("acme-best-of-two") function

                return best_of_two

    .. versionadded:: 0.2.0
    """


@hookspec
def platoon_register_environments(
    name: str,
) -> EnvironmentEntry | ModuleType | Sequence[EnvironmentEntry] | None:
    """Named environments called `name` (`environments[].env`).

    :param name: the environment's name as a config writes it, without `@version` (`acme-sums`).
    :returns: a `platoon.EnvironmentEntry` called `name`, a list of them (its versions), a module (skipped: the
        0.2.0 shape, still accepted), or None. Each answer is checked and registered as it is
        (`platoon.config.named.environment_record`); anything else is an error naming the entry point; an entry
        named after another installed environment entry point is skipped (a module shared by several entry points
        may answer them all).

    Called: each time core resolves an environment name that an installed `platoon.environments` entry point
    declares, once per such entry point: when a config with `env: <name>` is loaded (every command that loads
    one), by `platoon env show`, `platoon.testing.run_episode(env=...)` and `platoon extensions show|check`.

    First result: no. Every loaded plugin's hookimpl is called; each `EnvironmentEntry` called `name` is
    registered as one of its versions.

    Example::

        @platoon.hookimpl
        def platoon_register_environments(name):
            if name == "acme-sums":
                from acme_agents.environments import SUMS  # a platoon.EnvironmentEntry("acme-sums", "1", ...)

                return SUMS

    .. versionadded:: 0.2.0
    """


@hookspec
def platoon_register_reward_processors(
    name: str,
) -> (
    RewardProcessor
    | Callable[[Mapping[str, Any]], tuple[float, Mapping[str, float]]]
    | Sequence[RewardProcessor]
    | None
):
    """The reward processor called `name` (`environments[].reward_processor`).

    :param name: the processor's name as a config writes it.
    :returns: a `RewardProcessor` (its `fn` a callable or an import string `"pkg.mod:fn"`, imported when a run
        names the processor), the callable `fn(trajectory_dict) -> (score, components)` itself, or None. The
        answer becomes a `RewardProcessor` record (`platoon.plugins.reward_processor_record`) and its callable is
        registered under `name` where `register_reward_processor` registers: a different function under that
        name is an error naming both.

    Called: the first time a process resolves a processor name that an installed `platoon.reward_processors`
    entry point declares: in the start-up checks of `platoon train`, `eval`, `rollout` and `config validate`, or
    when `platoon.testing.run_episode(reward_processor=...)` scores. Core keeps the answer for the process, so
    one name is asked once (again only while nothing answers it); `platoon extensions show|check` ask afresh.

    First result: no. Every loaded plugin's hookimpl is called; core keeps the first answer called `name` (a
    plain callable counts as called `name`), in pluggy's order: the last registered plugin first.

    Example::

        @platoon.hookimpl
        def platoon_register_reward_processors(name):
            if name == "acme-partial":
                return RewardProcessor(name, "partial credit", "acme_agents.rewards:partial")

    .. versionadded:: 0.2.0
    """


@hookspec
def platoon_register_services(
    name: str,
) -> ServiceFactory | Callable[..., Any] | Sequence[ServiceFactory] | None:
    """The environment service for `name`: a service name (`harbor`, `table`) or a URI scheme (`python`, `ors+http`).

    :param name: the service name, or the scheme of a service URI (`python` for `python://pkg.mod:Cls`).
    :returns: a `ServiceFactory` (its `factory` a callable or an import string `module:attr`), the factory
        callable itself, or None.

    Called: the first time a process resolves a service name or scheme that an installed `platoon.services`
    entry point declares: when a config naming it is loaded (its path options) and checked, when a rollout
    builds its service (in the training process or a rollout worker). Core keeps the answer for the process, so
    one name is asked once (again only while nothing answers it); `platoon extensions show|check` ask afresh.

    First result: no. Every loaded plugin's hookimpl is called; core keeps the first answer called `name` (a bare
    factory counts as called `name`), in pluggy's order: the last registered plugin first.

    Example::

        @platoon.hookimpl
        def platoon_register_services(name):
            if name == "acme-lab":
                return ServiceFactory(name, "tasks graded by the lab", "acme_lab.service:LabService")

    .. versionadded:: 0.2.0
    """


@hookspec
def platoon_register_sandbox_runtimes(name: str) -> SandboxRuntime | type | Sequence[SandboxRuntime] | None:
    """The sandbox provider called `name` (Harbor's `service_kwargs.provider`, the site profile's provider).

    :param name: the provider's name (`docker`, `process`).
    :returns: a `SandboxRuntime` (its `provider` a class or an import string `module:Class`), the provider class
        itself, or None.

    Called: the first time a process resolves a provider name that an installed `platoon.sandbox_runtimes` entry
    point declares: when a run's start-up checks or the site profile check the provider, when a service opens its
    first sandbox, and by `platoon sandbox` commands. Core keeps the answer for the process, so one name is asked
    once (again only while nothing answers it); `platoon extensions show|check` ask afresh.

    First result: no. Every loaded plugin's hookimpl is called; core keeps the first answer called `name` (a bare
    class counts as called `name`), in pluggy's order: the last registered plugin first.

    Example::

        @platoon.hookimpl
        def platoon_register_sandbox_runtimes(name):
            if name == "acme-vm":
                return SandboxRuntime(name, "one micro-VM per sandbox", "acme_vm.provider:VMProvider")

    .. versionadded:: 0.2.0
    """


@hookspec
def platoon_register_commands(name: str) -> CommandGroup | Typer | Sequence[CommandGroup] | None:
    """The command group called `name`, mounted as `platoon <name> ...`.

    :param name: the group's name, the first word after `platoon`.
    :returns: a `CommandGroup` (its `app` a `typer.Typer` or an import string `module:attr` naming one), the
        `typer.Typer` itself, or None.

    Called: the first time a process runs `platoon <name> ...` for a name an installed `platoon.commands` entry
    point declares (`platoon --help` lists groups from metadata and never asks), and when core needs a plugin's
    seams that come with a group (the `toolchain` group brings the toolchain seams). Core keeps the answer for
    the process, so one name is asked once (again only while nothing answers it); `platoon extensions
    show|check` ask afresh.

    First result: no. Every loaded plugin's hookimpl is called; core keeps the first answer called `name` (a bare
    `typer.Typer` counts by its own name or none), in pluggy's order: the last registered plugin first.

    Example::

        @platoon.hookimpl
        def platoon_register_commands(name):
            if name == "acme":
                return CommandGroup("acme", "the acme lab's tools", "acme_agents.cli:app")

    .. versionadded:: 0.2.0
    """


@hookspec
def platoon_register_spec_runners(name: str) -> SpecRunner | type | Sequence[SpecRunner] | None:
    """The runner of TOML spec harnesses called `name`.

    :param name: the runner's name; core asks only for `SPEC_RUNNER_NAME` (`platoon-spec-runner`, declared by
        platoon-harnesses in the group `platoon.spec_runners`).
    :returns: a `SpecRunner` (its `runner` a class or an import string `module:Class`), the runner class itself,
        or None. The runner class takes no arguments; its instance answers `open_rollout(spec, ...)` with an
        object that prepares the session's needs (`needs()`), runs the root agent (`run(agent, timeout=...)`) and
        cleans up (`aclose()`): see `platoon.episode.spec_runs.SpecRollout`.

    Called: once per process, the first time a rollout runs a TOML spec harness; core keeps the runner instance.
    Nothing is imported before that: `platoon config validate` only checks from metadata that an installed
    distribution declares the runner. `platoon extensions show|check` ask afresh.

    First result: no. Every loaded plugin's hookimpl is called; core keeps the first answer called `name` (a bare
    class counts as called `name`), in pluggy's order: the last registered plugin first.

    Example::

        @platoon.hookimpl
        def platoon_register_spec_runners(name):
            if name == "platoon-spec-runner":
                return SpecRunner(name, "TOML spec harnesses", "acme_runner.runner:Runner")

    .. versionadded:: 0.2.0
    """


# Named seams: hooks that are not components. `platoon.hooks.hooks(name)` returns the functions
# registered with `platoon.hooks.register` and these hookimpls of loaded plugins together: a plugin module answers
# a seam only in a process where one of its entry points was named. Core calls the functions itself, in that
# order (registered functions first, then hookimpls in the order their plugins were loaded).


@hookspec
def platoon_rollout_worker_telemetry() -> Mapping[str, float] | None:
    """Counters every rollout worker reports (`rollout_worker.telemetry`), e.g. `{"sandboxes_started": 3.0}`.

    :returns: a mapping of counter names to numbers, or None. A value that is not a number is dropped. Each
        counter is the metric `train/<name>` of a training step, averaged over its rollouts.

    Called: in every rollout worker process, by its monitor thread every 2 seconds while the rollout runs (the
    values also go to the worker's diagnostic marker, read when a worker dies), and once when the worker writes
    its response. Keep it fast and thread-safe; an exception is logged and
    skipped, never failing the rollout.

    First result: no. Every function is called; their mappings are merged, a later one's key replacing an
    earlier one's.

    Example::

        @platoon.hookimpl
        def platoon_rollout_worker_telemetry():
            return {"acme_vms_started": float(ACME_VMS.started)}

    .. versionadded:: 0.2.0
    """


@hookspec
def platoon_rollout_worker_diagnostics() -> Mapping[str, str] | None:
    """Short strings for a rollout worker's diagnostic marker (`rollout_worker.diagnostics`).

    :returns: a mapping of names to short strings (other values are written with `str`), or None. Each is written
        to the worker's marker file as `note.<name>`, which is what is left to read when a worker dies.

    Called: in every rollout worker process, by its monitor thread every 2 seconds while the rollout runs. Keep it fast and thread-safe; an exception is logged and skipped, never
    failing the rollout.

    First result: no. Every function is called; their mappings are merged, a later one's key replacing an
    earlier one's.

    Example::

        @platoon.hookimpl
        def platoon_rollout_worker_diagnostics():
            return {"acme_vm": ACME_VMS.current_id or "none"}

    .. versionadded:: 0.2.0
    """


@hookspec
def platoon_trajectory_error_completion_ids(steps: list[Any]) -> set[str] | None:
    """Completion ids among `steps` whose actions failed (`trajectory.error_completion_ids`).

    :param steps: one trajectory's `platoon.trajectory.TrajectoryStep` list, one step per model call; a step's
        completion id is `step.misc["action_misc"]["completion_id"]`.
    :returns: the completion ids (strings, or values written with `str`) of the steps whose actions failed, in
        addition to those core finds itself (an `error` in the step, a traceback in its output, a tool call marked
        `is_error`); None or an empty set for none. Their action tokens are not reinforced where their advantage
        is positive.

    Called: in the training process, once per policy-eligible trajectory of every rollout turned into training
    data, while `train.workflow_config.filter_errors` is on (the default). An exception fails the rollout's
    group, as a reward processor's does.

    First result: no. Every function is called; the ids are united.

    Example::

        @platoon.hookimpl
        def platoon_trajectory_error_completion_ids(steps):
            return {
                str(step.misc["action_misc"]["completion_id"])
                for step in steps
                if step.misc.get("acme_verdict") == "invalid"
            }

    .. versionadded:: 0.2.0
    """


@hookspec
def platoon_trajectory_message_completion_ids(steps: list[Any]) -> set[str] | None:
    """Completion ids among `steps` that only sent a message (`trajectory.message_completion_ids`).

    :param steps: one trajectory's `platoon.trajectory.TrajectoryStep` list, one step per model call; a step's
        completion id is `step.misc["action_misc"]["completion_id"]`.
    :returns: the completion ids (strings, or values written with `str`) of the steps that called no tool, or
        None. Their tokens are not trained on; core finds no such steps itself, so only these ids are left out.

    Called: in the training process, once per policy-eligible trajectory of every rollout turned into training
    data, while `train.workflow_config.filter_message_actions` is on (it is off by default). An exception fails
    the rollout's group, as a reward processor's does.

    First result: no. Every function is called; the ids are united.

    Example::

        @platoon.hookimpl
        def platoon_trajectory_message_completion_ids(steps):
            return {
                str(step.misc["action_misc"]["completion_id"])
                for step in steps
                if not step.misc["message"].get("tool_calls")
            }

    .. versionadded:: 0.2.0
    """


# The toolchain seams. Core asks them for the TOML specs a config names; the plugin that provides the `platoon
# toolchain` command group (platoon-harnesses) is loaded first, so its hookimpls answer.


@hookspec
def platoon_toolchain_problems(spec: Any, root: str | None) -> list[str] | None:
    """The lines a run refuses with (exit 78) because the toolchain `spec` needs is not ready on this site.

    :param spec: the `platoon.harness.spec.HarnessSpec` an environment entry names, one whose `[install]` names a
        toolchain and a recipe to build it.
    :param root: the toolchain root the run uses (the entry's `service_kwargs.toolchain_root`); None: the site's.
    :returns: one line per problem, each naming what is wrong and the command that fixes it (`platoon toolchain
        build <ref> --root <root>`); an empty list or None when the toolchain is ready or the spec is not yours.

    Called: when a run (`platoon train`, `eval`, `rollout`) or `platoon config validate` checks its config
    before anything starts: once for each harness reference of an environment entry that names such a spec.
    Runs never build: a line here stops the run before its first rollout. Where no plugin or registered function
    provides the seam, core refuses the spec itself, naming platoon-harnesses.

    First result: no. Every function is called; their lines are joined, each prefixed with the entry's dotted
    path.

    Example::

        @platoon.hookimpl
        def platoon_toolchain_problems(spec, root):
            if spec.install.toolchain != "acme-node":
                return None
            if not acme_toolchain_built(root):
                return [f"the acme-node toolchain is not built: run `acme build --root {root}`"]
            return []

    .. versionadded:: 0.2.0
    """


@hookspec
def platoon_toolchain_prepare(spec: Any, root: str | None, dry_run: bool) -> PrepareStep | None:
    """`platoon prepare`'s `toolchain <name>` step for `spec`: build what is missing, or only say what would be built.

    :param spec: the `platoon.harness.spec.HarnessSpec` an environment entry names, one whose `[install]` names a
        toolchain and a recipe to build it.
    :param root: the toolchain root the run uses (the entry's `service_kwargs.toolchain_root`); None: the site's.
    :param dry_run: True for `platoon prepare --dry-run`: build nothing, answer `missing` for what would be built.
    :returns: the `PrepareStep` that was made (`done`), was already there (`current`), would be made (`missing`)
        or failed (`failed`); None when the spec is not yours. Never force a rebuild of a toolchain another recipe
        built.

    Called: by `platoon prepare` (and `--prepare` on `train`, `eval` and `rollout`), once for each harness
    reference of an environment entry that names such a spec.

    First result: no (pluggy's option is off): core calls the functions in order itself and prints the first
    answer that is not None; the later ones are not called. When none answers, the step fails, naming
    platoon-harnesses.

    Example::

        @platoon.hookimpl
        def platoon_toolchain_prepare(spec, root, dry_run):
            if spec.install.toolchain != "acme-node":
                return None
            step = f"toolchain {spec.install.toolchain}"
            if acme_toolchain_built(root):
                return PrepareStep(step, "current", f"in {root}")
            if dry_run:
                return PrepareStep(step, "missing", f"would build it in {root}")
            acme_build(root)
            return PrepareStep(step, "done", f"built in {root}")

    .. versionadded:: 0.2.0
    """


# The service seams. `platoon prepare` and the run-start check ask them for each entry that names a service; core
# first loads the plugin that declares the service's name (as a service, else as a command group), so its hookimpls
# answer.


@hookspec
def platoon_service_prepare(
    service: str, options: Mapping[str, Any], cache_root: str | None, dry_run: bool, config: str | None
) -> Iterable[PrepareStep] | None:
    """`platoon prepare`'s steps for an environment entry of `service` (Harbor: `dataset`, `images`).

    :param service: the entry's `service` as written (`harbor`, `python://pkg.mod:Cls`).
    :param options: the entry's `service_kwargs`, the site profile applied.
    :param cache_root: the site's cache root; None: the default.
    :param dry_run: True for `platoon prepare --dry-run`: make nothing, answer `missing` for what would be made.
    :param config: the config file as the user named it (for the commands a step's line suggests); None when
        there is none.
    :returns: an iterable of `PrepareStep`s, each made when missing (with `dry_run`, only said), which core
        prints one by one as it yields (a generator shows progress); None when the service is not yours.

    Called: by `platoon prepare` (and `--prepare` on `train`, `eval` and `rollout`), once for each environment
    entry that names a service.

    First result: no (pluggy's option is off): core calls the functions in order itself and prints the steps of
    the first answer that is not None; the later ones are not called.

    Example::

        @platoon.hookimpl
        def platoon_service_prepare(service, options, cache_root, dry_run, config):
            if service != "acme-lab":
                return None
            return acme_prepare_steps(options, cache_root, dry_run=dry_run)  # a generator of PrepareStep

    .. versionadded:: 0.2.0
    """


@hookspec
def platoon_service_problems(
    service: str, options: Mapping[str, Any], cache_root: str | None, config: str | None
) -> list[str] | None:
    """The lines a run refuses with (`NotPrepared`, exit 78) because what an entry of `service` needs is not
    prepared on this site (a dataset not fetched, images not built).

    :param service: the entry's `service` as written (`harbor`, `python://pkg.mod:Cls`).
    :param options: the entry's `service_kwargs`, the site profile applied.
    :param cache_root: the site's cache root; None: the default.
    :param config: the config file as the user named it; None when there is none.
    :returns: one line per problem (core prefixes each with `environments.<i>.service_kwargs:` and the refusal
        names `platoon prepare` with the run's config); an empty list when all is prepared; None when the service
        is not yours. Runs never build or fetch: only say what is missing.

    Called: at the start of `platoon train`, `eval` and `rollout`, before anything starts, and by `platoon config
    validate`: once for each environment entry that names a service.

    First result: no (pluggy's option is off): core calls the functions in order itself and keeps the lines of the
    first answer that is not None; the later ones are not called.

    Example::

        @platoon.hookimpl
        def platoon_service_problems(service, options, cache_root, config):
            if service != "acme-lab":
                return None
            if not acme_dataset_fetched(options, cache_root):
                return ["the acme-lab dataset is not fetched"]
            return []

    .. versionadded:: 0.2.0
    """


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
