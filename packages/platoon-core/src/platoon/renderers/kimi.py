"""The Kimi renderers: `kimi_k2`, `kimi_k25`, `kimi_k25_disable_thinking` (tinker-cookbook 0.3.0's, token for token).

`<|im_user|>user<|im_middle|>...<|im_end|>` turns, a default system turn, `<think>` blocks kept only in the last
assistant turn, and `<|tool_calls_section_begin|>` tool calls; K2.5 declares tools TypeScript-style.
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from platoon.renderers.base import (
    CallGroup,
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
    group_items,
    parse_think_blocks,
)

log = logging.getLogger(__name__)

_SECTION = re.compile(
    r"<\|tool_calls_section_begin\|>(.*?)<\|tool_calls_section_end\|>"
    r"|<\|tool_call_section_begin\|>(.*?)<\|tool_call_section_end\|>",
    re.DOTALL,
)
_SECTION_OPEN = re.compile(r"<\|tool_calls?_section_begin\|>")
_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*([^<]+:\d+)\s*<\|tool_call_argument_begin\|>\s*(.*?)\s*<\|tool_call_end\|>",
    re.DOTALL,
)


# An id that names a function: `functions.NAME:N` or `NAME:N` (the gateway's reading; the cookbook's takes any id).
_VALID_ID = re.compile(r"(?:functions\.)?[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*:\d+")


def _section_call(match: re.Match[str]) -> ToolCall | UnparsedToolCall:
    """One call of a section for the gateway: as the cookbook reads it, and unparsed when its id names no
    function (a call named `0` or `invalid.0` must not run)."""
    if not _VALID_ID.fullmatch(match.group(1).strip()):
        return UnparsedToolCall(match.group(0), f"the call id {match.group(1).strip()!r} names no function")
    return _parse_section(match.group(0))[0]


def _parse_section(section: str) -> list[ToolCall | UnparsedToolCall]:
    """The calls of a tool-calls section; an id is `functions.name:index`, arguments are kept as written."""
    calls: list[ToolCall | UnparsedToolCall] = []
    for match in _CALL.finditer(section):
        call_id, arguments = match.group(1).strip(), match.group(2).strip()
        name = call_id.split(":", 1)[0]
        if "." in name:
            name = name.split(".", 1)[1]
        try:
            json.loads(arguments)
        except (ValueError, RecursionError) as exc:
            calls.append(UnparsedToolCall(match.group(0), f"Invalid JSON: {exc}"))
            continue
        calls.append(ToolCall(FunctionBody(name, arguments), call_id or None, raw_text=match.group(0)))
    return calls


class KimiK2Renderer(Renderer):
    """Kimi K2 Thinking. A default system turn is added when none leads; tool declarations come first.

    Assistant turns after the last assistant turn without tool calls keep their thinking (the rest get an
    empty `<think></think>`), so multi-turn prompts are not extensions of each other.
    """

    supports_streaming = False
    DEFAULT_SYSTEM_PROMPT = "You are Kimi, an AI assistant created by Moonshot AI."

    def __init__(self, tokenizer: Tokenizer, strip_thinking_from_history: bool = True) -> None:
        super().__init__(tokenizer)
        self.strip_thinking_from_history = strip_thinking_from_history

    # The cookbook encodes Kimi text with the tokenizer's default special-token handling; so does platoon.
    def _kimi_encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def _with_system(self, messages: Sequence[Message]) -> list[Message]:
        """The default system turn where the HF template adds one (after a leading tool declaration)."""
        messages = list(messages)
        default: Message = {"role": "system", "content": self.DEFAULT_SYSTEM_PROMPT}
        if not messages:
            return [default]
        if messages[0]["role"] == "tool_declare":
            if len(messages) >= 2 and messages[1]["role"] == "system":
                return messages
            return [messages[0], default, *messages[1:]]
        if messages[0]["role"] != "system":
            return [default, *messages]
        return messages

    # ---- rendering -----------------------------------------------------------------------------------------

    def _header(self, message: Message) -> str:
        role = message["role"]
        if role == "user":
            return f"<|im_user|>{role}<|im_middle|>"
        if role == "assistant":
            return f"<|im_assistant|>{role}<|im_middle|>"
        if role != "tool":
            return f"<|im_system|>{role}<|im_middle|>"  # system, tool_declare and any other role
        name = message.get("name")
        if not name:
            warnings.warn(
                "Tool message missing 'name' field. Using 'tool' as fallback. Consider setting 'name' to match "
                "the tool function name for better context.",
                UserWarning,
                stacklevel=4,
            )
            name = role
        call_id = message.get("tool_call_id", "")
        if not call_id:
            warnings.warn(
                "Tool message missing 'tool_call_id' field. KimiK2Renderer requires 'tool_call_id' to render "
                "tool results correctly. The value should match ToolCall.id from the assistant's tool_calls.",
                UserWarning,
                stacklevel=4,
            )
        return f"<|im_system|>{name}<|im_middle|>## Return of {call_id}\n"

    def _assistant_text(self, message: Message, ctx: RenderContext) -> str:
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        thinking = "".join(p["thinking"] for p in parts if p["type"] == "thinking")
        text = "".join(p["text"] for p in parts if p["type"] == "text")
        keep = ctx.is_last or not self.strip_thinking_from_history
        out = (f"<think>{thinking}</think>" if keep and thinking else "<think></think>") + text
        if message.get("tool_calls"):
            out += "<|tool_calls_section_begin|>"
            for idx, raw in enumerate(message["tool_calls"]):
                call = ToolCall.from_obj(raw)
                call_id = call.id or f"functions.{call.function.name}:{idx}"
                out += (
                    f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{call.function.arguments}"
                    "<|tool_call_end|>"
                )
            out += "<|tool_calls_section_end|>"
        return out + "<|im_end|>"

    def _multipart(self, content: list[ContentPart]) -> list[list[int]]:
        raise RendererError("multi-part content is not supported by the Kimi K2 renderer")

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        header = self._kimi_encode(self._header(message))
        content = message["content"]
        if message["role"] == "assistant":
            output = [self._kimi_encode(self._assistant_text(message, ctx))]
        elif isinstance(content, str):
            output = [self._kimi_encode(content + "<|im_end|>")]
        elif len(content) == 1 and content[0]["type"] == "text":
            output = [self._kimi_encode(content[0]["text"] + "<|im_end|>")]
        else:
            output = self._multipart([*content, {"type": "text", "text": "<|im_end|>"}])
        return RenderedMessage(output=output, header=header)

    def _last_plain_assistant(self, messages: Sequence[Message], stop: int) -> int:
        """The index of the last assistant turn without tool calls before `stop`, else -1."""
        for idx in range(stop - 1, -1, -1):
            if messages[idx]["role"] == "assistant" and not messages[idx].get("tool_calls"):
                return idx
        return -1

    def _default_prefill(self) -> str | None:
        return None

    def generation_prompt_chunks(
        self, messages: Sequence[Message], role: str = "assistant", prefill: str | None = None
    ) -> list[list[int]]:
        messages = self._with_system(messages)
        if prefill is None:
            prefill = self._default_prefill()
        # Thinking is kept for the assistant turns after the last one without tool calls (the HF template).
        last_plain = self._last_plain_assistant(messages, len(messages))
        chunks: list[list[int]] = []
        for idx, message in enumerate(messages):
            keep = message["role"] == "assistant" and (last_plain == -1 or idx > last_plain)
            rendered = self.render_message(
                message, RenderContext(idx, keep, messages[idx - 1] if idx else None)
            )
            if rendered.header:
                chunks.append(list(rendered.header))
            chunks.extend(list(chunk) for chunk in rendered.output if chunk)
        chunks.append(self._kimi_encode(f"<|im_assistant|>{role}<|im_middle|>"))
        if prefill:
            chunks.append(self._kimi_encode(prefill))
        return chunks

    def supervised_chunks(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    ) -> list[tuple[list[int], int]]:
        """The cookbook's Kimi weighting: the last assistant turn (after the last plain assistant turn before
        the final message) keeps its thinking and is what `last_assistant_turn` trains on."""
        messages = self._with_system(messages)
        mode = TrainOnWhat(train_on_what)
        # The final message is left out of the search, so a whole last round of tool use keeps its thinking.
        last_plain = self._last_plain_assistant(messages, len(messages) - 1)
        pieces: list[tuple[list[int], int]] = []
        for idx, message in enumerate(messages):
            if mode == TrainOnWhat.CUSTOMIZED:
                if "trainable" not in message:
                    raise RendererError("train_on_what=customized needs a 'trainable' field on every message")
            elif "trainable" in message:
                raise RendererError("a 'trainable' field needs train_on_what=customized")
            is_assistant = message["role"] == "assistant"
            last_turn = is_assistant and (last_plain == -1 or idx > last_plain)
            rendered = self.render_message(
                message, RenderContext(idx, last_turn, messages[idx - 1] if idx else None)
            )
            if rendered.header:
                pieces.append((list(rendered.header), int(mode == TrainOnWhat.ALL_TOKENS)))
            weight = {
                TrainOnWhat.LAST_ASSISTANT_MESSAGE: is_assistant and idx == len(messages) - 1,
                TrainOnWhat.LAST_ASSISTANT_TURN: last_turn,
                TrainOnWhat.ALL_ASSISTANT_MESSAGES: is_assistant,
                TrainOnWhat.ALL_MESSAGES: True,
                TrainOnWhat.ALL_TOKENS: True,
                TrainOnWhat.ALL_USER_AND_SYSTEM_MESSAGES: message["role"] in ("user", "system"),
                TrainOnWhat.CUSTOMIZED: bool(message.get("trainable", False)),
            }[mode]
            pieces.extend((list(chunk), int(weight)) for chunk in rendered.output if chunk)
        return pieces

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """A `tool_declare` turn (compact JSON, keys sorted, as Kimi's own template writes it), then the system
        turn (the default prompt when none is given)."""
        messages: list[Message] = []
        if tools:
            payload = [{"type": "function", "function": tool} for tool in tools]
            messages.append(
                {
                    "role": "tool_declare",
                    "content": json.dumps(payload, separators=(",", ":"), sort_keys=True),
                }
            )
        messages.append({"role": "system", "content": system_prompt or self.DEFAULT_SYSTEM_PROMPT})
        return messages

    # ---- stops and parsing ---------------------------------------------------------------------------------

    @property
    def _end_message_token(self) -> int:
        # Encoded as Kimi encodes every text (`tokenizer.encode` with its own defaults), not by `_encode`.
        return self._only_token("<|im_end|>", self._kimi_encode("<|im_end|>"))

    def get_stop_sequences(self) -> list[int]:
        return [self._end_message_token]

    def parse_response(self, response: list[int]) -> tuple[Message, bool]:
        """The cookbook's parse: the tool-calls section, then `<think>` blocks of the text before it."""
        message, ok = self._parse_to_end_of_message(response)
        if not ok:
            return message, False
        content: str = message["content"]
        match = _SECTION.search(content)
        if match:
            calls = _parse_section(match.group(1) if match.group(1) is not None else match.group(2))
            attach_tool_calls(message, calls)
            content = content[: match.start()]
        parts = parse_think_blocks(content)
        message["content"] = parts if parts is not None else content
        return message, True

    def _opens_thinking(self) -> bool:
        """Whether the generation prompt leaves a `<think>` block open."""
        return False

    def completion_parts(self, tokens: list[int]) -> tuple[CompletionParts, bool]:
        """Content, reasoning and tool calls for the gateway, keeping what the cookbook's parse drops.

        Text after the tool-calls section stays content; every section is read, each a `CallGroup` (a section
        whose calls are not emitted reaches the agent as written, markers and whitespace included); a section
        none of whose calls matches, or one never closed, is one unparsed block; a call whose id names no
        function (`functions.NAME:N` or `NAME:N`) is unparsed. With K2.5's `<think>` prefill a truncated
        completion that never closed its think block is all reasoning.
        """
        end = self._end_message_token
        ok = end in tokens
        body = self._normalize_response_tokens(tokens[: tokens.index(end)] if ok else list(tokens))
        text = str(self.tokenizer.decode(body))
        if not ok and self._opens_thinking() and "<think>" not in text:
            return CompletionParts(reasoning=text), False
        blocks: list[Any] = []  # the sections and what follows the first
        first: int | None = None
        pos = 0
        for match in _SECTION.finditer(text):
            if first is None:
                first = match.start()
            else:
                blocks.append(text[pos : match.start()])
            pos = match.end()
            inner_group = 1 if match.group(1) is not None else 2
            inner, inner_at = match.group(inner_group), match.start(inner_group)
            calls = [(m.start(), m.end(), _section_call(m)) for m in _CALL.finditer(inner)]
            if not calls and inner.strip():
                blocks.append(UnparsedToolCall(match.group(0), "No tool call in the tool-calls section"))
                continue
            opener, closer = text[match.start() : inner_at], text[inner_at + len(inner) : match.end()]
            blocks.append(CallGroup(opener, group_items(inner, calls), closer))
        if (opened := _SECTION_OPEN.search(text, pos)) is not None:
            if first is None:
                first = opened.start()
            else:
                blocks.append(text[pos : opened.start()])
            blocks.append(UnparsedToolCall(text[opened.start() :], "Unterminated tool-calls section"))
        elif first is not None:
            blocks.append(text[pos:])
        if first is None:
            first = len(text)
        text = text[:first]
        reasoning = ""
        pieces = parse_think_blocks(text)
        if pieces is not None:
            reasoning = "".join(p["thinking"] for p in pieces if p["type"] == "thinking")
            text = "".join(p["text"] for p in pieces if p["type"] == "text")
            # An unclosed `<think>` (a truncated completion) is reasoning, not content.
            opened_at = text.rfind("<think>")
            if opened_at >= 0 and "</think>" not in text[opened_at:]:
                reasoning += text[opened_at + len("<think>") :]
                text = text[:opened_at]
        return CompletionParts.from_segments([text, *blocks], reasoning), ok

    def _tool_call_text(self, call: ToolCall) -> str:
        call_id = call.id or f"functions.{call.function.name}:0"
        return f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{call.function.arguments}<|tool_call_end|>"


class KimiK25Renderer(KimiK2Renderer):
    """Kimi K2.5 with thinking: the generation prompt ends with `<think>`; tools are declared TypeScript-style.

    Multi-part text content is encoded part by part (images are refused: platoon renders text only).
    """

    def __init__(
        self, tokenizer: Tokenizer, image_processor: Any = None, strip_thinking_from_history: bool = True
    ) -> None:
        super().__init__(tokenizer, strip_thinking_from_history)
        self.image_processor = image_processor
        self._think_open = self._single_token("<think>")
        self._think_close = self._single_token("</think>")

    def _multipart(self, content: list[ContentPart]) -> list[list[int]]:
        chunks: list[list[int]] = []
        for part in content:
            if part["type"] != "text":
                raise RendererError(f"Unsupported content type: {part['type']} (platoon renders text only)")
            chunks.append(self._kimi_encode(part["text"]))
        return chunks

    def _default_prefill(self) -> str | None:
        return "<think>"

    def _opens_thinking(self) -> bool:
        return True

    def _normalize_response_tokens(self, response: list[int]) -> list[int]:
        """Put the prefilled `<think>` back in front of a completion that closes a think block."""
        if response and response[0] != self._think_open and self._think_close in response:
            return [self._think_open, *response]
        return list(response)

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """A `tool_declare` turn with TypeScript-style declarations, then the system turn."""
        messages: list[Message] = []
        if tools:
            declaration = encode_tools_typescript([{"type": "function", "function": tool} for tool in tools])
            messages.append({"role": "tool_declare", "content": declaration})
        messages.append({"role": "system", "content": system_prompt or self.DEFAULT_SYSTEM_PROMPT})
        return messages


class KimiK25DisableThinkingRenderer(KimiK25Renderer):
    """Kimi K2.5 with thinking off: the generation prompt ends with an empty `<think></think>`."""

    def _default_prefill(self) -> str | None:
        return "<think></think>"

    def _opens_thinking(self) -> bool:
        return False


# --------------------------------------------------------------------------------------------------------------
# Kimi K2.5's TypeScript-style tool declaration (its tokenizer's `tool_declaration_ts`, reproduced output for
# output): a `namespace functions` of `type name = (_: {...}) => any;` with `//` comments.

_INDENT = "  "


def _comment(text: str, indent: str = "") -> str:
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


@dataclass
class _Refs:
    """`$defs` seen while reading a schema, and whether the schema refers to itself (`$ref: "#"`)."""

    definitions: dict[str, Any] = field(default_factory=dict)
    self_ref: bool = False


@dataclass
class _TsType:
    """A schema read for TypeScript output: its kind, its doc comment parts and what the kind needs."""

    kind: str  # scalar | object | array | enum | any_of | union | ref
    description: str = ""
    constraints: dict[str, Any] = field(default_factory=dict)
    name: str = ""  # scalar type or ref name
    properties: list[_TsParam] = field(default_factory=list)
    additional: Any = None  # None, a bool, or a _TsType
    items: list[_TsType] = field(default_factory=list)  # array item, or any_of members
    values: list[Any] = field(default_factory=list)  # enum values, or union type names

    def doc(self, indent: str) -> str:
        lines = []
        if self.description:
            lines.append(_comment(self.description, indent))
        if self.constraints:
            lines.append(f"{indent}// " + ", ".join(f"{k}: {v}" for k, v in sorted(self.constraints.items())))
        return "".join(line + "\n" for line in lines)

    def render(self, indent: str = "") -> str:
        if self.kind == "scalar":
            return "number" if self.name == "integer" else self.name
        if self.kind == "ref":
            return self.name
        if self.kind == "enum":
            return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in self.values)
        if self.kind == "union":
            return " | ".join(self.values)
        if self.kind == "any_of":
            return " | ".join(t.render(indent) for t in self.items)
        if self.kind == "array":
            item = self.items[0]
            item_doc = item.doc(indent + _INDENT)
            if item_doc:
                return f"Array<\n{item_doc}{indent}{_INDENT}{item.render(indent + _INDENT)}\n{indent}>"
            return f"Array<{item.render(indent)}>"
        # object: required fields first, each group by name
        ordered = sorted((p for p in self.properties if not p.optional), key=lambda p: p.name)
        ordered += sorted((p for p in self.properties if p.optional), key=lambda p: p.name)
        fields = [p.render(indent + _INDENT) for p in ordered]
        if self.additional is not None:
            if self.additional is True:
                extra = "any"
            elif self.additional is False:
                extra = "never"
            elif isinstance(self.additional, _TsType):
                extra = self.additional.render(indent + _INDENT)
            else:
                raise ValueError(f"Unknown additionalProperties: {self.additional}")
            fields.append(f"{indent}{_INDENT}[k: string]: {extra}")
        if not fields:
            return "{}"
        return "{\n" + ",\n".join(fields) + f"\n{indent}}}"


@dataclass
class _TsParam:
    name: str
    type: _TsType
    optional: bool
    default: Any = None

    def render(self, indent: str) -> str:
        comments = self.type.doc(indent)
        if self.default is not None:
            shown = (
                repr(self.default)
                if isinstance(self.default, (int, float, bool))
                else json.dumps(self.default, ensure_ascii=False)
            )
            comments += f"{indent}// Default: {shown}\n"
        return f"{comments}{indent}{self.name}{'?' if self.optional else ''}: {self.type.render(indent)}"


_UNION_NAMES = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "{}",
    "array": "Array<any>",
}
_SCALAR_CONSTRAINTS = {
    "string": ("maxLength", "minLength", "pattern"),
    "number": ("maximum", "minimum"),
    "integer": ("maximum", "minimum"),
}


def _ts_object(schema: dict[str, Any], refs: _Refs) -> _TsType:
    node = _TsType("object", description=schema.get("description", ""))
    if not schema:
        return node
    if schema.get("$defs"):
        refs.definitions.update(schema["$defs"])
    node.additional = schema.get("additionalProperties")
    if isinstance(node.additional, dict):
        node.additional = _ts_type(node.additional, refs)
    if "properties" not in schema:
        return node
    required = set(schema.get("required", []))
    node.properties = [
        _TsParam(
            name,
            _ts_type(prop, refs),
            optional=name not in required,
            default=prop.get("default") if isinstance(prop, dict) else None,
        )
        for name, prop in schema["properties"].items()
    ]
    return node


def _check_enum(schema: dict[str, Any]) -> None:
    """The declared type of an enum must fit its values (the reference encoder refuses otherwise)."""
    if "type" not in schema:
        return
    kind = schema["type"]
    if isinstance(kind, list):
        if len(kind) == 1:
            kind = kind[0]
        elif len(kind) == 2 and "null" in kind:
            kind = kind[0] if kind[0] != "null" else kind[1]
        else:
            raise ValueError(f"Enum type {kind} is not supported")
    checks: dict[str, tuple[tuple[type, ...], str]] = {
        "string": ((str,), "a string"),
        "number": ((int, float), "a number"),
        "integer": ((int,), "an integer"),
        "boolean": ((bool,), "a boolean"),
    }
    for value in schema["enum"]:
        if value is not None and kind in checks and not isinstance(value, checks[kind][0]):
            raise ValueError(f"Enum value {value} is not {checks[kind][1]}")


def _ts_type(schema: Any, refs: _Refs) -> _TsType:
    if isinstance(schema, bool):
        if not schema:
            log.warning("Warning: Boolean value False is not supported, use null instead.")
        return _TsType("scalar", name="any" if schema else "null")
    description = schema.get("description", "")
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref == "#":
            refs.self_ref = True
            return _TsType("ref", description=description, name="parameters")
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"Unsupported reference format: {ref}")
        if ref.split("/")[-1] not in refs.definitions:
            raise ValueError(f"Reference not found: {ref}")
        return _TsType("ref", description=description, name=ref.split("/")[-1])
    if "anyOf" in schema:
        return _TsType("any_of", description=description, items=[_ts_type(t, refs) for t in schema["anyOf"]])
    if "enum" in schema:
        _check_enum(schema)
        return _TsType("enum", description=description, values=list(schema["enum"]))
    if "type" in schema:
        kind = schema["type"]
        if isinstance(kind, list):
            return _TsType("union", description=description, values=[_UNION_NAMES[t] for t in kind])
        if kind == "object":
            return _ts_object(schema, refs)
        if kind == "array":
            item = _ts_type(schema["items"], refs) if schema.get("items") else _TsType("scalar", name="any")
            constraints = {k: v for k, v in schema.items() if k in ("minItems", "maxItems")}
            return _TsType("array", description=description, constraints=constraints, items=[item])
        allowed = _SCALAR_CONSTRAINTS.get(kind, ())
        constraints = {k: v for k, v in schema.items() if k in allowed}
        return _TsType("scalar", description=description, constraints=constraints, name=kind)
    if schema == {}:
        return _TsType("scalar", name="any")
    raise ValueError(f"Invalid JSON Schema object: {schema}")


def _ts_function(function: dict[str, Any]) -> str:
    refs = _Refs()
    parsed = _ts_object(function.get("parameters") or {}, refs)
    interfaces = []
    self_ref = refs.self_ref  # decided before the definitions are read, as the reference encoder does
    if self_ref:
        body = ",\n".join(p.render(_INDENT) for p in parsed.properties)
        body = f"\n{body}\n" if body else ""
        interfaces.append("interface parameters {" + body + "}")
    for name, schema in dict(refs.definitions).items():
        described = _comment(schema["description"]) + "\n" if schema.get("description", "") else ""
        interfaces.append(f"{described}interface {name} {_ts_type(schema, refs).render()}")
    name = function.get("name", "function")
    signature = "parameters" if self_ref else parsed.render()
    description = function.get("description")
    pieces = [
        "\n".join(interfaces),
        (description and _comment(description)) or "",
        f"type {name} = (_: {signature}) => any;",
    ]
    return "\n".join(p for p in pieces if p)


def encode_tools_typescript(tools: list[dict[str, Any]]) -> str:
    """OpenAI function tools as Kimi K2.5's `# Tools` block ("" when there are none)."""
    functions = [
        _ts_function(tool["function"])
        for tool in tools
        if tool.get("type") == "function" and tool.get("function")
    ]
    if not functions:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(functions) + "\n}\n"
