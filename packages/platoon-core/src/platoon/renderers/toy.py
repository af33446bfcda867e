"""The toy renderer: a platoon renderer over the toy tokenizer (byte-level ids plus the Qwen chat markers, no
download).

The toy tokenizer itself lives in `platoon.renderers.tokenizers`, which registers it as `platoon/toy`; its names
stay importable from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from platoon.renderers.base import get_renderer
from platoon.renderers.tokenizers import (
    MISSING_TOKENIZERS,
    TOY_MODEL_NAME,
    TOY_TOKENIZER_DIR,
    ToyTokenizerUnavailable,
    toy_tokenizer,
)

if TYPE_CHECKING:
    from platoon.renderers.base import Renderer

__all__ = [
    "MISSING_TOKENIZERS",
    "TOY_MODEL_NAME",
    "TOY_RENDERER_NAME",
    "TOY_TOKENIZER_DIR",
    "ToyTokenizerUnavailable",
    "toy_renderer",
    "toy_tokenizer",
]

TOY_RENDERER_NAME = "qwen3_instruct"


def toy_renderer(name: str = TOY_RENDERER_NAME) -> Renderer:
    """A platoon renderer over the toy tokenizer; the Qwen3 renderers are the ones it pairs with."""
    return get_renderer(name, toy_tokenizer())
