"""Turn pydantic validation errors into one-line problems: `<dotted path>: <what is wrong>` (with a did-you-mean
for unknown keys).

Paths are dotted from the data (`environments.0.harness_options.x`), the root is called `config`, and pydantic's
own location segments (union members, validator wrappers) are never printed: the schema is walked alongside the
location to tell them apart, and the errors of a union are reduced to the member the value was meant for.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from platoon.config.overrides import (
    NUMERIC_TEXT,
    NoneType,
    article,
    child_type,
    describe,
    is_any,
    is_model,
    pick_member,
    union_members,
    unknown_key_message,
    unwrap,
    yaml_kind,
)

FLOAT_TEXT_HINT = "YAML reads an exponent without a dot as text; write 1.0e-5"

_MISSING = object()

# Errors that only say "the value has the wrong type" (a union member that did not fit).
_TYPE_ERRORS = frozenset(
    {
        "literal_error",
        "enum",
        "model_type",
        "model_attributes_type",
        "dataclass_type",
        "dataclass_exact_type",
        "int_from_float",
        "is_instance_of",
        "is_subclass_of",
        "union_tag_invalid",
        "union_tag_not_found",
        "none_required",
        "callable_type",
    }
)


def _is_type_error(kind: str) -> bool:
    return kind in _TYPE_ERRORS or kind.endswith(("_type", "_parsing"))


def dotted(path: Sequence[Any]) -> str:
    """`environments.0.harness`, or `config` for the root."""
    return ".".join(str(p) for p in path) or "config"


def value_repr(value: Any, limit: int = 80) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def type_at(schema: Any, path: Sequence[Any], data: Any) -> Any | None:
    """The annotation at a data path (union members picked by the data's shape); None when unknown."""
    tp: Any = schema
    node = data
    for seg in path:
        if tp is None:
            return None
        tp = child_type(tp, seg, node)
        if isinstance(node, Mapping):
            node = node.get(seg, _MISSING)
        elif isinstance(node, list) and isinstance(seg, int) and -len(node) <= seg < len(node):
            node = node[seg]
        else:
            node = _MISSING
    return tp


def _value_at(data: Any, path: Sequence[Any]) -> Any:
    node = data
    for seg in path:
        if (isinstance(node, Mapping) and seg in node) or (
            isinstance(node, list) and isinstance(seg, int) and -len(node) <= seg < len(node)
        ):
            node = node[seg]
        else:
            return _MISSING
    return node


@dataclass
class _Record:
    clean: list[Any]
    tags: list[tuple[int, str]]  # (position in clean, pydantic's segment)
    error: dict[str, Any]
    member_types: dict[int, Any] = field(default_factory=dict)  # position -> the union annotation there


def _analyze(error: dict[str, Any], data: Any, schema: Any) -> _Record:
    """Split a pydantic location into the data path and the union-member segments pydantic inserted."""
    loc = list(error.get("loc", ()))
    clean: list[Any] = []
    tags: list[tuple[int, str]] = []
    unions: dict[int, Any] = {}
    tp: Any = schema
    node: Any = data
    for i, seg in enumerate(loc):
        t = unwrap(tp) if tp is not None else None
        members = union_members(t) if t is not None else None
        rest = [m for m in members if m is not NoneType] if members is not None else None
        if rest is not None and len(rest) >= 2 and not any(is_any(m) for m in rest):
            # pydantic names the union member it tried: a model's class name, else a type tag.
            member = next((m for m in rest if is_model(m) and m.__name__ == seg), None)
            if member is None:
                member = pick_member(t, node if node is not _MISSING else None)
            tags.append((len(clean), str(seg)))
            unions[len(clean)] = t
            tp = member
            continue
        if rest is not None and len(rest) == 1:
            t = rest[0]
        if t is None and node is not _MISSING:
            # No schema here: a segment that does not index the data is one pydantic added.
            indexes = (isinstance(node, Mapping) and seg in node) or (
                isinstance(node, list) and isinstance(seg, int) and 0 <= seg < len(node)
            )
            if not indexes and not (i == len(loc) - 1 and error.get("type") == "missing"):
                tags.append((len(clean), str(seg)))
                continue
        clean.append(seg)
        tp = child_type(t, seg, node if node is not _MISSING else None) if t is not None else None
        if (isinstance(node, Mapping) and seg in node) or (
            isinstance(node, list) and isinstance(seg, int) and 0 <= seg < len(node)
        ):
            node = node[seg]
        else:
            node = _MISSING
    return _Record(clean=clean, tags=tags, error=error, member_types=unions)


def _reduce(records: list[_Record], data: Any) -> list[_Record | tuple[list[Any], Any]]:
    """Keep plain errors; for each union, keep the member the value was meant for, or one combined problem.

    A combined problem is returned as (path, union annotation).
    """
    out: list[_Record | tuple[list[Any], Any]] = []
    groups: dict[tuple[Any, ...], dict[str, list[_Record]]] = {}
    order: list[tuple[Any, ...] | _Record] = []
    for rec in records:
        if not rec.tags:
            order.append(rec)
            continue
        pos, tag = rec.tags[0]
        key = (pos, *rec.clean[:pos])
        if key not in groups:
            groups[key] = {}
            order.append(key)
        groups[key].setdefault(tag, []).append(rec)
    for item in order:
        if isinstance(item, _Record):
            out.append(item)
            continue
        members = groups[item]
        pos = item[0]
        path = list(item[1:])

        def depth(recs: list[_Record], pos: int = pos) -> int:
            return max(len(r.clean) - pos for r in recs)

        best = max(depth(recs) for recs in members.values())
        chosen: list[_Record] | None = None
        if best > 0:
            candidates = [recs for recs in members.values() if depth(recs) == best]
            chosen = min(candidates, key=len)
        else:
            for recs in members.values():
                if any(not _is_type_error(r.error.get("type", "")) for r in recs):
                    chosen = recs
                    break
        if chosen is None:
            first = next(iter(members.values()))[0]
            out.append((path, first.member_types.get(pos)))
            continue
        stripped = [_Record(r.clean, r.tags[1:], r.error, r.member_types) for r in chosen]
        out.extend(_reduce(stripped, data))
    return out


def _type_problem(where: str, value: Any, tp: Any, fallback: str) -> str:
    if value is None:
        return f"{where}: null is not allowed (expected {describe(tp) if tp is not None else fallback})"
    expected = article(describe(tp)) if tp is not None and not is_any(tp) else article(fallback)
    problem = f"{where}: {value_repr(value)} is not {expected}"
    if tp is not None and _expects_float(tp) and isinstance(value, str) and NUMERIC_TEXT.match(value.strip()):
        problem += f"; {FLOAT_TEXT_HINT}"
    return problem


def _expects_float(tp: Any) -> bool:
    tp = unwrap(tp)
    members = union_members(tp) or [tp]
    return any(unwrap(m) is float for m in members)


_FALLBACK_NAMES = {
    "int": "int",
    "float": "float",
    "bool": "bool",
    "string": "string",
    "str": "string",
    "bytes": "bytes",
    "list": "list",
    "dict": "mapping",
}


def _fallback_type(kind: str) -> str:
    stem = kind.split("_", 1)[0]
    return _FALLBACK_NAMES.get(stem, stem)


#: a message's leading dotted name (`min_successful_group_size (5) must ...`, `hosted.timeout_s: ...`)
_LEADING_NAME = re.compile(r"([A-Za-z_]\w*(?:\.\w+)*)(: |(?=[\s(,])|$)")


def _named_field(schema: Any, path: Sequence[Any], data: Any, message: str) -> tuple[list[Any], str]:
    """The field a section's own rule names first, relative to the section, and the message to print.

    A model validator's problem is located at its section (`train.workflow_config`); when its message starts with
    one of that section's fields, the problem is placed at that field. A leading `field: ` is then dropped from
    the message, which would only repeat the path.
    """
    if schema is None:
        return [], message
    match = _LEADING_NAME.match(message)
    tp = type_at(schema, path, data) if match else None
    section = pick_member(unwrap(tp), _value_at(data, path)) if tp is not None else None
    if match is None or not is_model(section):
        return [], message
    segments = [int(seg) if seg.isdigit() else seg for seg in match.group(1).split(".")]
    if segments[0] not in section.model_fields:
        return [], message
    return segments, message[match.end() :] if match.group(2) == ": " else message


def _format(rec: _Record, data: Any, schema: Any) -> str:
    err = rec.error
    kind = str(err.get("type", ""))
    where = dotted(rec.clean)
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        parent = type_at(schema, rec.clean[:-1], data) if schema is not None else None
        parent = pick_member(unwrap(parent), _value_at(data, rec.clean[:-1])) if parent is not None else None
        if is_model(parent):
            return unknown_key_message(parent, str(rec.clean[-1]), where)
        return f"{where}: unknown key"
    if kind == "missing":
        parent = type_at(schema, rec.clean[:-1], data) if schema is not None else None
        parent = pick_member(unwrap(parent), _value_at(data, rec.clean[:-1])) if parent is not None else None
        hints = getattr(parent, "REQUIRED_KEY_HINTS", {}) if is_model(parent) else {}
        hint = (hints or {}).get(str(rec.clean[-1])) if rec.clean else None
        return f"{where}: required key is missing" + (f"; {hint}" if hint else "")
    tp = type_at(schema, rec.clean, data) if schema is not None else None
    if tp is not None and len(rec.tags) == 0:
        # Inside a union member that was chosen, the member's own type is the relevant one.
        tp = pick_member(unwrap(tp), value)
    if kind in ("value_error", "assertion_error"):
        error = ctx.get("error")
        message = str(error) if error is not None else str(err.get("msg", "")).removeprefix("Value error, ")
        name = type(error).__name__ if isinstance(error, Exception) else "ValueError"
        field_path, message = _named_field(schema, rec.clean, data, message)
        if field_path:
            where = dotted([*rec.clean, *field_path])
        return f"{where}: {name}: {message}"
    if kind in ("model_type", "model_attributes_type", "dataclass_type"):
        if value is None:
            return _type_problem(where, value, tp, "mapping")
        name = ctx.get("class_name") or (tp.__name__ if is_model(tp) else "mapping")
        return f"{where}: expected a mapping ({name}), got {yaml_kind(value)}"
    if kind in ("list_type", "tuple_type", "set_type", "frozen_set_type", "iterable_type"):
        if value is None:
            return _type_problem(where, value, tp, "list")
        return f"{where}: expected a list, got {yaml_kind(value)}"
    if kind in ("dict_type", "mapping_type"):
        if value is None:
            return _type_problem(where, value, tp, "mapping")
        return f"{where}: expected a mapping, got {yaml_kind(value)}"
    if kind in ("literal_error", "enum"):
        if value is None:
            return _type_problem(where, value, tp, "value")
        expected = describe(tp) if tp is not None and describe(tp).startswith("one of") else None
        if expected is None:
            expected = "one of " + str(ctx.get("expected", "")).replace(" or ", ", ")
        return f"{where}: {value_repr(value)} is not {expected}"
    if _is_type_error(kind):
        return _type_problem(where, value, tp, _fallback_type(kind))
    message = str(err.get("msg", kind))
    return f"{where}: {message} (got {value_repr(value)})"


def validation_problems(
    exc: ValidationError,
    data: Any,
    schema: type[BaseModel] | None,
    *,
    attribute: Callable[[Sequence[Any]], str | None] | None = None,
) -> list[str]:
    """One line per problem of a ValidationError, in order, without duplicates.

    `attribute(path)` names the file a value came from when it is not the config itself (a base, the site
    profile); the problem is then prefixed with it.
    """
    records = [_analyze(dict(e), data, schema) for e in exc.errors(include_url=False)]
    problems: list[str] = []
    for item in _reduce(records, data):
        if isinstance(item, _Record):
            path = item.clean
            line = _format(item, data, schema)
        else:
            path, union = item
            line = _type_problem(dotted(path), _value_at(data, path), union, "value")
        origin = attribute(path) if attribute is not None else None
        if origin:
            line = f"{origin}: {line}"
        if line not in problems:
            problems.append(line)
    return problems


def bool_number_problems(data: Any, schema: Any, path: Sequence[Any] = ()) -> list[tuple[list[Any], str]]:
    """Bools written where only an int or float is allowed (pydantic's lax mode would take them as 1/0)."""
    found: list[tuple[list[Any], str]] = []
    tp = unwrap(schema) if schema is not None else None
    if tp is None or is_any(tp):
        return found
    if isinstance(data, bool):
        members = [unwrap(m) for m in (union_members(tp) or [tp]) if m is not NoneType]
        if members and all(m in (int, float) for m in members):
            found.append((list(path), f"{dotted(path)}: {data!r} is not {article(describe(tp))}"))
        return found
    tp = pick_member(tp, data)
    if isinstance(data, Mapping):
        for key, value in data.items():
            ctp = child_type(tp, key, data)
            if ctp is not None:
                found.extend(bool_number_problems(value, ctp, [*path, key]))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            ctp = child_type(tp, index, data)
            if ctp is not None:
                found.extend(bool_number_problems(value, ctp, [*path, index]))
    return found
