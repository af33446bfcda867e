"""The GPT-OSS (Harmony) renderers: `gpt_oss_no_sysprompt`, `gpt_oss_{low,medium,high}_reasoning`.

Each renders exactly what tinker-cookbook 0.3.0's `GptOssRenderer` renders under that name:
`<|start|>role<|channel|>channel<|message|>content<|end|>` messages, tools declared as a TypeScript namespace.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from platoon.renderers.base import (
    CompletionParts,
    ContentPart,
    FunctionBody,
    Message,
    RenderContext,
    RenderedMessage,
    Renderer,
    RendererError,
    Tokenizer,
    ToolCall,
    ToolSpec,
    TrainOnWhat,
    UnparsedToolCall,
    attach_tool_calls,
)
from platoon.renderers.role_colon import ensure_text

#: the role of OpenAI's own system prompt, rendered as `system` (a user's system message becomes `developer`)
INTERNAL_SYSTEM_ROLE = "_gptoss_internal_system"

SYSTEM_PROMPT = (
    "You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n"
    "Current date: {current_date}\n\n"
    "Reasoning: {reasoning_effort}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
)

_END_TOKENS = ("<|end|>", "<|call|>", "<|return|>")


# ---- tool definitions as Harmony's TypeScript-ish declarations ----------------------------------------------


def _json_type_to_typescript(schema: dict[str, Any]) -> str:
    if "oneOf" in schema:
        return " | ".join(_json_type_to_typescript(s) for s in schema["oneOf"])
    if "anyOf" in schema:
        return " | ".join(_json_type_to_typescript(s) for s in schema["anyOf"])
    json_type = schema.get("type", "any")
    if isinstance(json_type, list):
        return " | ".join(_json_type_to_typescript({"type": t}) for t in json_type)
    if json_type == "string":
        if "enum" in schema:
            return " | ".join(json.dumps(v) for v in schema["enum"])
        base = "string"
    elif json_type in ("number", "integer"):
        base = "number"
    elif json_type == "boolean":
        base = "boolean"
    elif json_type == "array":
        base = f"{_json_type_to_typescript(schema.get('items', {}))}[]"
    elif json_type == "object":
        base = _json_schema_to_typescript(schema)
    else:
        base = "any"
    return f"{base} | null" if schema.get("nullable") else base


def _json_schema_to_typescript(schema: dict[str, Any]) -> str:
    if schema.get("type") != "object":
        return "any"
    required = set(schema.get("required", []))
    fields = [
        f"{name}{'' if name in required else '?'}: {_json_type_to_typescript(prop)}"
        for name, prop in schema.get("properties", {}).items()
    ]
    return "{ " + ", ".join(fields) + " }"


def _schema_comments(schema: dict[str, Any]) -> list[str]:
    comments: list[str] = []
    if schema.get("title"):
        comments += [str(schema["title"]), ""]
    if schema.get("description"):
        comments.append(str(schema["description"]))
    if schema.get("examples"):
        comments.append("Examples:")
        comments += [f"- {json.dumps(example)}" for example in schema["examples"]]
    return comments


def _parameters_block(schema: dict[str, Any]) -> str:
    if schema.get("type") != "object" or not schema.get("properties"):
        return "()"
    header = "(_:"
    if schema.get("description"):
        header += f" // {schema['description']}"
    lines = [header, "{"]
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        lines += [f"// {comment}" for comment in _schema_comments(prop)]
        default = f" // default: {json.dumps(prop['default'])}" if "default" in prop else ""
        lines.append(f"{name}{'' if name in required else '?'}: {_json_type_to_typescript(prop)},{default}")
    lines.append("})")
    return "\n".join(lines)


def format_tool_definition(tool: ToolSpec) -> str:
    """One tool as `// description` and `type name = (_: {...}) => any;`."""
    lines = [f"// {tool['description']}"] if tool.get("description") else []
    lines.append(f"type {tool['name']} = {_parameters_block(tool.get('parameters') or {})} => any;")
    return "\n".join(lines)


# ---- the renderer ---------------------------------------------------------------------------------------------


class GptOssRenderer(Renderer):
    """OpenAI's open-weight models in the Harmony format.

    Thinking goes to the `analysis` channel, tool calls to `commentary` (`to=functions.name`, ending `<|call|>`),
    answers to `final`; the last assistant message ends `<|return|>`, earlier ones `<|end|>`. With
    `use_system_prompt` (the `*_reasoning` names) OpenAI's system prompt, with `reasoning_effort` and
    `current_date` (today when None), is put before every conversation.
    """

    #: a message's render is a function of the message, its context and the renderer's attributes (the
    #: date of a system prompt dated today is in the message it renders)
    memoize_renders = True

    def __init__(
        self,
        tokenizer: Tokenizer,
        use_system_prompt: bool = False,
        reasoning_effort: str | None = None,
        current_date: str | None = None,
    ) -> None:
        super().__init__(tokenizer)
        if use_system_prompt != (reasoning_effort is not None):
            raise RendererError("Reasoning effort must be set iff using system prompt")
        self.use_system_prompt = use_system_prompt
        self.reasoning_effort = reasoning_effort
        self.current_date = current_date

    # ---- tokens --------------------------------------------------------------------------------------------

    @property
    def _return_token(self) -> int:
        return self._single_token("<|return|>")

    @property
    def _call_token(self) -> int:
        return self._single_token("<|call|>")

    def get_stop_sequences(self) -> list[int]:
        return [self._return_token, self._call_token]

    @property
    def history_turn_end_ids(self) -> list[int]:
        """A final answer sampled up to `<|return|>` ends `<|end|>` once it is history (token-in history)."""
        return [self._single_token("<|end|>")]

    # ---- rendering -----------------------------------------------------------------------------------------

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        role = message["role"]
        if role == "tool":
            return self._render_tool_result(message)
        header_role = {INTERNAL_SYSTEM_ROLE: "system", "system": "developer"}.get(role, role)
        output = ""
        tool_calls = [ToolCall.from_obj(c) for c in message.get("tool_calls") or []]
        if role == "assistant":
            content = message["content"]
            parts: list[ContentPart] = (
                [{"type": "text", "text": content}] if isinstance(content, str) else content
            )
            text = "".join(p["text"] for p in parts if p["type"] == "text")
            thinking = "".join(p["thinking"] for p in parts if p["type"] == "thinking")
            if thinking:
                output += f"<|channel|>analysis<|message|>{thinking}<|end|><|start|>assistant"
            if tool_calls:
                if text:  # a preamble before the calls goes to the commentary channel
                    output += f"<|channel|>commentary<|message|>{text}<|end|><|start|>assistant"
                output += "<|start|>assistant".join(
                    f" to=functions.{call.function.name}<|channel|>commentary <|constrain|>json<|message|>"
                    f"{call.function.arguments}<|call|>"
                    for call in tool_calls
                )
            else:
                output += f"<|channel|>final<|message|>{text}"
                output += "<|return|>" if ctx.is_last else "<|end|>"
        elif role == "system":
            output += f"<|message|># Instructions\n\n{ensure_text(message['content'])}\n\n<|end|>"
        else:
            output += f"<|message|>{ensure_text(message['content'])}<|end|>"
        return RenderedMessage(output=[self._encode(output)], header=self._encode(f"<|start|>{header_role}"))

    def _render_tool_result(self, message: Message) -> RenderedMessage:
        """`<|start|>functions.name to=assistant<|channel|>commentary<|message|>result<|end|>`; the name comes from
        the message's `name` (the renderer cannot map `tool_call_id`s)."""
        name = message.get("name") or ""
        if not name:
            warnings.warn(
                "Tool message missing 'name' field. GptOssRenderer requires the 'name' field "
                "to render tool results correctly. Add 'name' to your tool messages: "
                "{'role': 'tool', 'name': 'function_name', 'content': '...', 'tool_call_id': '...'}",
                UserWarning,
                stacklevel=3,
            )
            name = "unknown"
        if not name.startswith("functions."):
            name = f"functions.{name}"
        output = f"<|channel|>commentary<|message|>{ensure_text(message['content'])}<|end|>"
        return RenderedMessage(
            output=[self._encode(output)], header=self._encode(f"<|start|>{name} to=assistant")
        )

    def _with_system_prompt(self, messages: Sequence[Message]) -> list[Message]:
        messages = list(messages)
        if not self.use_system_prompt:
            return messages
        if messages and messages[0]["role"] == "system":
            warnings.warn(
                "use_system_prompt=True but messages already start with a system message. "
                "The built-in system prompt will be prepended, resulting in two system messages. "
                "Either set use_system_prompt=False or remove the system message from your messages.",
                UserWarning,
                stacklevel=4,
            )
        date = self.current_date if self.current_date is not None else datetime.now().strftime("%Y-%m-%d")
        content = SYSTEM_PROMPT.format(current_date=date, reasoning_effort=self.reasoning_effort)
        return [{"role": INTERNAL_SYSTEM_ROLE, "content": content}, *messages]

    def generation_prompt_chunks(
        self, messages: Sequence[Message], role: str = "assistant", prefill: str | None = None
    ) -> list[list[int]]:
        return super().generation_prompt_chunks(self._with_system_prompt(messages), role, prefill)

    def supervised_chunks(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    ) -> list[tuple[list[int], int]]:
        return super().supervised_chunks(self._with_system_prompt(messages), train_on_what)

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """The tool-routing system message (with tools) and a developer message with the instructions and the
        `functions` namespace."""
        messages: list[Message] = []
        if tools:
            messages.append(
                {
                    "role": INTERNAL_SYSTEM_ROLE,
                    "content": "Calls to these tools must go to the commentary channel: 'functions'.",
                }
            )
        sections: list[str] = []
        if system_prompt:
            sections.append(f"# Instructions\n\n{system_prompt}")
        if tools:
            definitions = "\n\n".join(format_tool_definition(tool) for tool in tools)
            sections.append(
                f"# Tools\n\n## functions\n\nnamespace functions {{\n\n{definitions}\n\n}} // namespace functions"
            )
        if sections:
            messages.append({"role": "developer", "content": "\n\n".join(sections)})
        return messages

    # ---- parsing -------------------------------------------------------------------------------------------

    def parse_response(self, response: list[int]) -> tuple[Message, bool]:
        """Channels as thinking/text parts and `functions.*` messages as tool calls, up to the first stop token.

        When no channel message carries visible content, the content is the decoded text itself.
        """
        response = list(response)
        call_count = response.count(self._call_token)
        return_count = response.count(self._return_token)
        if call_count == 0 and return_count == 0:
            return {"role": "assistant", "content": str(self.tokenizer.decode(response))}, False
        for name, count in (("<|call|>", call_count), ("<|return|>", return_count)):
            if count > 1:
                raise RendererError(
                    f"When parsing response, expected at most 1 {name} token, but got {count}. "
                    "You probably are using the wrong stop tokens when sampling"
                )
        stop = min(response.index(t) for t in (self._return_token, self._call_token) if t in response)
        text = str(self.tokenizer.decode(response[:stop]))
        parts, calls = self._parse_harmony_output(text)
        message: Message = {"role": "assistant", "content": parts if parts else text}
        attach_tool_calls(message, calls)
        return message, True

    def completion_parts(self, tokens: list[int]) -> tuple[CompletionParts, bool]:
        """Reasoning from `analysis`, content from `final`/`commentary`, calls from `functions.*` recipients; text
        outside any channel message (no `<|message|>` at all) is the content. A truncated turn is read the same
        way, so its reasoning is not shown as content. The calls keep their place among the content messages (a
        call that is not emitted reaches the agent where it was written), and a call message with an empty body
        is unparsed rather than dropped."""
        stops = [t for t in (self._return_token, self._call_token) if t in tokens]
        ok = bool(stops)
        text = str(self.tokenizer.decode(tokens[: min(tokens.index(t) for t in stops)] if ok else tokens))
        if "<|message|>" not in text:
            return CompletionParts.from_segments([text]), ok
        segments: list[Any] = []
        reasoning: list[str] = []
        for msg in _parse_harmony_messages(text):
            body, recipient = msg["content"], msg["recipient"]
            if recipient and recipient.startswith("functions."):
                if not body.strip():
                    segments.append(UnparsedToolCall(msg["raw_text"], "a tool call without arguments"))
                else:
                    segments.extend(self._harmony_call(msg))
            elif not body.strip():
                continue
            elif msg["channel"] == "analysis":
                reasoning.append(body)
            elif msg["channel"] in ("final", "commentary"):
                segments.append(body)
        return CompletionParts.from_segments(segments, "".join(reasoning)), ok

    @staticmethod
    def _harmony_call(msg: dict[str, Any]) -> list[ToolCall | UnparsedToolCall]:
        body = msg["content"]
        name = msg["recipient"].split("functions.", 1)[1]
        try:
            json.loads(body)
        except json.JSONDecodeError as exc:
            return [UnparsedToolCall(msg["raw_text"], f"Invalid JSON: {exc}")]
        # Harmony has no call ids.
        return [ToolCall(FunctionBody(name, body.strip()), None, raw_text=msg["raw_text"])]

    def _parse_harmony_output(self, text: str) -> tuple[list[ContentPart], list[ToolCall | UnparsedToolCall]]:
        parts: list[ContentPart] = []
        calls: list[ToolCall | UnparsedToolCall] = []
        for msg in _parse_harmony_messages(text):
            body = msg["content"]
            if not body.strip():
                continue
            recipient = msg["recipient"]
            if recipient and recipient.startswith("functions."):
                calls.extend(self._harmony_call(msg))
                continue
            if msg["channel"] == "analysis":
                parts.append({"type": "thinking", "thinking": body})
            elif msg["channel"] in ("final", "commentary"):
                parts.append({"type": "text", "text": body})
        return parts, calls

    def _tool_call_text(self, call: ToolCall) -> str:
        return (
            f"<|start|>assistant to=functions.{call.function.name}<|channel|>commentary <|constrain|>json"
            f"<|message|>{call.function.arguments}"
        )


class GptOssNoSysPromptRenderer(GptOssRenderer):
    """`gpt_oss_no_sysprompt`: no system prompt is added."""


class _GptOssReasoningRenderer(GptOssRenderer):
    effort = "medium"

    def __init__(self, tokenizer: Tokenizer, current_date: str | None = None) -> None:
        super().__init__(
            tokenizer, use_system_prompt=True, reasoning_effort=self.effort, current_date=current_date
        )


class GptOssLowReasoningRenderer(_GptOssReasoningRenderer):
    """`gpt_oss_low_reasoning`: OpenAI's system prompt with `Reasoning: low`."""

    effort = "low"


class GptOssMediumReasoningRenderer(_GptOssReasoningRenderer):
    """`gpt_oss_medium_reasoning`: OpenAI's system prompt with `Reasoning: medium`."""

    effort = "medium"


class GptOssHighReasoningRenderer(_GptOssReasoningRenderer):
    """`gpt_oss_high_reasoning`: OpenAI's system prompt with `Reasoning: high`."""

    effort = "high"


def _parse_harmony_messages(text: str) -> list[dict[str, Any]]:
    """Split decoded Harmony text into messages: header fields (channel, recipient, content type), body, raw text.

    A header starts at the last `<|start|>` before `<|message|>` (or where the previous message ended); a body
    ends at the first end token (or the end of the text).
    """
    messages: list[dict[str, Any]] = []
    pos = 0
    while (message_at := text.find("<|message|>", pos)) != -1:
        header_start = text.rfind("<|start|>", pos, message_at)
        if header_start == -1:
            header_start = pos
        header = text[header_start:message_at]
        body_start = message_at + len("<|message|>")
        end, end_token = len(text), ""
        for token in _END_TOKENS:
            found = text.find(token, body_start)
            if found != -1 and found < end:
                end, end_token = found, token
        channel = re.search(r"<\|channel\|>([^<\s]+)", header)
        recipient = re.search(r"to=([^\s<]+)", header)
        content_type = re.search(r"<\|constrain\|>\s*([^\s<]+)", header)
        messages.append(
            {
                "channel": channel.group(1) if channel else None,
                "recipient": recipient.group(1) if recipient else None,
                "content_type": content_type.group(1) if content_type else None,
                "content": text[body_start:end],
                "raw_text": text[header_start : end + len(end_token)],
            }
        )
        pos = end + len(end_token)
    return messages
