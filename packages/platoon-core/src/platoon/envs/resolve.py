"""The environment service a config entry names: `resolve_service` (a service reference or object) and
`entry_service_kwargs` (its options with relative input paths made absolute).

Shared by training, evaluation, rollout workers and `platoon.testing`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["entry_service_kwargs", "resolve_service"]


def resolve_service(service: Any, service_kwargs: Mapping[str, Any] | None = None) -> Any:
    """An `EnvironmentService` from a service reference (`table`, `python://mod:Class`, `module:Class`) or as is."""
    if not isinstance(service, str):
        if service_kwargs:
            raise ValueError("service_kwargs apply to a service reference, not to a service object")
        return service
    from platoon import plugins

    kwargs = dict(service_kwargs or {})
    scheme = plugins.service_scheme(service)
    if scheme != service:  # a URI: the factory takes it first
        factory = plugins.resolve_target(plugins.get_service(scheme).factory)
        return factory(service, **kwargs)
    if ":" in service:
        return plugins.resolve_target(service)(**kwargs)
    return plugins.resolve_target(plugins.get_service(service).factory)(**kwargs)


def entry_service_kwargs(entry: Any, base_dir: Path) -> dict[str, Any]:
    """The entry's service options with relative input paths made absolute against `base_dir`.

    The loader already made a config file's paths absolute; this covers entries built in code.
    """
    from platoon.config.paths import is_left_alone, service_path_options

    kwargs = dict(entry.service_kwargs)
    for option in service_path_options(entry.service):
        value = kwargs.get(option.name)
        if "[]." in option.name or not isinstance(value, str) or is_left_alone(value):
            continue
        expanded = os.path.expanduser(value)
        if not os.path.isabs(expanded):
            kwargs[option.name] = os.path.normpath(base_dir / expanded)
    return kwargs
