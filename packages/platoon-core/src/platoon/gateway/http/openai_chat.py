"""`POST /v1/chat/completions`: OpenAI Chat Completions over `ModelGateway.chat`.

Requests are validated here, then passed to the gateway as `ctx.chat` would pass them, so an HTTP call records
exactly what the in-process call records; streams are synthetic (sampled whole, keepalive comments meanwhile).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from platoon.gateway.core import GatewayError
from platoon.gateway.http.checks import check_chat_messages, invalid, optional_string
from platoon.gateway.http.common import ClientGone, DialectServer, dumps

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from platoon.gateway.records import AgentRecord
    from platoon.harness.agent import ChatReply

__all__ = ["endpoint", "error_body", "error_response", "handle_errors"]

_ERROR_TYPES = frozenset(("permission_error", "timeout", "server_error"))
_DONE = b"data: [DONE]\n\n"


def error_body(exc: GatewayError) -> dict[str, Any]:
    """The OpenAI error object: types `permission_error`, `timeout`, `server_error`, else `invalid_request_error`."""
    kind = exc.kind if exc.kind in _ERROR_TYPES else "invalid_request_error"
    param = "messages" if exc.code == "context_length_exceeded" else None
    return {"error": {"message": exc.message, "type": kind, "param": param, "code": exc.code}}


def error_response(server: DialectServer, exc: GatewayError) -> Response:
    return server.json(error_body(exc), status=exc.status)


def handle_errors(
    server: DialectServer,
    handler: Callable[[Request, list[AgentRecord | None]], Awaitable[Response]],
    render: Callable[[DialectServer, GatewayError], Response] = error_response,
) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a handler: gateway errors answered in the dialect's shape (`render`), a disconnect with nothing,
    anything else logged and answered as a server error counted on the calling agent (the handler fills `seen`)."""
    from starlette.responses import Response

    async def wrapped(request: Request) -> Response:
        seen: list[AgentRecord | None] = [None]
        try:
            return await handler(request, seen)
        except GatewayError as exc:
            return render(server, exc)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the client is gone
        except Exception as exc:
            server.server_error(exc, seen[0])
            failure = GatewayError(
                f"internal gateway error: {type(exc).__name__}", status=500, kind="server_error"
            )
            return render(server, failure)

    return wrapped


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayError("messages must be a non-empty list of message objects")
    check_chat_messages(messages)
    out = messages
    for index, message in enumerate(messages):
        if message["role"] == "developer":
            if out is messages:
                out = list(messages)  # copy on the first rewrite only: the common request has none
            out[index] = {**message, "role": "system"}
    return out


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """Function tools, verbatim when already in function form; any other named entry shown as a plain function."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise GatewayError("tools must be a list of tool objects")
    tools: list[dict[str, Any]] = []
    for index, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise GatewayError(f"tools[{index}] must be an object")
        if tool.get("type") == "custom":
            raise GatewayError(f"tools[{index}]: custom tools are not supported; use function tools")
        function = tool.get("function")
        nested = isinstance(function, dict)
        spec = function if nested else tool
        name = spec.get("name")  # type: ignore[union-attr]
        if not isinstance(name, str) or not name:
            raise GatewayError(f"tools[{index}] names no function")
        at = f"tools[{index}].function" if nested else f"tools[{index}]"
        optional_string(spec.get("description"), f"{at}.description")  # type: ignore[union-attr]
        parameters = spec.get("parameters")  # type: ignore[union-attr]
        if parameters is not None and not isinstance(parameters, dict):
            raise invalid(f"{at}.parameters", "a JSON schema object", parameters)
        if nested and tool.get("type", "function") == "function":
            tools.append(tool)
            continue
        plain: dict[str, Any] = {"name": name}
        if spec.get("description") is not None:  # type: ignore[union-attr]
            plain["description"] = spec["description"]  # type: ignore[index]
        plain["parameters"] = spec.get("parameters") or {"type": "object", "properties": {}}  # type: ignore[union-attr]
        tools.append({"type": "function", "function": plain})
    return tools or None


def parse_request(
    body: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
    """(messages, tools, sampling parameters) of a Chat Completions body; the gateway validates the sampling."""
    messages = _messages(body)
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        raise GatewayError(
            "tool_choice must be 'auto' or 'none' (named and required tool choices are not supported)"
        )
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise GatewayError("stream_options must be an object")
    sampling = {k: v for k, v in body.items() if k != "messages" and k != "tools"}
    return messages, tools, sampling


def _logprobs(server: DialectServer, agent: AgentRecord, call_id: str) -> dict[str, Any] | None:
    interaction = server.interaction(agent, call_id)
    if interaction is None:
        return {"content": []}
    decode = server.gateway.tokenizer.decode
    content = []
    for token, logprob in zip(interaction.sampled_tokens, interaction.logprobs, strict=False):
        text = str(decode([token]))  # each token decoded alone
        content.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []})
    return {"content": content}


def _message(reply: ChatReply) -> dict[str, Any]:
    source = reply.message
    tool_calls = source.get("tool_calls") or None
    content = source.get("content")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if tool_calls and not content else (content or ""),
    }
    reasoning = source.get("reasoning_content")
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _usage(server: DialectServer, agent: AgentRecord, call_id: str) -> dict[str, int]:
    prompt, completion = server.usage(agent, call_id)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion(
    server: DialectServer, agent: AgentRecord, reply: ChatReply, *, logprobs: bool
) -> dict[str, Any]:
    """The `chat.completion` object of a reply (`id` = the call id)."""
    return {
        "id": reply.call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": server.gateway.model_name,
        "choices": [
            {
                "index": 0,
                "message": _message(reply),
                "logprobs": _logprobs(server, agent, reply.call_id) if logprobs else None,
                "finish_reason": reply.finish_reason or "stop",
            }
        ],
        "usage": _usage(server, agent, reply.call_id),
    }


def chunks(
    server: DialectServer, agent: AgentRecord, reply: ChatReply, *, logprobs: bool, include_usage: bool
) -> Iterator[bytes]:
    """The stream of a reply: role, reasoning, content, one chunk per tool call, finish, usage, `[DONE]`."""
    head = {
        "id": reply.call_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": server.gateway.model_name,
    }
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None, lp: Any = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return b"data: " + dumps({**head, "choices": [choice], **extra}) + b"\n\n"

    message = _message(reply)
    yield chunk({"role": "assistant", "content": ""})
    if message.get("reasoning_content"):
        yield chunk({"reasoning_content": message["reasoning_content"]})
    if message["content"]:
        yield chunk({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or ()):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield chunk(
        {},
        reply.finish_reason or "stop",
        _logprobs(server, agent, reply.call_id) if logprobs else None,
    )
    if include_usage:
        usage = {**head, "choices": [], "usage": _usage(server, agent, reply.call_id)}
        yield b"data: " + dumps(usage) + b"\n\n"
    yield _DONE


def _failure(exc: BaseException) -> bytes:
    if not isinstance(exc, GatewayError):
        exc = GatewayError(f"internal gateway error: {type(exc).__name__}", status=500, kind="server_error")
    return b"data: " + dumps(error_body(exc)) + b"\n\n"


def endpoint(server: DialectServer) -> Callable[[Request], Awaitable[Response]]:
    """The route handler bound to `server`."""

    async def chat_completions(request: Request, seen: list[AgentRecord | None]) -> Response:
        agent = seen[0] = server.authenticate(request)
        kind = server.call_kind(request)
        body = await server.json_body(request)
        if server.backend is not None:
            return await server.forward(agent, body, "chat", kind)
        messages, tools, sampling = parse_request(body)
        want_logprobs = body.get("logprobs") is True
        task = server.start_chat(agent, messages, tools, kind, sampling)
        if body.get("stream"):
            if task.done():
                task.result()  # a refusal before sampling keeps its HTTP status
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

            def events(reply: ChatReply) -> Iterator[bytes]:
                return chunks(server, agent, reply, logprobs=want_logprobs, include_usage=include_usage)

            return server.sse(server.stream_events(task, events, _failure))
        reply = await server.until_disconnect(request, task)
        return server.json(
            completion(server, agent, reply, logprobs=want_logprobs),
            headers=server.call_headers(reply.call_id),
        )

    return handle_errors(server, chat_completions)
