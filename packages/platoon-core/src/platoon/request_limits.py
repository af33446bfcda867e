"""Bounds on one HTTP request to platoon's services: the model gateway and the local Tinker server.

Both read request bodies within a size cap (each service enforces it while reading) and parse them with
`loads_within_depth`, which refuses JSON nested deeper than a cap: no parser or later walk over the body can then
recurse without bound. `limit_from_env` reads a cap's variable once, when a server is made.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEFAULT_MAX_JSON_DEPTH",
    "MIB",
    "JSONTooDeep",
    "limit_from_env",
    "loads_within_depth",
    "nested_deeper_than",
]

MIB = 1 << 20
#: objects and lists inside one another; no request platoon's clients send comes near it (a chat request is ~6 deep)
DEFAULT_MAX_JSON_DEPTH = 64


class JSONTooDeep(ValueError):
    """A JSON body nested deeper than the cap; the message names the cap."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body's JSON is nested more than {limit} levels deep")
        self.limit = limit


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether decoded JSON holds objects and lists more than `limit` levels deep (the top level is level 1).

    Iterative, so a deep value cannot exhaust the stack; a list is scanned element by element only when it holds a
    container, so the long number lists of a training request cost one pass in C.
    """
    if not isinstance(value, list | dict):
        return False
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        kinds = set(map(type, children))
        if list in kinds or dict in kinds:
            pending.extend((child, depth + 1) for child in children if isinstance(child, list | dict))
    return False


def loads_within_depth(raw: bytes | str, max_depth: int) -> Any:
    """`json.loads(raw)`, refusing nesting deeper than `max_depth` with `JSONTooDeep`; any other malformed body
    raises `ValueError` (as `json.loads` does)."""
    try:
        value = json.loads(raw)
    except RecursionError:  # deeper than the interpreter's own limit: far past any cap
        raise JSONTooDeep(max_depth) from None
    if nested_deeper_than(value, max_depth):
        raise JSONTooDeep(max_depth)
    return value


def limit_from_env(name: str, default: int, env: Mapping[str, str] | None = None) -> int:
    """The positive integer in `$name`, else `default`; a value that is not one raises ValueError naming it."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a positive integer; got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value}")
    return value
