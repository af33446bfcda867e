"""platoon-sandbox: task sandboxes for platoon, found through entry points.

The provider contract lives in core (`platoon.sandbox`); its names stay importable from here (`SandboxSpec`, `Mount`,
`ExecResult`, `Sandbox`, `SandboxProvider`) for code written against platoon 0.1.
"""

from platoon.sandbox import (
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
