"""The toy tokenizer and the toy renderer: byte-level ids plus the Qwen chat markers, no download.

`toy_tokenizer()` loads the shipped files through `tokenizers` alone (no transformers import); the same directory
also loads with `transformers.AutoTokenizer.from_pretrained(TOY_TOKENIZER_DIR)`.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from platoon.errors import PlatoonError

if TYPE_CHECKING:
    from platoon.renderers.base import Renderer
    from platoon.renderers.tokenizers import TokenizersTokenizer

TOY_MODEL_NAME = "platoon/toy"
TOY_RENDERER_NAME = "qwen3_instruct"
TOY_TOKENIZER_DIR = Path(__file__).resolve().parent / "toy_tokenizer"
MISSING_TOKENIZERS = "the toy tokenizer needs the tokenizers package, which is not installed: pip install 'platoon-core[tinker]'"


class ToyTokenizerUnavailable(PlatoonError, ImportError):
    """`tokenizers` is missing (bare platoon-core); the message is one line naming the extra that brings it."""


@functools.cache
def toy_tokenizer() -> TokenizersTokenizer:
    """The toy tokenizer (one shared instance): 265 ids, EOS `<|im_end|>` (258), pad `<|endoftext|>` (256)."""
    from platoon.renderers.tokenizers import TokenizersTokenizer

    try:
        found = importlib.util.find_spec("tokenizers") is not None
    except (ImportError, ValueError):  # `sys.modules["tokenizers"] = None` and broken installs land here
        found = False
    if not found:
        raise ToyTokenizerUnavailable(MISSING_TOKENIZERS)

    return TokenizersTokenizer.from_directory(TOY_TOKENIZER_DIR, name_or_path=TOY_MODEL_NAME)


def toy_renderer(name: str = TOY_RENDERER_NAME) -> Renderer:
    """A platoon renderer over the toy tokenizer; the Qwen3 renderers are the ones it pairs with."""
    from platoon.renderers.base import get_renderer

    return get_renderer(name, toy_tokenizer())
