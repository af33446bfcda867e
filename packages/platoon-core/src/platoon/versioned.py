"""The store shape for the components configs name by `name@version`: harnesses, programs, named environments.

The stores themselves live in `platoon.registry`, with every other kind's.

Records carry `name`, `version` and `source`; the same source registering again replaces its record (a module
re-import), a different source under a taken ref is refused naming both, and lookups pick a version: a bare name
needs exactly one version, and `name@version` matches exactly or as a dotted prefix (`@2` matches `2.4.6`).
"""

from __future__ import annotations

import threading
from typing import Protocol

from platoon.errors import ExtensionError
from platoon.naming import pick_version


class Versioned(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def source(self) -> str | None: ...


class VersionedRegistry[R: Versioned]:
    """The `name@version` records of one kind registered in this process."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._records: dict[str, R] = {}
        self._lock = threading.Lock()

    @staticmethod
    def ref(record: Versioned) -> str:
        return f"{record.name}@{record.version}" if record.version else record.name

    def add(self, record: R) -> R:
        """Register `record`; a different source under its ref raises ValueError naming both."""
        ref = self.ref(record)
        with self._lock:
            existing = self._records.get(ref)
            if existing is not None and existing is not record and existing.source != record.source:
                raise ValueError(
                    f"{self.kind} {ref} is defined twice: by {existing.source} and by {record.source}; "
                    "give one of them another name or version"
                )
            self._records[ref] = record
        return record

    def records(self) -> dict[str, R]:
        with self._lock:
            return dict(self._records)

    def versions(self, name: str) -> dict[str, R]:
        return {r.version: r for r in self.records().values() if r.name == name}

    def pick(self, name: str, wanted: str | None) -> R:
        """The record `name[@wanted]` means; ExtensionError when it is ambiguous or that version is missing."""
        versions = self.versions(name)
        try:
            return versions[pick_version(name, wanted, versions, kind=self.kind)]
        except (LookupError, ValueError) as exc:
            raise ExtensionError(str(exc)) from exc

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
