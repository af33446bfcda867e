"""`platoon prepare CONFIG [k=v ...] [--dry-run]`, and the run-start check that refuses a run whose
services are not prepared on this site (exit 78, naming the prepare command).

Prepare makes once per site what a config needs, step by step, each skipped when already done: per entry, the
steps of its service's plugin (Harbor: `dataset`, `images`, through the `service.prepare` seam), each TOML
spec's `toolchain <name>` (the `toolchain.prepare` seam) and what a function harness prepares for the entry's
options (its `prepare`: TextCraft's published prompts); then the policy's `tokenizer` once. Core imports no
plugin: it loads the plugin that declares the service's name and asks the seams. Every step's own work is
idempotent and guarded by file locks, so an interrupted prepare leaves what the next one finishes.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from platoon import hooks, plugins
from platoon.config.environments import EnvironmentsOnlyConfig
from platoon.config.loader import load_config
from platoon.config.messages import validation_problems
from platoon.config.site import describe_site
from platoon.errors import ConfigError, ExtensionError, NotPrepared
from platoon.extras import installed
from platoon.harness.function import FunctionHarness
from platoon.harness.registry import get_harness
from platoon.harness.toolchains import entry_toolchain_root, prepare_toolchain
from platoon.hookspecs import PrepareStep
from platoon.renderers.tokenizers import LLAMA3_PREFIX, LLAMA3_TOKENIZER, is_tokenizer_registered
from platoon.sandbox_runs import site_provider_problem

__all__ = [
    "check_prepared",
    "not_prepared_lines",
    "prepare_command",
    "run_prepare",
    "service_problems",
    "tokenizer_step",
]

STATUSES = ("current", "done", "missing", "failed", "none")


def prepare_command(config: str, overrides: Sequence[str] = ()) -> str:
    """`platoon prepare CONFIG [k=v ...]`, shell-quoted, as a refusal prints it."""
    return shlex.join(["platoon", "prepare", config, *overrides])


# ------------------------------------------------------------------------------------------------ loading


def load_environments(config: str, overrides: Sequence[str]) -> tuple[Any, list[Any]]:
    """(the loaded file, its validated entries): only `environments` is read and validated; overrides are untyped
    YAML (no schema applies to the rest of the file), and the site profile fills provider gaps, never log_path."""
    from pydantic import ValidationError

    loaded = load_config(config, list(overrides), kind="none")
    raw = loaded.data.get("environments")
    if not raw:
        raise ConfigError(f"{config}: lists no environments (nothing to prepare)")
    data = {"environments": raw}
    try:
        checked = EnvironmentsOnlyConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc, data, EnvironmentsOnlyConfig), source=config) from None
    return loaded, list(checked.environments)


def entry_label(entry: Any, index: int) -> str:
    return f"environments[{entry.name if entry.name else index}]"


def cache_root_of(loaded: Any) -> str | None:
    site = getattr(loaded, "site", None)
    return str(site.cache_root) if site is not None else None


# -------------------------------------------------------------------------------------------- the seams


def _service_seam(seam: str, service: str) -> list[Callable[..., Any]]:
    """The seam's functions once the plugin that declares `service` (by its scheme, in the services group, else
    the command group of that name: platoon-harbor declares `harbor` as both) is loaded."""
    scheme = plugins.service_scheme(service)
    for kind in ("service", "command"):
        found = plugins.candidates(kind, scheme)
        if found:
            for info in found:
                try:
                    plugins.load(info)
                except ExtensionError:
                    continue  # a broken plugin: resolving the service reports it
            break
    return hooks.hooks(seam)


def service_steps(
    entry: Any, *, cache_root: str | None, dry_run: bool, config: str | None
) -> Iterable[PrepareStep]:
    service = getattr(entry, "service", None)
    if not service:
        return
    options = dict(entry.service_kwargs or {})
    for fn in _service_seam("service.prepare", service):
        answer = fn(service, options, cache_root, dry_run, config)
        if answer is not None:
            yield from answer
            return


def service_problems(loaded: Any, entries: Sequence[Any], *, config: str | None) -> list[str]:
    """Each entry's service's not-prepared lines (dotted by entry); runs never build or fetch."""
    problems: list[str] = []
    for index, entry in enumerate(entries):
        service = getattr(entry, "service", None)
        if not service:
            continue
        options = dict(entry.service_kwargs or {})
        for fn in _service_seam("service.problems", service):
            answer = fn(service, options, cache_root_of(loaded), config)
            if answer is not None:
                problems += [f"environments.{index}.service_kwargs: {line}" for line in answer]
                break
    return problems


def check_prepared(loaded: Any, config: str, overrides: Sequence[str] = ()) -> None:
    """The run-start check of train, eval and rollout: raise `NotPrepared` (exit 78, naming `platoon prepare`
    with this config and overrides) when a service's dataset or images are not prepared on this site."""
    entries = list(getattr(getattr(loaded, "config", None), "environments", None) or [])
    problems = service_problems(loaded, entries, config=config)
    if problems:
        raise NotPrepared(problems, command=prepare_command(config, overrides))


def not_prepared_lines(loaded: Any, config: str, overrides: Sequence[str] = ()) -> list[str]:
    """`check_prepared` as `platoon config validate` reports it: what a service needs prepared on this site and is
    not (a dataset not fetched, images not built), then the command that prepares it; none when all is ready."""
    entries = list(getattr(loaded.config, "environments", None) or [])
    lines = service_problems(loaded, entries, config=config)
    return [*lines, f"prepare it with: {prepare_command(config, overrides)}"] if lines else []


# ---------------------------------------------------------------------------------------------- toolchains


def _harness_refs(entry: Any) -> list[str]:
    harness = entry.harness
    if isinstance(harness, str):
        return [harness]
    if isinstance(harness, Mapping):
        return list(harness)
    return []


def harness_steps(entry: Any, *, where: str, cache_root: str | None, dry_run: bool) -> Iterable[PrepareStep]:
    """Each harness's steps: a TOML spec's toolchain; what a function harness prepares for the entry's options."""
    for ref in _harness_refs(entry):
        try:
            harness = get_harness(ref)
        except (ExtensionError, ValueError, TypeError, ImportError, AttributeError) as exc:
            raise ConfigError(f"{where}.harness: {exc}") from None
        if isinstance(harness, FunctionHarness):
            if harness.prepare is not None:
                yield from harness.prepare(dict(entry.harness_options), cache_root, dry_run)
            continue
        step = prepare_toolchain(harness, root=entry_toolchain_root(entry), dry_run=dry_run)
        if step is not None:
            yield step


# ----------------------------------------------------------------------------------------------- tokenizer


def _policy(data: Mapping[str, Any]) -> tuple[str | None, str | None, bool]:
    """(model name, renderer, hosted) of a training or evaluation config's policy."""
    for section in ("train", "inference"):
        value = data.get(section)
        if isinstance(value, Mapping):
            return value.get("model_name"), value.get("renderer_name"), value.get("hosted") is not None
    return None, None, False


#: the files a tokenizer is made of (what `AutoTokenizer.from_pretrained` reads)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "*.tiktoken",
    "config.json",
)


def tokenizer_step(data: Mapping[str, Any], *, dry_run: bool) -> PrepareStep:
    """`tokenizer`: skipped (none) for hosted models, without a renderer or without the tinker extra; current for
    a registered name, a local directory or a tokenizer already in the Hugging Face cache; else downloaded into the
    cache (the hub's own offline switch, `HF_HUB_OFFLINE=1`, makes that a failure that says so)."""

    model, renderer, hosted = _policy(data)
    if hosted:
        return PrepareStep("tokenizer", "none", "a hosted model needs no tokenizer here")
    if not model or not renderer:
        return PrepareStep("tokenizer", "none", "no renderer, so no Tinker policy is served")

    if is_tokenizer_registered(model):
        return PrepareStep("tokenizer", "current", f"{model} (registered with platoon)")
    if os.path.isdir(os.path.expanduser(model)):
        return PrepareStep("tokenizer", "current", f"{model} (a local directory)")
    if not (installed("transformers") and installed("huggingface_hub")):
        return PrepareStep(
            "tokenizer", "none", "the tinker extra is not installed (pip install platoon-core[tinker])"
        )
    repo = LLAMA3_TOKENIZER if model.startswith(LLAMA3_PREFIX) else model
    from huggingface_hub import try_to_load_from_cache

    for name in ("tokenizer_config.json", "tokenizer.json"):
        found = try_to_load_from_cache(repo, name)
        if isinstance(found, str):
            return PrepareStep("tokenizer", "current", f"{repo} (in the Hugging Face cache)")
    if dry_run:
        return PrepareStep("tokenizer", "missing", f"{repo} would be downloaded into the Hugging Face cache")
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(repo, allow_patterns=list(TOKENIZER_FILES))
    except Exception as exc:  # the hub's errors (offline, not found, gated): the step fails with its message
        return PrepareStep("tokenizer", "failed", f"{repo}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    return PrepareStep("tokenizer", "done", f"{repo} -> {path}")


# -------------------------------------------------------------------------------------------------- running


def run_prepare(
    config: str,
    overrides: Sequence[str] = (),
    *,
    dry_run: bool = False,
    out: Callable[[str], None] = print,
    err: Callable[[str], None],
) -> int:
    """Prepare what `config` needs; print one line per step (`out`) and the verdict, the site's lines on `err`.
    Returns 0 ready, 1 not ready; configuration errors raise (exit 78)."""
    say = err
    loaded, entries = load_environments(config, overrides)
    for line in describe_site(
        loaded.site, loaded.site_gave, looked_at=loaded.site_looked_at, mention_absence=True
    ):
        say(line)
    if not dry_run and (unavailable := site_provider_problem(loaded.site)) is not None:
        raise ConfigError(unavailable)
    cache_root = cache_root_of(loaded)
    steps: list[tuple[str, PrepareStep]] = []

    def show(where: str, step: PrepareStep) -> None:
        steps.append((where, step))
        out(f"{where} {step.step}: {step.status}" + (f": {step.detail}" if step.detail else ""))

    for index, entry in enumerate(entries):
        where = entry_label(entry, index)
        for step in service_steps(entry, cache_root=cache_root, dry_run=dry_run, config=config):
            show(where, step)
        for step in harness_steps(
            entry, where=f"environments.{index}", cache_root=cache_root, dry_run=dry_run
        ):
            show(where, step)
    show("policy", tokenizer_step(loaded.data, dry_run=dry_run))

    failed = [f"{where} {step.step}" for where, step in steps if step.status == "failed"]
    missing = [step for _, step in steps if step.status == "missing"]
    if failed:
        out(f"not ready: {len(failed)} step(s) failed ({', '.join(failed)})")
        return 1
    if missing:
        out(f"not ready: {len(missing)} step(s) would make something (a dry run changes nothing)")
        return 1
    made = sum(1 for _, step in steps if step.status == "done")
    current = sum(1 for _, step in steps if step.status == "current")
    out(f"ready: {f'{made} made now, ' if made else ''}{current} already current")
    return 0
