"""`get_harness(ref)`: find a harness by `name[@version]`, a `.toml` path or `module:function`.

Names are looked up in installed entry points (group `platoon.harnesses`, imported when named) and in harnesses
registered by imported modules; version prefixes match at dots (`@2` matches `2.4.6`).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

from platoon import plugins
from platoon.errors import ExtensionError
from platoon.harness.function import REGISTRY, FunctionHarness, record_of, registered_harnesses
from platoon.naming import is_reserved, split_ref
from platoon.versioned import import_target


def _from_import_string(ref: str) -> FunctionHarness:
    record = record_of(import_target(ref, what="harness"))
    if record is None:
        raise ExtensionError(f"harness {ref!r} is not an @platoon.harness function")
    return record


def _absorb(answers: list[Any], name: str) -> None:
    """Register what a plugin's hook gave for `name` (functions, records; spec files come with the spec runner)."""
    for answer in answers:
        if record_of(answer) is not None:
            if answer_name(answer) != name:
                warnings.warn(
                    f"the entry point {name!r} gave the harness {answer_name(answer)!r}: "
                    "name each entry point after the harness",
                    stacklevel=3,
                )
            continue
        if isinstance(answer, str) or hasattr(answer, "__fspath__"):
            raise ExtensionError(
                f"harness {name!r} is a TOML spec ({answer}); TOML-spec harnesses are not available in this "
                "build yet (the spec runner is still to come)"
            )
        raise ExtensionError(
            f"harness entry point {name!r} gave {type(answer).__name__}, which is not a harness"
        )


def answer_name(answer: Any) -> str | None:
    record = record_of(answer)
    return record.name if record else None


def get_harness(ref: str) -> FunctionHarness:
    """The harness a config or code names. Unknown or ambiguous names raise ExtensionError (a ValueError)."""
    if not isinstance(ref, str) or not ref:
        raise ExtensionError(f"harness reference {ref!r} is not a name, a .toml path or module:function")
    if ref.endswith(".toml"):
        raise ExtensionError(
            f"harness {ref!r} is a TOML spec; TOML-spec harnesses are not available in this build yet "
            "(the spec runner is still to come)"
        )
    if ":" in ref:
        return _from_import_string(ref)
    name, wanted = split_ref(ref)
    if plugins.candidates("harness", name):
        _absorb(plugins.load_named("harness", name), name)
    versions = REGISTRY.versions(name)
    if not versions and not is_reserved(name, "harness"):
        # Legacy names: an entry point may register harnesses under names other than its own.
        for info in plugins.entry_points("harness"):
            if plugins.first_party_shadow(info) is None:
                with contextlib.suppress(ExtensionError):  # recorded; the unknown-name error lists it
                    _absorb(plugins.ask("harness", info.name, plugins.load(info)), info.name)
        versions = REGISTRY.versions(name)
        if versions:
            warnings.warn(
                f"harness {name!r} was found only by loading every harness entry point; "
                "name each entry point after the harness it provides",
                stacklevel=2,
            )
    if not versions:
        raise plugins.unknown_name_error(
            "harness",
            name,
            [r.ref for r in registered_harnesses().values()],
            "provide one with @platoon.harness in a module that an entry point (group 'platoon.harnesses') or an "
            "environment's package: imports, or name it as module:function",
        )
    return REGISTRY.pick(name, wanted)
