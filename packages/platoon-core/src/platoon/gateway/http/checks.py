"""Field checks shared by the dialects: a malformed field is a 400 that names it, before anything renders.

The message reads `<field path>: expected <what>, got <JSON type>` (`messages[2].content: expected a string or a
list of content parts, got a number`). The checks read the request once and copy nothing: they cost microseconds
per message, against the renderer failing later with a message that names no field.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from platoon.gateway.core import GatewayError

__all__ = ["check_chat_messages", "invalid", "json_type", "optional_string", "string", "text_parts"]

#: Chat Completions content parts the renderers read (text; `refusal` and `thinking` render as text and reasoning)
_CHAT_PARTS = {"text": "text", "refusal": "refusal", "thinking": "thinking"}


def json_type(value: Any) -> str:
    """The JSON type of a decoded value, as an error message names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def invalid(where: str, expected: str, value: Any) -> GatewayError:
    """The 400 for a field holding the wrong kind of value."""
    return GatewayError(f"{where}: expected {expected}, got {json_type(value)}")


def string(value: Any, where: str, *, empty: bool = True) -> str:
    """`value` when it is a string (a non-empty one unless `empty`), else the 400 naming `where`."""
    if not isinstance(value, str):
        raise invalid(where, "a string", value)
    if not empty and not value:
        raise GatewayError(f"{where}: expected a non-empty string")
    return value


def optional_string(value: Any, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise invalid(where, "a string or null", value)
    return value


def text_parts(content: list[Any], where: str, types: Collection[str], what: str) -> None:
    """Each part of `content` an object whose `type` is one of `types` and whose `text` is a string (or null)."""
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        if not isinstance(part, dict):
            raise invalid(at, f"a {what} object", part)
        kind = part.get("type")
        if kind not in types:
            raise _unsupported(f"{at}.type", kind, types)
        optional_string(part.get("text"), f"{at}.text")


def _unsupported(where: str, kind: Any, types: Collection[str]) -> GatewayError:
    allowed = ", ".join(sorted(types))
    if not isinstance(kind, str):
        return invalid(where, f"one of {allowed}", kind)
    return GatewayError(f"{where}: {kind!r} is not supported: only text is rendered ({allowed})")


def check_chat_messages(messages: list[Any]) -> None:
    """Chat Completions messages: objects with a string `role`; `content` null, a string or a list of text
    parts; `tool_calls` a list of function calls (a non-empty string name, arguments a JSON string or an object);
    `tool_call_id`, `name` and the reasoning strings or null."""
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise invalid(where, "a message object", message)
        string(message.get("role"), f"{where}.role")
        content = message.get("content")
        if isinstance(content, list):
            for at, part in enumerate(content):
                _chat_part(part, f"{where}.content[{at}]")
        elif content is not None and not isinstance(content, str):
            raise invalid(f"{where}.content", "a string or a list of content parts", content)
        for key in ("tool_call_id", "name", "reasoning_content", "reasoning"):
            if key in message:
                optional_string(message[key], f"{where}.{key}")
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise invalid(f"{where}.tool_calls", "a list of tool calls", calls)
            for at, call in enumerate(calls):
                _chat_tool_call(call, f"{where}.tool_calls[{at}]")


def _chat_part(part: Any, where: str) -> None:
    if isinstance(part, str):  # the renderers take bare strings as text parts
        return
    if not isinstance(part, dict):
        raise invalid(where, "a content part object", part)
    kind = part.get("type")
    key = _CHAT_PARTS.get(kind) if isinstance(kind, str) else None
    if key is None:
        raise _unsupported(f"{where}.type", kind, _CHAT_PARTS)
    string(part.get(key), f"{where}.{key}")


def _chat_tool_call(call: Any, where: str) -> None:
    if not isinstance(call, dict):
        raise invalid(where, "a tool call object", call)
    optional_string(call.get("id"), f"{where}.id")
    kind = call.get("type") or "function"
    if kind != "function":
        raise GatewayError(f"{where}.type: expected 'function', got {kind!r}")
    function = call.get("function")
    if not isinstance(function, dict):
        raise invalid(f"{where}.function", "an object", function)
    string(function.get("name"), f"{where}.function.name", empty=False)
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, (str, dict)):
        raise invalid(f"{where}.function.arguments", "a JSON string", arguments)
