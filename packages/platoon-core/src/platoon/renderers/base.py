"""The renderer base class, message types and renderer registry shared by every renderer family.

A renderer turns chat messages into prompt tokens, parses sampled tokens back into a message, and offers the
gateway-facing adapter (`render_prompt`, `stop_token_ids`, `parse_completion`) on top. Imports nothing heavy.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import itertools
import json
import logging
import re
import secrets
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from platoon.errors import ConfigError
from platoon.renderers.memo import RENDER_MEMO, RenderMemo, content_key, register_key_type
from platoon.renderers.tokenizers import encode_long

if TYPE_CHECKING:
    import tinker

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------------------
# Message types: the cookbook's message form, as plain dicts plus two small tool-call classes


class Tokenizer(Protocol):
    """What a renderer needs from a tokenizer (a `transformers` tokenizer or platoon's `tokenizers` adapter)."""

    name_or_path: str

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Any, *args: Any, **kwargs: Any) -> str: ...


#: A message: `{"role", "content": str | list[part], "tool_calls"?: [ToolCall], "unparsed_tool_calls"?: [...],
#: "tool_call_id"?, "name"?, "trainable"?}`; a part is `{"type": "text", "text"}` or `{"type": "thinking",
#: "thinking"}`. Plain dicts, as in tinker-cookbook, so the golden `messages` load as they are.
Message = dict[str, Any]
ContentPart = dict[str, Any]
#: A tool definition: `{"name", "description", "parameters"}` (the `function` body of an OpenAI tool).
ToolSpec = dict[str, Any]


class RendererError(ValueError):
    """A message or a response the renderer cannot handle (the cookbook's `RendererError`)."""


@dataclass(frozen=True)
class FunctionBody:
    """A tool call's function: its name and its arguments as a JSON string."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCall:
    """A parsed or given tool call (the cookbook's `ToolCall`): `function.name`, `function.arguments` (JSON text).

    `raw_text` is the sampled block it was parsed from (not part of equality or `to_dict`), so a call that is not
    emitted can be shown to the harness as the text the model wrote.
    """

    function: FunctionBody
    id: str | None = None
    type: str = "function"
    raw_text: str | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "id": self.id,
            "function": {"name": self.function.name, "arguments": self.function.arguments},
        }

    @classmethod
    def from_obj(cls, value: Any) -> ToolCall:
        """A `ToolCall` from itself, an OpenAI/cookbook dict (nested or flat), or an object with `.function`."""
        if isinstance(value, ToolCall):
            return value
        if isinstance(value, Mapping):
            function = value.get("function")
            body = function if isinstance(function, Mapping) else value
            name, arguments, call_id = body.get("name"), body.get("arguments"), value.get("id")
        else:
            body = getattr(value, "function", None) or value
            name, arguments = getattr(body, "name", None), getattr(body, "arguments", None)
            call_id = getattr(value, "id", None)
        if not isinstance(name, str):
            raise RendererError(f"a tool call needs a function name; got {value!r}")
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        return cls(FunctionBody(name, arguments), None if call_id is None else str(call_id))


@dataclass(frozen=True)
class UnparsedToolCall:
    """A tool-call block that did not parse: the raw text (tags included) and why."""

    raw_text: str
    error: str

    def to_dict(self) -> dict[str, Any]:
        return {"raw_text": self.raw_text, "error": self.error}


# Renders are memoized by content (platoon.renderers.memo): the call classes are written field by field, the raw
# text included, although it is not part of their equality.
register_key_type(FunctionBody, lambda body: (content_key(body.name), content_key(body.arguments)))
register_key_type(
    ToolCall,
    lambda call: tuple(content_key(v) for v in (call.function, call.id, call.type, call.raw_text)),
)
register_key_type(UnparsedToolCall, lambda call: (content_key(call.raw_text), content_key(call.error)))


def message_to_jsonable(message: Message) -> dict[str, Any]:
    """A message with its tool-call objects as dicts (the golden files' `parsed` form)."""
    out = dict(message)
    for key in ("tool_calls", "unparsed_tool_calls"):
        if key in out:
            out[key] = [c.to_dict() if hasattr(c, "to_dict") else c for c in out[key]]
    return out


def remove_thinking(parts: list[ContentPart]) -> list[ContentPart]:
    return [p for p in parts if p["type"] != "thinking"]


def has_thinking(content: str | list[ContentPart]) -> bool:
    if isinstance(content, str):
        return "<think>" in content
    return any(p["type"] == "thinking" for p in content)


# --------------------------------------------------------------------------------------------------------------
# Rendering structure


@dataclass(frozen=True)
class RenderedMessage:
    """One message as token chunks: `header` (role markup, never trained), `output` (what the model writes),
    `stop_overlap` (role-colon style stops that span into the next header; appended only for the last message)."""

    output: list[list[int]]
    header: list[int] | None = None
    stop_overlap: list[int] | None = None


@dataclass(frozen=True)
class RenderContext:
    """Where a message sits in the conversation being rendered."""

    idx: int
    is_last: bool
    prev_message: Message | None = None
    last_user_index: int = -1


class TrainOnWhat(StrEnum):
    """Which tokens of a supervised example get weight 1 (the cookbook's modes)."""

    LAST_ASSISTANT_MESSAGE = "last_assistant_message"
    LAST_ASSISTANT_TURN = "last_assistant_turn"
    ALL_ASSISTANT_MESSAGES = "all_assistant_messages"
    ALL_MESSAGES = "all_messages"
    ALL_TOKENS = "all_tokens"
    ALL_USER_AND_SYSTEM_MESSAGES = "all_user_and_system_messages"
    CUSTOMIZED = "customized"


# --------------------------------------------------------------------------------------------------------------
# The gateway adapter's result


@dataclass
class ParsedCompletion:
    """One sampled sequence parsed for an OpenAI-compatible caller.

    `message` is an OpenAI assistant message: `role`, `content` (str: the sampled text with the reasoning and the
    emitted tool blocks taken out; a tool block that was not emitted, unparsed or withheld, stays where the model
    wrote it, as written), `tool_calls` (OpenAI dicts with JSON-string arguments and ids, or None),
    `reasoning_content` (None when empty). `ok`: a stop token was sampled. `unemitted_content` is the content as
    it reads when none of the calls is emitted (what a caller that withholds the calls shows instead).
    """

    message: dict[str, Any]
    ok: bool
    finish_reason: str
    parsed_tool_calls: int = 0
    emitted_tool_calls: int = 0
    recovered_tool_calls: int = 0
    unparsed_tool_calls: int = 0
    unemitted_content: str | None = None


@dataclass
class CompletionParts:
    """A renderer's reading of a completion before the emit rules: the input to `parse_completion`'s assembly.

    `content` is the visible text (tool blocks removed); `calls` the tool blocks, parsed (`ToolCall`, with its
    `raw_text`) or not (`UnparsedToolCall`); `recovered` how many calls needed a lenient parse. `segments`, when
    the renderer gives them, is the text after the reasoning in the order it was written: visible text (str), tool
    blocks and `CallGroup`s; `parse_completion` builds the agent's content from them so that a block that is not
    emitted stays in place (`strip_content`: the visible text is stripped at both ends, never a block's text).
    Without segments the text of blocks that are not emitted is appended to `content`.
    """

    content: str = ""
    reasoning: str = ""
    #: parsed and unparsed tool blocks, in the order they were written
    calls: list[ToolCall | UnparsedToolCall] = field(default_factory=list)
    recovered: int = 0
    segments: list[Segment] | None = None
    strip_content: bool = False

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [c for c in self.calls if isinstance(c, ToolCall)]

    @property
    def unparsed(self) -> list[UnparsedToolCall]:
        return [c for c in self.calls if isinstance(c, UnparsedToolCall)]

    @classmethod
    def from_segments(
        cls, segments: list[Segment], reasoning: str = "", *, strip_content: bool = False
    ) -> CompletionParts:
        """Parts whose content (the visible text, blocks out) and calls (in order) are read off the segments."""
        calls = [c for c in iter_blocks(segments) if isinstance(c, ToolCall | UnparsedToolCall)]
        content = segments_text(segments)
        return cls(
            content.strip() if strip_content else content,
            reasoning,
            calls,
            segments=segments,
            strip_content=strip_content,
        )


# --------------------------------------------------------------------------------------------------------------
# Segments: the sampled text in order, so that blocks that are not emitted reach the agent where they were written


@dataclass(frozen=True)
class Text:
    """Text the model wrote inside a `CallGroup` that is not the format's markup: shown whatever is emitted."""

    text: str


@dataclass
class CallGroup:
    """Tool blocks written inside one piece of format markup (a calls section, a Python list, `<|python_tag|>`s).

    `open`/`close` are the group's markup and `items` its blocks in order, with the markup between them (str) and
    any stray text (`Text`). Nothing emitted: the group is shown as written. Every call emitted: only its stray
    text is shown. Otherwise the blocks that were not emitted are shown inside the group's markup, each followed
    by the markup that followed it.
    """

    open: str
    items: list[Any]
    close: str = ""


#: a piece of the sampled text: visible text, a tool block (parsed or not), or a group of blocks
Segment = Any


def iter_blocks(segments: Sequence[Segment]) -> list[Any]:
    """The tool blocks and stray `Text`s of the segments, groups flattened, in order."""
    out: list[Any] = []
    for segment in segments:
        if isinstance(segment, CallGroup):
            out.extend(item for item in segment.items if not isinstance(item, str))
        elif not isinstance(segment, str):
            out.append(segment)
    return out


def group_items(text: str, blocks: Sequence[tuple[int, int, Any]]) -> list[Any]:
    """The items of a `CallGroup` over `text`: each block (start, end, block) in order, the whitespace between
    blocks as markup, and any other text between them as stray `Text`."""
    items: list[Any] = []
    pos = 0
    for start, end, block in [*blocks, (len(text), len(text), None)]:
        between = text[pos:start]
        if between:
            items.append(between if not between.strip() else Text(between))
        if block is not None:
            items.append(block)
        pos = end
    return items


def segments_text(segments: Sequence[Segment]) -> str:
    """The visible text of the segments with every block taken out (stray text inside groups kept)."""
    out: list[str] = []
    for segment in segments:
        if isinstance(segment, str):
            out.append(segment)
        elif isinstance(segment, Text):
            out.append(segment.text)
        elif isinstance(segment, CallGroup):
            out.extend(item.text for item in segment.items if isinstance(item, Text))
    return "".join(out)


def assemble_text(
    segments: Sequence[Segment],
    emitted: Callable[[Any], bool],
    block_text: Callable[[Any], str],
    *,
    strip: bool = False,
) -> str:
    """The text the agent sees: the segments with the emitted blocks taken out, every other block as written and
    in place. `strip` strips the visible text at both ends but never into a block's own text. Linear time."""
    pieces: list[tuple[str, bool]] = []  # (text, written by a block: never stripped)
    for segment in segments:
        if isinstance(segment, str):
            pieces.append((segment, False))
        elif isinstance(segment, Text):
            pieces.append((segment.text, False))
        elif isinstance(segment, CallGroup):
            pieces.extend(_group_pieces(segment, emitted, block_text))
        elif not emitted(segment):
            pieces.append((block_text(segment), True))
    if strip:
        pieces = _strip_pieces(pieces)
    return "".join(text for text, _ in pieces)


def _group_pieces(
    group: CallGroup, emitted: Callable[[Any], bool], block_text: Callable[[Any], str]
) -> list[tuple[str, bool]]:
    def text_of(item: Any) -> str:
        return item if isinstance(item, str) else item.text if isinstance(item, Text) else block_text(item)

    blocks = [i for i, item in enumerate(group.items) if not isinstance(item, str)]
    gone = {i for i in blocks if not isinstance(group.items[i], Text) and emitted(group.items[i])}
    if not gone:  # nothing emitted: the group exactly as written
        return [(group.open + "".join(text_of(item) for item in group.items) + group.close, True)]
    kept = [i for i in blocks if i not in gone]
    if all(isinstance(group.items[i], Text) for i in kept):  # every call emitted: only the stray text stays
        return [(group.items[i].text, False) for i in kept]

    def markup(start: int, stop: int) -> str:
        return "".join(item for item in group.items[start:stop] if isinstance(item, str))

    # Some calls emitted: the rest inside the group's markup, each followed by the markup that followed it.
    bounds = [*blocks, len(group.items)]
    after = {i: markup(i + 1, bounds[n + 1]) for n, i in enumerate(blocks)}
    out = group.open + markup(0, blocks[0])
    for n, i in enumerate(kept):
        out += text_of(group.items[i]) + (after[i] if n + 1 < len(kept) else "")
    out += markup(blocks[-1] + 1, len(group.items)) + group.close
    return [(out, True)]


def _strip_pieces(pieces: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Strip whitespace off the visible text at both ends; a block's text stops the stripping."""
    pieces = list(pieces)
    for index in range(len(pieces)):
        text, written = pieces[index]
        if written:
            break
        pieces[index] = (text.lstrip(), False)
        if pieces[index][0]:
            break
    for index in range(len(pieces) - 1, -1, -1):
        text, written = pieces[index]
        if written:
            break
        pieces[index] = (text.rstrip(), False)
        if pieces[index][0]:
            break
    return pieces


def mint_tool_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


# --------------------------------------------------------------------------------------------------------------
# Tool-call block parsing shared by the `<tool_call>{json}</tool_call>` families


def parse_tool_call_json(payload: str, raw_text: str) -> ToolCall | UnparsedToolCall:
    """A `{"name", "arguments": {...}, "id"?}` payload as a `ToolCall`, else an `UnparsedToolCall` saying why."""
    try:
        value = json.loads(payload.strip())
    except (json.JSONDecodeError, RecursionError) as exc:
        return UnparsedToolCall(raw_text, f"Invalid JSON: {exc}")
    if not isinstance(value, dict):
        return UnparsedToolCall(raw_text, "Tool call is not a JSON object")
    name, arguments, call_id = value.get("name"), value.get("arguments"), value.get("id")
    if not isinstance(name, str):
        return UnparsedToolCall(raw_text, "Missing or invalid 'name' field")
    if not isinstance(arguments, dict):
        return UnparsedToolCall(raw_text, "Missing or invalid 'arguments' field")
    try:
        encoded = json.dumps(arguments)
    except ValueError as exc:  # e.g. nesting too deep to encode again
        return UnparsedToolCall(raw_text, f"Invalid JSON: {exc}")
    return ToolCall(
        FunctionBody(name, encoded), call_id if isinstance(call_id, str) else None, raw_text=raw_text
    )


BLOCK_PATTERN = re.compile(r"<think>(.*?)</think>|<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_content_blocks(
    content: str,
) -> tuple[list[ContentPart], list[ToolCall | UnparsedToolCall]] | None:
    """Split text with `<think>` and `<tool_call>` blocks into parts and tool calls (None when there are none).

    Text outside blocks is kept verbatim (empty pieces dropped), so parse then render is the identity.
    """
    if "<think>" not in content and "<tool_call>" not in content:
        return None
    parts: list[ContentPart] = []
    calls: list[ToolCall | UnparsedToolCall] = []
    pos = 0
    for match in BLOCK_PATTERN.finditer(content):
        if match.start() > pos:
            parts.append({"type": "text", "text": content[pos : match.start()]})
        if match.group(1) is not None:
            if match.group(1):
                parts.append({"type": "thinking", "thinking": match.group(1)})
        else:
            calls.append(parse_tool_call_json(match.group(2), match.group(0)))
        pos = match.end()
    if pos < len(content):
        parts.append({"type": "text", "text": content[pos:]})
    return parts, calls


def parse_response_for_stop_token(
    response: Sequence[int], tokenizer: Tokenizer, stop_token: int
) -> tuple[Message, bool]:
    """Decode up to the single stop token: (message with string content, whether the stop token was there).

    More than one stop token means the sampler was given the wrong stops, as in the cookbook: a `RendererError`.
    """
    tokens = list(response)
    count = tokens.count(stop_token)
    if count == 0:
        return {"role": "assistant", "content": str(tokenizer.decode(tokens))}, False
    if count == 1:
        return {
            "role": "assistant",
            "content": str(tokenizer.decode(tokens[: tokens.index(stop_token)])),
        }, True
    raise RendererError(
        f"When parsing response, expected to split into 1 or 2 pieces using stop tokens, but got {count}. "
        "You probably are using the wrong stop tokens when sampling"
    )


def attach_tool_calls(message: Message, calls: Sequence[ToolCall | UnparsedToolCall]) -> None:
    """Put the parsed calls on `message` as `tool_calls` and the unparsable ones as `unparsed_tool_calls`, each key
    only when it has any."""
    tool_calls = [c for c in calls if isinstance(c, ToolCall)]
    unparsed = [c for c in calls if isinstance(c, UnparsedToolCall)]
    if tool_calls:
        message["tool_calls"] = tool_calls
    if unparsed:
        message["unparsed_tool_calls"] = unparsed


# --------------------------------------------------------------------------------------------------------------
# The base class


#: how many texts a renderer keeps the encoding of, and the longest text it keeps
_ENCODE_CACHE_ENTRIES = 16384
_ENCODE_CACHE_TEXT_LIMIT = 8192
#: tokenizer -> its encodings of short texts (weak: a table lives as long as its tokenizer)
_ENCODINGS: weakref.WeakKeyDictionary[Any, dict[str, tuple[int, ...]]] = weakref.WeakKeyDictionary()


def _encodings(tokenizer: Any) -> dict[str, tuple[int, ...]] | None:
    """The tokenizer's table of encoded texts; None for a tokenizer that cannot be weakly referenced or hashed."""
    try:
        table = _ENCODINGS.get(tokenizer)
        if table is None:
            table = _ENCODINGS[tokenizer] = {}
    except TypeError:
        return None
    return table


class Renderer(ABC):
    """The common base of platoon's renderers; subclasses reproduce one tinker-cookbook renderer token for token.

    A subclass implements `render_message`, `get_stop_sequences` and `parse_response`, and usually
    `create_conversation_prefix_with_tools`; `build_generation_prompt` and `build_supervised_example` concatenate
    the rendered messages and work for every family whose prompt is such a concatenation.

    The gateway adapter, which the gateway codes against and which every renderer offers through this class:

    - `render_prompt(openai_messages, tools=None) -> list[int]`: OpenAI Chat Completions messages (and OpenAI
      function tools) to the generation prompt's token ids.
    - `stop_token_ids() -> list[int]`: the token ids that end a turn.
    - `parse_completion(tokens, stop_reason) -> ParsedCompletion`: sampled ids to an OpenAI assistant message;
      it never raises on what the model wrote.

    Families override `to_renderer_messages`, `tool_specs_from_openai` or `completion_parts` when their message
    form or output format needs it.
    """

    #: the registry name it was built under (set by `get_renderer`)
    name: str | None = None
    #: whether `parse_response_streaming` exists (kept for parity with the cookbook's attribute)
    supports_streaming: bool = False
    #: whether the gateway reuses the exact tokens of an agent's earlier calls in its next prompt (token-in
    #: history, platoon.gateway.history); `renderer_kwargs: {token_in_history: false}` renders every prompt whole
    token_in_history: bool = True
    #: whether `generation_prompt_chunks` may reuse a message's render from the active `RenderMemo` (the gateway
    #: keeps one per agent; platoon.renderers.memo): true for a family whose `render_message` depends only on the
    #: message, its `RenderContext` and the renderer's attributes, and has no effect other than its result
    memoize_renders: bool = False

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        # Renders memoized under the earlier settings no longer hold (`_memo_renders` compares the version).
        self.__dict__["_settings_version"] = self.__dict__.get("_settings_version", 0) + 1

    # ---- what a family implements --------------------------------------------------------------------------

    @property
    def has_extension_property(self) -> bool:
        """Whether each successive generation prompt extends the previous prompt plus its completion."""
        return False

    @property
    def _bos_tokens(self) -> list[int]:
        return []

    @abstractmethod
    def get_stop_sequences(self) -> list[int] | list[str]:
        """The stop token ids (or stop strings for text-stop families) for sampling."""

    @abstractmethod
    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        """One message as header/output/stop-overlap token chunks."""

    @abstractmethod
    def parse_response(self, response: list[int]) -> tuple[Message, bool]:
        """Sampled ids to an assistant message and whether the response ended on a stop token."""

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """The messages that declare `tools` (and carry `system_prompt`), to put before the conversation."""
        raise NotImplementedError(f"the {type(self).__name__} renderer has no tool declaration")

    # ---- control tokens and the start of parsing, shared by the families that end a turn on one token --------

    @property
    def _end_message_token(self) -> int:
        """The one token that ends a turn (and stops sampling), for a family whose turns end on one token."""
        raise NotImplementedError(f"the {type(self).__name__} renderer ends its turns on no single token")

    def _single_token(self, text: str) -> int:
        """The id of a control string the family needs to be one token in this tokenizer."""
        # Asked several times on every call (stops, parsing, token-in history): kept per settings version, in the
        # instance dict directly (a version bump must not follow from the cache itself).
        version = self.__dict__.get("_settings_version", 0)
        known: tuple[int, dict[str, int]] | None = self.__dict__.get("_single_tokens")
        if known is None or known[0] != version:
            known = self.__dict__["_single_tokens"] = (version, {})
        token = known[1].get(text)
        if token is None:
            token = known[1][text] = self._only_token(text, self._encode(text))
        return token

    def _only_token(self, text: str, tokens: list[int]) -> int:
        if len(tokens) != 1:
            raise RendererError(
                f"the {self.name or type(self).__name__} renderer needs {text} to be one token in "
                f"{self.tokenizer.name_or_path!r}; it encodes to {tokens}"
            )
        return tokens[0]

    def _normalize_response_tokens(self, response: list[int]) -> list[int]:
        """The sampled ids as the family parses them (a family that prefills `<think>` puts it back here)."""
        return response

    def _parse_to_end_of_message(self, response: list[int]) -> tuple[Message, bool]:
        """The sampled ids, normalized, decoded up to the end-of-turn token: (a message with text content, whether
        that token ended the turn)."""
        tokens = self._normalize_response_tokens(list(response))
        return parse_response_for_stop_token(tokens, self.tokenizer, self._end_message_token)

    # ---- prompts and supervised examples -------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        # A conversation re-renders its earlier messages on every call, and a text always encodes the same way:
        # the encodings of short texts are kept (a bounded table, emptied when full). The table is the tokenizer's,
        # shared by every renderer over it: a renderer per episode (platoon.testing) starts warm.
        if len(text) > _ENCODE_CACHE_TEXT_LIMIT:
            # Long texts are tokenized with the GIL released: a large prompt renders in a thread of the gateway.
            return encode_long(self.tokenizer, text)
        cache = _encodings(self.tokenizer)
        if cache is None:
            cache = self.__dict__.setdefault("_encoded", {})
        tokens = cache.get(text)
        if tokens is None:
            tokens = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            if len(cache) >= _ENCODE_CACHE_ENTRIES:
                cache.clear()
            cache[text] = tokens
        return list(tokens)

    def _get_generation_suffix(self, role: str, ctx: RenderContext) -> list[int]:
        """The tokens that open the turn to be generated: the header of an empty message of `role`."""
        rendered = self.render_message({"role": role, "content": ""}, ctx)
        return list(rendered.header) if rendered.header else []

    def generation_prompt_chunks(
        self, messages: Sequence[Message], role: str = "assistant", prefill: str | None = None
    ) -> list[list[int]]:
        """The generation prompt as token chunks (the chunks of `build_generation_prompt`'s ModelInput)."""
        return [list(piece) for piece in self._prompt_pieces(messages, role, prefill)]

    def _prompt_pieces(
        self, messages: Sequence[Message], role: str = "assistant", prefill: str | None = None
    ) -> list[Sequence[int]]:
        """`generation_prompt_chunks` with the memo's own tuples in it, not copied: for callers that only read
        them (`render_prompt` joins them into one list, and a copy of each first would double its work)."""
        messages = list(messages)
        chunks: list[Sequence[int]] = []
        if self._bos_tokens:
            chunks.append(self._bos_tokens)
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
        memo = self._active_memo()
        turn_only = memo is not None and self._turn_memo()
        render_id: int | None = None
        last = len(messages) - 1
        for idx, message in enumerate(messages):
            memoized = None
            if memo is not None:
                # A render is keyed on everything its context holds, the message before by its render id (None
                # before the first message; a message before without one leaves this render uncached too), or on
                # the little of it the family reads (`_turn_memo`).
                previous, render_id = render_id, memo.render_id(message)
                entry: tuple[Any, ...] | None = None
                if render_id is not None and turn_only:
                    entry = (render_id, idx > 0, idx == last and message["role"] == "assistant")
                elif render_id is not None and (previous is not None or not idx):
                    entry = (render_id, previous, idx, idx == last, last_user)
                if entry is not None:
                    memoized = memo.renders.get(entry)
                    if memoized is None:
                        rendered = self.render_message(message, self._context(messages, idx, last_user))
                        memoized = memo.renders[entry] = (
                            tuple(rendered.header or ()),
                            tuple(tuple(chunk) for chunk in rendered.output if chunk),
                        )
            if memoized is not None:
                header, output = memoized
                if header:
                    chunks.append(header)
                chunks.extend(output)  # the memo keeps only non-empty chunks
                continue
            rendered = self.render_message(message, self._context(messages, idx, last_user))
            if rendered.header:
                chunks.append(rendered.header)
            # Empty chunks are dropped: the service answers 400 to an empty encoded-text chunk.
            chunks.extend(chunk for chunk in rendered.output if chunk)
        suffix_ctx = RenderContext(len(messages), True, messages[-1] if messages else None, last_user)
        suffix: Sequence[int]
        if (
            memo is None
            or (render_id is None and not turn_only)
            or type(self)._get_generation_suffix is not Renderer._get_generation_suffix
        ):
            suffix = self._get_generation_suffix(role, suffix_ctx)
        else:
            # The suffix is the header of an empty message of `role` after the last one: keyed as its render is.
            opening = (role, bool(messages)) if turn_only else (role, render_id, len(messages), last_user)
            known = memo.suffixes.get(opening)
            if known is None:
                known = memo.suffixes[opening] = tuple(self._get_generation_suffix(role, suffix_ctx))
            suffix = known
        if suffix:
            chunks.append(suffix)
        if prefill:
            chunks.append(self._encode(prefill))
        return chunks

    def _turn_memo(self) -> bool:
        """Whether `render_message` reads of its context only whether the message is the first and, for an
        assistant message, whether it is the last (and the generation suffix only the role and whether a message
        precedes it). Its renders are then memoized on those alone: a message keeps its render as the conversation
        grows past it, and the suffix is rendered once. A family says so of the methods it wrote, never of a
        subclass's overrides (those are keyed on the whole context)."""
        return False

    @staticmethod
    def _context(messages: Sequence[Message], idx: int, last_user: int) -> RenderContext:
        return RenderContext(idx, idx == len(messages) - 1, messages[idx - 1] if idx else None, last_user)

    def _active_memo(self) -> RenderMemo | None:
        """The memo of the conversation being rendered, holding this renderer's renders at its current settings;
        None when nothing is memoized."""
        if not self.memoize_renders:
            return None
        memo = RENDER_MEMO.get()
        if memo is not None:
            memo.bind(self, self.__dict__.get("_settings_version", 0))
        return memo

    def build_generation_prompt(
        self, messages: Sequence[Message], role: str = "assistant", prefill: str | None = None
    ) -> tinker.ModelInput:
        """The prompt to sample the next `role` turn from, as a Tinker `ModelInput` (one chunk per piece)."""
        import tinker

        return tinker.ModelInput(
            chunks=[
                tinker.EncodedTextChunk(tokens=chunk)
                for chunk in self.generation_prompt_chunks(messages, role, prefill)
            ]
        )

    def supervised_chunks(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    ) -> list[tuple[list[int], int]]:
        """The supervised example as (token chunk, weight) pairs, in the cookbook's weighting."""
        messages = list(messages)
        mode = TrainOnWhat(train_on_what)
        if mode == TrainOnWhat.ALL_ASSISTANT_MESSAGES and not self.has_extension_property:
            log.warning(
                "train_on_what=all_assistant_messages with a renderer without the extension property: earlier "
                "assistant messages see a different prefix than their generation prompt had"
            )
        pieces: list[tuple[list[int], int]] = []
        if self._bos_tokens:
            pieces.append((list(self._bos_tokens), 0))
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
        for idx, message in enumerate(messages):
            if mode == TrainOnWhat.CUSTOMIZED:
                if "trainable" not in message:
                    raise RendererError("train_on_what=customized needs a 'trainable' field on every message")
            elif "trainable" in message:
                raise RendererError("a 'trainable' field needs train_on_what=customized")
            is_last = idx == len(messages) - 1
            is_assistant = message["role"] == "assistant"
            ctx = RenderContext(idx, is_last, messages[idx - 1] if idx else None, last_user)
            rendered = self.render_message(message, ctx)
            if rendered.header:
                pieces.append((list(rendered.header), int(mode == TrainOnWhat.ALL_TOKENS)))
            weight = {
                TrainOnWhat.LAST_ASSISTANT_MESSAGE: is_last and is_assistant,
                TrainOnWhat.LAST_ASSISTANT_TURN: is_assistant and (last_user == -1 or idx > last_user),
                TrainOnWhat.ALL_ASSISTANT_MESSAGES: is_assistant,
                TrainOnWhat.ALL_MESSAGES: True,
                TrainOnWhat.ALL_TOKENS: True,
                TrainOnWhat.ALL_USER_AND_SYSTEM_MESSAGES: message["role"] in ("user", "system"),
                TrainOnWhat.CUSTOMIZED: bool(message.get("trainable", False)),
            }[mode]
            pieces.extend((list(chunk), int(weight)) for chunk in rendered.output if chunk)
            if is_last and rendered.stop_overlap:
                pieces.append((list(rendered.stop_overlap), int(weight)))
        return pieces

    def build_supervised_example(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    ) -> tuple[tinker.ModelInput, list[float]]:
        """The conversation as a Tinker `ModelInput` and one weight per token (1.0 where the loss applies).

        The cookbook returns a torch tensor of weights; platoon returns a list so no torch is needed.
        """
        import tinker

        pieces = self.supervised_chunks(messages, train_on_what)
        model_input = tinker.ModelInput(chunks=[tinker.EncodedTextChunk(tokens=c) for c, _ in pieces])
        return model_input, [float(w) for chunk, w in pieces for _ in chunk]

    # ---- the gateway adapter -------------------------------------------------------------------------------

    def stop_token_ids(self) -> list[int]:
        """The token ids that end a sampled turn (the renderer's integer stop sequences)."""
        return [s for s in self.get_stop_sequences() if isinstance(s, int)]

    def tool_specs_from_openai(self, tools: Sequence[Mapping[str, Any]]) -> list[ToolSpec]:
        """OpenAI function tools (`{"type": "function", "function": {...}}`, or the bare function) as tool specs.

        A spec is exactly `{"name", "description", "parameters"}` (the cookbook's `ToolSpec`): a missing
        description is "", missing parameters are an empty object schema, other keys (`strict`) are dropped.
        """
        specs: list[ToolSpec] = []
        for tool in tools:
            function = tool.get("function") if isinstance(tool, Mapping) else None
            body = function if isinstance(function, Mapping) else tool
            if not isinstance(body, Mapping) or not isinstance(body.get("name"), str):
                raise RendererError(f"a tool needs a function name; got {tool!r}")
            parameters = body.get("parameters")
            specs.append(
                {
                    "name": body["name"],
                    "description": body.get("description") or "",
                    "parameters": dict(parameters) if parameters else {"type": "object", "properties": {}},
                }
            )
        return specs

    def to_renderer_messages(self, openai_messages: Sequence[Mapping[str, Any]]) -> list[Message]:
        """OpenAI Chat Completions messages in this renderer's message form.

        None content becomes ""; text content parts are kept as text parts; an assistant's `reasoning_content`
        becomes a thinking part followed by the content as a text part (when not empty); tool-call dicts
        (JSON-string arguments) become `ToolCall`s; empty tool-call lists are dropped; a tool message keeps its
        `tool_call_id` and `name`. OpenAI's `developer` role is the system role.
        """
        return [self._to_renderer_message(raw) for raw in openai_messages]

    def _to_renderer_message(self, raw: Any) -> Message:
        """One OpenAI message in this renderer's message form (`to_renderer_messages`), from it alone: a render
        memo converts each message content once."""
        if not isinstance(raw, Mapping):
            raise RendererError(f"a message must be an object; got {raw!r}")
        role = raw.get("role")
        if not isinstance(role, str):
            raise RendererError(f"a message needs a role; got {raw!r}")
        if role == "developer":
            role = "system"
        content = _content_from_openai(raw.get("content"))
        message: Message = {"role": role, "content": content}
        reasoning = raw.get("reasoning_content")
        if reasoning is None:
            reasoning = raw.get("reasoning")  # the newer OpenAI-compatible spelling
        if role == "assistant" and isinstance(reasoning, str) and reasoning:
            parts: list[ContentPart] = [{"type": "thinking", "thinking": reasoning}]
            if isinstance(content, str):
                if content:
                    parts.append({"type": "text", "text": content})
            else:
                parts.extend(content)
            message["content"] = parts
        tool_calls = raw.get("tool_calls")
        if tool_calls:
            message["tool_calls"] = [ToolCall.from_obj(call) for call in tool_calls]
        if role == "tool":
            for key in ("tool_call_id", "name"):
                value = raw.get(key)
                if value is not None:
                    # A render memo keeps the message for later calls: a value the caller could change is copied.
                    message[key] = value if isinstance(value, str) else copy.deepcopy(value)
        return message

    def apply_tools(
        self, messages: list[Message], tools: Sequence[Mapping[str, Any]] | None
    ) -> list[Message]:
        """Fold `tools` into the conversation by this renderer's tools-prefix rule.

        A leading system message's content becomes the system prompt of the tool prefix. A renderer without a
        tool declaration renders the conversation without the tools (logged).
        """
        if not tools:
            return messages
        specs = self.tool_specs_from_openai(tools)
        system_prompt, rest = "", messages
        if messages and messages[0]["role"] == "system":
            system_prompt = _text_of(messages[0]["content"])
            rest = messages[1:]
        try:
            prefix = self.create_conversation_prefix_with_tools(specs, system_prompt)
        except NotImplementedError as exc:
            log.warning("tools not rendered: %s", exc)
            return messages
        return [*prefix, *rest]

    def render_prompt(
        self, openai_messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """The generation prompt's token ids for OpenAI messages and OpenAI function tools."""
        memo = self._active_memo()
        if memo is None or type(self).to_renderer_messages is not Renderer.to_renderer_messages:
            messages = self.to_renderer_messages(openai_messages)
        else:
            messages = memo.converted_messages(openai_messages, self._to_renderer_message)
        if memo is None or type(self).apply_tools is not Renderer.apply_tools:
            messages = self.apply_tools(messages, tools)
        else:
            messages = self._apply_tools_memoized(memo, messages, tools)
        if type(self).generation_prompt_chunks is not Renderer.generation_prompt_chunks:
            return list(itertools.chain.from_iterable(self.generation_prompt_chunks(messages)))
        tokens: list[int] = []
        for piece in self._prompt_pieces(messages):
            tokens += piece
        return tokens

    def _apply_tools_memoized(
        self, memo: RenderMemo, messages: list[Message], tools: Sequence[Mapping[str, Any]] | None
    ) -> list[Message]:
        """`apply_tools`, with the messages that replace a leading system message (or go first) made once per
        content of the tools and of that message: they depend on nothing else."""
        if not tools:
            return messages
        system = messages[0] if messages and messages[0]["role"] == "system" else None
        tools_id = memo.tools_id(tools)
        system_id = None if system is None else memo.render_id(system)
        if tools_id is None or (system is not None and system_id is None):
            return self.apply_tools(messages, tools)
        prefix = memo.prefixes.get((tools_id, system_id))
        if prefix is None:
            head = [] if system is None else [system]
            prefix = memo.prefixes[(tools_id, system_id)] = memo.adopt(self.apply_tools(head, tools))
        return [*prefix, *messages[1:]] if system is not None else [*prefix, *messages]

    def completion_parts(self, tokens: list[int]) -> tuple[CompletionParts, bool]:
        """Read a completion (already cut after its first stop token) into content, reasoning and tool calls.

        The default reads `parse_response`'s message; families whose format needs more (the whitespace the
        renderer writes around tool calls, an unclosed reasoning block) override it.
        """
        message, ok = self.parse_response(tokens)
        parts = CompletionParts()
        content = message.get("content", "")
        if isinstance(content, str):
            parts.content = content
        else:
            parts.content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
            parts.reasoning = "".join(p.get("thinking", "") for p in content if p.get("type") == "thinking")
        parts.calls = [*(message.get("tool_calls") or []), *(message.get("unparsed_tool_calls") or [])]
        return parts, ok

    def parse_completion(self, tokens: Sequence[int], stop_reason: str) -> ParsedCompletion:
        """Sampled ids and the sampler's stop reason as an OpenAI assistant message.

        Tool calls are emitted only when a stop token was sampled and the stop reason is not `length`. The content
        is the sampled text with the reasoning and the emitted tool blocks taken out: a block that is not emitted
        (unparsed, or parsed but not emitted) stays where the model wrote it, as written (renderers that give no
        segments append it instead). Nothing the model wrote makes this raise: a parser failure makes the whole
        text one unparsed call.
        """
        tokens = list(map(int, tokens))
        # The first stop token, each looked for by `list.index` (a scan in C), not token by token in Python.
        cut = None
        for stop in set(self.stop_token_ids()):
            try:
                found = tokens.index(stop, 0, len(tokens) if cut is None else cut)
            except ValueError:
                continue
            cut = found
        if cut is not None:
            tokens = tokens[
                : cut + 1
            ]  # the sampler stops at the first stop token; anything after is not a turn
        try:
            parts, ok = self.completion_parts(tokens)
        except Exception as exc:  # a parser bug must not fail the model call
            log.warning("the %s renderer could not parse a completion: %s", type(self).__name__, exc)
            text = str(self.tokenizer.decode(tokens[:cut] if cut is not None else tokens))
            unparsed = UnparsedToolCall(text, f"parser error: {exc}")
            parts, ok = CompletionParts(calls=[unparsed], segments=[unparsed]), cut is not None
        emit = ok and stop_reason != "length"
        tool_calls: list[dict[str, Any]] = []
        if emit:
            tool_calls = [
                {
                    "id": call.id or mint_tool_call_id(),
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
                for call in parts.tool_calls
            ]
        unemitted = self._visible_content(parts, emitted=False)
        content = self._visible_content(parts, emitted=True) if tool_calls else unemitted
        if tool_calls:
            finish_reason = "tool_calls"
        elif stop_reason == "length":
            finish_reason = "length"
        else:
            finish_reason = "stop"
        message = {
            "role": "assistant",
            "content": content,
            "tool_calls": tool_calls or None,
            "reasoning_content": parts.reasoning or None,
        }
        return ParsedCompletion(
            message=message,
            ok=ok,
            finish_reason=finish_reason,
            parsed_tool_calls=len(parts.tool_calls),
            emitted_tool_calls=len(tool_calls),
            recovered_tool_calls=parts.recovered,
            unparsed_tool_calls=len(parts.unparsed),
            unemitted_content=unemitted,
        )

    def _visible_content(self, parts: CompletionParts, *, emitted: bool) -> str:
        """The content the agent sees when the parsed calls are emitted (or not): blocks not emitted as written."""

        def is_emitted(block: Any) -> bool:
            return emitted and isinstance(block, ToolCall)

        if parts.segments is not None:
            return assemble_text(parts.segments, is_emitted, self._block_text, strip=parts.strip_content)
        # A renderer without segments: the text of the blocks that are not emitted follows the content.
        return parts.content + "".join(self._block_text(c) for c in parts.calls if not is_emitted(c))

    def _block_text(self, block: ToolCall | UnparsedToolCall) -> str:
        if isinstance(block, UnparsedToolCall):
            return block.raw_text
        return block.raw_text if block.raw_text is not None else self._tool_call_text(block)

    def _tool_call_text(self, call: ToolCall) -> str:
        """The text of a parsed call that was not emitted, when the parser kept no raw text."""
        return json.dumps({"name": call.function.name, "arguments": call.function.arguments})


def _content_from_openai(content: Any) -> str | list[ContentPart]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts: list[ContentPart] = []
        for part in content:
            if isinstance(part, str):
                parts.append({"type": "text", "text": part})
                continue
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text":
                parts.append({"type": "text", "text": str(part.get("text") or "")})
            elif kind == "thinking":
                parts.append({"type": "thinking", "thinking": str(part.get("thinking") or "")})
            elif kind == "refusal":
                parts.append({"type": "text", "text": str(part.get("refusal") or "")})
            else:
                raise RendererError(f"only text content is supported by this renderer; got a {kind!r} part")
        return parts
    raise RendererError(f"message content must be a string or a list of parts; got {type(content).__name__}")


def _text_of(content: str | list[ContentPart]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type") == "text")


# --------------------------------------------------------------------------------------------------------------
# The registry

#: factory(tokenizer, image_processor) -> Renderer
RendererFactory = Callable[..., Renderer]

_CUSTOM: dict[str, RendererFactory] = {}

#: built-in renderer names -> "module:class"; imported on first use, so the registry stays import-light
_BUILTIN: dict[str, str] = {
    "chat_template": "platoon.renderers.chat_template:ChatTemplateRenderer",
    "qwen3_6_preserve_thinking": "platoon.renderers.chat_template:Qwen36PreserveThinkingRenderer",
    "qwen3_6_preserve_thinking_disable_thinking": (
        "platoon.renderers.chat_template:Qwen36PreserveThinkingDisableThinkingRenderer"
    ),
    "qwen3_8_preserve_thinking": "platoon.renderers.chat_template:Qwen38PreserveThinkingRenderer",
    "qwen3_8_preserve_thinking_disable_thinking": (
        "platoon.renderers.chat_template:Qwen38PreserveThinkingDisableThinkingRenderer"
    ),
    "qwen3": "platoon.renderers.qwen3:Qwen3Renderer",
    "qwen3_disable_thinking": "platoon.renderers.qwen3:Qwen3DisableThinkingRenderer",
    "qwen3_instruct": "platoon.renderers.qwen3:Qwen3InstructRenderer",
    "qwen3_vl": "platoon.renderers.qwen3:Qwen3VLRenderer",
    "qwen3_vl_instruct": "platoon.renderers.qwen3:Qwen3VLInstructRenderer",
    "role_colon": "platoon.renderers.role_colon:RoleColonRenderer",
    "llama3": "platoon.renderers.llama3:Llama3Renderer",
    "deepseekv3": "platoon.renderers.deepseek:DeepSeekV3DisableThinkingRenderer",
    "deepseekv3_disable_thinking": "platoon.renderers.deepseek:DeepSeekV3DisableThinkingRenderer",
    "deepseekv3_thinking": "platoon.renderers.deepseek:DeepSeekV3ThinkingRenderer",
    "gpt_oss_no_sysprompt": "platoon.renderers.gpt_oss:GptOssNoSysPromptRenderer",
    "gpt_oss_low_reasoning": "platoon.renderers.gpt_oss:GptOssLowReasoningRenderer",
    "gpt_oss_medium_reasoning": "platoon.renderers.gpt_oss:GptOssMediumReasoningRenderer",
    "gpt_oss_high_reasoning": "platoon.renderers.gpt_oss:GptOssHighReasoningRenderer",
    "qwen3_5": "platoon.renderers.qwen3_5:Qwen3_5Renderer",
    "qwen3_5_disable_thinking": "platoon.renderers.qwen3_5:Qwen3_5DisableThinkingRenderer",
    "kimi_k2": "platoon.renderers.kimi:KimiK2Renderer",
    "kimi_k25": "platoon.renderers.kimi:KimiK25Renderer",
    "kimi_k25_disable_thinking": "platoon.renderers.kimi:KimiK25DisableThinkingRenderer",
    "nemotron3": "platoon.renderers.nemotron:Nemotron3Renderer",
    "nemotron3_disable_thinking": "platoon.renderers.nemotron:Nemotron3DisableThinkingRenderer",
}
#: built-in classes that take an image processor as their second argument
_TAKES_IMAGE_PROCESSOR = {
    "qwen3_vl",
    "qwen3_vl_instruct",
    "qwen3_5",
    "qwen3_5_disable_thinking",
    "kimi_k25",
    "kimi_k25_disable_thinking",
}


def register_renderer(name: str, factory: RendererFactory) -> None:
    """Add (or replace) a renderer name; `factory(tokenizer, image_processor)` builds it.

    A factory that takes a single argument is called with the tokenizer alone. Registered names are looked up
    before the built-in ones.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("a renderer name must be a non-empty string")
    if not callable(factory):
        raise TypeError(f"the factory for renderer {name!r} is not callable")
    _CUSTOM[name] = factory


def unregister_renderer(name: str) -> bool:
    """Remove a registered renderer name; False when it was not registered."""
    return _CUSTOM.pop(name, None) is not None


def renderer_names() -> list[str]:
    """Every name `get_renderer` knows: the registered ones, then the built-in ones."""
    return [*_CUSTOM, *(n for n in _BUILTIN if n not in _CUSTOM)]


def _register_builtin(name: str, target: str, *, takes_image_processor: bool = False) -> None:
    """For renderer families shipped with platoon: add a built-in name resolved lazily from "module:class"."""
    _BUILTIN[name] = target
    if takes_image_processor:
        _TAKES_IMAGE_PROCESSOR.add(name)


def get_renderer(
    name: str,
    tokenizer: Tokenizer,
    image_processor: Any = None,
    *,
    renderer_kwargs: Mapping[str, Any] | None = None,
) -> Renderer:
    """The renderer `name` over `tokenizer`, with `renderer_kwargs` set as attributes afterwards.

    An unknown name, or a renderer kwarg naming an attribute the renderer lacks, is a `ConfigError` (a
    `ValueError`).
    """
    renderer: Renderer
    if name in _CUSTOM:
        factory = _CUSTOM[name]
        renderer = factory(tokenizer, image_processor) if _takes_two(factory) else factory(tokenizer)
    elif name in _BUILTIN:
        module_name, _, class_name = _BUILTIN[name].partition(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        renderer = cls(tokenizer, image_processor) if name in _TAKES_IMAGE_PROCESSOR else cls(tokenizer)
    else:
        raise ConfigError(
            f"unknown renderer {name!r}; known renderers: {', '.join(sorted(renderer_names()))} "
            "(or register one with register_renderer)"
        )
    try:
        renderer.name = name
    except AttributeError:  # a custom renderer class that does not allow the attribute
        pass
    if renderer_kwargs:
        apply_renderer_kwargs(renderer, renderer_kwargs)
    return renderer


def apply_renderer_kwargs(renderer: Any, renderer_kwargs: Mapping[str, Any]) -> None:
    """Set each kwarg as an attribute of `renderer`; one it does not have is a `ConfigError` (a `ValueError`)."""
    unknown = [key for key in renderer_kwargs if not hasattr(renderer, key)]
    if unknown:
        raise ConfigError(
            f"renderer_kwargs: the {type(renderer).__name__} renderer has no attribute "
            + ", ".join(repr(k) for k in unknown)
        )
    for key, value in renderer_kwargs.items():
        setattr(renderer, key, value)


def _takes_two(factory: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return True
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return True
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    return len(positional) >= 2


_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def parse_think_blocks(content: str) -> list[ContentPart] | None:
    """Text with `<think>` blocks as thinking and text parts (empty pieces dropped); None without `<think>`."""
    if "<think>" not in content:
        return None
    parts: list[ContentPart] = []
    pos = 0
    for match in _THINK_BLOCK.finditer(content):
        if match.start() > pos:
            parts.append({"type": "text", "text": content[pos : match.start()]})
        if match.group(1):
            parts.append({"type": "thinking", "thinking": match.group(1)})
        pos = match.end()
    if pos < len(content):
        parts.append({"type": "text", "text": content[pos:]})
    return parts
