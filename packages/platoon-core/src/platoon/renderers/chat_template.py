"""The `chat_template` renderer: the model's own chat template (transformers' `apply_chat_template`) plus a
tool-call parser chosen by name, by round trip (`auto`) or written by the user, and its aliases.

transformers is never imported here: the tokenizer brings `apply_chat_template`, and generation settings are read
from the model directory's `generation_config.json` (or the Hugging Face cache, imported lazily).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from platoon.renderers.base import (
    CallGroup,
    CompletionParts,
    FunctionBody,
    Message,
    ParsedCompletion,
    RenderContext,
    RenderedMessage,
    Renderer,
    RendererError,
    Tokenizer,
    ToolCall,
    UnparsedToolCall,
)
from platoon.renderers.probe import resolve_parser
from platoon.renderers.tool_parsers import ParsedToolCall, ParseResult
from platoon.renderers.tool_parsers._common import dumps_arguments

if TYPE_CHECKING:
    import tinker

log = logging.getLogger(__name__)

#: (tokenizer name, template hash, stop tokens, parser setting, reasoning tags, template kwargs) -> (parser, record)
_PARSER_CHOICES: dict[tuple[Any, ...], tuple[Any, dict[str, Any]]] = {}
_CHOICE_LOCK = threading.Lock()
#: parser failures seen in this process (tracebacks for the first 3, then every 1000th)
_parse_failures = 0


class ChatTemplateRenderer(Renderer):
    """Renders with the tokenizer's chat template and parses with the chosen tool-call parser.

    Settings (renderer_kwargs, set as attributes): `enable_thinking` (True), `preserve_thinking` (None = the
    template's default), `reasoning_effort`, `chat_template_kwargs`, `tool_call_parser` (`auto`, a name,
    `package.module:attr` or `none`), `reasoning_tags` (`auto`, `none` or `[open, close]`).

    History is rendered by the template, so whether successive prompts extend each other is the template's
    business: templates that drop earlier reasoning blocks (Qwen3's) break the prefix property unless the
    template keeps them (`preserve_thinking` on templates that take it).
    """

    def __init__(self, tokenizer: Tokenizer, image_processor: Any = None) -> None:
        super().__init__(tokenizer)
        self.image_processor = image_processor
        self.enable_thinking: bool = True
        self.preserve_thinking: bool | None = None
        self.reasoning_effort: str | None = None
        self.chat_template_kwargs: dict[str, Any] = {}
        self.tool_call_parser: str = "auto"
        self.reasoning_tags: str | Sequence[str] | None = "auto"
        self._stop_ids: list[int] | None = None
        self._in_reasoning: dict[tuple[Any, ...], bool] = {}
        # Tools of the latest render: the parser types text values by them when a caller does not pass them.
        self._last_tools: list[dict[str, Any]] | None = None
        self._call = threading.local()

    # ---- rendering -----------------------------------------------------------------------------------------

    def template_kwargs(
        self, *, enable_thinking: bool | None = None, preserve_thinking: bool | None = None
    ) -> dict[str, Any]:
        """The template kwargs: `chat_template_kwargs`, then the thinking settings (a request may override)."""
        kwargs = dict(self.chat_template_kwargs or {})
        kwargs["enable_thinking"] = self.enable_thinking if enable_thinking is None else enable_thinking
        preserve = self.preserve_thinking if preserve_thinking is None else preserve_thinking
        if preserve is not None:
            kwargs["preserve_thinking"] = preserve
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
        return kwargs

    def render_text(
        self,
        messages: Sequence[Mapping[str, Any] | Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        preserve_thinking: bool | None = None,
    ) -> str:
        """The template applied to the cleaned messages (untokenized); template failures are `RendererError`s."""
        apply = getattr(self.tokenizer, "apply_chat_template", None)
        if apply is None:
            raise RendererError(
                f"the chat_template renderer needs a transformers tokenizer with a chat template; "
                f"{type(self.tokenizer).__name__} has no apply_chat_template"
            )
        cleaned = clean_messages(messages)
        function_tools = [_function_tool(t) for t in tools] if tools else None
        kwargs = self.template_kwargs(enable_thinking=enable_thinking, preserve_thinking=preserve_thinking)
        try:
            text = apply(
                cleaned,
                tools=function_tools,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **kwargs,
            )
        except Exception as exc:  # jinja errors, raise_exception(...) in the template, a missing template
            raise RendererError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(text, str):
            raise RendererError(f"the chat template returned {type(text).__name__}, not text")
        return text

    def render_prompt(
        self,
        openai_messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        enable_thinking: bool | None = None,
        preserve_thinking: bool | None = None,
        prefill: str | None = None,
    ) -> list[int]:
        """The generation prompt's token ids: OpenAI messages verbatim, tools as plain function tools."""
        text = self.render_text(
            openai_messages,
            tools,
            enable_thinking=enable_thinking,
            preserve_thinking=preserve_thinking,
        )
        self._last_tools = [_function_tool(t) for t in tools] if tools else None
        return self._encode(text + (prefill or ""))

    def generation_prompt_chunks(
        self, messages: Sequence[Message], role: str = "assistant", prefill: str | None = None
    ) -> list[list[int]]:
        if role != "assistant":
            raise RendererError("the chat_template renderer only builds assistant generation prompts")
        return [self._encode(self.render_text(messages) + (prefill or ""))]

    def build_generation_prompt(
        self, messages: Sequence[Message], role: str = "assistant", prefill: str | None = None
    ) -> tinker.ModelInput:
        import tinker

        chunks = self.generation_prompt_chunks(messages, role, prefill)
        return tinker.ModelInput(chunks=[tinker.EncodedTextChunk(tokens=c) for c in chunks])

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        raise RendererError(
            "the chat_template renderer renders whole conversations with the model's template, not one message"
        )

    def supervised_chunks(
        self, messages: Sequence[Message], train_on_what: Any = None
    ) -> list[tuple[list[int], int]]:
        raise RendererError(
            "the chat_template renderer supports assistant generation only (no supervised examples)"
        )

    # ---- stops ---------------------------------------------------------------------------------------------

    def stop_token_ids(self) -> list[int]:
        """`generation_config.json`'s `eos_token_id` (an int or a list); else the tokenizer's eos, with a warning."""
        if self._stop_ids is None:
            self._stop_ids = self._find_stop_ids()
        return list(self._stop_ids)

    def get_stop_sequences(self) -> list[int]:
        return self.stop_token_ids()

    def _find_stop_ids(self) -> list[int]:
        eos = _generation_config_eos(str(getattr(self.tokenizer, "name_or_path", "") or ""))
        if eos:
            return eos
        token_id = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(token_id, int):
            log.warning(
                "no generation_config.json for %s: stopping at the tokenizer's eos token only (%d)",
                getattr(self.tokenizer, "name_or_path", "?"),
                token_id,
            )
            return [token_id]
        raise RendererError(
            f"no stop tokens for {getattr(self.tokenizer, 'name_or_path', '?')!r}: no generation_config.json "
            "eos_token_id and no tokenizer eos token"
        )

    # ---- the parser ----------------------------------------------------------------------------------------

    def _choice_key(self) -> tuple[Any, ...]:
        template = getattr(self.tokenizer, "chat_template", None)
        digest = hashlib.sha256(json.dumps(template, sort_keys=True, default=str).encode()).hexdigest()
        return (
            str(getattr(self.tokenizer, "name_or_path", "")),
            digest,
            tuple(self.stop_token_ids()),
            str(self.tool_call_parser),
            json.dumps(self.reasoning_tags, default=str),
            json.dumps(self.template_kwargs(), sort_keys=True, default=str),
        )

    def _choice(self) -> tuple[Any, dict[str, Any]]:
        key = self._choice_key()
        with _CHOICE_LOCK:
            found = _PARSER_CHOICES.get(key)
        if found is None:
            found = resolve_parser(self, str(self.tool_call_parser), self.reasoning_tags)
            with _CHOICE_LOCK:
                _PARSER_CHOICES[key] = found
        return found

    @property
    def parser(self) -> Any:
        """The tool-call parser in use (chosen once per template and settings per process)."""
        return self._choice()[0]

    def tool_call_parsing(self) -> dict[str, Any]:
        """The lock.json record: `{model_name, renderer_name, setting, parser, verified, reason}`."""
        record = dict(self._choice()[1])
        record["model_name"] = str(getattr(self.tokenizer, "name_or_path", ""))
        record["renderer_name"] = self.name or "chat_template"
        return record

    # ---- parsing -------------------------------------------------------------------------------------------

    def starts_in_reasoning(
        self, prompt: Sequence[int] | None = None, enable_thinking: bool | None = None
    ) -> bool:
        """Whether the sampled text starts inside the parser's reasoning block."""
        open_tag = getattr(self.parser, "open_reasoning_tag", None)
        if not open_tag:
            return False
        if prompt:
            tail = str(self.tokenizer.decode(list(prompt)[-16:]))
            return tail.rstrip().endswith(open_tag)
        thinking = self.enable_thinking if enable_thinking is None else enable_thinking
        key = (open_tag, thinking, json.dumps(self.template_kwargs(enable_thinking=thinking), default=str))
        if key not in self._in_reasoning:
            try:
                text = self.render_text([{"role": "user", "content": "Hi"}], enable_thinking=thinking)
                self._in_reasoning[key] = text.rstrip().endswith(open_tag)
            except RendererError:
                self._in_reasoning[key] = bool(thinking)
        return self._in_reasoning[key]

    def parse_completion(
        self,
        tokens: Sequence[int],
        stop_reason: str,
        *,
        prompt: Sequence[int] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool | None = None,
    ) -> ParsedCompletion:
        """As the base adapter; `prompt` (its last tokens tell whether the text starts in reasoning) and `tools`
        (schema typing; default: the latest render's) make the parse exact when the caller has them."""
        self._call.context = (prompt, tools, enable_thinking)
        try:
            return super().parse_completion(tokens, stop_reason)
        finally:
            self._call.context = None

    def completion_parts(self, tokens: list[int]) -> tuple[CompletionParts, bool]:
        stops = set(self.stop_token_ids())
        cut = next((i for i, t in enumerate(tokens) if t in stops), None)
        text = str(self.tokenizer.decode(tokens[:cut] if cut is not None else tokens))
        prompt, tools, enable_thinking = getattr(self._call, "context", None) or (None, None, None)
        tools_for_parse = [_function_tool(t) for t in tools] if tools else self._last_tools
        try:
            parser = self.parser
            in_reasoning = self.starts_in_reasoning(prompt, enable_thinking)
            result = parser.parse(text, tools=tools_for_parse, in_reasoning=in_reasoning)
            parts = _parts_from_result(result)
        except Exception as exc:  # a parser bug or arguments JSON cannot hold: the text reaches the agent
            _log_parse_failure(exc)
            parts = CompletionParts(
                calls=[UnparsedToolCall(text, f"parser error: {type(exc).__name__}: {exc}")]
            )
        return parts, cut is not None

    def parse_response(self, response: list[int]) -> tuple[Message, bool]:
        parts, ok = self.completion_parts(list(response))
        content: list[dict[str, Any]] = []
        if parts.reasoning:
            content.append({"type": "thinking", "thinking": parts.reasoning})
        # Unparsed blocks stay where the model wrote them (they are listed in `unparsed_tool_calls` too).
        text = self._visible_content(parts, emitted=True)
        if text:
            content.append({"type": "text", "text": text})
        message: Message = {"role": "assistant", "content": content}
        if parts.tool_calls:
            message["tool_calls"] = parts.tool_calls
        if parts.unparsed:
            message["unparsed_tool_calls"] = parts.unparsed
        return message, ok


def _parts_from_result(result: Any) -> CompletionParts:
    if not isinstance(result, ParseResult):
        raise TypeError(f"the parser returned {type(result).__name__}, not a ParseResult")
    recovered = 0

    def convert(block: Any) -> Any:
        nonlocal recovered
        if isinstance(block, ParsedToolCall):
            encoded = dumps_arguments(block.arguments)  # NaN/Infinity raise: the whole text becomes unparsed
            recovered += int(bool(block.recovered))
            return ToolCall(FunctionBody(block.name, encoded), block.id, raw_text=block.raw_text)
        if isinstance(block, CallGroup):
            return CallGroup(block.open, [convert(item) for item in block.items], block.close)
        return block

    if result.segments is None:  # a user's parser: its unparsed blocks follow the content
        segments = [result.content or "", *result.tool_calls, *result.unparsed]
    else:
        segments = list(result.segments)
    parts = CompletionParts.from_segments(
        [convert(s) for s in segments], result.reasoning or "", strip_content=True
    )
    parts.recovered = recovered
    return parts


def _log_parse_failure(exc: BaseException) -> None:
    global _parse_failures
    _parse_failures += 1
    if _parse_failures <= 3 or _parse_failures % 1000 == 0:
        log.warning(
            "tool-call parser failed (%d so far); the text is kept as content", _parse_failures, exc_info=exc
        )
    else:
        log.debug("tool-call parser failed: %s", exc)


# --------------------------------------------------------------------------------------------------------------
# Message cleanup


def clean_messages(messages: Sequence[Mapping[str, Any] | Message]) -> list[dict[str, Any]]:
    """Messages as the template expects them: content parts joined into one string (thinking
    parts inline in `<think>` tags; image and video parts refused), tool calls as OpenAI dicts whose `arguments`
    is a mapping. Other keys (`reasoning_content`, `tool_call_id`, `name`, ...) pass through verbatim."""
    out: list[dict[str, Any]] = []
    for raw in messages:
        if not isinstance(raw, Mapping):
            raise RendererError(f"a message must be an object; got {raw!r}")
        message = {k: v for k, v in raw.items() if k != "unparsed_tool_calls"}
        message["content"] = _content_text(raw.get("content"))
        calls = raw.get("tool_calls")
        if calls:
            message["tool_calls"] = [_clean_tool_call(c) for c in calls]
        elif "tool_calls" in message:
            del message["tool_calls"]
        out.append(message)
    return out


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        raise RendererError(
            f"message content must be a string or a list of parts; got {type(content).__name__}"
        )
    pieces: list[str] = []
    for part in content:
        if isinstance(part, str):
            pieces.append(part)
            continue
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            pieces.append(str(part.get("text") or ""))
        elif kind == "thinking":
            pieces.append(f"<think>{part.get('thinking') or ''}</think>")
        elif kind == "refusal":
            pieces.append(str(part.get("refusal") or ""))
        elif kind in ("image", "image_url", "input_image", "video", "video_url"):
            raise RendererError(
                "the chat_template renderer renders text only; image and video parts are refused"
            )
        else:
            raise RendererError(f"unsupported content part {kind!r}")
    return "".join(pieces)


def _clean_tool_call(call: Any) -> dict[str, Any]:
    """A tool call (OpenAI nested, flat, or an object) as an OpenAI dict with mapping arguments."""
    if isinstance(call, Mapping):
        function = call.get("function")
        body: Any = function if isinstance(function, Mapping) else call
        name, arguments, call_id = body.get("name"), body.get("arguments"), call.get("id")
    else:
        body = getattr(call, "function", None) or call
        name, arguments, call_id = (
            getattr(body, "name", None),
            getattr(body, "arguments", None),
            getattr(call, "id", None),
        )
    if not isinstance(name, str) or not name:
        raise RendererError(f"a tool call needs a function name; got {call!r}")
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    elif isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            raise RendererError(f"tool call {name!r}: arguments are not JSON: {exc}") from exc
    if not isinstance(arguments, Mapping):
        raise RendererError(
            f"tool call {name!r}: arguments must be a JSON object; got {type(arguments).__name__}"
        )
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": dict(arguments)}}
    if call_id is not None:
        out["id"] = str(call_id)
    return out


def _function_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI function tool (`{"type": "function", "function": {...}}`) from itself or a bare function."""
    if not isinstance(tool, Mapping):
        raise RendererError(f"a tool must be an object; got {tool!r}")
    function = tool.get("function")
    body = function if isinstance(function, Mapping) else tool
    if not isinstance(body.get("name"), str):
        raise RendererError(f"a tool needs a function name; got {tool!r}")
    return {"type": "function", "function": dict(body)}


def _generation_config_eos(name: str) -> list[int]:
    """`eos_token_id` from the model's generation_config.json: the local directory, else the HF cache."""
    config: Any = None
    if name and os.path.isdir(name):
        path = os.path.join(name, "generation_config.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                config = json.load(handle)
    elif name:
        try:
            from transformers import GenerationConfig

            config = GenerationConfig.from_pretrained(name, local_files_only=True).to_dict()
        except Exception:  # no cached generation_config: the tokenizer's eos is the fallback
            config = None
    eos = config.get("eos_token_id") if isinstance(config, Mapping) else None
    if isinstance(eos, int) and not isinstance(eos, bool):
        return [eos]
    if isinstance(eos, list):
        return [int(t) for t in eos if isinstance(t, int)]
    return []


# --------------------------------------------------------------------------------------------------------------
# Preset aliases


class Qwen36PreserveThinkingRenderer(ChatTemplateRenderer):
    """`qwen3_6_preserve_thinking`: the chat template with `preserve_thinking` on."""

    def __init__(self, tokenizer: Tokenizer, image_processor: Any = None) -> None:
        super().__init__(tokenizer, image_processor)
        self.preserve_thinking = True


class Qwen36PreserveThinkingDisableThinkingRenderer(Qwen36PreserveThinkingRenderer):
    """`qwen3_6_preserve_thinking_disable_thinking`: `preserve_thinking` on, `enable_thinking` off."""

    def __init__(self, tokenizer: Tokenizer, image_processor: Any = None) -> None:
        super().__init__(tokenizer, image_processor)
        self.enable_thinking = False


class Qwen38PreserveThinkingRenderer(Qwen36PreserveThinkingRenderer):
    """`qwen3_8_preserve_thinking`: `preserve_thinking` on, `reasoning_effort: xhigh`."""

    def __init__(self, tokenizer: Tokenizer, image_processor: Any = None) -> None:
        super().__init__(tokenizer, image_processor)
        self.reasoning_effort = "xhigh"


class Qwen38PreserveThinkingDisableThinkingRenderer(Qwen38PreserveThinkingRenderer):
    """`qwen3_8_preserve_thinking_disable_thinking`: as `qwen3_8_preserve_thinking`, with `enable_thinking` off."""

    def __init__(self, tokenizer: Tokenizer, image_processor: Any = None) -> None:
        super().__init__(tokenizer, image_processor)
        self.enable_thinking = False
