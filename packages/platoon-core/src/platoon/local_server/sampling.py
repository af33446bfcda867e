"""Sampling for the local server: a batched KV-cache decode loop with temperature, top-k, top-p, seed and stops,
in numpy over any engine's prefill and step, so one seed gives the same tokens on every engine whose logits agree.

Returned logprobs are those of the distribution actually sampled from (`log_softmax(logits / T)` after the top-k
and top-p masks), so on-policy importance ratios are 1 at temperature 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from platoon.local_server.inflight import raise_if_cancelled

if TYPE_CHECKING:
    from platoon.local_server.engines import Engine

#: below this temperature sampling is greedy (the distribution is a point mass, logprob 0)
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """`SamplingParams` with the 0.16 defaults filled in (the SDK omits fields left at their default)."""

    max_tokens: int | None = None
    seed: int | None = None
    stop_tokens: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0

    @classmethod
    def parse(cls, params: dict[str, Any] | None, encode: Callable[[str], list[int]]) -> SamplingParams:
        """Read a request's `sampling_params`; a stop string of one token becomes a stop token."""
        params = params or {}
        stop = params.get("stop")
        stop_tokens: set[int] = set()
        stop_strings: list[str] = []
        for item in [stop] if isinstance(stop, str | int) else (stop or []):
            if isinstance(item, bool) or not isinstance(item, str | int):
                raise ValueError(f"a stop entry must be a token id or a string, not {item!r}")
            if isinstance(item, int):
                stop_tokens.add(item)
            elif item:
                ids = encode(item)
                if len(ids) == 1:
                    stop_tokens.add(ids[0])
                else:
                    stop_strings.append(item)
        max_tokens = params.get("max_tokens")
        if max_tokens is not None and int(max_tokens) < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        temperature = float(_default(params, "temperature", 1.0))
        if not 0 <= temperature < float("inf"):  # NaN too
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
        top_p = float(_default(params, "top_p", 1.0))
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        seed = params.get("seed")
        return cls(
            max_tokens=None if max_tokens is None else int(max_tokens),
            seed=None if seed is None else int(seed),
            stop_tokens=frozenset(stop_tokens),
            stop_strings=tuple(stop_strings),
            temperature=temperature,
            top_k=int(_default(params, "top_k", -1)),
            top_p=top_p,
        )


def _default(params: dict[str, Any], key: str, default: float) -> Any:
    # An explicit null means the default, as an omitted field does.
    value = params.get(key)
    return default if value is None else value


def sampling_logprobs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Log-probabilities of the sampling distribution for rows of raw logits: temperature, then top-k, top-p."""
    scaled = np.asarray(logits, dtype=np.float32) / np.float32(params.temperature)
    vocab = scaled.shape[-1]
    if 0 < params.top_k < vocab:
        kth = -np.partition(-scaled, params.top_k - 1, axis=-1)[..., params.top_k - 1 : params.top_k]
        scaled = np.where(scaled < kth, -np.inf, scaled).astype(np.float32)
    if params.top_p < 1.0:
        probs = _softmax(scaled)
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is below top_p
        # (so the most likely token always stays).
        before = np.cumsum(sorted_probs, axis=-1) - sorted_probs
        drop = np.empty_like(before, dtype=bool)
        np.put_along_axis(drop, order, before >= params.top_p, axis=-1)
        scaled = np.where(drop, -np.inf, scaled).astype(np.float32)
    return log_softmax(scaled)


def log_softmax(values: np.ndarray) -> np.ndarray:
    """log_softmax over the last axis, in float32."""
    shifted = values - values.max(axis=-1, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))).astype(np.float32)


def _softmax(values: np.ndarray) -> np.ndarray:
    return np.exp(log_softmax(values))


def pick(
    logits: np.ndarray, params: SamplingParams, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """One token per row and its logprob under the sampling distribution."""
    if params.temperature < GREEDY_TEMPERATURE:
        tokens = np.argmax(logits, axis=-1)
        return tokens, np.zeros(tokens.shape, dtype=np.float32)
    logprobs = sampling_logprobs(logits, params)
    # Inverse transform sampling, one uniform draw per row: a token of probability 0 is never picked.
    cumulative = np.cumsum(np.exp(logprobs.astype(np.float64)), axis=-1)
    draws = rng.random(len(logprobs)) * cumulative[:, -1]
    tokens = np.minimum((cumulative <= draws[:, None]).sum(axis=-1), logprobs.shape[-1] - 1)
    return tokens, np.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]


@dataclass
class Sequence:
    """One sample being decoded."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: str | None = None

    def body(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "logprobs": self.logprobs, "stop_reason": self.stop_reason or "length"}


def decode(
    engine: Engine,
    prompt_tokens: list[int],
    *,
    num_samples: int,
    params: SamplingParams,
    max_context: int,
    decode_text: Callable[[list[int]], str],
    prompt_logits: Callable[[np.ndarray], None] | None = None,
) -> list[Sequence]:
    """Sample `num_samples` continuations of one prompt with a shared, batched KV cache.

    The prompt is run once at batch size 1 (its logits are handed to `prompt_logits` for prompt logprobs) and the
    cache is then repeated for the samples. Finished samples keep decoding in the batch but record nothing. A
    cancelled request (`/cancel_future`) stops before its next token.
    """
    if not prompt_tokens:
        raise ValueError("the prompt is empty: sampling needs at least one prompt token")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    room = max_context - len(prompt_tokens)
    if room < 0:
        raise ValueError(
            f"the prompt has {len(prompt_tokens)} tokens, over the model's context of {max_context}"
        )
    max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
    rng = np.random.default_rng(params.seed)

    sequences = [Sequence() for _ in range(num_samples)]
    logits, cache = engine.prefill(prompt_tokens)
    if prompt_logits is not None:
        prompt_logits(logits)
    if max_tokens == 0:
        return sequences
    cache = engine.repeat(cache, num_samples)
    next_logits = np.repeat(logits[-1:], num_samples, axis=0)
    open_rows = list(range(num_samples))
    for step in range(max_tokens):
        raise_if_cancelled()
        tokens, logprobs = pick(next_logits, params, rng)
        token_list, logprob_list = tokens.tolist(), logprobs.tolist()
        still_open = []
        for row in open_rows:
            seq = sequences[row]
            seq.tokens.append(token_list[row])
            seq.logprobs.append(logprob_list[row])
            if token_list[row] in params.stop_tokens or (
                params.stop_strings and _ends_with_stop(seq.tokens, params.stop_strings, decode_text)
            ):
                seq.stop_reason = "stop"
            else:
                still_open.append(row)
        open_rows = still_open
        if not open_rows or step == max_tokens - 1:
            break
        next_logits, cache = engine.step(cache, tokens)
    return sequences


def _ends_with_stop(
    tokens: list[int], stops: tuple[str, ...], decode_text: Callable[[list[int]], str]
) -> bool:
    # Stop strings need incremental detokenisation: decode a tail long enough to hold the longest stop
    # (every token decodes to at least one character or a partial byte).
    tail = decode_text(tokens[-4 * max(len(s) for s in stops) :])
    return any(stop in tail for stop in stops)
