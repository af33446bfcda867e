"""The process-default policy: a seam through which `platoon.testing.serve_policy` makes the in-process rollouts of
`platoon train`, `platoon eval` and `platoon rollout` sample a scripted policy instead of the service.

The product only reads it (`default_policy()`); the test kit installs it. What is installed is any object with a
`gateway(*, model_name, renderer, renderer_kwargs, **settings)` method that returns a `ModelGateway`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["default_policy", "install_default_policy"]

_installed: Any = None


def default_policy() -> Any:
    """The installed default policy, or None (the usual case: rollouts sample the configured service)."""
    return _installed


def install_default_policy(policy: Any) -> Any:
    """Install `policy` (None removes it); returns what was installed before, for the caller to put back."""
    global _installed
    previous, _installed = _installed, policy
    return previous
