"""`k=v` / `k+=v` overrides typed by the config schema, and the library argv form.

Values are parsed against the annotation of the field they set, found by walking the pydantic model's
`model_fields`; with no schema every value is untyped YAML. The type helpers here are shared with the message
formatter and the loader's normalization.
"""

from __future__ import annotations

import copy
import difflib
import enum
import os
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Annotated, Any, Literal, TypeGuard, Union

import yaml
from pydantic import BaseModel

from platoon.errors import ConfigError

NULL_WORDS = frozenset({"null", "Null", "NULL", "none", "None", "~"})
TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
FALSE_WORDS = frozenset({"false", "no", "off", "0"})

# Numbers with an exponent that YAML 1.1 reads as text (`1e-5`, `3E5`, `1.0e5`); the inf/nan words are not numbers.
_EXPONENT_NUMBER = re.compile(r"^[-+]?(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)[eE][-+]?\d+$")
# Any decimal or exponent number written as text (what YAML may leave as a string in a float field).
NUMERIC_TEXT = re.compile(r"^[-+]?(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][-+]?\d+)?$")

_KEY_SHAPE = re.compile(r"^[A-Za-z_][\w.\-\[\]]*\+?=")


# ---------------------------------------------------------------------------------------------------------------
# Type helpers (generic over pydantic models)
# ---------------------------------------------------------------------------------------------------------------

NoneType = type(None)


def unwrap(tp: Any) -> Any:
    """The annotation without `Annotated[...]` wrappers (and `Any` for a missing annotation)."""
    if tp is None:
        return Any
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def union_members(tp: Any) -> list[Any] | None:
    """The members of a union annotation (None included), or None when `tp` is not a union."""
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        return [unwrap(m) for m in typing.get_args(tp)]
    return None


def is_any(tp: Any) -> bool:
    return tp is Any or tp is object or isinstance(tp, typing.TypeVar)


def is_model(tp: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def is_str_like(tp: Any) -> bool:
    """`str` and path types: override text is taken verbatim."""
    tp = unwrap(tp)
    if not isinstance(tp, type) or issubclass(tp, enum.Enum):
        return False
    return issubclass(tp, (str, PurePath)) or tp is os.PathLike


def list_item_type(tp: Any) -> Any | None:
    """The item type when `tp` is a list-like annotation (list, tuple, set, Sequence), else None."""
    tp = unwrap(tp)
    origin = typing.get_origin(tp) or tp
    if not isinstance(origin, type) or issubclass(origin, (str, bytes)):
        return None
    if issubclass(origin, (list, tuple, set, frozenset)) or origin in (Sequence, typing.Sequence):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return unwrap(args[0]) if args else Any
    try:
        from collections import abc

        if issubclass(origin, (abc.Sequence, abc.Set)) and not issubclass(origin, Mapping):
            params = typing.get_args(tp)
            return unwrap(params[0]) if params else Any
    except TypeError:
        pass
    return None


def mapping_value_type(tp: Any) -> Any | None:
    """The value type when `tp` is a dict/Mapping annotation, else None."""
    tp = unwrap(tp)
    origin = typing.get_origin(tp) or tp
    if isinstance(origin, type) and issubclass(origin, Mapping) and not is_model(origin):
        args = typing.get_args(tp)
        return unwrap(args[1]) if len(args) == 2 else Any
    if typing.is_typeddict(tp):
        return Any
    return None


def model_field(model: type[BaseModel], key: str) -> tuple[str, Any] | None:
    """(field name, annotation) for a key written in a config (the field name or its alias)."""
    fields = model.model_fields
    if key in fields:
        return key, unwrap(fields[key].annotation)
    for name, info in fields.items():
        if info.alias == key or info.validation_alias == key:
            return name, unwrap(info.annotation)
    deprecated = getattr(model, "DEPRECATED_KEYS", {}) or {}
    if key in deprecated:
        # A deprecated key the class accepts without declaring it takes its new name's type when renamed.
        renamed = deprecated[key].renamed_to
        if renamed and renamed in fields:
            return key, unwrap(fields[renamed].annotation)
        return key, Any
    return None


def model_keys(model: type[BaseModel]) -> list[str]:
    """The keys a config may write for a model (field names, aliases where they differ)."""
    keys: list[str] = []
    for name, info in model.model_fields.items():
        keys.append(info.alias if isinstance(info.alias, str) else name)
    return keys


def did_you_mean(key: str, candidates: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def keys_below(model: type[BaseModel], key: str, depth: int = 2) -> list[str]:
    """The dotted paths inside `model`'s sections (down to `depth` levels) that end in the key `key`:
    `batch_size` -> `train.batch_size` in a training config."""
    found: list[str] = []
    for name, info in model.model_fields.items():
        written = info.alias if isinstance(info.alias, str) else name
        annotation = unwrap(info.annotation)
        for section in union_members(annotation) or [annotation]:
            if not is_model(section):
                continue
            if key in model_keys(section):
                found.append(f"{written}.{key}")
            elif depth > 1:
                found += [f"{written}.{path}" for path in keys_below(section, key, depth - 1)]
    return list(dict.fromkeys(found))


def unknown_key_message(model: type[BaseModel], key: str, dotted: str) -> str:
    """`<dotted>: unknown key; did you mean <dotted match>?` or the class's hint. The match is the key itself
    one or two sections down (a `batch_size=` that belongs under `train.`), else a close name at this level."""
    hints = getattr(model, "UNKNOWN_KEY_HINTS", {}) or {}
    if key in hints:
        return f"{dotted}: unknown key; {hints[key]}"
    parent = dotted.rsplit(".", 1)[0] + "." if "." in dotted else ""
    below = keys_below(model, key)
    if below:
        return f"{dotted}: unknown key; did you mean {' or '.join(parent + path for path in below[:3])}?"
    match = did_you_mean(key, model_keys(model))
    if match is None:
        return f"{dotted}: unknown key"
    return f"{dotted}: unknown key; did you mean {parent}{match}?"


def pick_member(tp: Any, value: Any) -> Any:
    """For a union annotation, the member that a value's shape (mapping, list, scalar) belongs to."""
    members = union_members(tp)
    if members is None:
        return tp
    rest = [m for m in members if m is not NoneType]
    if isinstance(value, Mapping):
        for m in rest:
            if is_model(m) or mapping_value_type(m) is not None:
                return m
    elif isinstance(value, list):
        for m in rest:
            if list_item_type(m) is not None:
                return m
    for m in rest:
        if is_any(m):
            return m
    if len(rest) == 1:
        return rest[0]
    return tp


def child_type(tp: Any, key: Any, value: Any = None) -> Any | None:
    """The annotation of `key` inside a value of type `tp` (Any when untyped); None when `tp` has no such key.

    `value` is the current value at `tp` (it picks a union member). Models answer unknown keys with None.
    """
    tp = unwrap(tp)
    if is_any(tp):
        return Any
    if union_members(tp) is not None:
        members = [m for m in union_members(tp) or [] if m is not NoneType]
        if isinstance(value, list):
            members = [m for m in members if list_item_type(m) is not None] or members
        elif isinstance(value, Mapping) or value is None:
            navigable = [m for m in members if is_model(m) or mapping_value_type(m) is not None or is_any(m)]
            members = navigable or members
        for m in members:
            if is_model(m) and model_field(m, str(key)) is not None:
                return child_type(m, key, value)
        for m in members:
            if not is_model(m):
                found = child_type(m, key, value)
                if found is not None:
                    return found
        return None
    if is_model(tp):
        found = model_field(tp, str(key))
        return None if found is None else found[1]
    vt = mapping_value_type(tp)
    if vt is not None:
        return vt
    it = list_item_type(tp)
    if it is not None:
        return it
    return None


def is_list_typed(tp: Any) -> bool:
    """True when a field can only hold a list (so walking into it needs an index, not a new mapping)."""
    tp = unwrap(tp)
    members = [m for m in (union_members(tp) or [tp]) if m is not NoneType]
    if any(is_any(m) or is_model(m) or mapping_value_type(m) is not None for m in members):
        return False
    return any(list_item_type(m) is not None for m in members)


def _navigable(tp: Any) -> bool:
    """Whether a value of this type can hold keys or indices (models, mappings, lists, free-form)."""
    tp = unwrap(tp)
    members = [m for m in (union_members(tp) or [tp]) if m is not NoneType]
    return any(
        is_any(m) or is_model(m) or mapping_value_type(m) is not None or list_item_type(m) is not None
        for m in members
    )


def describe(tp: Any) -> str:
    """A type as messages name it, without an article: `int`, `mapping (Class)`, `one of 'a', 'b'`, ..."""
    tp = unwrap(tp)
    if is_any(tp):
        return "value"
    if tp is NoneType:
        return "null"
    members = union_members(tp)
    if members is not None:
        parts: list[str] = []
        for m in members:
            if m is NoneType:
                continue
            d = article(describe(m))
            if d not in parts:
                parts.append(d)
        return _join_or(parts)
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    if is_model(tp):
        return f"mapping ({tp.__name__})"
    if tp is bool:
        return "bool"
    if tp is int:
        return "int"
    if tp is float:
        return "float"
    if isinstance(tp, type) and issubclass(tp, PurePath):
        return "path"
    if tp is str:
        return "string"
    if mapping_value_type(tp) is not None:
        return "mapping"
    if list_item_type(tp) is not None:
        return "list"
    return getattr(tp, "__name__", str(tp))


def _join_or(parts: list[str]) -> str:
    # The first part's article is dropped: callers add their own ("is not a <type>").
    text = " or ".join(parts)
    for art in ("an ", "a "):
        if text.startswith(art):
            return text[len(art) :]
    return text


def article(noun: str) -> str:
    """`an int`, `a float`, `one of ...` (no article), ..."""
    if noun.startswith(("one of", "null", "a ", "an ")):
        return noun
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def yaml_kind(value: Any) -> str:
    """A value's kind as messages name it: `a mapping`, `a list`, `a string`, `null`, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return "an int"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "a " + type(value).__name__


def numbers_from_exponents(value: Any) -> Any:
    """Free-form YAML values with exponent-only floats (`1e-5`) turned into numbers, recursively."""
    if isinstance(value, str) and _EXPONENT_NUMBER.match(value):
        return float(value)
    if isinstance(value, dict):
        return {k: numbers_from_exponents(v) for k, v in value.items()}
    if isinstance(value, list):
        return [numbers_from_exponents(v) for v in value]
    return value


def _exponents_where_any(value: Any, tp: Any) -> Any:
    """Apply `numbers_from_exponents` to the parts of a parsed container whose schema type is free-form."""
    tp = unwrap(tp)
    if is_any(tp):
        return numbers_from_exponents(value)
    tp = pick_member(tp, value)
    if isinstance(value, dict):
        if is_model(tp):
            out = {}
            for k, v in value.items():
                found = model_field(tp, str(k))
                out[k] = v if found is None else _exponents_where_any(v, found[1])
            return out
        vt = mapping_value_type(tp)
        if vt is not None:
            return {k: _exponents_where_any(v, vt) for k, v in value.items()}
    if isinstance(value, list):
        it = list_item_type(tp)
        if it is not None:
            return [_exponents_where_any(v, it) for v in value]
    return value


# ---------------------------------------------------------------------------------------------------------------
# Parsing one override
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Override:
    """One parsed override: `key` is dotted, `append` is true for `+=`."""

    text: str
    key: str
    value: str
    append: bool = False

    @property
    def segments(self) -> list[str]:
        return self.key.split(".")


def parse_override(text: str) -> Override:
    """Split `a.b=value` / `a.b+=value`; a malformed one raises a one-line ConfigError."""
    malformed = ConfigError(f"override {text!r} is not of the form key=value or key+=value")
    if not isinstance(text, str) or "=" not in text:
        raise malformed
    key, _, value = text.partition("=")
    append = key.endswith("+")
    if append:
        key = key[:-1]
    key = key.strip()
    if not key or any(not seg.strip() for seg in key.split(".")):
        raise malformed
    return Override(text=text, key=key, value=value, append=append)


class _Bad(Exception):
    """A value that does not fit its type (message without the dotted path)."""


def _yaml(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise _Bad(f"{text!r} is not valid YAML ({problem})") from None


def parse_value(text: str, tp: Any) -> Any:
    """The value an override's text gives for a field annotated `tp`."""
    tp = unwrap(tp)
    if is_any(tp):
        return numbers_from_exponents(_yaml(text))
    if tp is NoneType:
        if text in NULL_WORDS:
            return None
        raise _Bad(f"{text!r} is not null")
    members = union_members(tp)
    if members is not None:
        rest = [m for m in members if m is not NoneType]
        if len(rest) < len(members) and text in NULL_WORDS:
            return None
        # Typed members first, plain text last, so `1` is a number where a number is allowed.
        ordered = [m for m in rest if not is_str_like(m) and not is_any(m)]
        ordered += [m for m in rest if is_any(m)] + [m for m in rest if is_str_like(m)]
        if len(ordered) == 1:
            return parse_value(text, ordered[0])
        for member in ordered:
            try:
                return parse_value(text, member)
            except _Bad:
                continue
        raise _Bad(f"{text!r} is not {article(describe(tp))}")
    if is_str_like(tp):
        return text
    if text in NULL_WORDS:
        raise _Bad(f"null is not allowed (expected {describe(tp)})")
    if typing.get_origin(tp) is Literal:
        for allowed in typing.get_args(tp):
            if isinstance(allowed, bool):
                word = text.strip().lower()
                if (allowed and word in TRUE_WORDS) or (not allowed and word in FALSE_WORDS):
                    return allowed
            elif isinstance(allowed, enum.Enum):
                if text in (str(allowed.value), allowed.name):
                    return allowed.value
            elif str(allowed) == text:
                return allowed
        raise _Bad(f"{text!r} is not {describe(tp)}")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if text == str(member.value) or text == member.name:
                return member.value
        raise _Bad(f"{text!r} is not {describe(tp)}")
    if tp is bool:
        word = text.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise _Bad(f"{text!r} is not a bool")
    if tp is int:
        try:
            return int(text.strip())
        except ValueError:
            raise _Bad(f"{text!r} is not an int") from None
    if tp is float:
        try:
            return float(text.strip())
        except ValueError:
            raise _Bad(f"{text!r} is not a float") from None
    if is_model(tp) or mapping_value_type(tp) is not None:
        value = _yaml(text)
        if not isinstance(value, dict):
            expected = f"a mapping ({tp.__name__})" if is_model(tp) else "a mapping"
            raise _Bad(f"expected {expected}, got {yaml_kind(value)}")
        return _exponents_where_any(value, tp)
    if list_item_type(tp) is not None:
        value = _yaml(text)
        if not isinstance(value, list):
            raise _Bad(f"expected a list, got {yaml_kind(value)}")
        return _exponents_where_any(value, tp)
    # Other types (dates, custom classes): YAML, checked when the config is validated.
    return _yaml(text)


# ---------------------------------------------------------------------------------------------------------------
# Applying overrides
# ---------------------------------------------------------------------------------------------------------------


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; everything else (lists included) replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _index(segment: str, items: list[Any], dotted: str) -> int:
    try:
        index = int(segment)
    except ValueError:
        raise _Bad(f"{dotted}: {segment!r} is not a list index (an integer)") from None
    if not -len(items) <= index < len(items):
        count = f"{len(items)} entry" if len(items) == 1 else f"{len(items)} entries"
        raise _Bad(f"{dotted}: index {index} is out of range (the list has {count})")
    return index if index >= 0 else len(items) + index


def _apply_one(data: dict[str, Any], ov: Override, schema: type[BaseModel] | None) -> None:
    segments = ov.segments
    node: Any = data
    tp: Any = schema if schema is not None else Any
    done: list[str] = []
    for position, seg in enumerate(segments):
        last = position == len(segments) - 1
        dotted = ".".join([*done, seg])
        where = ".".join(done) or "config"
        if isinstance(node, list):
            index = _index(seg, node, dotted)
            ctp = child_type(tp, index, node)
            key: Any = index
            current = node[index]
        elif isinstance(node, dict):
            ctp = child_type(tp, seg, node)
            if ctp is None:
                model = pick_member(unwrap(tp), node)
                if is_model(model):
                    raise _Bad(unknown_key_message(model, seg, dotted))
                raise _Bad(f"{dotted}: {where} is {article(describe(tp))}, which has no key {seg!r}")
            if list_item_type(unwrap(tp)) is not None:
                raise _Bad(f"{dotted}: {seg!r} is not a list index (an integer)")
            key = seg
            current = node.get(seg)
        else:  # pragma: no cover - guarded when walking
            raise _Bad(f"{dotted}: cannot set a key inside {where}")
        if last:
            _set(node, key, current, ctp, ov, dotted)
            return
        if not _navigable(ctp):
            nxt = segments[position + 1]
            raise _Bad(f"{dotted}.{nxt}: {dotted} is {article(describe(ctp))}, which has no key {nxt!r}")
        if current is None:
            if is_list_typed(ctp):
                raise _Bad(f"{dotted}: has no entries to index")
            current = {}
            node[key] = current
        elif not isinstance(current, (dict, list)):
            raise _Bad(
                f"{dotted}: {current!r} is not a mapping or a list, so {segments[position + 1]!r} cannot be set in it"
            )
        done.append(seg)
        node, tp = current, ctp


def _set(node: Any, key: Any, current: Any, tp: Any, ov: Override, dotted: str) -> None:
    if ov.append:
        target = unwrap(tp)
        item_tp = list_item_type(pick_member(target, []))
        if item_tp is None and not is_any(target):
            raise _Bad(f"{dotted}: += appends to a list, but {dotted} is {article(describe(target))}")
        if current is None:
            current = []
            node[key] = current
        elif not isinstance(current, list):
            raise _Bad(f"{dotted}: += appends to a list, but the current value is {current!r}")
        try:
            item = parse_value(ov.value, item_tp if item_tp is not None else Any)
        except _Bad as exc:
            raise _Bad(f"{dotted}: {exc}") from None
        current.append(item)
        return
    try:
        value = parse_value(ov.value, tp)
    except _Bad as exc:
        raise _Bad(f"{dotted}: {exc}") from None
    if isinstance(value, dict) and isinstance(current, dict):
        node[key] = deep_merge(current, value)
    else:
        node[key] = value


def apply_overrides(
    data: Mapping[str, Any],
    overrides: Iterable[str | Override],
    schema: type[BaseModel] | None = None,
) -> dict[str, Any]:
    """A copy of `data` with the overrides applied in order; every problem is reported in one ConfigError."""
    out = copy.deepcopy(dict(data))
    problems: list[str] = []
    for item in overrides:
        try:
            ov = item if isinstance(item, Override) else parse_override(item)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        try:
            _apply_one(out, ov, schema)
        except _Bad as exc:
            problems.append(f"override {ov.text!r}: {exc}")
    if problems:
        raise ConfigError(problems)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The library argv form
# ---------------------------------------------------------------------------------------------------------------


def split_library_argv(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(config path, overrides) from `--config PATH`/`-c PATH`/`--config=PATH`, `--key=value`, `--key value`,
    bare `--key` (true) and `key=value`; anything else is refused."""
    config: str | None = None
    overrides: list[str] = []
    items = list(argv)
    i = 0

    def unexpected(arg: str) -> ConfigError:
        return ConfigError(f"unexpected argument {arg!r}: overrides are key=value")

    while i < len(items):
        arg = items[i]
        if arg in ("--config", "-c"):
            if i + 1 >= len(items):
                raise ConfigError(f"{arg} needs a config file path")
            config = items[i + 1]
            i += 2
            continue
        if arg.startswith("--config="):
            config = arg.split("=", 1)[1]
            i += 1
            continue
        if arg.startswith("--") and len(arg) > 2:
            body = arg[2:]
            if "=" in body:
                overrides.append(body)
            else:
                following = items[i + 1] if i + 1 < len(items) else None
                if (
                    following is not None
                    and not following.startswith("-")
                    and not _KEY_SHAPE.match(following)
                ):
                    overrides.append(f"{body}={following}")
                    i += 1
                else:
                    overrides.append(f"{body}=true")
            i += 1
            continue
        if not arg.startswith("-") and _KEY_SHAPE.match(arg):
            overrides.append(arg)
            i += 1
            continue
        raise unexpected(arg)
    return config, overrides
