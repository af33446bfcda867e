"""The checks a run makes on a loaded config beyond its schema: mixture rules, rollouts that could never train,
every component the entries name resolving, and a writable place for the run's records.

`platoon config validate` reports these so that it refuses what a run would refuse, before any run starts.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from platoon import plugins, registry
from platoon.config.environments import check_environments_defined, check_mixture
from platoon.envs.ors.remote import mixture_problems
from platoon.episode.rollout import Route
from platoon.errors import ExtensionError
from platoon.gateway.tinker_service import uses_local_server
from platoon.harness.function import FunctionHarness
from platoon.harness.registry import get_harness
from platoon.harness.spec import HarnessSpec, option_problems
from platoon.harness.toolchains import entry_toolchain_root, toolchain_problems
from platoon.programs.registry import get_program
from platoon.renderers.base import renderer_names
from platoon.request_limits import gateway_limit_problems
from platoon.rollouts.records import writable_dir_problem
from platoon.sandbox_runs import provider_problems
from platoon.startup.tinker import local_engine_problem
from platoon.startup.training_rules import training_problems

#: the workflow and rollouts core provides itself (they arrive with the trainer): nothing to look up
BUILTIN_WORKFLOWS = frozenset({"group_rollout"})
BUILTIN_ROLLOUTS = frozenset({"harness_rollout"})


def _entries(config: Any) -> list[Any]:
    return list(getattr(config, "environments", None) or [])


def run_problems(config: Any, *, kind: str) -> list[str]:
    """Mixture rules and, for training, the settings under which no rollout could ever train."""
    if kind not in ("train", "eval"):
        return []
    entries = _entries(config)
    problems = check_environments_defined(entries) or check_mixture(entries)
    if kind == "train":
        problems += training_problems(config)  # the gateway's limits among them
    else:
        problems += gateway_limit_problems()
        # A Tinker policy (no hosted model) samples the local server the config names; `platoon rollout` checks a
        # training config here too, which has no inference section.
        inference = getattr(config, "inference", None)
        hosted = inference.hosted if inference is not None else None
        if hosted is None and uses_local_server(config.tinker_base_url):
            engine = local_engine_problem(config.local_server.engine)
            problems += [engine] if engine is not None else []
    return problems


def output_problems(config: Any, *, kind: str, site_runs: str | os.PathLike[str] | None = None) -> list[str]:
    """Whether the run could write its records: a training run's `log_path/<experiment>/<trial>`, an evaluation's
    `inference.output_dir` (unset: `<runs>/eval`, the site profile's runs or `./runs`). A file where a directory
    goes, a read-only mount or a full disk is one line, which the run refuses (78) before writing anything."""
    if kind == "train" and getattr(config, "log_path", None) is not None:
        stats = config.stats
        target = Path(os.path.abspath(config.log_path)) / stats.experiment_name / stats.trial_name
        key = "log_path"
    elif kind == "eval" and getattr(config, "inference", None) is not None:
        explicit = config.inference.output_dir
        if explicit:
            target = Path(os.path.abspath(os.path.expanduser(explicit)))
        else:
            target = Path(site_runs if site_runs is not None else os.path.abspath("runs")) / "eval"
        key = "inference.output_dir"
    else:
        return []
    problem = writable_dir_problem(target, key=key)
    return [problem] if problem is not None else []


def _references(entry: Any) -> Iterator[tuple[str, str, Callable[[str], Any]]]:
    """(config key, reference, resolver) for every component an entry names."""

    def registered(kind: str) -> Callable[[str], Any]:
        def resolve(ref: str) -> Any:
            found = registry.lookup(kind, ref)
            if found is not None:
                return found
            if ":" in ref or "." in ref:
                return registry.resolve_import_string(ref)
            raise ExtensionError(
                f"unknown {kind.replace('_', ' ')} {ref!r}: register one with "
                f"platoon.registry.register_{kind}() in the entry's package, or name it as module:attr"
            )

        return resolve

    def service(ref: str) -> Any:
        if "://" not in ref and ":" in ref:
            return registry.resolve_import_string(ref)
        return plugins.get_service(plugins.service_scheme(ref))

    harness = entry.harness
    if isinstance(harness, str):
        yield "harness", harness, get_harness
    elif isinstance(harness, dict):
        for ref in harness:
            yield f"harness.{ref}", ref, get_harness
    yield "program", entry.program, get_program
    if entry.service:
        yield "service", entry.service, service
    if entry.reward_processor:
        yield "reward_processor", entry.reward_processor, plugins.get_reward_processor
    for key in ("dataset_loader", "eval_dataset_loader", "task_loader"):
        ref = getattr(entry, key)
        if ref:
            yield key, ref, registered("task_loader" if key == "task_loader" else "dataset_loader")
    for key in ("rollout", "eval_rollout"):
        ref = getattr(entry, key)
        if ref and ref not in BUILTIN_ROLLOUTS:
            yield key, ref, registered("rollout")
    if entry.workflow not in BUILTIN_WORKFLOWS:
        yield "workflow", entry.workflow, registered("workflow")


def renderer_problems(config: Any) -> list[str]:
    """The named renderer of a training (`train.renderer_name`) or evaluation (`inference.renderer_name`) config.

    Checked by name against the renderer registry, without loading the model's tokenizer.
    """
    import difflib

    problems = []
    for section in ("train", "inference"):
        name = getattr(getattr(config, section, None), "renderer_name", None)
        known = renderer_names()
        if name and name not in known:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            problems.append(
                f"{section}.renderer_name: unknown renderer {name!r}{hint}; the renderers are listed in "
                "docs/gateway.md, and register_renderer() adds one"
            )
    return problems


def spec_problems(entry: Any, harness: Any, *, where: str, key: str) -> list[str]:
    """A TOML spec an entry names: its `harness_options` (and, for evaluation, `eval_overrides.harness_options`
    merged over them) checked against the spec's `[options]`, then (from metadata only) whether an installed
    distribution provides the spec runner.

    In a harness mixture every spec is checked against the entry's one mapping, which must suit each of them.
    """
    if not isinstance(harness, HarnessSpec):
        return []
    problems = option_problems(harness, entry.harness_options, where=f"{where}.harness_options")
    overrides = entry.eval_overrides.harness_options
    if overrides:
        merged = Route.from_entry(entry, split="eval", task_id="-").harness_options
        problems += option_problems(
            harness, {k: merged[k] for k in overrides}, where=f"{where}.eval_overrides.harness_options"
        )

    # A run never builds: a toolchain that is not ready stops it here, before any rollout.
    root = entry_toolchain_root(entry)
    problems += [f"{where}.{key}: {line}" for line in toolchain_problems(harness, root=root)]
    # Without a spec runner a run cannot start such an entry, so `config validate` says so too; nothing is imported.
    missing = plugins.spec_runner_missing()
    if missing is not None:
        problems.append(f"{where}.{key}: harness {harness.ref} is a TOML spec; {missing}")
    return problems


def function_option_problems(entry: Any, harness: Any, *, where: str) -> list[str]:
    """A function harness's own check of the entry's `harness_options` (and, for evaluation, of
    `eval_overrides.harness_options` merged over them): what it refuses, a preparation it needs not made."""
    if not isinstance(harness, FunctionHarness) or harness.check_options is None:
        return []
    own = harness.check_options(dict(entry.harness_options))
    problems = [f"{where}.harness_options: {line}" for line in own]
    if entry.eval_overrides.harness_options:
        merged = Route.from_entry(entry, split="eval", task_id="-").harness_options
        problems += [
            f"{where}.eval_overrides.harness_options: {line}"
            for line in harness.check_options(dict(merged))
            if line not in own  # said once, where it is written
        ]
    return problems


def component_problems(config: Any) -> list[str]:
    """Resolve (importing where needed) every component the config names; one line per failure."""
    problems: list[str] = []
    for index, entry in enumerate(_entries(config)):
        where = f"environments.{index}"
        if entry.package:
            try:
                importlib.import_module(entry.package)
            except Exception as exc:  # the user's package: any failure to import it is reported, not raised
                problems.append(
                    f"{where}.package: {entry.package} failed to import: {type(exc).__name__}: {exc}"
                )
                continue
        for key, ref, resolve in _references(entry):
            try:
                resolved = resolve(ref)
            except (ExtensionError, ValueError, TypeError, ImportError, AttributeError) as exc:
                problems.append(f"{where}.{key}: {exc}")
                continue
            if key.startswith("harness"):
                problems += spec_problems(entry, resolved, where=where, key=key)
                problems += function_option_problems(entry, resolved, where=where)
    entries = _entries(config)
    if len(entries) > 1 and any(str(getattr(e, "service", "") or "").startswith("ors+") for e in entries):
        # remote entries without a variant must not reach one server under two environment names
        problems += mixture_problems(entries)

    # a sandbox provider no installed distribution provides (e.g. platoon-sandbox is missing): what to install
    problems += provider_problems(_entries(config))
    # after the entries' packages are imported: they may register renderers
    return problems + renderer_problems(config)
