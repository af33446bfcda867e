"""platoon-sandbox's hook implementations: the light module its entry points name (imported only when named)."""

from __future__ import annotations

from platoon.hookspecs import CommandGroup, SandboxRuntime, hookimpl


@hookimpl
def platoon_register_commands(name: str) -> CommandGroup | None:
    if name == "sandbox":
        return CommandGroup("sandbox", "sandbox reaping", "platoon_sandbox.cli:app")
    return None


@hookimpl
def platoon_register_sandbox_runtimes(name: str) -> SandboxRuntime | None:
    # Import strings: the provider modules load only when a run picks them.
    if name == "docker":
        return SandboxRuntime(
            "docker",
            "one container per sandbox through the docker CLI",
            "platoon_sandbox.docker:DockerProvider",
        )
    return None
