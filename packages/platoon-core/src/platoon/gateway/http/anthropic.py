"""`POST /v1/messages` and `/v1/messages/count_tokens`: the Anthropic Messages dialect (experimental).

Anthropic clients take the base URL without `/v1`. Blocks become Chat Completions messages for `ModelGateway.chat`;
the context overflow reads "prompt is too long: M tokens > N maximum", which triggers Claude Code's compaction.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from platoon.gateway.core import CALL_ID_PREFIX, ContextWindowExceeded, GatewayError
from platoon.gateway.http.checks import invalid, optional_string, string, text_parts
from platoon.gateway.http.common import DialectServer, dumps
from platoon.gateway.http.openai_chat import handle_errors

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from platoon.gateway.records import AgentRecord
    from platoon.harness.agent import ChatReply

__all__ = ["count_tokens_endpoint", "endpoint", "error_body", "parse_request"]

_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    410: "permission_error",
    413: "request_too_large",
    504: "timeout_error",
}
_IGNORED = frozenset(
    ("model", "stream", "metadata", "service_tier", "container", "mcp_servers", "context_management")
)


def error_body(exc: GatewayError) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}` in Anthropic's error types."""
    if isinstance(exc, ContextWindowExceeded):
        message = f"prompt is too long: {exc.prompt_tokens} tokens > {exc.window} maximum"
    else:
        message = exc.message
    kind = _ERROR_TYPES.get(exc.status) or ("api_error" if exc.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _error_response(server: DialectServer, exc: GatewayError) -> Response:
    return server.json(error_body(exc), status=exc.status)


def _text_blocks(content: Any, where: str) -> str:
    """The text of a content field (`where` names it): a string, or the joined text of text blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(where, "a string or a list of text blocks", content)
    text_parts(content, where, ("text",), "text block")
    return "".join(block.get("text") or "" for block in content)


def _block(block: Any, where: str) -> str | None:
    """A content block's type (the 400 naming `where` for a block that is not an object)."""
    if not isinstance(block, dict):
        raise invalid(where, "a content block object", block)
    kind = block.get("type")
    return kind if isinstance(kind, str) else None


def _assistant(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise invalid(f"{where}.content", "a string or a list of content blocks", content)
    reasoning: list[str] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(content):
        at = f"{where}.content[{index}]"
        kind = _block(block, at)
        if kind == "thinking":
            reasoning.append(optional_string(block.get("thinking"), f"{at}.thinking") or "")
        elif kind == "redacted_thinking":
            continue  # opaque: nothing to re-render
        elif kind == "text":
            texts.append(optional_string(block.get("text"), f"{at}.text") or "")
        elif kind == "tool_use":
            name = string(block.get("name"), f"{at}.name", empty=False)
            arguments = block.get("input")
            if arguments is not None and not isinstance(arguments, dict):
                raise invalid(f"{at}.input", "an object", arguments)
            calls.append(
                {
                    "id": optional_string(block.get("id"), f"{at}.id"),
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments or {}, ensure_ascii=False)},
                }
            )
        else:
            raise GatewayError(
                f"{at}.type: assistant block type {kind or block.get('type')!r} is not supported "
                "(text, thinking, redacted_thinking, tool_use)"
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    """Tool results first (as tool messages), then the user's text, if any."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content", "a string or a list of content blocks", content)
    results: list[dict[str, Any]] = []
    texts: list[str] = []
    for index, block in enumerate(content):
        at = f"{where}.content[{index}]"
        kind = _block(block, at)
        if kind == "text":
            texts.append(optional_string(block.get("text"), f"{at}.text") or "")
        elif kind == "tool_result":
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": optional_string(block.get("tool_use_id"), f"{at}.tool_use_id"),
                    "content": _text_blocks(block.get("content") or "", f"{at}.content"),
                }
            )
        else:
            raise GatewayError(
                f"{at}.type: user block type {kind or block.get('type')!r} is not supported "
                "(text and tool_result only)"
            )
    if texts:
        results.append({"role": "user", "content": "".join(texts)})
    return results


def parse_request(
    body: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
    """(messages, tools, sampling) of a Messages body."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_blocks(system, "system")})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise GatewayError("messages must be a non-empty list")
    for index, message in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise invalid(where, "a message object", message)
        role = message.get("role")
        if role == "assistant":
            messages.append(_assistant(message.get("content"), where))
        elif role == "user":
            messages.extend(_user(message.get("content"), where))
        elif isinstance(role, str):
            raise GatewayError(f"{where}.role: expected 'user' or 'assistant', got {role!r}")
        else:
            raise invalid(f"{where}.role", "'user' or 'assistant'", role)

    tools: list[dict[str, Any]] = []
    raw_tools = body.get("tools") or []
    if not isinstance(raw_tools, list):
        raise GatewayError("tools must be a list")
    for index, tool in enumerate(raw_tools):
        # Every named entry is shown as a function (server tools too, though nothing runs them).
        if isinstance(tool, dict) and isinstance(tool.get("name"), str) and tool["name"]:
            schema = tool.get("input_schema")
            if schema is not None and not isinstance(schema, dict):
                raise invalid(f"tools[{index}].input_schema", "a JSON schema object", schema)
            function = {"name": tool["name"], "parameters": schema or {"type": "object"}}
            if tool.get("description") is not None:
                function["description"] = string(tool["description"], f"tools[{index}].description")
            tools.append({"type": "function", "function": function})

    sampling: dict[str, Any] = {}
    for key, value in body.items():
        if value is None or key in ("messages", "system", "tools") or key in _IGNORED:
            continue
        if key in ("max_tokens", "temperature", "top_p", "top_k"):
            sampling[key] = value
        elif key == "tool_choice":
            choice = value.get("type") if isinstance(value, dict) else value
            if choice not in ("auto", "none"):
                raise GatewayError(f"tool_choice {choice!r} is not supported (auto or none)")
        elif key == "stop_sequences":
            if value:
                raise GatewayError(
                    "stop_sequences are not supported: they would replace the end-of-turn stops"
                )
        elif key == "thinking":
            if isinstance(value, dict) and value.get("type") == "disabled":
                sampling["chat_template_kwargs"] = {"enable_thinking": False}
        else:
            raise GatewayError(f"unsupported Messages parameter {key!r}")
    return messages, tools or None, sampling


def _message_id(call_id: str) -> str:
    return "msg_" + (call_id[len(CALL_ID_PREFIX) :] if call_id.startswith(CALL_ID_PREFIX) else call_id)


def content_blocks(reply: ChatReply) -> list[dict[str, Any]]:
    """thinking (signed `platoon:<call id>`, unchecked), text (when there is content or no tool calls), tool_use."""
    message = reply.message
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append(
            {
                "type": "thinking",
                "thinking": message["reasoning_content"],
                "signature": f"platoon:{reply.call_id}",
            }
        )
    content = message.get("content") or ""
    tool_calls = message.get("tool_calls") or ()
    if content or not tool_calls:
        blocks.append({"type": "text", "text": content})
    for call in tool_calls:
        arguments = call["function"]["arguments"]
        try:
            parsed = json.loads(arguments) if arguments else {}
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            parsed = {"_raw_arguments": arguments}
        blocks.append(
            {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": parsed}
        )
    return blocks


def message(server: DialectServer, agent: AgentRecord, reply: ChatReply) -> dict[str, Any]:
    prompt, completion = server.usage(agent, reply.call_id)
    return {
        "id": _message_id(reply.call_id),
        "type": "message",
        "role": "assistant",
        "model": server.gateway.model_name,
        "content": content_blocks(reply),
        "stop_reason": _STOP_REASONS.get(reply.finish_reason or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": completion},
    }


def _event(kind: str, **fields: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + dumps({"type": kind, **fields}) + b"\n\n"


def events(server: DialectServer, agent: AgentRecord, reply: ChatReply) -> Iterator[bytes]:
    """`message_start`, per block start/delta/stop, `message_delta`, `message_stop`."""
    final = message(server, agent, reply)
    usage = final["usage"]
    start = {**final, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    yield _event("message_start", message=start)
    for index, block in enumerate(final["content"]):
        if block["type"] == "thinking":
            yield _event(
                "content_block_start", index=index, content_block={**block, "thinking": "", "signature": ""}
            )
            yield _event(
                "content_block_delta",
                index=index,
                delta={"type": "thinking_delta", "thinking": block["thinking"]},
            )
            yield _event(
                "content_block_delta",
                index=index,
                delta={"type": "signature_delta", "signature": block["signature"]},
            )
        elif block["type"] == "text":
            yield _event("content_block_start", index=index, content_block={"type": "text", "text": ""})
            yield _event(
                "content_block_delta", index=index, delta={"type": "text_delta", "text": block["text"]}
            )
        else:
            yield _event("content_block_start", index=index, content_block={**block, "input": {}})
            yield _event(
                "content_block_delta",
                index=index,
                delta={
                    "type": "input_json_delta",
                    "partial_json": json.dumps(block["input"], ensure_ascii=False),
                },
            )
        yield _event("content_block_stop", index=index)
    yield _event(
        "message_delta",
        delta={"stop_reason": final["stop_reason"], "stop_sequence": None},
        usage={"output_tokens": usage["output_tokens"]},
    )
    yield _event("message_stop")


def _failure(exc: BaseException) -> bytes:
    if not isinstance(exc, GatewayError):
        exc = GatewayError(f"internal gateway error: {type(exc).__name__}", status=500, kind="server_error")
    return _event("error", error=error_body(exc)["error"])


def endpoint(server: DialectServer) -> Callable[[Request], Awaitable[Response]]:
    """The `/v1/messages` handler bound to `server`."""

    async def messages(request: Request, seen: list[AgentRecord | None]) -> Response:
        agent = seen[0] = server.authenticate(request)
        kind = server.call_kind(request)
        body = await server.json_body(request)
        if server.backend is not None:
            return await server.forward(agent, body, "messages", kind)
        chat_messages, tools, sampling = parse_request(body)
        task = server.start_chat(agent, chat_messages, tools, kind, sampling)
        if body.get("stream"):
            if task.done():
                task.result()  # a refusal before sampling keeps its HTTP status
            return server.sse(
                server.stream_events(task, lambda reply: events(server, agent, reply), _failure)
            )
        reply = await server.until_disconnect(request, task)
        return server.json(message(server, agent, reply), headers=server.call_headers(reply.call_id))

    return handle_errors(server, messages, _error_response)


def count_tokens_endpoint(server: DialectServer) -> Callable[[Request], Awaitable[Response]]:
    """`/v1/messages/count_tokens`: renders the request and answers `{"input_tokens": prompt_len}`."""

    async def count_tokens(request: Request, seen: list[AgentRecord | None]) -> Response:
        agent = seen[0] = server.authenticate(request)
        body = await server.json_body(request)
        if server.backend is not None:
            return await server.forward(agent, body, "count_tokens", server.call_kind(request))
        body.pop("max_tokens", None)
        chat_messages, tools, sampling = parse_request(body)
        length = await server.gateway.prompt_length(
            agent, chat_messages, tools=tools, render_kwargs=sampling.get("chat_template_kwargs")
        )
        return server.json({"input_tokens": length})

    return handle_errors(server, count_tokens, _error_response)
