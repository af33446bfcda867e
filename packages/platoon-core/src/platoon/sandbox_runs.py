"""A run's sandboxes, seen from core: the run label, the providers a run could have used, and
run-level reaping.

Core never imports a sandbox package: providers are reached through `platoon.plugins.get_sandbox_runtime(name)`
(entry points `platoon.sandbox_runtimes`), and the run label travels to every process a run starts (rollout
workers, the sandboxes' own code) in the environment variable `PLATOON_SANDBOX_LABELS`, a JSON object the
sandbox package's registry reads. Reaping logs its failures and never raises: a run must not fail because a
left-over sandbox would not stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from platoon import plugins
from platoon.rollouts.records import RESOLVED_CONFIG_FILE
from platoon.sandbox import SandboxProvider, as_provider_class

__all__ = [
    "DEFAULT_PROVIDER",
    "LABELS_ENV",
    "REAP_BUDGET_SECONDS",
    "RUN_LABEL",
    "carry_labels",
    "install_hint",
    "provider_missing",
    "provider_problems",
    "reap_run",
    "reap_run_async",
    "run_label",
    "run_providers",
    "set_run_label",
    "site_provider_problem",
]

log = logging.getLogger(__name__)

#: the JSON object of labels every sandbox started below this process carries (read by platoon-sandbox)
LABELS_ENV = "PLATOON_SANDBOX_LABELS"
RUN_LABEL = "platoon.run"
#: a Harbor entry that names no provider, with no site-profile provider, uses this one
DEFAULT_PROVIDER = "docker"
#: one run-level reap, all providers together
REAP_BUDGET_SECONDS = 120.0

#: What to install for each built-in provider.
_INSTALL = {
    "process": "platoon-sandbox",
    "docker": "platoon-sandbox",
    "singularity": "platoon-sandbox[hpc]",
    "enroot": "platoon-sandbox[hpc]",
}


def run_label(run_dir: str | os.PathLike[str]) -> str:
    """The run label of a run dir: its absolute path (symlinks kept, `..` folded)."""
    return os.path.normpath(os.path.abspath(os.fspath(run_dir)))


def carry_labels(labels: Mapping[str, str]) -> None:
    """Set labels in this process's environment, over the ones already there, so that every process it starts
    (and the sandbox registry of this one) carries them."""
    current: dict[str, str] = {}
    try:
        loaded = json.loads(os.environ.get(LABELS_ENV) or "{}")
        if isinstance(loaded, dict):
            current = {str(k): str(v) for k, v in loaded.items() if isinstance(v, str) and v}
    except ValueError:
        pass  # a malformed value from outside: replaced by ours
    current.update({k: v for k, v in labels.items() if v})
    os.environ[LABELS_ENV] = json.dumps(current, sort_keys=True)


def set_run_label(run_dir: str | os.PathLike[str]) -> str:
    """Label every sandbox this run starts with `platoon.run = <absolute run dir>`; returns the label."""
    label = run_label(run_dir)
    carry_labels({RUN_LABEL: label})
    return label


def install_hint(name: str) -> str:
    """What to install for a provider: `uv add platoon-sandbox` (or `[hpc]`), else a distribution providing it."""
    what = _INSTALL.get(name)
    if what is None:
        return f"install a distribution whose `platoon.sandbox_runtimes` entry point provides {name!r}"
    return f"install it with `uv add '{what}'`" if "[" in what else f"install it with `uv add {what}`"


def provider_missing(name: str) -> str | None:
    """Why the sandbox provider `name` cannot be used here (no installed distribution provides it), or None.

    An import string (`module:Class`) is the user's own provider: it is not looked up here."""
    if ":" in name:
        return None

    try:
        plugins.get_sandbox_runtime(name)
    except Exception:  # not provided by any installed distribution
        pass
    else:
        return None
    what = _INSTALL.get(name)
    if what is not None and "[" not in what:
        from importlib import metadata

        try:
            version = metadata.version(what)
        except metadata.PackageNotFoundError:
            pass
        else:  # installed, yet without this provider: an older (or newer) release
            return f"sandbox provider {name!r} is not provided by the installed {what} {version}"
    return f"sandbox provider {name!r} is not installed: {install_hint(name)}"


def provider_problems(entries: Any) -> list[str]:
    """One line per Harbor entry (of a validated config, the site profile's provider already applied) whose
    named sandbox provider no installed distribution provides. An entry naming none gets the service default,
    which the Harbor service itself checks."""
    problems: list[str] = []
    for index, entry in enumerate(entries or []):
        if getattr(entry, "service", None) != "harbor":
            continue
        name = (getattr(entry, "service_kwargs", None) or {}).get("provider")
        if isinstance(name, str) and name and (missing := provider_missing(name)) is not None:
            problems.append(f"environments.{index}.service_kwargs.provider: {missing}")
    return problems


def site_provider_problem(site: Any) -> str | None:
    """Why the site profile's `provider` cannot run here (no installed distribution provides it), quoting the
    profile, or None. Commands that start sandboxes (train, eval, config validate) refuse it with exit 78."""
    name = getattr(site, "provider", None)
    if not isinstance(name, str) or not name or (missing := provider_missing(name)) is None:
        return None
    return (
        f"site profile {site.path}: provider: {name}: {missing}; or set $PLATOON_SITE to another profile "
        "(/dev/null for none)"
    )


def run_providers(
    data: Mapping[str, Any], site: Any = None, *, default: str | None = DEFAULT_PROVIDER
) -> list[tuple[str, dict[str, Any]]]:
    """The distinct `(provider, options)` a run's resolved config could have started sandboxes with: each
    Harbor entry's `service_kwargs.provider` + `provider_options`; an entry without one gets the site profile's
    provider with the entry's options laid over the profile's, else `default`. The site profile's provider
    itself is listed too (a run may have used it through an environment of its own)."""
    out: list[tuple[str, dict[str, Any]]] = []

    def add(name: Any, options: Any) -> None:
        if not isinstance(name, str) or not name:
            return
        item = (name, dict(options) if isinstance(options, Mapping) else {})
        if item not in out:
            out.append(item)

    site_provider = getattr(site, "provider", None)
    site_options = dict(getattr(site, "provider_options", None) or {})
    for entry in data.get("environments") or []:
        if not isinstance(entry, Mapping) or entry.get("service") != "harbor":
            continue
        kwargs = entry.get("service_kwargs")
        kwargs = kwargs if isinstance(kwargs, Mapping) else {}
        own = kwargs.get("provider_options")
        own = dict(own) if isinstance(own, Mapping) else {}
        if kwargs.get("provider"):
            add(kwargs["provider"], own)
        elif site_provider:
            add(site_provider, {**site_options, **own})
        elif default:
            add(default, own)
    if site_provider:
        add(site_provider, site_options)
    return out


def provider_class(name: str) -> type[SandboxProvider]:
    """The provider class a sandbox provider name (`docker`) or import string (`module:Class`) names."""
    if ":" in name:
        cls = plugins.resolve_target(name)
    else:
        cls = plugins.resolve_target(plugins.get_sandbox_runtime(name).provider)
    return as_provider_class(cls)


def _provider(name: str, options: Mapping[str, Any]) -> SandboxProvider:
    return provider_class(name)(**dict(options))


async def _reap_with(name: str, options: Mapping[str, Any], labels: Mapping[str, str]) -> int:
    provider = await asyncio.to_thread(_provider, name, options)  # an import may be slow
    return int(await provider.reap(dict(labels)))


async def reap_run_async(
    providers: list[tuple[str, dict[str, Any]]],
    label: str,
    *,
    deadline_s: float = REAP_BUDGET_SECONDS,
    strict: bool = False,
) -> int:
    """Reap the sandboxes labelled `platoon.run = label` through each installed provider, concurrently within
    `deadline_s`. Providers no installed distribution provides are skipped. Failures are logged (and raised as
    RuntimeError, after every provider had its turn, when `strict`). Returns how many were reaped."""
    if not label:
        raise ValueError("reaping with an empty label set is refused: it would reap every run's sandboxes")
    labels = {RUN_LABEL: label}
    usable = [(name, options) for name, options in providers if provider_missing(name) is None]
    if not usable:
        return 0
    tasks = [asyncio.ensure_future(_reap_with(name, options, labels)) for name, options in usable]
    done, pending = await asyncio.wait(tasks, timeout=deadline_s)
    for task in pending:
        task.cancel()
    problems: list[str] = []
    if pending:
        problems.append(f"{len(pending)} provider(s) did not finish reaping within {deadline_s:.0f} s")
    reaped = 0
    for (name, _), task in zip(usable, tasks, strict=True):
        if task not in done:
            continue
        exc = task.exception()
        if exc is not None:
            problems.append(f"reaping {name} sandboxes of {label} failed: {type(exc).__name__}: {exc}")
        else:
            reaped += task.result()
    for problem in problems:
        log.warning("%s", problem)
    if strict and problems:
        raise RuntimeError("; ".join(problems))
    return reaped


def reap_run(
    run_dir: str | os.PathLike[str],
    data: Mapping[str, Any] | None = None,
    site: Any = None,
    *,
    deadline_s: float = REAP_BUDGET_SECONDS,
) -> int:
    """Reap what this run's label still has, from sync or async code alike (in a thread of its own, bounded by
    `deadline_s`); never raises. `data` is the resolved config (read from the run dir when None)."""
    try:
        if data is None:
            data = _resolved(Path(run_dir))
        providers = run_providers(data, site)
        if not [name for name, _ in providers if provider_missing(name) is None]:
            return 0  # nothing installed that could have started a sandbox: no thread, no loop
    except Exception as exc:
        log.warning("not reaping the sandboxes of %s: %s", run_dir, exc)
        return 0
    label = run_label(run_dir)
    result: list[int] = []

    def work() -> None:
        try:
            result.append(asyncio.run(reap_run_async(providers, label, deadline_s=deadline_s)))
        except Exception as exc:
            log.warning("reaping the sandboxes of %s failed: %s", label, exc)

    thread = threading.Thread(target=work, name="platoon-reap", daemon=True)
    thread.start()
    thread.join(deadline_s + 5)  # the coroutine keeps its own deadline; this only guards a stuck import
    return result[0] if result else 0


def _resolved(run_dir: Path) -> Mapping[str, Any]:
    import yaml

    try:
        loaded = yaml.safe_load((run_dir / RESOLVED_CONFIG_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}  # a start refused before it wrote one started no sandbox either
    return loaded if isinstance(loaded, Mapping) else {}
