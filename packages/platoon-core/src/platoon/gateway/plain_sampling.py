"""A sampling request and answer in the Tinker SDK's shape, without the SDK: for samplers that are not its clients.

The gateway hands a sampler a prompt (`ModelInput`: chunks of token ids, `to_ints()`) and settings
(`SamplingParams`), and reads back a `SampleResponse` (`sequences`, each with `tokens`, `logprobs`, `stop_reason`).
When the Tinker SDK is loaded (a process that made an SDK client has loaded it), the gateway builds the SDK's own
types, since the sampler may be one of its clients. Otherwise no sampler can be, and the gateway builds these
instead, so an episode sampled by a scripted policy or another sampler of its own never imports the SDK (or torch,
which the SDK imports when it is installed). The fields are those of the SDK's types, read the same way.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PlainChunk",
    "PlainPrompt",
    "PlainSample",
    "PlainSampledSequence",
    "PlainSamplingParams",
    "loaded_tinker",
]


def loaded_tinker() -> Any:
    """The Tinker SDK if this process has imported it, else None (never imports it)."""
    return sys.modules.get("tinker")


@dataclass(frozen=True)
class PlainChunk:
    """One chunk of token ids (`tinker.EncodedTextChunk`)."""

    tokens: list[int]
    type: str = "encoded_text"

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class PlainPrompt:
    """A prompt of token chunks (`tinker.ModelInput`)."""

    chunks: list[PlainChunk]

    def to_ints(self) -> list[int]:
        return [token for chunk in self.chunks for token in chunk.tokens]

    @property
    def length(self) -> int:
        return sum(chunk.length for chunk in self.chunks)


@dataclass(frozen=True)
class PlainSamplingParams:
    """The settings of one sample (`tinker.SamplingParams`)."""

    max_tokens: int | None = None
    seed: int | None = None
    stop: Any = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0


@dataclass(frozen=True)
class PlainSampledSequence:
    """One sampled sequence (`tinker.SampledSequence`): its ids, their logprobs and why it stopped."""

    stop_reason: str
    tokens: list[int]
    logprobs: list[float] | None = None
    sequence_id: str | None = None
    routing_id: str | None = None


@dataclass(frozen=True)
class PlainSample:
    """A sampler's answer (`tinker.SampleResponse`)."""

    sequences: list[PlainSampledSequence] = field(default_factory=list)
