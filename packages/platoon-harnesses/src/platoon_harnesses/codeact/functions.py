"""Cell functions: environment tools as real Python functions whose signatures come from their JSON schemas.

Standard library only (no IPython), so the harness can describe the action space without starting a shell.
Python itself binds and rejects calls; the generated body sends only the arguments actually passed.
"""

from __future__ import annotations

import functools
import inspect
import keyword
import linecache
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: the fixed description of `finish` when the environment has no terminal tool
FINISH_DESCRIPTION = (
    "End the agent trajectory. Call it once the task is done (or cannot be done) with a message "
    "that reports the result."
)

LAUNCH_SUBAGENT_DESCRIPTION = (
    "Launch a subagent that works on `targets` (its goal) in the same environment and return its final "
    "message. `num_steps` is the subagent's step budget; launching reserves num_steps + 1 of your own "
    "steps until it returns. `context` is passed on to the subagent. Await it, or run several at once "
    "with asyncio.gather."
)

LAUNCH_SUBAGENT_FIXED_DESCRIPTION = (
    "Launch a subagent that works on `targets` (its goal) in the same environment and return its final "
    "message. `context` is passed on to the subagent. Await it, or run several at once with asyncio.gather."
)

_SCALARS: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "object": dict,
    "null": None,
}


@dataclass(frozen=True)
class FunctionSpec:
    """One cell function as the namespace and the action-space text see it.

    `arguments` maps each Python parameter name to the schema property it sends, and `tool` is the environment
    tool called (names differ only where the tool's or a property's name is not a Python identifier).
    """

    name: str
    signature: inspect.Signature
    description: str
    is_async: bool = False
    arguments: Mapping[str, str] | None = None
    tool: str | None = None

    @property
    def signature_text(self) -> str:
        """`name(params) -> ret`, prefixed `async ` for coroutine functions."""
        prefix = "async " if self.is_async else ""
        return f"{prefix}{self.name}{self.signature}"


def annotation(schema: Any) -> Any:
    """The Python annotation of a JSON schema: scalars, `list[...]`/`tuple[...]`, unions; unknown → empty."""
    if not isinstance(schema, Mapping):
        return inspect.Parameter.empty
    if "$ref" in schema:
        return dict
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return _union([annotation(option) for option in options])
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union([annotation({**schema, "type": item}) for item in kind])
    if kind == "array":
        prefix = schema.get("prefixItems")
        items = schema.get("items")
        if isinstance(prefix, list) and prefix:
            return tuple.__class_getitem__(tuple(_or_any(annotation(item)) for item in prefix))
        if isinstance(items, list) and items:  # the draft-07 tuple form
            return tuple.__class_getitem__(tuple(_or_any(annotation(item)) for item in items))
        inner = annotation(items)
        return list if inner is inspect.Parameter.empty else list[inner]  # type: ignore[valid-type]
    if isinstance(kind, str) and kind in _SCALARS:
        return _SCALARS[kind]
    return inspect.Parameter.empty


def _or_any(value: Any) -> Any:
    return Any if value is inspect.Parameter.empty else value


def _union(members: list[Any]) -> Any:
    if any(member is inspect.Parameter.empty for member in members):
        return inspect.Parameter.empty
    unique: list[Any] = []
    for member in members:
        if member not in unique:
            unique.append(member)
    # None | None is not an expression Python allows; a lone None stays the NoneType annotation.
    if len(unique) == 1:
        return unique[0]
    return functools.reduce(operator.or_, [type(None) if m is None else m for m in unique])


def parameter_name(prop: str, taken: set[str]) -> str:
    """A Python parameter name for a schema property: itself when valid, else a close identifier."""
    name = prop
    if not name.isidentifier():
        name = re.sub(r"\W", "_", name) or "arg"
        if not name.isidentifier():
            name = f"_{name}"
    if keyword.iskeyword(name):
        name = f"{name}_"
    while name in taken:
        name = f"{name}_"
    taken.add(name)
    return name


def tool_function_spec(
    tool: str, description: str, schema: Mapping[str, Any] | None, *, name: str | None = None
) -> FunctionSpec:
    """The spec of a tool's cell function: required properties first, then optional ones, each in schema order.

    `name` is the Python name (default: the tool's name, which must then be an identifier).
    """
    schema = schema if isinstance(schema, Mapping) else {}
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = [p for p in schema.get("required") or () if p in properties]
    ordered = required + [p for p in properties if p not in required]
    taken: set[str] = set()
    parameters: list[inspect.Parameter] = []
    arguments: dict[str, str] = {}
    for prop in ordered:
        prop_schema = properties[prop] if isinstance(properties[prop], Mapping) else {}
        pname = parameter_name(prop, taken)
        arguments[pname] = prop
        default = inspect.Parameter.empty if prop in required else prop_schema.get("default")
        parameters.append(
            inspect.Parameter(
                pname,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=default,
                annotation=annotation(prop_schema),
            )
        )
    return FunctionSpec(
        name or tool, inspect.Signature(parameters), description or "", False, arguments, tool
    )


_MISSING_NAME = "__platoon_missing__"
_counter = 0


def build_function(spec: FunctionSpec, invoke: Callable[[dict[str, Any]], Any], missing: object) -> Any:
    """A real Python function with `spec`'s parameters that calls `invoke({property: value})`.

    Optional parameters default to the `missing` sentinel, so only arguments actually passed are sent; the
    function's `__signature__` shows the schema defaults. Its source is registered with linecache so a
    traceback through it reads like any other.
    """
    global _counter
    _counter += 1
    params: list[str] = []
    items: list[str] = []
    for parameter in spec.signature.parameters.values():
        if parameter.default is inspect.Parameter.empty:
            params.append(parameter.name)
        else:
            params.append(f"{parameter.name}={_MISSING_NAME}")
        prop = (spec.arguments or {}).get(parameter.name, parameter.name)
        items.append(f"({prop!r}, {parameter.name})")
    body = (
        "__platoon_invoke__({k: v for k, v in [" + ", ".join(items) + "] if v is not " + _MISSING_NAME + "})"
    )
    keyword_def = "async def" if spec.is_async else "def"
    returns = "return await " if spec.is_async else "return "
    source = f"{keyword_def} {spec.name}({', '.join(params)}):\n    {returns}{body}\n"
    filename = f"<cell function {spec.name} #{_counter}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict[str, Any] = {"__platoon_invoke__": invoke, _MISSING_NAME: missing}
    exec(compile(source, filename, "exec"), namespace)  # generating the function is the point
    fn = namespace[spec.name]
    fn.__signature__ = spec.signature
    fn.__doc__ = spec.description
    fn.__qualname__ = spec.name
    fn.__module__ = "__main__"
    return fn
