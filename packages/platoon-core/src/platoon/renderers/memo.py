"""Exact content keys, and the memo of one conversation's conversions and renders.

A harness sends its whole conversation on every model call, so the gateway would convert and render every earlier
message again on every call (O(n) per call, O(n^2) per episode). A message's render is a function of the message, of
its `RenderContext` (its index, whether it is last, the message before it, the index of the last user message) and
of the renderer's settings. The gateway therefore gives each agent a `RenderMemo` (`platoon.gateway.history`) and
makes it the active one while it renders that agent's prompt (`RENDER_MEMO`); `Renderer.render_prompt` and
`Renderer.generation_prompt_chunks` look each message up by exactly those inputs and convert and render only what
they have not seen.

Keys are made of content, never of object identity: `content_key` writes a message as nested tuples that keep every
type apart (`1`, `1.0` and `True` differ, `-0.0` differs from `0.0`, dict order counts), so two messages with one
key render alike under every renderer. A value it cannot key (an object of a type it does not know) makes the
message uncached, never wrong. Each content key is hashed once per call and named by an int; the tables are keyed
by those ints. A memo forgets its renders when its renderer's settings change (any attribute set on it), is bounded
(`RENDER_MEMO_ENTRIES`, emptied when full), and goes with its agent. Only renderer classes that declare
`memoize_renders` use it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from contextvars import ContextVar
from typing import Any

__all__ = [
    "RENDER_MEMO",
    "RENDER_MEMO_ENTRIES",
    "RenderMemo",
    "Unkeyable",
    "content_key",
    "key_or_none",
    "register_key_type",
]

#: The most renders one memo keeps before it is emptied: far more than one agent's conversation holds.
RENDER_MEMO_ENTRIES = 4096


class Unkeyable(TypeError):
    """A value `content_key` cannot write exactly (an object of a type it does not know)."""


#: type -> the function that writes an instance as a tuple of content (registered by the modules that own the type)
_KEY_TYPES: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def register_key_type(cls: type, key: Callable[[Any], tuple[Any, ...]]) -> None:
    """Let `content_key` write instances of exactly `cls` as `key(instance)`: a tuple of `content_key`s of
    everything the instance holds (the type is put in front of it)."""
    _KEY_TYPES[cls] = key


#: `content_key(None)`
_NONE_KEY = (type(None), None)


def content_key(value: Any) -> Hashable:
    """`value` as a hashable key equal to another value's key only when the two are the same content.

    Strings stand for themselves; every other value is a tuple led by its type, so no two types meet (`1`, `1.0`,
    `True`; a list and a tuple; a dict and its items). Dicts keep their order (a renderer may write keys in order).
    Floats are written by `repr`, which tells `-0.0` from `0.0`. Anything else raises `Unkeyable`.
    """
    kind = type(value)
    if kind is str:
        return value
    if kind is dict:
        out: list[Any] = [dict]
        for key, item in value.items():
            out.append(key if type(key) is str else content_key(key))
            # Strings and None are most of a message's values: written here rather than by a call each.
            out.append(item if type(item) is str else _NONE_KEY if item is None else content_key(item))
        return tuple(out)
    if kind is list or kind is tuple:
        return (kind, *[item if type(item) is str else content_key(item) for item in value])
    if value is None or kind is bool or kind is int:
        return (kind, value)
    if kind is float:
        return (float, repr(value))
    key = _KEY_TYPES.get(kind)
    if key is None:
        raise Unkeyable(f"no content key for {kind.__name__}")
    return (kind, *key(value))


def key_or_none(value: Any) -> Hashable | None:
    """`content_key(value)`, or None for a value it cannot key (or one nested too deep to walk)."""
    try:
        return content_key(value)
    except (Unkeyable, RecursionError):
        return None


class RenderMemo:
    """One conversation's content ids, conversions and renders (an agent's, kept on its `AgentHistory`); the
    conversions and renders hold for one renderer with the settings it had when they were made.

    - `ids`: a message's content key -> a small int standing for that content. A call hashes and compares each
      message's key once, here; everything else is keyed by these ints. Ids come from one counter and are never
      reused, so an entry made under an id that was since forgotten can never be met by other content.
    - `converted`: an OpenAI message's id -> the renderer message converted from it. A converted message is the one
      object the memo hands out for that content, and nothing changes it (renderers only read their messages), so
      the memo knows it again by identity: `canonical` maps its address to its render id. Every object listed
      there is held by `converted` or `prefixes` and they are emptied together, so no other object can have a
      listed address.
    - `prefixes`: (the tools' id, the leading system message's render id) -> the messages the renderer puts in
      their place (`Renderer.apply_tools`), each adopted like a converted message.
    - `renders`: (render id, render id of the message before, idx, is_last, last user index) -> the render as
      (header tokens, non-empty output chunks); `suffixes`: (role, render id of the last message, its index + 1,
      last user index) -> the generation suffix. For a family whose renders read less of their context
      (`Renderer._turn_memo`): (render id, idx > 0, is the last message and an assistant one) and (role, whether a
      message precedes it). Tuples of ints only: the garbage collector stops tracking them, so an agent's memo adds
      next to nothing to what a full collection walks.
    - `request`: the OpenAI messages of the call being rendered and their ids, then its tools and their id (None
      for none), made once by the gateway for its own digests and read here for the conversion and the tools.
    """

    __slots__ = (
        "_next",
        "canonical",
        "converted",
        "ids",
        "limit",
        "prefixes",
        "renderer",
        "renders",
        "request",
        "suffixes",
        "version",
    )

    def __init__(self, limit: int = RENDER_MEMO_ENTRIES) -> None:
        self.ids: dict[Hashable, int] = {}
        self.renders: dict[tuple[Any, ...], tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]] = {}
        self.suffixes: dict[tuple[Any, ...], tuple[int, ...]] = {}
        self.converted: dict[int, Any] = {}
        self.prefixes: dict[tuple[int, int | None], list[Any]] = {}
        self.canonical: dict[int, int] = {}
        self.request: tuple[Sequence[Any], list[int | None], Any, int | None] | None = None
        self.limit = limit
        self.renderer: Any = None
        self.version = -1
        self._next = itertools.count()

    def content_ids(self, messages: Sequence[Any]) -> list[int | None]:
        """The id of each message's content (None for a message without a content key)."""
        ids = self.ids
        if len(ids) >= self.limit:
            ids.clear()
        out: list[int | None] = []
        for message in messages:
            key = key_or_none(message)
            if key is None:
                out.append(None)
                continue
            found = ids.get(key)
            if found is None:
                found = ids[key] = next(self._next)
            out.append(found)
        return out

    def tools_id(self, tools: Any) -> int | None:
        """The id of the tools' content: the gateway's for the call being rendered, else made here."""
        request = self.request
        if request is not None and request[2] is tools:
            return request[3]
        return self.content_ids((tools,))[0]

    def bind(self, renderer: Any, version: int) -> None:
        """Keep the conversions and renders made by `renderer` at settings `version`; forget them when either
        changed since (the memo holds the renderer, so the identity check cannot meet a new object at a reused
        address) or when they fill the memo."""
        if (
            self.renderer is not renderer
            or self.version != version
            or len(self.renders) + len(self.converted) + len(self.prefixes) + len(self.suffixes) >= self.limit
        ):
            for table in (self.renders, self.suffixes, self.converted, self.prefixes, self.canonical):
                table.clear()
            self.renderer, self.version = renderer, version

    def converted_messages(self, messages: Sequence[Any], convert: Callable[[Any], Any]) -> list[Any]:
        """`convert(message)` for each of `messages`, each made once per content."""
        request = self.request
        ids = request[1] if request is not None and request[0] is messages else self.content_ids(messages)
        out = []
        for raw, content_id in zip(messages, ids, strict=True):
            if content_id is None:
                out.append(convert(raw))
                continue
            found = self.converted.get(content_id)
            if found is None:
                found = self.converted[content_id] = convert(raw)
                self.canonical[id(found)] = next(self._next)
            out.append(found)
        return out

    def adopt(self, messages: list[Any]) -> list[Any]:
        """`messages`, each known from now on by identity under a render id of its own (one already known keeps
        its id): for messages the renderer made itself and nothing else holds."""
        for message in messages:
            if self.render_id(message, content=False) is None:
                self.canonical[id(message)] = next(self._next)
        return messages

    def render_id(self, message: Any, *, content: bool = True) -> int | None:
        """The id a renderer message is rendered under: its own for a message converted here, else its content's
        (None when it has no content key). The two never meet: every id is drawn once from one counter."""
        found = self.canonical.get(id(message))
        if found is not None:
            return found
        return self.content_ids((message,))[0] if content else None


#: The memo the renders of the current call go to (set by the gateway around one agent's render; None elsewhere).
RENDER_MEMO: ContextVar[RenderMemo | None] = ContextVar("platoon_render_memo", default=None)
