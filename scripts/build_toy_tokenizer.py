"""Writes the toy tokenizer's `tokenizer.json` and `tokenizer_config.json` into platoon-core.

Run `uv run python scripts/build_toy_tokenizer.py` after changing it; the generated files are committed and shipped
in the package (this script is not: it lives outside the package so the wheel carries no build code). The output is
byte-identical to platoon 0.2.0's files (sha256 in testdata/renders/toy-tokenizer.json).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: (content, special) for ids 256..264
ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "unk_token": None,
    "clean_up_tokenization_spaces": False,
    "model_max_length": 1048576,
}


def byte_level_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode: the vocabulary string of each byte, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    alphabet: list[str] = []
    extra = 0
    for byte in range(256):
        if byte in printable:
            alphabet.append(chr(byte))
        else:
            alphabet.append(chr(256 + extra))
            extra += 1
    return alphabet


def build(directory: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    # Byte i is id i and there are no merges, so any text round-trips and ASCII ids are character codes.
    vocab = {symbol: i for i, symbol in enumerate(byte_level_alphabet())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.decoder = decoders.ByteLevel()
    for content, special in ADDED_TOKENS:
        token = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False)
        if special:
            tokenizer.add_special_tokens([token])
        else:
            tokenizer.add_tokens([token])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(CONFIG, indent=2) + "\n", encoding="utf-8")


#: where platoon-core ships the files (`platoon.renderers.toy.TOY_TOKENIZER_DIR`)
PACKAGE_DIR = (
    Path(__file__).resolve().parents[1] / "packages/platoon-core/src/platoon/renderers/toy_tokenizer"
)

if __name__ == "__main__":
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE_DIR)
