"""Renderers over one tokenizer share its table of encoded texts: a renderer made per episode starts warm, the
tokens are the same, and the table goes with its tokenizer."""

from __future__ import annotations

import gc
from typing import Any

from platoon.renderers import base
from platoon.renderers.base import get_renderer
from platoon.renderers.toy import toy_tokenizer

MESSAGES = [
    {"role": "system", "content": "You find hidden numbers."},
    {"role": "user", "content": "Guess the correct number between 1 and 100."},
]


class CountingTokenizer:
    """The toy tokenizer, counting its encode calls (a tokenizer object of its own)."""

    def __init__(self) -> None:
        self.inner = toy_tokenizer()
        self.encoded = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.encoded += 1
        return self.inner.encode(text, add_special_tokens=add_special_tokens)


def test_a_second_renderer_over_the_tokenizer_encodes_nothing_the_first_encoded():
    tokenizer = CountingTokenizer()
    first = get_renderer("qwen3_instruct", tokenizer).build_generation_prompt(MESSAGES)
    encoded = tokenizer.encoded
    assert encoded > 0
    second = get_renderer("qwen3_instruct", tokenizer).build_generation_prompt(MESSAGES)
    assert tokenizer.encoded == encoded
    assert second.to_ints() == first.to_ints()
    assert (
        first.to_ints()
        == get_renderer("qwen3_instruct", toy_tokenizer()).build_generation_prompt(MESSAGES).to_ints()
    )


def test_the_table_goes_with_its_tokenizer():
    tokenizer = CountingTokenizer()
    get_renderer("qwen3_instruct", tokenizer).build_generation_prompt(MESSAGES)
    assert tokenizer in base._ENCODINGS
    before = len(base._ENCODINGS)
    del tokenizer
    gc.collect()
    assert len(base._ENCODINGS) == before - 1


def test_a_tokenizer_that_cannot_be_weakly_referenced_keeps_a_table_per_renderer():
    class Slotted:
        __slots__ = ("encoded", "inner")

        def __init__(self) -> None:
            self.inner = toy_tokenizer()
            self.encoded = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            self.encoded += 1
            return self.inner.encode(text, add_special_tokens=add_special_tokens)

    tokenizer = Slotted()
    renderer = get_renderer("qwen3_instruct", tokenizer)
    prompt = renderer.build_generation_prompt(MESSAGES)
    encoded = tokenizer.encoded
    assert renderer.build_generation_prompt(MESSAGES).to_ints() == prompt.to_ints()
    assert tokenizer.encoded == encoded  # the renderer's own table
    get_renderer("qwen3_instruct", tokenizer).build_generation_prompt(MESSAGES)
    assert tokenizer.encoded == 2 * encoded
