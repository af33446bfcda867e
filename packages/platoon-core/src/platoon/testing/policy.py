"""The scripted policy: a Tinker sampler that answers from a script instead of a model.

A script is a sequence of completions consumed in order, or a function of the decoded prompt; each answer is
encoded with the policy's tokenizer and returned as a real Tinker `SampleResponse` when the Tinker SDK is loaded,
else as `platoon.gateway.plain_sampling.PlainSample` (the same fields): a scripted episode never imports the SDK.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from platoon.gateway.plain_sampling import PlainSample, PlainSampledSequence, loaded_tinker
from platoon.renderers.tokenizers import TokenizersTokenizer
from platoon.renderers.toy import toy_tokenizer

if TYPE_CHECKING:
    import tinker

_USER_OPEN = "<|im_start|>user\n"
_TURN_END = "<|im_end|>"
_PROMPT_TAIL = 300


class ScriptExhaustedError(AssertionError):
    """The policy was called more times than its script has completions."""


@dataclass(frozen=True)
class Completion:
    """One scripted completion. `length` means the sampler ran out of tokens: no stop token, no tool calls.

    `delay` (seconds) is slept asynchronously before answering; `logprob` overrides the policy's per-token one.
    """

    text: str
    stop_reason: Literal["stop", "length"] = "stop"
    routing_id: str | None = None
    delay: float = 0.0
    logprob: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"Completion.text must be a str; got {type(self.text).__name__}")
        if self.stop_reason not in ("stop", "length"):
            raise ValueError(f"Completion.stop_reason must be 'stop' or 'length'; got {self.stop_reason!r}")
        if self.delay < 0:
            raise ValueError(f"Completion.delay must be >= 0; got {self.delay!r}")


@dataclass(frozen=True)
class PolicyCall:
    """One call to the policy: the decoded prompt, the completion text, the sampling params, the completion and the
    sampled tokens (the stop token included when there is one); `prompt_tokens` is the exact prompt."""

    prompt: str
    text: str
    sampling_params: Any
    completion: Completion
    tokens: list[int]
    prompt_tokens: list[int] = field(default_factory=list)

    @property
    def last_user_message(self) -> str:
        return last_user_message(self.prompt)


def last_user_message(prompt: str) -> str:
    """The content of the prompt's last Qwen3 user turn (tool results are user turns too); "" if there is none."""
    start = prompt.rfind(_USER_OPEN)
    if start < 0:
        return ""
    body = prompt[start + len(_USER_OPEN) :]
    end = body.find(_TURN_END)
    return body if end < 0 else body[:end]


def tool_call(name: str, arguments: Mapping[str, Any] | None = None, /, **kwargs: Any) -> str:
    """The Qwen3 text of one tool call: `<tool_call>`, newline, `{"name", "arguments"}` JSON, newline, `</tool_call>`.

    Keyword arguments are added to (and override) `arguments`.
    """
    args = {**(arguments or {}), **kwargs}
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def rules(
    table: Mapping[str, str | Completion | Callable[[str], str | Completion]],
    *,
    default: str | Completion | Callable[[str], str | Completion] | None = None,
) -> Callable[[str], str | Completion]:
    """A script function answering by the first key (in table order) that the last user message starts with.

    A value may be a completion or a function of the prompt. With no match and no default the call fails with an
    `AssertionError` quoting the message.
    """
    entries = list(table.items())

    def answer(prompt: str) -> str | Completion:
        message = last_user_message(prompt)
        for prefix, value in entries:
            if message.startswith(prefix):
                return value(prompt) if callable(value) else value
        if default is None:
            raise AssertionError(f"no rule matches the last user message {message!r}")
        return default(prompt) if callable(default) else default

    return answer


def sample_response(
    tokens: Iterable[int],
    *,
    stop_reason: str = "stop",
    routing_id: str | None = None,
    logprob: float | None = -0.25,
) -> tinker.SampleResponse | PlainSample:
    """A Tinker `SampleResponse` with one sequence of `tokens`, each with log-probability `logprob` (a
    `PlainSample` when the Tinker SDK is not loaded: see the module docstring).

    The SDK's sequence model drops unknown fields, so a routing id is attached as an attribute (and kept as a
    field where workers patched the model to allow extras).
    """
    ids = [int(t) for t in tokens]
    logprobs = None if logprob is None else [float(logprob)] * len(ids)
    tinker = loaded_tinker()
    if tinker is None:
        sequence_id = f"scripted-{uuid.uuid4().hex}"
        plain = PlainSampledSequence(
            stop_reason, ids, logprobs, sequence_id=sequence_id, routing_id=routing_id
        )
        return PlainSample([plain])
    from pydantic import BaseModel

    sequence_type: Any = tinker.SampledSequence  # its fields depend on the SDK
    if issubclass(sequence_type, BaseModel):  # 0.16: a pydantic model of lists
        sequence = sequence_type(
            stop_reason=stop_reason,
            tokens=ids,
            logprobs=logprobs,
            **({"routing_id": routing_id} if routing_id is not None else {}),
        )
    else:  # 0.24 and later (0.38): a frozen dataclass of numpy arrays, with an id per sequence
        import numpy as np

        sequence = sequence_type(
            stop_reason=stop_reason,
            sequence_id=f"scripted-{uuid.uuid4().hex}",
            tokens_np=np.asarray(ids, dtype=np.int32),
            logprobs_np=None if logprobs is None else np.asarray(logprobs, dtype=np.float32),
        )
    if routing_id is not None and getattr(sequence, "routing_id", None) != routing_id:
        object.__setattr__(sequence, "routing_id", routing_id)
    return tinker.SampleResponse(sequences=[sequence])


class ScriptedPolicy:
    """A sampler that answers from a script (`sample_async`, and a blocking `sample`), in the Tinker SDK's shape.

    The script is a sequence of str/`Completion` consumed in order, or a function of the decoded prompt returning
    one. A completion that stops on `stop` gets the stop token appended (the tokenizer's EOS unless `stop_token`, an
    id or the token's text, is given); every token gets log-probability `logprob` unless the completion sets its own. When the sampling
    params give `max_tokens` and the completion is longer, it is cut there with stop reason `length`, as a real
    sampler would.
    """

    def __init__(
        self,
        script: Iterable[str | Completion] | Callable[[str], str | Completion] = (),
        *,
        tokenizer: Any = None,
        stop_token: int | str | None = None,
        logprob: float = -0.25,
    ) -> None:
        if isinstance(script, (str, bytes, Completion)):
            raise TypeError(
                "ScriptedPolicy's script is a sequence of completions or a function of the prompt, not a single "
                f"{type(script).__name__}: wrap it in a list"
            )
        self._function: Callable[[str], str | Completion] | None = None
        self._items: list[Completion] = []
        if callable(script):
            self._function = script
        else:
            self._items = [_as_completion(item, f"script item {i}") for i, item in enumerate(script)]
        if tokenizer is None:
            tokenizer = toy_tokenizer()
        self.tokenizer = tokenizer
        if stop_token is None:
            stop_token = getattr(tokenizer, "eos_token_id", None)
            if stop_token is None:
                raise ValueError("the tokenizer has no EOS token: give ScriptedPolicy a stop_token")
        elif isinstance(stop_token, str):  # 0.2.0 took the token's text
            ids = tokenizer.encode(stop_token, add_special_tokens=False)
            if len(ids) != 1:
                raise ValueError(f"stop_token {stop_token!r} is {len(ids)} tokens of the tokenizer, not one")
            stop_token = ids[0]
        self.stop_token = int(stop_token)
        self.logprob = float(logprob)
        self.calls: list[PolicyCall] = []
        self._next = 0
        #: (the tokenizer, whether its decoding concatenates): worked out again when `tokenizer` is replaced
        self._concatenation: tuple[Any, bool] = (None, False)

    @property
    def script(self) -> tuple[Completion, ...] | Callable[[str], str | Completion]:
        """The script: the completions (as `Completion`s) or the function."""
        return self._function if self._function is not None else tuple(self._items)

    @property
    def remaining(self) -> int | None:
        """How many scripted completions are left (None for a function script)."""
        return None if self._function is not None else len(self._items) - self._next

    @property
    def prompts(self) -> list[str]:
        """The decoded prompt of every call so far."""
        return [call.prompt for call in self.calls]

    # ---- the sampler interface -----------------------------------------------------------------------------

    async def sample_async(
        self,
        prompt: Any,
        num_samples: int = 1,
        sampling_params: Any = None,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> tinker.SampleResponse | PlainSample:
        """Answer the next scripted completion for `prompt` (a `ModelInput` or token ids)."""
        completion, response = self._answer(prompt, num_samples, sampling_params)
        if completion.delay:
            await asyncio.sleep(completion.delay)
        return response

    def sample(
        self,
        prompt: Any,
        num_samples: int = 1,
        sampling_params: Any = None,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> tinker.SampleResponse | PlainSample:
        """The blocking form of `sample_async` (the delay is slept in this thread)."""
        completion, response = self._answer(prompt, num_samples, sampling_params)
        if completion.delay:
            time.sleep(completion.delay)
        return response

    def _answer(
        self, prompt: Any, num_samples: int, sampling_params: Any
    ) -> tuple[Completion, tinker.SampleResponse | PlainSample]:
        if num_samples != 1:
            raise ValueError(f"ScriptedPolicy samples one sequence per call; got num_samples={num_samples}")
        prompt_tokens = _prompt_ids(prompt)
        text = self._decode_prompt(prompt_tokens)
        completion = self._completion_for(text)
        tokens = list(self.tokenizer.encode(completion.text, add_special_tokens=False))
        stop_reason: str = completion.stop_reason
        if stop_reason == "stop":
            tokens.append(self.stop_token)
        max_tokens = getattr(sampling_params, "max_tokens", None)
        if isinstance(max_tokens, int) and 0 <= max_tokens < len(tokens):
            tokens, stop_reason = tokens[:max_tokens], "length"
        self.calls.append(
            PolicyCall(text, completion.text, sampling_params, completion, tokens, prompt_tokens)
        )
        logprob = self.logprob if completion.logprob is None else completion.logprob
        response = sample_response(
            tokens, stop_reason=stop_reason, routing_id=completion.routing_id, logprob=logprob
        )
        return completion, response

    def _decode_prompt(self, ids: list[int]) -> str:
        """The prompt's text. A turn's prompt extends an earlier call's prompt (the same conversation, longer by a
        reply and a tool result), and an episode's first prompt shares its start (the system prompt, the tools)
        with other episodes' first prompts: with a byte-level tokenizer, whose text is the concatenation of its
        tokens' bytes, only the new tokens are decoded, and the text is what decoding the whole prompt gives.
        Otherwise (another decoder, or an earlier text ending in a cut character) the whole prompt is decoded."""
        tokenizer = self.tokenizer
        if self._concatenation[0] is not tokenizer:
            self._concatenation = (tokenizer, _concatenates(tokenizer))
        if not self._concatenation[1]:
            return str(tokenizer.decode(ids))
        decode = _plain_decode(tokenizer)
        for call in reversed(self.calls[-_REUSE_WINDOW:]):
            known = call.prompt_tokens
            size = len(known)
            if (
                0 < size <= len(ids)
                and ids[size - 1] == known[-1]
                and ids[:size] == known
                and not call.prompt.endswith("\ufffd")
            ):
                return call.prompt + decode(ids[size:])
        return _decode_from_shared_start(tokenizer, ids, decode)

    def _completion_for(self, prompt: str) -> Completion:
        call_number = len(self.calls) + 1
        if self._function is not None:
            return _as_completion(
                self._function(prompt), f"the script function's answer to call {call_number}"
            )
        if self._next >= len(self._items):
            raise ScriptExhaustedError(
                f"ScriptedPolicy: the script ran out at call {call_number} (it has {len(self._items)} "
                f"completions); the prompt ends with: {prompt[-_PROMPT_TAIL:]!r}"
            )
        completion = self._items[self._next]
        self._next += 1
        return completion


def _as_completion(value: Any, what: str) -> Completion:
    if isinstance(value, Completion):
        return value
    if isinstance(value, str):
        return Completion(value)
    raise TypeError(f"{what} must be a str or a Completion; got {type(value).__name__}")


#: how many earlier calls a prompt is compared with for a prefix (concurrent episodes on one policy interleave)
_REUSE_WINDOW = 64


def _plain_decode(tokenizer: Any) -> Callable[[list[int]], str]:
    """`tokenizer.decode` for a list of ints. platoon's own tokenizer is called past its wrapper, which converts
    every id with `int()` again (a tenth of a microsecond a token: a first prompt's thousand cost more than the
    decode); its decode is the backend's with special tokens kept, which this calls the same way."""
    if type(tokenizer) is TokenizersTokenizer:
        backend = tokenizer.backend_tokenizer.decode
        return lambda ids: str(backend(ids, skip_special_tokens=False))
    return lambda ids: str(tokenizer.decode(ids))


#: id(tokenizer) -> (a weak reference to it, the start its policies' first prompts share, that start's text, the
#: last prompt decoded whole): each episode's policy is new, so an episode's first prompt has no earlier call of its
#: own to extend, but its start (system prompt, tool listing) is the previous episode's
_shared_starts: dict[int, tuple[Any, list[int], str, list[int]]] = {}

#: a shared start shorter than this is not worth its extra decodes (the chat template's first tokens alone)
_SHARED_START_MIN_TOKENS = 32

#: how many tokenizers keep a shared start before the table is emptied (a process uses one or two)
_SHARED_STARTS_KEPT = 8


def _decode_from_shared_start(tokenizer: Any, ids: list[int], decode: Callable[[list[int]], str]) -> str:
    """`decode(ids)` of a concatenating tokenizer, reusing the text of the start that recent prompts shared.

    On a miss the whole prompt is decoded, and its common start with the last such prompt becomes the shared start
    when it is long enough, cut between whole characters, and its text plus the rest's is the whole text."""
    try:
        entry = _shared_starts.get(id(tokenizer))
        if entry is not None and entry[0]() is not tokenizer:
            entry = None  # a tokenizer gone, its id reused
        reference = entry[0] if entry is not None else weakref.ref(tokenizer)
    except TypeError:  # a tokenizer without weak references: nothing kept
        return decode(ids)
    start, start_text, last = (entry[1], entry[2], entry[3]) if entry is not None else ([], "", [])
    size = len(start)
    if 0 < size <= len(ids) and ids[size - 1] == start[-1] and ids[:size] == start:
        return start_text + decode(ids[size:])
    text = decode(ids)
    common = _common_start(ids, last)
    if common >= _SHARED_START_MIN_TOKENS:
        candidate = ids[:common]
        candidate_text = decode(candidate)
        if not candidate_text.endswith("\ufffd") and candidate_text + decode(ids[common:]) == text:
            start, start_text = candidate, candidate_text
    if len(_shared_starts) >= _SHARED_STARTS_KEPT and id(tokenizer) not in _shared_starts:
        _shared_starts.clear()
    _shared_starts[id(tokenizer)] = (reference, start, start_text, list(ids))
    return text


def _common_start(a: list[int], b: list[int]) -> int:
    """The length of the longest common start of two lists (a binary search over slice comparisons, in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _concatenates(tokenizer: Any) -> bool:
    """Whether decoding a token sequence is decoding its parts and joining the texts, at any cut between whole
    characters: true of byte-level BPE (GPT-2, Qwen, the toy tokenizer) with no clean-up of the decoded text;
    not of SentencePiece or WordPiece decoders, which treat the first token or the gaps between tokens apart."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    try:
        from tokenizers import decoders
    except ImportError:
        return False
    return isinstance(getattr(backend, "decoder", None), decoders.ByteLevel)


def _prompt_ids(prompt: Any) -> list[int]:
    if hasattr(prompt, "to_ints"):
        # a ModelInput's tokens are ints already (its chunks are typed so); converting each again cost more than
        # the rest of a scripted call
        return list(prompt.to_ints())
    if isinstance(prompt, Iterable) and not isinstance(prompt, (str, bytes)):
        return list(map(int, prompt))
    raise TypeError(f"the prompt must be a tinker ModelInput or token ids; got {type(prompt).__name__}")
