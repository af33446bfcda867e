"""Cheap measures of a request, taken before it renders.

- `request_chars`: how much text a request holds. A large request renders in a worker thread, so that the event
  loop (other agents' calls, `/healthz`) keeps running while a multi-megabyte prompt is tokenized.
- `prompt_token_floor`: a lower bound on the prompt's token count from the bytes of the text every renderer writes
  into the prompt and the most bytes one token of the tokenizer can stand for. A request whose bound already
  exceeds the context window is refused without rendering it.

Both walk the messages once and copy nothing; the per-tokenizer table (`token_span`) is read once per tokenizer.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "OFF_LOOP_CHARS",
    "TokenSpan",
    "known_token_span",
    "prompt_token_floor",
    "request_chars",
    "token_span",
]

#: A request with at least this many characters of text renders off the event loop. Measured (qwen3 tokenizer,
#: qwen3_instruct, 2 cores): a thread hop costs ~0.1 ms; 16 Ki characters the tokenizer has not seen cost 14-35 ms
#: to render (more than a hundred hops), a cached 100 KB conversation 0.8 ms; a 2 KB request 0.04 ms (less than a hop).
OFF_LOOP_CHARS = 16 * 1024

#: Roles whose message content every renderer writes into the prompt (possibly trimmed, possibly escaped, never
#: shortened otherwise). Assistant turns are left out: templates drop reasoning and strip thinking from them.
_VERBATIM_ROLES = frozenset(("system", "developer", "user", "tool"))


def request_chars(
    messages: Sequence[Any], tools: Sequence[Any] | None, *, enough: int = OFF_LOOP_CHARS
) -> int:
    """Characters of text in the request: message content (strings and text parts), reasoning, tool-call
    arguments, then the tools' JSON. Counting stops once `enough` is reached (the answer is then >= `enough`)."""
    total = 0
    # Runs twice on every model call over the whole conversation: plain dicts and strings are recognised by their
    # exact type first, since an `isinstance` check against `Mapping` costs an ABC lookup each time.
    for message in messages:
        if type(message) is not dict and not isinstance(message, Mapping):
            continue
        content = message.get("content")
        total += len(content) if type(content) is str else _content_chars(content)
        reasoning = message.get("reasoning_content")
        if isinstance(reasoning, str):
            total += len(reasoning)
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                function = call.get("function") if type(call) is dict or isinstance(call, Mapping) else None
                if type(function) is not dict and not isinstance(function, Mapping):
                    continue
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    total += len(arguments)
        if total >= enough:
            return total
    if tools:
        # Tools render as JSON; dumping them costs microseconds for the usual few kilobytes.
        total += len(json.dumps(tools, ensure_ascii=False, default=str))
    return total


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    total = 0
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                total += len(part)
            elif type(part) is dict or isinstance(part, Mapping):
                for key in ("text", "thinking", "refusal"):
                    value = part.get(key)
                    if isinstance(value, str):
                        total += len(value)
    return total


@dataclass(frozen=True)
class TokenSpan:
    """What bounds a tokenizer's token count from below: no token stands for more than `max_bytes` bytes of the
    normalized text, and the tokenizer's normalizer shrinks non-ASCII text at most `shrink`-fold (ASCII not at all)."""

    max_bytes: int
    shrink: int


def prompt_token_floor(messages: Sequence[Any], span: TokenSpan) -> int:
    """A lower bound on the token count of any prompt rendered from `messages`.

    Why it is a true bound: every renderer writes the content of system, developer, user and tool messages into the
    prompt, at most trimmed of surrounding whitespace (templates may `trim`) or escaped (`tojson` only lengthens a
    string); these texts sit between template markers, so they are disjoint parts of the prompt's text. The
    tokenizer's normalizer leaves ASCII text as it is and shrinks other text at most `span.shrink`-fold; each token
    then stands for at most `span.max_bytes` bytes of the normalized text. So a prompt holding A ASCII bytes and
    U other UTF-8 bytes of such text has at least (A + U / shrink) / max_bytes tokens.
    """
    ascii_bytes = other_bytes = 0
    for message in messages:
        role = message.get("role") if isinstance(message, Mapping) else None
        if not isinstance(role, str) or role not in _VERBATIM_ROLES:
            continue
        content = message.get("content")
        texts: list[Any] = [content] if isinstance(content, str) else []
        if isinstance(content, list):
            # Parts may be joined without a separator, so they count as one text (a composing character at a
            # part's start could otherwise merge with the previous part's last ASCII character).
            pieces = [
                p if isinstance(p, str) else p.get("text") for p in content if isinstance(p, (str, Mapping))
            ]
            texts = ["".join(p for p in pieces if isinstance(p, str))]
        for text in texts:
            text = text.strip()
            if text.isascii():  # O(1): CPython keeps the flag
                ascii_bytes += len(text)
            else:
                other_bytes += len(text.encode("utf-8", "surrogatepass"))
    shrink, width = span.shrink, span.max_bytes
    # ceil((A + U / shrink) / width) in integers.
    return -(-(ascii_bytes * shrink + other_bytes) // (width * shrink))


# --------------------------------------------------------------------------------------------------------------
# The per-tokenizer table

#: tokenizer -> its span (None: the bound is skipped for it); weak, like the renderers' table of encoded texts
_SPANS: weakref.WeakKeyDictionary[Any, TokenSpan | None] = weakref.WeakKeyDictionary()
_SPANS_LOCK = threading.Lock()
#: normalizers that never change ASCII text and shrink other text at most this many times (in UTF-8 bytes):
#: NFC composes a Hangul L+V+T jamo triple (9 bytes) into one syllable (3); NFKC maps a 4-byte mathematical letter
#: to one ASCII letter; lowercasing maps the Kelvin sign (3 bytes) to "k"; Strip only trims what we trim too.
_SHRINK = {"NFC": 3, "NFD": 3, "NFKC": 4, "NFKD": 4, "Lowercase": 3, "Prepend": 1, "Strip": 1}
#: pre-tokenizers that keep every byte of the text (those that drop whitespace or matches are not here)
_KEEPING_PRE_TOKENIZERS = frozenset(
    ("ByteLevel", "Metaspace", "Digits", "Split", "Punctuation", "UnicodeScripts", "Sequence")
)


def token_span(tokenizer: Any) -> TokenSpan | None:
    """The tokenizer's `TokenSpan`, worked out once per tokenizer (reading a vocabulary of 150k tokens takes
    ~0.1 s); None when it cannot be read (no `tokenizers` backend, a model other than BPE, a normalizer or
    pre-tokenizer that may drop text): the bound is then skipped."""
    try:
        return _SPANS[tokenizer]
    except KeyError:
        pass
    except TypeError:  # not weakly referenceable: worked out on every call
        return _read_span(tokenizer)
    with _SPANS_LOCK:
        if tokenizer not in _SPANS:
            _SPANS[tokenizer] = _read_span(tokenizer)
        return _SPANS[tokenizer]


def known_token_span(tokenizer: Any) -> tuple[bool, TokenSpan | None]:
    """(whether the span was worked out already, the span): lets the event loop read it without the cost."""
    try:
        if tokenizer in _SPANS:
            return True, _SPANS[tokenizer]
    except TypeError:
        pass
    return False, None


def _read_span(tokenizer: Any) -> TokenSpan | None:
    try:
        return _span_of(getattr(tokenizer, "backend_tokenizer", None))
    except Exception:  # an unusual backend: no bound rather than a failed call
        return None


def _span_of(backend: Any) -> TokenSpan | None:
    if backend is None:
        return None
    from tokenizers.models import BPE  # the backend is a tokenizers.Tokenizer: the package is there

    if not isinstance(backend.model, BPE):
        # WordPiece, WordLevel and Unigram map a whole unknown word (or run) to one token: no byte bound.
        return None
    model = backend.model
    shrink = _normalizer_shrink(_state(backend.normalizer))
    pre = _state(backend.pre_tokenizer)
    if shrink is None or not _keeps_text(pre):
        return None
    byte_level = _has_type(pre, "ByteLevel")
    added = {token.content for token in backend.get_added_tokens_decoder().values()}
    widest = 0
    for token in backend.get_vocab(with_added_tokens=True):
        if byte_level and token not in added:
            # Byte-level vocabularies spell each byte as one character: a token stands for len(token) bytes.
            width = len(token)
        else:
            # Otherwise a token's own UTF-8 spelling is at least what it stands for ("▁" for a space,
            # "<0x0A>" for one byte, an added token for itself).
            width = len(token.encode("utf-8", "surrogatepass"))
        widest = max(widest, width)
    if model.unk_token is not None and not model.byte_fallback:
        if getattr(model, "fuse_unk", False):
            return None  # a run of unknown characters becomes one token
        widest = max(widest, 4)  # one unknown character: at most 4 bytes
    if widest < 1:
        return None
    return TokenSpan(max_bytes=widest, shrink=shrink)


def _state(component: Any) -> Any:
    """A normalizer's or pre-tokenizer's JSON description (None for none)."""
    if component is None:
        return None
    return json.loads(component.__getstate__())


def _normalizer_shrink(state: Any) -> int | None:
    if state is None:
        return 1
    kind = state.get("type")
    if kind == "Sequence":
        shrink = 1
        for item in state.get("normalizers") or ():
            part = _normalizer_shrink(item)
            if part is None:
                return None
            shrink *= part
        return shrink
    if kind == "Replace":
        # A literal replacement that is not shorter than what it replaces never shrinks the text.
        pattern = state.get("pattern") or {}
        literal = pattern.get("String") if isinstance(pattern, dict) else None
        content = state.get("content")
        if (
            isinstance(literal, str)
            and isinstance(content, str)
            and len(content.encode()) >= len(literal.encode())
        ):
            return 1
        return None
    return _SHRINK.get(kind)


def _keeps_text(state: Any) -> bool:
    if state is None:
        return True
    kind = state.get("type")
    if kind not in _KEEPING_PRE_TOKENIZERS:
        return False
    if kind in ("Split", "Punctuation") and state.get("behavior") == "Removed":
        return False
    if kind == "Sequence":
        return all(_keeps_text(item) for item in state.get("pretokenizers") or ())
    return True


def _has_type(state: Any, kind: str) -> bool:
    if not isinstance(state, dict):
        return False
    if state.get("type") == kind:
        return True
    return any(_has_type(item, kind) for item in state.get("pretokenizers") or ())
