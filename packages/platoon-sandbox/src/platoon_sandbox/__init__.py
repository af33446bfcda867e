"""platoon-sandbox: task sandboxes for platoon (harness.md 5), found through entry points.

The provider contract is importable from here (`SandboxSpec`, `Mount`, `ExecResult`, `Sandbox`,
`SandboxProvider`); it is standard-library only, so importing it is cheap.
"""

from platoon_sandbox.contract import (
    CAPABILITIES,
    ExecResult,
    Mount,
    Sandbox,
    SandboxDiskLimit,
    SandboxError,
    SandboxGone,
    SandboxProvider,
    SandboxSpec,
)

__all__ = [
    "CAPABILITIES",
    "ExecResult",
    "Mount",
    "Sandbox",
    "SandboxDiskLimit",
    "SandboxError",
    "SandboxGone",
    "SandboxProvider",
    "SandboxSpec",
]
