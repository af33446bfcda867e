"""platoon-sandbox's hook implementations: the light module its entry points name (imported only when named)."""

from __future__ import annotations

from platoon.hookspecs import CommandGroup, SandboxRuntime, hookimpl

#: name -> (summary, the provider class as an import string: a provider module loads only when a run picks it)
RUNTIMES = {
    "process": (
        "host processes in a private directory; no isolation (tests and laptops)",
        "platoon_sandbox.process:ProcessProvider",
    ),
    "docker": (
        "one container per sandbox through the docker CLI",
        "platoon_sandbox.docker:DockerProvider",
    ),
    "singularity": (
        "Singularity/Apptainer instances through hpc-sandbox (the hpc extra)",
        "platoon_sandbox.hpc:SingularityProvider",
    ),
    "enroot": (
        "enroot containers through hpc-sandbox (the hpc extra)",
        "platoon_sandbox.hpc:EnrootProvider",
    ),
}


@hookimpl
def platoon_register_commands(name: str) -> CommandGroup | None:
    if name == "sandbox":
        return CommandGroup("sandbox", "sandbox reaping", "platoon_sandbox.cli:app")
    return None


@hookimpl
def platoon_register_sandbox_runtimes(name: str) -> SandboxRuntime | None:
    if name in RUNTIMES:
        summary, provider = RUNTIMES[name]
        return SandboxRuntime(name, summary, provider)
    return None
