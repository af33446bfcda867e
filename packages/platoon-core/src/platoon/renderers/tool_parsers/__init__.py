"""Tool-call parsers for the `chat_template` renderer, chosen by name, by round trip (`auto`) or written by a user.

Each parser reads the sampled text (before the stop token) into reasoning, content, tool calls and unparsed blocks. Built-in parsers are imported on first use, in `auto` order; users subclass `ToolCallParser`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from platoon.errors import ConfigError
from platoon.renderers.base import CallGroup, Text, UnparsedToolCall, iter_blocks, segments_text

__all__ = [
    "CallGroup",
    "ParseResult",
    "ParsedToolCall",
    "Text",
    "ToolCallParser",
    "UnparsedToolCall",
    "builtin_parser_names",
    "get_parser",
    "load_parser",
    "parser_names",
    "register_parser",
    "unregister_parser",
]


@dataclass(frozen=True)
class ParsedToolCall:
    """One tool call read from the text: `arguments` is a mapping; `id` only when the model wrote one."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None
    #: the call needed a lenient parse (a missing close tag, raw control characters, string-encoded arguments)
    recovered: bool = False
    #: the sampled text of the call (shown to the harness when the call is not emitted)
    raw_text: str = field(default="", compare=False)


@dataclass
class ParseResult:
    """What a parser read: reasoning and content (both stripped), tool calls and unparsed blocks, in order.

    `segments` (built-in parsers; None from a user's parser that gives none) is the text after the reasoning in
    the order it was written: visible text (str), calls (`ParsedToolCall`/`UnparsedToolCall`) and `CallGroup`s of
    calls inside the format's markup. The gateway builds the agent's content from them, so that a call it does not
    emit stays where the model wrote it; `content` is their visible text, stripped.
    """

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    unparsed: list[UnparsedToolCall] = field(default_factory=list)
    segments: list[Any] | None = None

    @classmethod
    def from_segments(cls, segments: list[Any], reasoning: str = "") -> ParseResult:
        blocks = iter_blocks(segments)
        return cls(
            content=segments_text(segments).strip(),
            reasoning=reasoning.strip(),
            tool_calls=[b for b in blocks if isinstance(b, ParsedToolCall)],
            unparsed=[b for b in blocks if isinstance(b, UnparsedToolCall)],
            segments=segments,
        )


class ToolCallParser:
    """The base of every tool-call parser; subclass it and implement `parse_calls` (or override `parse`).

    `parse` splits the reasoning block at the start (tags `reasoning_tags`; None = no split) and hands the rest
    to `parse_segments`, which returns the text in order (visible text, calls, groups of calls); by default it
    asks `parse_calls`, which returns (content, calls, unparsed) — the calls' text then follows the content.
    `call_start` says where a real call starts, so an unclosed reasoning block ends there. A user parser is
    named in `tool_call_parser` as `package.module:attr`.
    """

    #: the parser's registry name (and its aliases)
    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    #: the format's reasoning tags (open, close); None when the format has none
    default_reasoning_tags: ClassVar[tuple[str, str] | None] = ("<think>", "</think>")

    def __init__(self, reasoning_tags: Sequence[str] | str | None = "auto") -> None:
        self.reasoning_tags: tuple[str, str] | None = self.default_reasoning_tags
        self.set_reasoning_tags(reasoning_tags)

    def set_reasoning_tags(self, tags: Sequence[str] | str | None) -> None:
        """`auto` (the format's own), `none`/None (no reasoning split) or `[open, close]`."""
        if tags == "auto":
            self.reasoning_tags = self.default_reasoning_tags
        elif tags is None or tags == "none":
            self.reasoning_tags = None
        elif not isinstance(tags, str) and len(tags) == 2 and all(isinstance(t, str) and t for t in tags):
            self.reasoning_tags = (tags[0], tags[1])
        else:
            raise ConfigError(f"reasoning_tags must be 'auto', 'none' or [open, close]; got {tags!r}")

    @property
    def open_reasoning_tag(self) -> str | None:
        return self.reasoning_tags[0] if self.reasoning_tags else None

    # ---- the contract -------------------------------------------------------------------------------------

    def parse(
        self, text: str, *, tools: Sequence[Any] | None = None, in_reasoning: bool = False
    ) -> ParseResult:
        """Read `text` (the sampled text before the stop token) into a `ParseResult`."""
        reasoning, rest = self.split_reasoning(text, in_reasoning)
        return ParseResult.from_segments(self.parse_segments(rest, tools), reasoning)

    def parse_segments(self, text: str, tools: Sequence[Any] | None) -> list[Any]:
        """The text after the reasoning, in order: visible text, calls and `CallGroup`s (their text in place)."""
        content, calls, unparsed = self.parse_calls(text, tools)
        return [content, *calls, *unparsed]

    def parse_calls(
        self, text: str, tools: Sequence[Any] | None
    ) -> tuple[str, list[ParsedToolCall], list[UnparsedToolCall]]:
        """The text after the reasoning: (content, tool calls, unparsed blocks). The base finds no calls; a parser
        that implements `parse_segments` answers from its segments."""
        if type(self).parse_segments is ToolCallParser.parse_segments:
            return text, [], []
        segments = self.parse_segments(text, tools)
        blocks = iter_blocks(segments)
        return (
            segments_text(segments),
            [b for b in blocks if isinstance(b, ParsedToolCall)],
            [b for b in blocks if isinstance(b, UnparsedToolCall)],
        )

    def call_start(self, text: str) -> int | None:
        """Where the first real tool call starts in `text` (None: none); ends an unclosed reasoning block."""
        return None

    # ---- the shared reasoning split -----------------------------------------------------------------------

    def tags_for(self, text: str) -> tuple[str, str] | None:
        """The reasoning tags that apply to this response (a format may pick by how the response opens)."""
        return self.reasoning_tags

    def split_reasoning(self, text: str, in_reasoning: bool) -> tuple[str, str]:
        """(reasoning, rest): the block between the reasoning tags at the start of the response."""
        tags = self.tags_for(text)
        if tags is None:
            return "", text
        open_tag, close_tag = tags
        stripped = text.lstrip()
        inside = in_reasoning
        if stripped.startswith(open_tag):
            inside, text = True, stripped
        if not inside:
            if stripped.startswith(
                close_tag
            ):  # the template opened the block and the model closed it at once
                return "", stripped[len(close_tag) :]
            return "", text
        # Repeated open tags at the start are the model echoing the template's: strip them all.
        while text.lstrip().startswith(open_tag):
            text = text.lstrip()[len(open_tag) :]
        end = text.find(close_tag)
        start = self.call_start(text)
        if end >= 0 and (start is None or end < start):
            return text[:end], text[end + len(close_tag) :]
        if start is not None:  # an unclosed block ends where a real call starts
            return text[:start], text[start:]
        return text, ""


# --------------------------------------------------------------------------------------------------------------
# The registry: built-in names in `auto` order, resolved lazily, then the user's registrations

_PKG = "platoon.renderers.tool_parsers"

#: built-in name -> "module:class", in `auto` order
_BUILTIN: dict[str, str] = {
    "qwen3_coder": f"{_PKG}.qwen3_coder:Qwen3CoderParser",
    "hermes": f"{_PKG}.hermes:HermesParser",
    "glm45": f"{_PKG}.glm45:Glm45Parser",
    "deepseekv31": f"{_PKG}.deepseek:DeepSeekV31Parser",
    "deepseekv3": f"{_PKG}.deepseek:DeepSeekV3Parser",
    "kimi_k2": f"{_PKG}.kimi_k2:KimiK2Parser",
    "mistral": f"{_PKG}.mistral:MistralParser",
    "gpt-oss": f"{_PKG}.gpt_oss:GptOssParser",
    "llama3": f"{_PKG}.llama3:Llama3JsonParser",
    "pythonic": f"{_PKG}.pythonic:PythonicParser",
}
_ALIASES: dict[str, str] = {
    "qwen3_xml": "qwen3_coder",
    "step3p5": "qwen3_coder",
    "nanbeige": "qwen3_coder",
    "qwen25": "hermes",
    "qwen": "hermes",
    "glm": "glm45",
    "glm47": "glm45",
    "deepseek_v31": "deepseekv31",
    "deepseek_v3": "deepseekv3",
    "openai": "gpt-oss",
    "gpt_oss": "gpt-oss",
    "llama3_json": "llama3",
    "llama4_json": "llama3",
    "llama4_pythonic": "pythonic",
}

#: factory(reasoning_tags) -> parser; registered names come after the built-in ones in `auto` order
ParserFactory = Callable[..., Any]
_CUSTOM: dict[str, ParserFactory] = {}


def register_parser(
    name: str, parser: type[ToolCallParser] | ParserFactory, *, aliases: Sequence[str] = ()
) -> None:
    """Add (or replace) a parser name: a `ToolCallParser` subclass or a factory returning a parser."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"a parser name must be a non-empty string without ':'; got {name!r}")
    if not callable(parser):
        raise TypeError(f"the parser for {name!r} is not callable")
    _CUSTOM[name] = parser
    for alias in aliases:
        _ALIASES[alias] = name


def unregister_parser(name: str) -> bool:
    """Remove a registered parser name (and its aliases); False when it was not registered."""
    for alias in [a for a, target in _ALIASES.items() if target == name and name in _CUSTOM]:
        del _ALIASES[alias]
    return _CUSTOM.pop(name, None) is not None


def builtin_parser_names() -> list[str]:
    return list(_BUILTIN)


def parser_names() -> list[str]:
    """Every canonical parser name in `auto` order: the built-in ones, then the registered ones."""
    return [*(n for n in _BUILTIN if n not in _CUSTOM), *_CUSTOM]


def canonical_name(name: str) -> str:
    return _ALIASES.get(name, name)


def get_parser(name: str, reasoning_tags: Sequence[str] | str | None = "auto") -> Any:
    """A new parser for a name or alias (`none` reads the reasoning split only); unknown → `ConfigError`."""
    if name == "none":
        parser = ToolCallParser()
        parser.set_reasoning_tags(reasoning_tags)
        return parser
    canonical = canonical_name(name)
    if canonical in _CUSTOM:
        factory = _CUSTOM[canonical]
        if isinstance(factory, type) and issubclass(factory, ToolCallParser):
            return factory(reasoning_tags)
        made = factory()
        if isinstance(made, ToolCallParser):
            made.set_reasoning_tags(reasoning_tags)
        return made
    if canonical not in _BUILTIN:
        known = sorted({*_BUILTIN, *_CUSTOM, *_ALIASES, "none"})
        raise ConfigError(
            f"unknown tool_call_parser {name!r}; known: {', '.join(known)}, 'auto', or 'package.module:attr'"
        )
    module_name, _, class_name = _BUILTIN[canonical].partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(reasoning_tags)


class _FunctionParser:
    """A user function (or an object with `parse`) with the `parse(text, *, tools, in_reasoning)` signature."""

    def __init__(self, fn: Callable[..., Any], label: str) -> None:
        self._fn = fn
        self.name = label
        self.open_reasoning_tag: str | None = None

    def parse(
        self, text: str, *, tools: Sequence[Any] | None = None, in_reasoning: bool = False
    ) -> ParseResult:
        result = self._fn(text, tools=tools, in_reasoning=in_reasoning)
        if not isinstance(result, ParseResult):
            raise TypeError(f"the parser {self.name} returned {type(result).__name__}, not a ParseResult")
        return result


def load_parser(spec: str, reasoning_tags: Sequence[str] | str | None = "auto") -> Any:
    """A user parser from `package.module:attr`: a parser class, an instance, or a function.

    `reasoning_tags` applies only to `ToolCallParser` subclasses (a plain function splits as it likes).
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"tool_call_parser {spec!r}: expected 'package.module:attr'")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"tool_call_parser {spec!r} cannot be loaded: {exc}") from exc
    if isinstance(target, type):
        if issubclass(target, ToolCallParser):
            return target(reasoning_tags)
        target = target()
    if isinstance(target, ToolCallParser):
        target.set_reasoning_tags(reasoning_tags)
        return target
    parse = getattr(target, "parse", None)
    if callable(parse) and not inspect.isfunction(target):
        return _FunctionParser(parse, spec)
    if callable(target):
        return _FunctionParser(target, spec)
    raise ConfigError(f"tool_call_parser {spec!r} is not a parser class, instance or function")


def make_parser(setting: str, reasoning_tags: Sequence[str] | str | None = "auto") -> Any:
    """The parser for a `tool_call_parser` setting other than `auto`: `none`, a name/alias or `module:attr`."""
    if ":" in setting:
        return load_parser(setting, reasoning_tags)
    return get_parser(setting, reasoning_tags)
