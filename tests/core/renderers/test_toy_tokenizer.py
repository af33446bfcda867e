"""The shipped toy tokenizer: its files, its encode/decode examples, and how it loads.

The examples come from testdata/renders/toy-tokenizer.json (read in place); the files must load with
`tokenizers.Tokenizer.from_file`, with `transformers.AutoTokenizer.from_pretrained(dir)` offline, and through
platoon's registry as `platoon/toy` without importing transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from platoon.renderers import get_tokenizer
from platoon.testing import TOY_MODEL_NAME, TOY_RENDERER_NAME, TOY_TOKENIZER_DIR, toy_renderer, toy_tokenizer

REPO = Path(__file__).resolve().parents[3]


@cache
def toy_spec() -> dict[str, Any]:
    for base in (
        os.environ.get("PLATOON_TESTDATA"),
        REPO / "shared" / "testdata",
        REPO.parent / "shared" / "testdata",
    ):
        if base and (Path(base) / "renders" / "toy-tokenizer.json").is_file():
            return json.loads((Path(base) / "renders" / "toy-tokenizer.json").read_text("utf-8"))
    raise FileNotFoundError(
        "shared/testdata/renders/toy-tokenizer.json is not beside the repository: set PLATOON_TESTDATA"
    )


def _spec() -> dict[str, Any]:
    spec = toy_spec()
    assert spec is not None
    return spec


def _examples(key: str) -> list[Any]:
    spec = toy_spec()
    return [] if spec is None else spec[key]


def test_names_and_directory():
    assert TOY_MODEL_NAME == "platoon/toy"
    assert TOY_RENDERER_NAME == "qwen3_instruct"
    assert sorted(p.name for p in TOY_TOKENIZER_DIR.glob("*.json")) == [
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert sum(p.stat().st_size for p in TOY_TOKENIZER_DIR.glob("*.json")) < 8000  # "about 7 KB"


def test_shipped_files_are_byte_identical_to_platoon_0_2_0():
    files = _spec()["files"]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        digest = hashlib.sha256((TOY_TOKENIZER_DIR / name).read_bytes()).hexdigest()
        assert digest == files[f"{name}_sha256"], name
    assert (
        json.loads((TOY_TOKENIZER_DIR / "tokenizer_config.json").read_text())
        == files["tokenizer_config.json"]
    )


def test_build_script_regenerates_the_shipped_files(tmp_path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("toy_build", REPO / "scripts" / "build_toy_tokenizer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (TOY_TOKENIZER_DIR / name).read_bytes(), name


def test_adapter_attributes():
    tok = toy_tokenizer()
    assert tok is toy_tokenizer() and get_tokenizer("platoon/toy") is tok
    assert tok.name_or_path == "platoon/toy"
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 258)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 256)
    assert tok.bos_token is None and tok.bos_token_id is None and tok.unk_token is None
    assert tok.model_max_length == 1048576
    assert len(tok) == 265 and tok.vocab_size == 256
    assert tok.convert_tokens_to_ids("<|im_start|>") == 257
    assert tok.convert_tokens_to_ids(["<think>", "</think>", "nope"]) == [263, 264, None]
    assert tok.all_special_ids == [256, 257, 258]
    assert tok.decode(258) == "<|im_end|>"


def test_vocabulary_matches_the_spec():
    spec = _spec()
    tok = toy_tokenizer()
    assert tok.convert_ids_to_tokens(list(range(256))) == spec["byte_level_alphabet"]
    for added in spec["added_tokens"]:
        assert tok.convert_tokens_to_ids(added["content"]) == added["id"]
        assert (added["id"] in tok.all_special_ids) is added["special"]
    assert tok.decode(spec["out_of_range_id"]["ids"]) == spec["out_of_range_id"]["decode"]["value"]
    assert (
        tok.convert_ids_to_tokens(spec["out_of_range_id"]["ids"])
        == spec["out_of_range_id"]["convert_ids_to_tokens"]["value"]
    )


@pytest.mark.parametrize("example", _examples("encode_examples"), ids=lambda e: repr(e["text"])[:40])
def test_encode_examples(example: dict[str, Any]):
    tok = toy_tokenizer()
    assert tok.encode(example["text"], add_special_tokens=False) == example["ids"]
    assert tok.encode(example["text"], add_special_tokens=True) == example["ids_add_special_tokens"]
    assert tok.convert_ids_to_tokens(example["ids"]) == example["tokens"]
    assert tok.decode(example["ids"]) == example["text"]


@pytest.mark.parametrize("example", _examples("decode_examples"), ids=lambda e: e["name"])
def test_decode_examples_including_invalid_utf8(example: dict[str, Any]):
    tok = toy_tokenizer()
    assert tok.decode(example["ids"]) == example["decode"]["value"]
    assert (
        tok.decode(example["ids"], skip_special_tokens=True) == example["decode_skip_special_tokens"]["value"]
    )


def test_decode_takes_token_ids_in_any_form_int_takes():
    # A plain list of ints goes to the backend as it is; other forms are read as `int()` reads them.
    tok = toy_tokenizer()
    ids = tok.encode("Guess 42, then 17.")
    text = tok.decode(ids)
    assert text == "Guess 42, then 17."
    for form in (tuple(ids), [float(i) for i in ids], [str(i) for i in ids], iter(ids)):
        assert tok.decode(form) == text
    assert tok.decode(ids[0]) == tok.decode(ids[:1])
    with pytest.raises(OverflowError):
        tok.decode([*ids, -1])


def test_loads_with_tokenizers_from_file():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOY_TOKENIZER_DIR / "tokenizer.json"))
    assert tok.encode("<|im_start|>user\nhi<|im_end|>\n", add_special_tokens=False).ids == [
        257, 117, 115, 101, 114, 10, 104, 105, 258, 10,
    ]  # fmt: skip
    assert tok.get_vocab_size(with_added_tokens=True) == 265


def test_loads_with_auto_tokenizer_offline(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(TOY_TOKENIZER_DIR))
    toy = toy_tokenizer()
    assert (auto.eos_token_id, auto.pad_token_id, auto.bos_token) == (258, 256, None)
    assert auto.model_max_length == 1048576 and len(auto) == 265
    for text in ["x<|im_end|>y", "Café naïve 日本語 👋🏽", "<tool_call>{}</tool_call>", "  spaces  \r\n\t"]:
        assert auto.encode(text, add_special_tokens=False) == toy.encode(text)
    ids = [230, 258, 151, 165, 104, 230, 151]
    assert auto.decode(ids) == toy.decode(ids) == "\ufffd<|im_end|>\ufffd\ufffdh\ufffd"


def test_get_tokenizer_of_a_local_directory_uses_auto_tokenizer(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = get_tokenizer(str(TOY_TOKENIZER_DIR))
    assert type(tok).__module__.startswith("transformers")
    assert tok.encode("a<|im_end|>b", add_special_tokens=False) == [97, 258, 98]


def test_toy_loads_without_transformers_or_tinker(run_python: Any):
    code = (
        "import sys\n"
        "from platoon.renderers import get_tokenizer, get_renderer\n"
        "tok = get_tokenizer('platoon/toy')\n"
        "ids = get_renderer('qwen3_instruct', tok).render_prompt([{'role': 'user', 'content': 'hi'}])\n"
        "assert ids[-1] == 10 and ids[0] == 257, ids\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'transformers', 'tinker', 'torch'}))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_toy_renderer():
    renderer = toy_renderer()
    assert renderer.name == "qwen3_instruct" and renderer.tokenizer is toy_tokenizer()
    assert toy_renderer("qwen3").name == "qwen3"
    assert renderer.stop_token_ids() == [258]
