"""Component names, versions and references (`name@version`), and who may use a reserved name.

Shared by every kind of component: harnesses, programs, named environments, reward processors, services,
sandbox runtimes and command groups.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

NAME_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")
VERSION_RE = re.compile(r"^[A-Za-z0-9]+(?:[._+-][A-Za-z0-9]+)*$")
#: a service may also be named by the URI scheme it serves (`ors+http`): the name rule, with `+` joining words
SCHEME_RE = re.compile(r"^[a-z][a-z0-9]*(?:[.+-][a-z0-9]+)*$")

#: top-level modules and distributions that are first-party
FIRST_PARTY_MODULES = frozenset(
    {"platoon", "platoon_harnesses", "platoon_sandbox", "platoon_harbor", "platoon_textcraft"}
)

#: names reserved for core, beyond every `platoon-*` name
RESERVED_NAMES: dict[str, frozenset[str]] = {
    "harness": frozenset({"mini-swe-agent", "openhands"}),
    "program": frozenset({"single", "gym"}),
}


def check_name(name: object, *, what: str = "name") -> str:
    """Return `name` if it follows the name rule, else raise ValueError saying what the rule is."""
    if not isinstance(name, str) or not NAME_RE.match(name) or name.endswith(".toml"):
        raise ValueError(
            f"{what} {name!r} does not follow the naming rule: lower-case letters and digits in words "
            "joined by '.', '_' or '-' (for example 'acme-solver')"
        )
    return name


def check_version(version: object) -> str:
    """Return `version` if it follows the version rule, else raise ValueError."""
    if not isinstance(version, str) or not VERSION_RE.match(version):
        raise ValueError(
            f"version {version!r} does not follow the version rule: letters and digits joined by "
            "'.', '_', '+' or '-' (for example '1' or '2.4.6')"
        )
    return version


def owner(name: str) -> str:
    """The owner of a name: its first `-`-separated word (`platoon` for `platoon-react`)."""
    return name.split("-", 1)[0]


def is_reserved(name: str, kind: str | None = None) -> bool:
    """Whether only first-party code may register `name` (every `platoon-*` name, and core's names)."""
    if owner(name) == "platoon":
        return True
    kinds = RESERVED_NAMES if kind is None else {kind: RESERVED_NAMES.get(kind, frozenset())}
    return any(name in names for names in kinds.values())


def is_first_party_distribution(distribution: str | None) -> bool:
    """`platoon` and every `platoon-*` distribution (names compared after PEP 503 normalisation)."""
    if not distribution:
        return False
    normalized = re.sub(r"[-_.]+", "-", distribution).lower()
    return normalized == "platoon" or normalized.startswith("platoon-")


def is_first_party_module(module: str | None) -> bool:
    """Code inside one of the first-party packages (`platoon`, `platoon_harnesses`, ...)."""
    return bool(module) and str(module).split(".", 1)[0] in FIRST_PARTY_MODULES


def check_not_reserved(name: str, kind: str, module: str | None) -> None:
    """Refuse a reserved name registered from code outside the first-party packages."""
    if is_reserved(name, kind) and not is_first_party_module(module):
        suffix = name.split("-", 1)[1] if owner(name) == "platoon" and "-" in name else name
        raise ValueError(
            f"{kind} name {name!r} is reserved for platoon's own components; "
            f"name yours with your own prefix, for example 'acme-{suffix}'"
        )


def split_ref(ref: str) -> tuple[str, str | None]:
    """`name@version` -> (name, version); a bare name -> (name, None)."""
    name, sep, version = ref.partition("@")
    return name, (version if sep else None)


def version_matches(version: str, wanted: str) -> bool:
    """`@2` matches `2.4.6`: exact, or a prefix ending at a dot."""
    return version == wanted or version.startswith(wanted + ".")


def pick_version(name: str, wanted: str | None, versions: Iterable[str], *, kind: str) -> str:
    """The one registered version that `name[@wanted]` means, or a ValueError saying why there is none."""
    versions = sorted(set(versions))
    candidates = versions if wanted is None else [v for v in versions if version_matches(v, wanted)]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        have = ", ".join(f"{name}@{v}" for v in versions) or "none"
        raise LookupError(f"{kind} {name}@{wanted} is not registered (registered versions: {have})")
    refs = ", ".join(f"{name}@{v}" for v in candidates)
    raise ValueError(
        f"{kind} {name!r} is ambiguous: it matches {refs}; name one, for example {name}@{candidates[-1]}"
    )
