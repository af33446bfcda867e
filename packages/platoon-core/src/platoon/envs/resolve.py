"""The environment service a config entry names: `resolve_service` (a service reference or object),
`entry_service_kwargs` (its options with relative input paths made absolute) and `LazyServices` (services built
on first use).

Shared by training, evaluation, rollout workers and `platoon.testing`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from platoon import plugins
from platoon.config.paths import is_left_alone, service_path_options
from platoon.errors import ConfigError

__all__ = ["LazyServices", "entry_service_kwargs", "resolve_service"]


def resolve_service(service: Any, service_kwargs: Mapping[str, Any] | None = None) -> Any:
    """An `EnvironmentService` from a service reference (`table`, `python://mod:Class`, `module:Class`) or as is."""
    if not isinstance(service, str):
        if service_kwargs:
            raise ValueError("service_kwargs apply to a service reference, not to a service object")
        return service

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
    kwargs = dict(entry.service_kwargs)
    for option in service_path_options(entry.service):
        value = kwargs.get(option.name)
        if "[]." in option.name or not isinstance(value, str) or is_left_alone(value):
            continue
        expanded = os.path.expanduser(value)
        if not os.path.isabs(expanded):
            kwargs[option.name] = os.path.normpath(base_dir / expanded)
    return kwargs


class LazyServices(Mapping[str, Any]):
    """label -> service, each built by `resolve_service` on its first lookup and kept.

    Building an in-process ORS service imports its SDK (seconds): a start that finds nothing to train, or a
    `config validate` answered from the task listing cache, never looks one up. Iterating gives the labels
    without building anything. A service that fails to build is the config's problem (exit 78), named by `where`.
    """

    def __init__(self, specs: Mapping[str, tuple[Any, Mapping[str, Any], str]]) -> None:
        # label -> (service reference or object, its service_kwargs, where the config names it)
        self._specs = dict(specs)
        self._built: dict[str, Any] = {}

    def __getitem__(self, label: str) -> Any:
        try:
            return self._built[label]
        except KeyError:
            pass
        service, kwargs, where = self._specs[label]
        try:
            built = resolve_service(service, kwargs)
        except (
            Exception
        ) as exc:  # the user's service: a failure to build it is one line, as the listing says it
            reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            raise ConfigError(f"{where}: {reason}") from exc
        self._built[label] = built
        return built

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    @property
    def built(self) -> dict[str, Any]:
        """The services built so far (nothing is built by asking)."""
        return dict(self._built)
