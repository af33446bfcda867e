"""platoon-harnesses's hook implementations: the light module its entry points name (imported only when named).

Harness modules are imported inside the hook, so listing components never imports them (nor IPython).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from platoon.hookspecs import SPEC_RUNNER_NAME, CommandGroup, SpecRunner, hookimpl

#: harness name -> (module, function) of the built-in function harnesses
FUNCTION_HARNESSES: dict[str, tuple[str, str]] = {
    "platoon-react": ("platoon_harnesses.react", "react"),
    "platoon-codeact": ("platoon_harnesses.codeact.harness", "codeact"),
    "platoon-oracle": ("platoon_harnesses.oracle", "oracle"),
    "platoon-noop": ("platoon_harnesses.noop", "noop"),
}

#: where the built-in TOML specs live: each in a folder of its own beside the files it ships
SPECS_DIR = Path(__file__).resolve().parent / "specs"
#: harness name -> its TOML spec (loaded and checked by core when the name is looked up)
SPEC_HARNESSES: dict[str, Path] = {
    "platoon-bash": SPECS_DIR / "platoon-bash" / "platoon-bash.toml",
    "mini-swe-agent": SPECS_DIR / "mini-swe-agent" / "mini-swe-agent.toml",
    "openhands": SPECS_DIR / "openhands" / "openhands.toml",
}


@hookimpl
def platoon_register_commands(name: str) -> CommandGroup | None:
    if name == "toolchain":
        return CommandGroup("toolchain", "toolchain builds", "platoon_harnesses.cli:app")
    return None


@hookimpl
def platoon_register_spec_runners(name: str) -> SpecRunner | None:
    """The TOML spec runner (imported when a spec first runs, not here)."""
    if name == SPEC_RUNNER_NAME:
        return SpecRunner(name, "runs TOML spec harnesses", "platoon_harnesses.spec_runner:SpecRunner")
    return None


@hookimpl
def platoon_register_harnesses(name: str) -> Any:
    """The decorated function of the built-in function harness `name`, the path of the built-in TOML spec
    `name`, or None for any other name."""
    spec = SPEC_HARNESSES.get(name)
    if spec is not None:
        return spec
    target = FUNCTION_HARNESSES.get(name)
    if target is None:
        return None
    module, attr = target
    return getattr(importlib.import_module(module), attr)


@hookimpl
def platoon_toolchain_problems(spec: Any, root: str | None) -> list[str] | None:
    """The run-start refusal for a spec whose toolchain is not ready (platoon_harnesses.toolchains.check)."""
    from platoon_harnesses import toolchains

    try:
        problem = toolchains.check(spec, toolchains.toolchain_root(root))
    except toolchains.ToolchainError as exc:
        problem = str(exc)
    return [problem] if problem is not None else None


@hookimpl
def platoon_toolchain_prepare(spec: Any, root: str | None, dry_run: bool) -> Any:
    """`platoon prepare`'s `toolchain <name>` step (never forces a rebuild)."""
    from platoon.hookspecs import PrepareStep
    from platoon_harnesses import toolchains

    status, detail = toolchains.prepare(spec, toolchains.toolchain_root(root), dry_run=dry_run)
    return PrepareStep(f"toolchain {spec.toolchain}", status, detail)
