"""Shared pieces of the tool-call parsers: the JSON rules and the schema typing of text values.

Strict JSON first, then a lenient decode (raw control characters in strings) marked as recovered; NaN,
Infinity, out-of-range numbers and nesting deeper than 1000 are refused.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from typing import Any

MAX_DEPTH = 1000


class ArgumentsError(ValueError):
    """Arguments that cannot become a JSON object; `pos` is where a JSON decode stopped, when one did."""

    def __init__(self, message: str, pos: int | None = None) -> None:
        super().__init__(message)
        self.pos = pos


def _no_constant(name: str) -> Any:
    raise ArgumentsError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 decodes to inf, which JSON cannot hold
        raise ArgumentsError(f"number out of range: {text}")
    return value


def _check_depth(value: Any) -> None:
    """Refuse nesting deeper than MAX_DEPTH (iteratively, so the check itself cannot overflow the stack)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise ArgumentsError(f"JSON nested deeper than {MAX_DEPTH}")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def _decoder(strict: bool) -> json.JSONDecoder:
    return json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float, strict=strict)


_STRICT = _decoder(True)
_LENIENT = _decoder(False)


def loads(text: str) -> tuple[Any, bool]:
    """Decode one JSON document: (value, recovered). Raises `ArgumentsError` when neither decode works."""
    value, _, recovered = _decode(text, raw=False)
    return value, recovered


def raw_decode(text: str, pos: int = 0) -> tuple[Any, int, bool]:
    """Decode one JSON value starting at `pos`: (value, end index, recovered)."""
    return _decode(text, raw=True, pos=pos)


#: the first window `decode_at` reads, and the characters before a window's end where a value may have been cut
_WINDOW, _CUT_MARGIN = 512, 10


def decode_at(text: str, pos: int) -> tuple[Any, int, bool]:
    """`raw_decode` of the object or list at `pos` of a long text, costing what the value's length costs.

    A failed decode in place costs the whole text before `pos` (the JSON error counts the lines before it), so a
    parser trying many places of a long response would take quadratic time. This reads a window from `pos`,
    doubling it while the value runs past the window's end. Only for values that open with `{` or `[`, which a cut
    window can never decode to a wrong value.
    """
    size = _WINDOW
    while True:
        stop = min(len(text), pos + size)
        window = text[pos:stop]
        try:
            value, end, recovered = _decode(window, raw=True)
        except ArgumentsError as exc:
            cut = exc.pos is not None and exc.pos >= len(window) - _CUT_MARGIN
            if stop < len(text) and (cut or "Unterminated string" in str(exc)):
                size *= 2
                continue
            raise ArgumentsError(str(exc), None if exc.pos is None else pos + exc.pos) from exc
        return value, pos + end, recovered


def _decode(text: str, *, raw: bool, pos: int = 0) -> tuple[Any, int, bool]:
    errors = []
    for decoder, recovered in ((_STRICT, False), (_LENIENT, True)):
        try:
            if raw:
                value, end = decoder.raw_decode(text, pos)
            else:
                value, end = decoder.decode(text.strip()), len(text)
        except (ValueError, RecursionError) as exc:
            errors.append(exc)
            if isinstance(exc, ArgumentsError):
                break
            continue
        _check_depth(value)
        return value, end, recovered
    raise ArgumentsError(f"invalid JSON: {errors[-1]}", getattr(errors[-1], "pos", None))


def normalize_arguments(value: Any) -> tuple[dict[str, Any], bool]:
    """Arguments as a mapping: null/missing = {}; a JSON string holding an object is decoded (recovered)."""
    if value is None:
        return {}, False
    if isinstance(value, dict):
        return value, False
    if isinstance(value, str):
        if not value.strip():
            return {}, True
        decoded, _ = loads(value)
        if isinstance(decoded, dict):
            return decoded, True
    raise ArgumentsError(f"arguments must be a JSON object; got {type(value).__name__}")


def dumps_arguments(arguments: Mapping[str, Any]) -> str:
    """The arguments as JSON text; NaN/Infinity (which JSON cannot hold) raise `ValueError`."""
    return json.dumps(dict(arguments), ensure_ascii=False, allow_nan=False)


# ---------------------------------------------------------------------------------------------------------------
# Schema typing for the text-valued formats (qwen3_coder, glm45)

_ALL_TYPES = ("null", "boolean", "integer", "number", "object", "array")
_INTEGER = re.compile(r"[+-]?\d+")
# Type names some tool schemas use instead of JSON Schema's (Python's and C's): read as the JSON type they mean.
_TYPE_ALIASES = {
    "float": "number",
    "double": "number",
    "int": "integer",
    "long": "integer",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
    "tuple": "array",
    "str": "string",
    "none": "null",
}


def _type_name(name: str) -> str:
    lowered = name.strip().lower()
    return _TYPE_ALIASES.get(lowered, lowered)


def schema_types(schema: Any) -> set[str]:
    """The JSON types a parameter schema allows (empty when it says nothing about types)."""
    if not isinstance(schema, Mapping):
        return set()
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(_type_name(declared))
    elif isinstance(declared, list):
        types.update(_type_name(t) for t in declared if isinstance(t, str))
    for key in ("anyOf", "oneOf", "allOf"):
        members = schema.get(key)
        if isinstance(members, list):
            for member in members:
                types |= schema_types(member)
    if types:
        return types
    values = list(schema.get("enum") or [])
    if "const" in schema:
        values.append(schema["const"])
    for value in values:
        types.add(_json_type(value))
    if types:
        return types
    if "properties" in schema:
        return {"object"}
    if "items" in schema:
        return {"array"}
    return set()


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string"


def type_value(text: str, types: set[str] | None) -> Any:
    """A text value typed by the allowed JSON types, tried in a fixed order: null, boolean, integer, number,
    object, array (else the text).

    `types=None` means "untyped: try every type" (a parameter no schema declares, for formats that decode such
    values); an empty set or only `string` keeps the text.
    """
    allowed = set(_ALL_TYPES) if types is None else types
    if not (allowed - {"string"}):
        return text
    stripped = text.strip()
    if "null" in allowed and stripped in ("null", "None"):
        return None
    if "boolean" in allowed and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if ("integer" in allowed or "number" in allowed) and _INTEGER.fullmatch(stripped):
        return int(stripped)
    if "number" in allowed:
        try:
            number = _finite_float(stripped)
        except (ValueError, ArgumentsError):
            pass
        else:
            # "1.0" stays a float; only text without a fraction or exponent is an integer (handled above)
            return number
    if "object" in allowed or "array" in allowed:
        wanted = tuple(t for t, n in ((dict, "object"), (list, "array")) if n in allowed)
        try:
            value, _ = loads(stripped)
        except ArgumentsError:
            value = python_literal(stripped)
        if isinstance(value, wanted):
            return value
    return text


def python_literal(text: str) -> Any:
    """A Python literal that JSON can hold, else None (used when JSON decoding failed)."""
    try:
        return literal_to_json(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def literal_to_json(node: ast.AST) -> Any:
    """A literal AST node as a JSON-compatible value; `true/false/null` names are accepted. Else ValueError."""
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, bool | int | str):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError("a non-finite number")
            return value
        raise ValueError(f"not a JSON value: {value!r}")
    if isinstance(node, ast.Name):
        names = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}
        if node.id in names:
            return names[node.id]
        raise ValueError(f"not a literal: {node.id}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = literal_to_json(node.operand)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("a sign before a non-number")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List | ast.Tuple):
        return [literal_to_json(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if key_node is None:
                raise ValueError("a ** expansion is not a literal")
            decoded = literal_to_json(key_node)
            if not isinstance(decoded, str):
                raise ValueError("object keys must be strings")
            out[decoded] = literal_to_json(value_node)
        return out
    raise ValueError(f"not a literal: {type(node).__name__}")


def tool_parameters(tools: Any, name: str) -> dict[str, Any] | None:
    """The `properties` of the named tool's parameter schema; None when no tool of that name is declared."""
    if not tools:
        return None
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        body = function if isinstance(function, Mapping) else tool
        if body.get("name") == name:
            parameters = body.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
            return dict(properties) if isinstance(properties, Mapping) else {}
    return None


class NextFind:
    """`text.find(needle, pos)` for positions that only move forward, in linear time overall: the answer of the
    last search is kept, so a marker that never comes is not searched for again from every later position."""

    def __init__(self, text: str, needle: str) -> None:
        self.text, self.needle = text, needle
        self._from, self._at = len(text) + 1, -1

    def __call__(self, pos: int) -> int:
        if pos < self._from or (self._at != -1 and self._at < pos):
            self._from, self._at = pos, self.text.find(self.needle, pos)
        return self._at
