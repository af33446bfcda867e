"""Toolchains seen from core: the check a run makes before any rollout, and `platoon prepare`'s
`toolchain <name>` step, for the TOML specs a config names.

Building, reading and staging toolchains is platoon-harnesses' work. Core never imports it: it loads the plugin
that provides the `platoon toolchain` command group (only its light hook module, not the command line) and asks the
seams `toolchain.problems` and `toolchain.prepare` (`platoon.hookspecs`), which `platoon.hooks.register` can also
serve.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from platoon import hooks, plugins
from platoon.errors import ExtensionError
from platoon.harness.spec import HarnessSpec
from platoon.hookspecs import PrepareStep

__all__ = ["entry_toolchain_root", "needs_toolchain", "prepare_toolchain", "toolchain_problems"]

#: the command group whose provider owns toolchains
TOOLCHAIN_COMMAND = "toolchain"


def needs_toolchain(harness: Any) -> bool:
    """Whether a harness is a TOML spec whose toolchain platoon builds (`[install.recipe]`)."""
    return (
        isinstance(harness, HarnessSpec)
        and harness.install is not None
        and harness.install.toolchain is not None
        and harness.install.recipe is not None
    )


def entry_toolchain_root(entry: Any) -> str | None:
    """A Harbor entry's deprecated `service_kwargs.toolchain_root`, which overrides the site's root for it."""
    if getattr(entry, "service", None) != "harbor":
        return None
    kwargs = getattr(entry, "service_kwargs", None)
    root = kwargs.get("toolchain_root") if isinstance(kwargs, Mapping) else None
    return str(root) if root else None


def _seam(name: str) -> list[Callable[..., Any]]:
    try:
        plugins.get_command_group(TOOLCHAIN_COMMAND)  # registers its provider's hook module
    except ExtensionError:
        pass  # nothing installed provides toolchains: only registered functions can answer
    return hooks.hooks(name)


def _no_provider(spec: Any) -> str:
    return (
        f"harness {spec.ref} needs the toolchain {spec.install.toolchain}, and nothing installed checks or builds "
        "toolchains: install platoon-harnesses (pip install platoon-harnesses)"
    )


def toolchain_problems(spec: Any, *, root: str | None = None) -> list[str]:
    """The lines a run refuses with because the spec's toolchain is missing, unfinished, stale or unreadable."""
    if not needs_toolchain(spec):
        return []
    functions = _seam("toolchain.problems")
    if not functions:
        return [_no_provider(spec)]
    problems: list[str] = []
    for fn in functions:
        problems += list(fn(spec, root) or [])
    return problems


def prepare_toolchain(spec: Any, *, root: str | None = None, dry_run: bool = False) -> PrepareStep | None:
    """`platoon prepare`'s step for the spec's toolchain (None when the spec has none to build)."""
    if not needs_toolchain(spec):
        return None
    step = f"toolchain {spec.install.toolchain}"
    for fn in _seam("toolchain.prepare"):
        answer = fn(spec, root, dry_run)
        if answer is not None:
            return answer
    return PrepareStep(step, "failed", _no_provider(spec))
