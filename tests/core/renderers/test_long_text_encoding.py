"""Long texts are tokenized with the GIL released (`encode_batch_fast`) and give exactly the ids `encode` gives:
through platoon's `tokenizers` adapter, and through a transformers fast tokenizer's backend when it encodes as
transformers' own class does."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from platoon.renderers.tokenizers import LONG_TEXT_CHARS, TokenizersTokenizer, _plain_backend, encode_long

from .conftest import _real_tokenizer_dir


def _mixed_text(length: int) -> str:
    """Text with what tokenizers treat specially: special-token text, non-ASCII, combining marks, whitespace runs."""
    rng = random.Random(7)
    specials = ["<|im_start|>", "<|endoftext|>", "<|eot_id|>", "<|start|>"]
    pieces = [
        "word",
        " ",
        "  ",
        "\n",
        "\n\n",
        "北京",
        "é",
        "e\u0301",
        "🙂",
        "def f(x):\n    return x\n",
        *specials,
    ]
    out: list[str] = []
    size = 0
    while size < length:
        piece = rng.choice(pieces)
        out.append(piece)
        size += len(piece)
    return "".join(out)


def _tokenizer_dirs(qwen3_tokenizer_dir: Path) -> dict[str, Path]:
    return {
        "qwen3": qwen3_tokenizer_dir,
        **{n: _real_tokenizer_dir(n) for n in ("llama3", "deepseek_v3", "gpt_oss")},
    }


def test_the_adapter_encodes_long_texts_as_encode_does(qwen3_tokenizer_dir: Path):
    for name, directory in _tokenizer_dirs(qwen3_tokenizer_dir).items():
        tokenizer = TokenizersTokenizer.from_directory(directory)
        backend = tokenizer.backend_tokenizer
        for length in (LONG_TEXT_CHARS - 1, LONG_TEXT_CHARS, 100_000):
            text = _mixed_text(length)[:length]
            expected = backend.encode(text, add_special_tokens=False).ids
            assert tokenizer.encode(text) == expected, (name, length)
            assert encode_long(tokenizer, text) == expected, (name, length)


def test_a_transformers_fast_tokenizer_encodes_long_texts_through_its_backend(qwen3_tokenizer_dir: Path):
    transformers = pytest.importorskip("transformers")
    for name, directory in _tokenizer_dirs(qwen3_tokenizer_dir).items():
        if name == "deepseek_v3":  # AutoTokenizer mis-loads this directory (testdata/renders/index.json)
            continue
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), use_fast=True)
        tokenizer.model_max_length = 10**9  # no too-long warning
        assert _plain_backend(tokenizer) is not None, name
        text = _mixed_text(100_000)
        assert encode_long(tokenizer, text) == tokenizer.encode(text, add_special_tokens=False), name


def test_a_tokenizer_that_encodes_its_own_way_keeps_its_encode(qwen3_tokenizer_dir: Path):
    transformers = pytest.importorskip("transformers")
    base = type(transformers.AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir), use_fast=True))

    class Shouting(base):  # type: ignore[misc, valid-type]
        def encode(self, text: str, *args: Any, **kwargs: Any) -> Any:
            return super().encode(text.upper(), *args, **kwargs)

    tokenizer = Shouting.from_pretrained(str(qwen3_tokenizer_dir))
    assert _plain_backend(tokenizer) is None
    assert encode_long(tokenizer, "quiet " * 2000) == tokenizer.encode(
        "QUIET " * 2000, add_special_tokens=False
    )
    plain = transformers.AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir), use_fast=True)
    plain.backend_tokenizer.enable_truncation(16)  # a backend setting transformers would undo for an encode
    assert _plain_backend(plain) is None


def test_a_long_message_renders_the_same_through_either_tokenizer(qwen3_tokenizer_dir: Path):
    transformers = pytest.importorskip("transformers")
    from platoon.renderers.base import get_renderer

    hf = transformers.AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir), use_fast=True)
    hf.model_max_length = 10**9
    adapter = TokenizersTokenizer.from_directory(qwen3_tokenizer_dir)
    messages = [{"role": "user", "content": _mixed_text(50_000)}]
    rendered = get_renderer("qwen3_instruct", adapter).render_prompt(messages)
    assert get_renderer("qwen3_instruct", hf).render_prompt(messages) == rendered
    assert rendered[-3:] == adapter.encode("<|im_start|>assistant\n")[-3:]
