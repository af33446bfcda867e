"""Where the golden renders live (`renders_dir`, shared by the golden test modules), and the real Qwen3
tokenizer checked against the index. The golden cases themselves run in `test_golden_renders_more.py`.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
RENDERERS = ["qwen3", "qwen3_instruct", "qwen3_disable_thinking", "qwen3_vl", "qwen3_vl_instruct"]
TOKENIZERS = {"toy": "toy", "qwen3": "real_qwen3"}  # golden file suffix -> test id prefix


@cache
def renders_dir() -> Path:
    """`shared/testdata/renders`: under $PLATOON_TESTDATA, else in the repository, else beside it."""
    for base in (
        os.environ.get("PLATOON_TESTDATA"),
        REPO / "shared" / "testdata",
        REPO.parent / "shared" / "testdata",
    ):
        if base and (Path(base) / "renders" / "index.json").is_file():
            return Path(base).resolve() / "renders"
    raise FileNotFoundError(
        "the golden renders (shared/testdata/renders) are not beside the repository: set PLATOON_TESTDATA"
    )


@cache
def golden(renderer: str, tokenizer: str) -> dict[str, Any]:
    directory = renders_dir()
    return json.loads((directory / f"{renderer}--{tokenizer}.json").read_text("utf-8"))


def test_real_qwen3_tokenizer_matches_the_index(qwen3_tokenizer: Any) -> None:
    directory = renders_dir()
    assert directory is not None
    index = json.loads((directory / "index.json").read_text("utf-8"))["tokenizers"]["qwen3"]
    assert qwen3_tokenizer.eos_token_id == index["eos_token_id"]
    assert len(qwen3_tokenizer) == index["vocab_size"]
    for example in index["encode_examples"]:
        assert qwen3_tokenizer.encode(example["text"]) == example["ids"]
        assert qwen3_tokenizer.decode(example["ids"]) == example["decoded"]
    for marker, ids in index["marker_encodings"].items():
        assert qwen3_tokenizer.encode(marker) == ids, marker
