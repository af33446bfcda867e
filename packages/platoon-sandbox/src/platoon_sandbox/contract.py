"""The sandbox contract's import path of platoon 0.1; the contract itself is core's `platoon.sandbox`."""

# kept so that third-party providers importing from here keep working; first-party code imports platoon.sandbox
from platoon.sandbox import (
    CAPABILITIES,
    NETWORKS,
    OUTPUT_CAP_BYTES,
    SPEC_FIELD_CAPABILITIES,
    ExecResult,
    Mount,
    Network,
    Sandbox,
    SandboxDiskLimit,
    SandboxError,
    SandboxGone,
    SandboxProvider,
    SandboxSpec,
    unenforced_field,
)

__all__ = [
    "CAPABILITIES",
    "NETWORKS",
    "OUTPUT_CAP_BYTES",
    "SPEC_FIELD_CAPABILITIES",
    "ExecResult",
    "Mount",
    "Network",
    "Sandbox",
    "SandboxDiskLimit",
    "SandboxError",
    "SandboxGone",
    "SandboxProvider",
    "SandboxSpec",
    "unenforced_field",
]
