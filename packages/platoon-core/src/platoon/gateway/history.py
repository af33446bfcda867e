"""Token-in history: a prompt that repeats an agent's earlier call reuses that call's exact tokens.

A harness sends the whole conversation back on every call, including the assistant turns the gateway gave it.
Re-rendering those turns from their parsed text need not give back what the model sampled (JSON re-serialised,
whitespace normalised, non-ASCII escaped, a separator newline added), and then the next prompt no longer extends
the previous prompt and its sampled tokens: training loses the prefix sharing and sees text the model never wrote.

So the gateway remembers, per agent, each call it recorded: the request's messages (as a chain of digests), the
reply it returned, its prompt and sampled tokens, and the digest of the prompt a plain render of the request gave.
A new request whose messages up to an assistant turn are exactly such a request followed by its reply is built as

    the earlier call's prompt + its sampled tokens + what the renderer writes after that turn

where the last part is cut from a plain render of the new request, after the end token of the re-rendered turn.
A turn that stopped on a stop string the caller gave (`</python>`) has no end token of its own: its sampled tokens
are followed by the renderer's end of the turn, provided the renderer writes the turn's text as it was sampled.
Nothing else changes: the prompt a renderer builds for a conversation it has not seen is the plain render.

The reuse is refused, and the call starts a new *segment* (recorded with the reason), when a plain render would
not keep the turn as sampled: the turn was cut short (no stop token), the renderer re-renders the earlier history
differently once the new messages follow (thinking dropped after a new user turn), or it drops the turn's
reasoning. A renderer opts out with the renderer attribute `token_in_history = False` (`renderer_kwargs`).

This runs on every model call, over the whole conversation: each turn keeps its plain render (compared with the new
render's prefix directly, no hashing of long token lists). The agent's `RenderMemo` (platoon.renderers.memo) names
each message's exact content by an int once per call; the digests of messages already seen are remembered by those
ints, and the renderer reuses its conversions and renders of them, so a call hashes, converts and renders only the
messages it has not seen. The tools are named the same way, and the digest the chain starts from is remembered by
their id and the render kwargs; a reply sent back as it came is known by its text and arguments text
(`_reply_signature`), without parsing its arguments or hashing it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from platoon.gateway.measure import request_chars
from platoon.renderers.memo import RENDER_MEMO, RenderMemo, key_or_none

__all__ = ["SEGMENT_REASONS", "AgentHistory", "PromptBuild", "Turn", "build_prompt"]

#: Why a call's prompt does not extend an earlier call of the same agent (`generation["history"]["segment"]`).
SEGMENT_REASONS = {
    "first_call": "the agent's first call",
    "no_matching_call": "the conversation repeats none of this agent's earlier calls as they were answered",
    "opted_out": "the renderer is configured with token_in_history false",
    "truncated": "the repeated turn did not end on a stop token (cut at the completion budget, or stopped on a stop "
    "string where the renderer writes the turn differently)",
    "history_rerendered": "the renderer renders the earlier history differently once the new messages follow",
    "prefill_dropped": "the renderer opens the turn in history without the prefill it was sampled after",
    "reasoning_dropped": "the renderer drops the repeated turn's reasoning from history",
    "turn_not_found": "the repeated turn's end could not be found in the renderer's output",
}


@dataclass(frozen=True)
class PromptBuild:
    """A call's prompt tokens and how they were built.

    `history` is recorded on the call (`generation["history"]`): `extends` (the call id whose prompt and sampled
    tokens this prompt starts with, or None), `reused_tokens` (how many tokens came from that call), and `segment`
    (None when the prompt extends an earlier call; else a key of `SEGMENT_REASONS`).
    """

    tokens: list[int]
    history: dict[str, Any] = field(default_factory=dict)
    #: the chain digest of the request (tools, render kwargs, messages): the key a later call matches against
    request_digest: bytes = b""
    #: the plain render of the request, and how many of its last tokens open the turn to sample (what follows the
    #: last message's end token: the header and any prefill)
    rendered: list[int] = field(default_factory=list)
    opening_length: int = 0

    @property
    def rendered_length(self) -> int:
        return len(self.rendered)


@dataclass(frozen=True)
class Turn:
    """One recorded call of an agent, as a later request may repeat it."""

    call_id: str
    prompt: tuple[int, ...]
    sampled: tuple[int, ...]
    #: the plain render of the request the turn answered (a later render must begin with it)
    rendered: list[int]
    opening_length: int
    #: the reply's visible text, reasoning and tool-call names (to check the re-rendered turn is this one)
    content: str
    reasoning: str
    tool_names: tuple[str, ...]
    #: whether sampling stopped on its own (a stop token or a stop string) rather than at the completion budget
    stopped: bool = True
    #: the reply's `_reply_signature`; its reply digest is made from it only when a request needs it (made at once
    #: for a reply without a signature)
    signature: tuple[str, ...] | None = None
    digest: bytes | None = None

    @property
    def rendered_length(self) -> int:
        return len(self.rendered)

    @property
    def reply_digest(self) -> bytes:
        if self.digest is not None:
            return self.digest
        assert self.signature is not None  # one of the two is set when the turn is recorded
        return _signature_digest(self.signature)


@dataclass
class AgentHistory:
    """An agent's recorded calls, by their request digest (latest last): a later request repeats one of them
    when its messages up to an assistant turn have that digest and the turn that reply's digest."""

    turns: dict[bytes, list[Turn]] = field(default_factory=dict)
    calls: int = 0
    #: (chain digest, the message's content id) -> the chain digest after that message: a conversation sends its
    #: earlier messages again on every call, and their digests do not change (bounded: `DIGEST_MEMO_ENTRIES`)
    digests: dict[tuple[bytes, int], bytes] = field(default_factory=dict)
    #: the content ids, conversions and renders of this agent's messages (platoon.renderers.memo): only new
    #: messages are hashed, converted and rendered on a call
    renders: RenderMemo = field(default_factory=RenderMemo)
    #: (the tools' content id, the render kwargs' content key) -> the digest the request chain starts from, and
    #: the tools' content id -> the characters of their JSON: an agent sends the same tools on every call, and
    #: dumping them as JSON cost more than the rest of the chain (bounded: `TOOLS_MEMO_ENTRIES`)
    heads: dict[tuple[int, Hashable], bytes] = field(default_factory=dict)
    tool_sizes: dict[int, int] = field(default_factory=dict)

    def tools_id(self, tools: Sequence[Any]) -> int | None:
        """The id of the tools' exact content in this agent's memo (None: they have no content key)."""
        return self.renders.content_ids((tools,))[0]

    def tools_chars(self, tools: Sequence[Any], tools_id: int) -> int:
        """`request_chars` of the tools alone (`tools_id`: their id from `tools_id`, made on this call)."""
        size = self.tool_sizes.get(tools_id)
        if size is None:
            if len(self.tool_sizes) >= TOOLS_MEMO_ENTRIES:
                self.tool_sizes.clear()
            size = self.tool_sizes[tools_id] = request_chars((), tools)
        return size

    def record(
        self,
        build: PromptBuild,
        call_id: str,
        sampled: Sequence[int],
        reply: Mapping[str, Any],
        *,
        stop_reason: str = "stop",
        prompt: tuple[int, ...] | None = None,
    ) -> None:
        """Remember a recorded call so that a request repeating it reuses its tokens (`prompt`: the call's prompt
        tokens as a tuple already made, else made from the build)."""
        self.calls += 1
        if not build.request_digest:
            return
        # The signature holds the reply's strings as they are now: a harness that later edits the reply's calls
        # in place does not change what this turn was.
        signature = _reply_signature(reply)
        self.turns.setdefault(build.request_digest, []).append(
            Turn(
                call_id=call_id,
                prompt=tuple(build.tokens) if prompt is None else prompt,
                sampled=tuple(sampled),
                rendered=build.rendered,
                opening_length=build.opening_length,
                content=_text(reply.get("content")).strip(),
                reasoning=_reasoning(reply).strip(),
                tool_names=tuple(_call_name(call) for call in reply.get("tool_calls") or ()),
                stopped=stop_reason != "length",
                signature=signature,
                digest=_reply_digest(reply) if signature is None else None,
            )
        )

    def match(self, chain: list[bytes], messages: Sequence[Mapping[str, Any]]) -> Turn | None:
        """The latest assistant turn of `messages` that repeats a recorded call with the request before it."""
        if not self.turns:
            return None
        for j in range(len(messages) - 1, 0, -1):
            message = messages[j]
            if not isinstance(message, Mapping) or message.get("role") != "assistant":
                continue
            recorded = self.turns.get(chain[j])
            if not recorded:
                continue
            turn = _latest_with_reply(recorded, message)
            if turn is None:
                continue
            # A client may drop the reasoning it was given, but one that sends other reasoning wrote a new turn.
            sent = _reasoning(message).strip()
            if sent and sent != turn.reasoning:
                continue
            return turn
        return None


def build_prompt(
    renderer: Any,
    history: AgentHistory,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    render_kwargs: Mapping[str, Any],
    *,
    tools_id: int | None = None,
) -> PromptBuild:
    """The prompt of a call: the plain render, or an earlier call's exact tokens and the render after them.

    `tools_id`: the tools' content id (`AgentHistory.tools_id`) when the caller made it on this call, with nothing
    run since that could change them; None: made here."""
    # The messages' (and the tools') content keys are made once: for the digests here, and for the renderer's
    # memo of this agent's conversions and renders (platoon.renderers.memo), active while it renders.
    memo = history.renders
    ids = memo.content_ids(messages)
    if tools and tools_id is None:
        tools_id = history.tools_id(tools)
    memo.request = (messages, ids, tools, tools_id)
    active = RENDER_MEMO.set(memo)
    try:
        rendered = list(renderer.render_prompt(messages, tools=tools or None, **render_kwargs))
    finally:
        RENDER_MEMO.reset(active)
        memo.request = None
    chain = _chain(messages, _head(history, tools, tools_id, render_kwargs), history.digests, ids)
    ends = _end_ids(renderer)
    head = next((i + 1 for i in range(len(rendered) - 1, -1, -1) if rendered[i] in ends), 0)
    request_digest, opening_length = chain[-1], len(rendered) - head
    plain = PromptBuild(
        rendered, request_digest=request_digest, rendered=rendered, opening_length=opening_length
    )
    if history.calls == 0:
        return _segment(plain, "first_call")
    if not getattr(renderer, "token_in_history", True):
        return _segment(plain, "opted_out")
    turn = history.match(chain, messages)
    if turn is None:
        return _segment(plain, "no_matching_call")
    tokens, reason = _splice(renderer, turn, rendered, ends)
    if tokens is None:
        return _segment(plain, reason, turn)
    # The plain render's digests stay: a later call matches against what a plain render of this request gave.
    history_record = {
        "extends": turn.call_id,
        "reused_tokens": len(turn.prompt) + len(turn.sampled),
        "segment": None,
    }
    return PromptBuild(
        tokens,
        history_record,
        request_digest=request_digest,
        rendered=rendered,
        opening_length=opening_length,
    )


def _end_ids(renderer: Any) -> set[int]:
    """The tokens that end a message: the stop tokens, and those a renderer ends history turns with instead."""
    return {*renderer.stop_token_ids(), *getattr(renderer, "history_turn_end_ids", ())}


def _splice(renderer: Any, turn: Turn, rendered: list[int], ends: set[int]) -> tuple[list[int] | None, str]:
    """The turn's prompt and sampled tokens followed by the part of `rendered` after the re-rendered turn."""
    if not turn.sampled or not turn.stopped:
        return None, "truncated"
    # A turn that ends on a stop token closes itself; one that stopped on a caller's stop string does not.
    closed = turn.sampled[-1] in renderer.stop_token_ids()
    start = turn.rendered_length
    # The plain render of the new request must begin with the plain render the turn was sampled from: otherwise
    # the renderer writes the earlier history differently now, and the sampled turn cannot stand in it.
    if len(rendered) <= start or rendered[:start] != turn.rendered:
        # Either the earlier messages render differently now, or only the turn's opening does (the header and
        # prefill after the last message: an empty think block the template does not keep in history).
        head = start - turn.opening_length
        if rendered[:head] == turn.rendered[:head]:
            return None, "prefill_dropped"
        return None, "history_rerendered"
    # The re-rendered turn ends at an end token; the first one after which the rendered text holds the reply's
    # text and calls is its end (a turn may hold several messages: reasoning, a preamble, each call). Reasoning
    # before that point but missing from it means the renderer drops it from history, and so must the prompt.
    for end in _ends_after(rendered, start, ends):
        text = str(renderer.tokenizer.decode(rendered[start : end + 1]))
        if (turn.content and turn.content not in text) or any(name not in text for name in turn.tool_names):
            continue
        if turn.reasoning and turn.reasoning not in text:
            return None, "reasoning_dropped"
        if not closed:
            # Stopped on a stop string: the renderer's end of the turn follows the sampled tokens, as long as what
            # it writes before that end is the sampled text itself (the tokens may differ, the text may not).
            decode = renderer.tokenizer.decode
            if str(decode(rendered[start:end])) != str(decode(list(turn.sampled))):
                return None, "truncated"
            return [*turn.prompt, *turn.sampled, *rendered[end:]], ""
        # A turn may close with several end tokens (DeepSeek: the calls' section end, then the end of sentence).
        while end + 1 < len(rendered) and rendered[end + 1] in ends:
            end += 1
        return [*turn.prompt, *turn.sampled, *rendered[end + 1 :]], ""
    return None, "turn_not_found"


def _ends_after(rendered: list[int], start: int, ends: set[int], limit: int = 16) -> Iterator[int]:
    """The first `limit` positions at or after `start` that hold an end token."""
    found = 0
    for i in range(start, len(rendered)):
        if rendered[i] in ends:
            yield i
            found += 1
            if found == limit:
                return


def _segment(build: PromptBuild, reason: str, turn: Turn | None = None) -> PromptBuild:
    """`build` recorded as a new segment, unless its tokens extend the matched turn anyway."""
    if turn is not None:
        prefix = (*turn.prompt, *turn.sampled)
        if tuple(build.tokens[: len(prefix)]) == prefix:
            build.history.update(extends=turn.call_id, reused_tokens=0, segment=None)
            return build
    build.history.update(extends=None, reused_tokens=0, segment=reason)
    return build


# ---- digests ------------------------------------------------------------------------------------------------

#: The most message digests one agent remembers before the memo is emptied: far more than a conversation holds.
DIGEST_MEMO_ENTRIES = 4096
#: The most (tools, render kwargs) heads and tool sizes one agent remembers: an agent sends one or a few tool sets.
TOOLS_MEMO_ENTRIES = 64

#: the `heads` key part that stands for no tools (content ids are never negative)
_NO_TOOLS = -1


def _head(
    history: AgentHistory,
    tools: Sequence[Mapping[str, Any]] | None,
    tools_id: int | None,
    render_kwargs: Mapping[str, Any],
) -> bytes:
    """The digest of the tools and the render kwargs, the start of the request chain: remembered by the tools'
    content id (`tools_id`, None when they have none) and the kwargs' content key, the same content by definition."""
    kwargs_key = key_or_none(dict(render_kwargs))
    if kwargs_key is None or (tools and tools_id is None):
        return _head_digest(tools, render_kwargs)
    key = (tools_id if tools and tools_id is not None else _NO_TOOLS, kwargs_key)
    digest = history.heads.get(key)
    if digest is None:
        if len(history.heads) >= TOOLS_MEMO_ENTRIES:
            history.heads.clear()
        digest = history.heads[key] = _head_digest(tools, render_kwargs)
    return digest


def _head_digest(tools: Sequence[Mapping[str, Any]] | None, render_kwargs: Mapping[str, Any]) -> bytes:
    return _digest(b"", [_canonical(tools or []), _canonical(dict(render_kwargs))])


def _chain(
    messages: Sequence[Mapping[str, Any]],
    head: bytes,
    memo: dict[tuple[bytes, int], bytes] | None = None,
    ids: Sequence[int | None] | None = None,
) -> list[bytes]:
    """`chain[i]` = the digest of the tools and the render kwargs (`head`) and `messages[:i]` (len(messages) + 1
    entries).

    `memo` remembers the digest after each message by the digest before it and the id of the message's exact
    content (`ids`, from the agent's `RenderMemo.content_ids`: equal ids are equal content): only the new
    messages of a conversation are hashed. A message without an id is hashed on every call.
    """
    digest = head
    chain = [digest]
    for index, message in enumerate(messages):
        content_id = None if memo is None or ids is None else ids[index]
        if content_id is not None and memo is not None:
            known = memo.get((digest, content_id))
            if known is not None:
                digest = known
                chain.append(digest)
                continue
        previous = digest
        digest = _digest(digest, _message_form(message))
        if content_id is not None and memo is not None:
            if len(memo) >= DIGEST_MEMO_ENTRIES:
                memo.clear()
            memo[(previous, content_id)] = digest
        chain.append(digest)
    return chain


def _digest(previous: bytes, value: Any) -> bytes:
    hasher = hashlib.blake2b(previous, digest_size=16)
    hasher.update(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).encode())
    return hasher.digest()


def _reply_digest(message: Mapping[str, Any]) -> bytes:
    """What identifies a reply when a client sends it back: its visible text and its calls (names, arguments).

    Reasoning is left out (clients drop it) and checked separately; call ids are left out (some dialects mint
    their own); whitespace around the text is left out (some clients trim it).
    """
    calls = [[_call_name(call), _arguments(call)] for call in message.get("tool_calls") or ()]
    return _digest(b"", [_text(message.get("content")).strip(), calls])


def _latest_with_reply(recorded: list[Turn], message: Mapping[str, Any]) -> Turn | None:
    """The latest of `recorded` whose reply has the reply digest of `message`. A reply sent back as it came has
    the latest turn's signature, and no digest is made then."""
    signature = _reply_signature(message)
    if signature is not None and recorded[-1].signature == signature:
        return recorded[-1]
    digest = _reply_digest(message)
    return next((turn for turn in reversed(recorded) if turn.reply_digest == digest), None)


def _signature_digest(signature: tuple[str, ...]) -> bytes:
    """`_reply_digest` of a reply with this `_reply_signature`."""
    calls = [[signature[i], _json_value(signature[i + 1])] for i in range(1, len(signature), 2)]
    return _digest(b"", [signature[0], calls])


def _reply_signature(message: Mapping[str, Any]) -> tuple[str, ...] | None:
    """What `_reply_digest` is made of, unparsed: the stripped text, then each call's name and arguments text
    (None when an argument is not a string). Equal signatures have equal digests, and one costs far less."""
    signature = [_text(message.get("content")).strip()]
    for call in message.get("tool_calls") or ():
        arguments = _call_field(_call_function(call), "arguments")
        if type(arguments) is not str:
            return None
        signature += (_call_name(call), arguments)
    return tuple(signature)


def _message_form(message: Any) -> Any:
    """A message as the fields that change its rendering, in a canonical form."""
    if not isinstance(message, Mapping):
        return repr(message)
    form: dict[str, Any] = {"role": message.get("role"), "content": _canonical(message.get("content"))}
    if message.get("tool_calls"):
        form["tool_calls"] = [
            [_call_field(call, "id"), _call_name(call), _arguments(call)] for call in message["tool_calls"]
        ]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            form[key] = message[key]
    reasoning = _reasoning(message)
    if reasoning:
        form["reasoning"] = reasoning
    return form


def _canonical(value: Any) -> Any:
    """None and "" alike (a reply's null content comes back either way); everything else as it is."""
    return "" if value is None else value


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return str(content)


def _reasoning(message: Mapping[str, Any]) -> str:
    value = message.get("reasoning_content")
    if value is None:
        value = message.get("reasoning")
    return value if isinstance(value, str) else ""


def _call_field(call: Any, key: str) -> Any:
    return call.get(key) if isinstance(call, Mapping) else getattr(call, key, None)


def _call_function(call: Any) -> Any:
    function = _call_field(call, "function")
    return call if function is None else function


def _call_name(call: Any) -> str:
    return str(_call_field(_call_function(call), "name") or "")


def _arguments(call: Any) -> Any:
    """The call's arguments as a JSON value (a client may re-serialise the JSON text it was given)."""
    arguments = _call_field(_call_function(call), "arguments")
    return _json_value(arguments) if isinstance(arguments, str) else arguments


def _json_value(text: str) -> Any:
    """`text` read as JSON, or `text` itself when it is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return text
