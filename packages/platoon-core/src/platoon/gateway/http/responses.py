"""`POST /v1/responses`: the OpenAI Responses dialect (experimental, for Codex).

Input items become Chat Completions messages for `ModelGateway.chat`; sampled reasoning travels back to the client
in `encrypted_content` (`pg1:` + base64) so the next prompt re-renders it exactly.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from platoon.gateway.core import CALL_ID_PREFIX, GatewayError
from platoon.gateway.http.checks import invalid, json_type, optional_string, string, text_parts
from platoon.gateway.http.common import DialectServer, dumps
from platoon.gateway.http.openai_chat import error_body, handle_errors

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from platoon.gateway.records import AgentRecord
    from platoon.harness.agent import ChatReply

__all__ = ["decode_reasoning", "encode_reasoning", "endpoint", "parse_request"]

_REASONING_PREFIX = "pg1:"
_TEXT_PARTS = frozenset(("input_text", "output_text", "text", "summary_text", "reasoning_text"))
_IGNORED = frozenset(
    (
        "model",
        "stream",
        "store",
        "include",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "metadata",
        "prompt_cache_key",
        "truncation",
        "user",
        "service_tier",
        "previous_response_id",
        "background",
        "safety_identifier",
        "stream_options",
        "top_logprobs",
        "max_tool_calls",
        "prompt",
    )
)


def encode_reasoning(text: str) -> str:
    return _REASONING_PREFIX + base64.b64encode(text.encode()).decode()


def decode_reasoning(item: dict[str, Any], where: str = "reasoning") -> str:
    """The reasoning text of an input reasoning item: ours decoded from `encrypted_content`, else its text parts."""
    encrypted = optional_string(item.get("encrypted_content"), f"{where}.encrypted_content")
    if encrypted is not None and encrypted.startswith(_REASONING_PREFIX):
        try:
            return base64.b64decode(encrypted[len(_REASONING_PREFIX) :], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise GatewayError(f"{where}.encrypted_content: not platoon's encoding of reasoning") from None
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts:
            return _text(parts, f"{where}.{key}")
    return ""


def _text(content: Any, where: str) -> str:
    """The text of a content field (`where` names it): a string, or the joined text of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(where, "a string or a list of text parts", content)
    text_parts(content, where, _TEXT_PARTS, "text part")
    return "".join(part.get("text") or "" for part in content)


def parse_request(
    body: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
    """(messages, tools, sampling) of a Responses body."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        string(instructions, "instructions")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    elif not isinstance(items, list):
        raise GatewayError("input must be a string or a list of items")
    turn: dict[str, Any] | None = None  # the assistant turn being assembled

    def flush() -> None:
        nonlocal turn
        if turn is not None:
            turn.setdefault("content", "")
            messages.append(turn)
            turn = None

    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise invalid(where, "an input item object", item)
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise GatewayError(
                    f"{where}.role: expected one of user, assistant, system, developer, got "
                    + (repr(role) if isinstance(role, str) else json_type(role))
                )
            text = _text(item.get("content"), f"{where}.content")
            if role == "assistant":
                # A new turn when this message follows content or tool calls of the current one.
                if turn is not None and (turn.get("content") or turn.get("tool_calls")):
                    flush()
                if turn is None:
                    turn = {"role": "assistant"}
                turn["content"] = text
                continue
            flush()
            if role in ("system", "developer"):
                messages.append({"role": "system", "content": text})
            else:
                messages.append({"role": "user", "content": text})
        elif kind == "reasoning":
            flush()
            turn = {"role": "assistant", "reasoning_content": decode_reasoning(item, where)}
        elif kind == "function_call":
            name = string(item.get("name"), f"{where}.name", empty=False)
            arguments = item.get("arguments")
            if arguments is not None and not isinstance(arguments, (str, dict)):
                raise invalid(f"{where}.arguments", "a JSON string", arguments)
            call_id = optional_string(item.get("call_id"), f"{where}.call_id")
            if turn is None:
                turn = {"role": "assistant"}
            turn.setdefault("tool_calls", []).append(
                {
                    "id": call_id or optional_string(item.get("id"), f"{where}.id"),
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": arguments
                        if isinstance(arguments, str)
                        else dumps(arguments or {}).decode(),
                    },
                }
            )
        elif kind == "function_call_output":
            flush()
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": optional_string(item.get("call_id"), f"{where}.call_id"),
                    "content": output if isinstance(output, str) else _text(output, f"{where}.output"),
                }
            )
        else:
            raise GatewayError(
                f"{where}.type: {kind!r} is not supported (message, reasoning, function_call, "
                "function_call_output)"
            )
    flush()
    if not messages:
        raise GatewayError("input holds no messages")

    tools: list[dict[str, Any]] = []
    raw_tools = body.get("tools") or []
    if not isinstance(raw_tools, list):
        raise GatewayError("tools must be a list")
    for index, tool in enumerate(raw_tools):
        if isinstance(tool, dict) and tool.get("type") == "function" and tool.get("name"):
            name = string(tool["name"], f"tools[{index}].name")
            parameters = tool.get("parameters")
            if parameters is not None and not isinstance(parameters, dict):
                raise invalid(f"tools[{index}].parameters", "a JSON schema object", parameters)
            function = {"name": name, "parameters": parameters or {"type": "object"}}
            if tool.get("description") is not None:
                function["description"] = string(tool["description"], f"tools[{index}].description")
            tools.append({"type": "function", "function": function})

    sampling: dict[str, Any] = {}
    for key, value in body.items():
        if value is None or key in ("input", "instructions", "tools") or key in _IGNORED:
            continue
        if key == "max_output_tokens":
            sampling["max_tokens"] = value
        elif key in ("temperature", "top_p", "top_k", "seed"):
            sampling[key] = value
        elif key == "reasoning":
            if isinstance(value, dict) and value.get("effort") == "none":
                sampling["reasoning_effort"] = "none"
        elif key in ("chat_template_kwargs", "extra_body"):
            sampling[key] = value
        else:
            raise GatewayError(f"unsupported Responses parameter {key!r}")
    return messages, tools or None, sampling


def _suffix(call_id: str) -> str:
    return call_id[len(CALL_ID_PREFIX) :] if call_id.startswith(CALL_ID_PREFIX) else call_id


def output_items(reply: ChatReply) -> list[dict[str, Any]]:
    """Reasoning (`rs_<call>`), message (`msg_<call>`, when there is content or no tool calls), function calls."""
    call = _suffix(reply.call_id)
    message = reply.message
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{call}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
                "encrypted_content": encode_reasoning(reasoning),
            }
        )
    content = message.get("content") or ""
    tool_calls = message.get("tool_calls") or ()
    if content or not tool_calls:
        items.append(
            {
                "type": "message",
                "id": f"msg_{call}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": content, "annotations": [], "logprobs": []}],
            }
        )
    for tool_call in tool_calls:
        function = tool_call["function"]
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{tool_call['id']}",
                "call_id": tool_call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
                "status": "completed",
            }
        )
    return items


def _response(
    server: DialectServer, call_id: str, status: str, output: list[Any], usage: Any
) -> dict[str, Any]:
    return {
        "id": f"resp_{_suffix(call_id)}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": None,
        "model": server.gateway.model_name,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


def response(server: DialectServer, agent: AgentRecord, reply: ChatReply) -> dict[str, Any]:
    """The Responses object of a reply: `completed`, or `incomplete` for a truncated one."""
    prompt, completion = server.usage(agent, reply.call_id)
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }
    status = "incomplete" if reply.finish_reason == "length" else "completed"
    return _response(server, reply.call_id, status, output_items(reply), usage)


class _Events:
    """SSE events with increasing `sequence_number`s."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + dumps(event) + b"\n\n"


def events(server: DialectServer, agent: AgentRecord, reply: ChatReply) -> Iterator[bytes]:
    """`response.created`, each item's added/delta/done events, then `response.completed` (even when truncated:
    a `response.incomplete` would make Codex resample)."""
    final = response(server, agent, reply)
    event = _Events()
    yield event("response.created", response={**final, "status": "in_progress", "output": [], "usage": None})
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            yield event("response.output_item.added", output_index=index, item={**item, "content": []})
            part = item["content"][0]
            empty = {**part, "text": ""}
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield event("response.content_part.added", **ids, part=empty)
            yield event("response.output_text.delta", **ids, delta=part["text"], logprobs=[])
            yield event("response.output_text.done", **ids, text=part["text"], logprobs=[])
            yield event("response.content_part.done", **ids, part=part)
        elif item["type"] == "function_call":
            yield event("response.output_item.added", output_index=index, item={**item, "arguments": ""})
            ids = {"item_id": item["id"], "output_index": index}
            yield event("response.function_call_arguments.delta", **ids, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **ids, arguments=item["arguments"])
        else:
            yield event("response.output_item.added", output_index=index, item=item)
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=final)


def _failure(server: DialectServer) -> Callable[[BaseException], bytes]:
    def failed(exc: BaseException) -> bytes:
        if not isinstance(exc, GatewayError):
            exc = GatewayError(
                f"internal gateway error: {type(exc).__name__}", status=500, kind="server_error"
            )
        error = error_body(exc)["error"]
        body = _response(server, "failed", "failed", [], None)
        body["error"] = {"code": error["code"] or error["type"], "message": error["message"]}
        return _Events()("response.failed", response=body)

    return failed


def endpoint(server: DialectServer) -> Callable[[Request], Awaitable[Response]]:
    """The route handler bound to `server`."""

    async def responses(request: Request, seen: list[AgentRecord | None]) -> Response:
        agent = seen[0] = server.authenticate(request)
        kind = server.call_kind(request)
        body = await server.json_body(request)
        if server.backend is not None:
            return await server.forward(agent, body, "responses", kind)
        messages, tools, sampling = parse_request(body)
        task = server.start_chat(agent, messages, tools, kind, sampling)
        if body.get("stream"):
            if task.done():
                task.result()  # a refusal before sampling keeps its HTTP status
            return server.sse(
                server.stream_events(task, lambda reply: events(server, agent, reply), _failure(server))
            )
        reply = await server.until_disconnect(request, task)
        return server.json(response(server, agent, reply), headers=server.call_headers(reply.call_id))

    return handle_errors(server, responses)
