"""A checkpoint written by transformers' own `save_pretrained` (bfloat16, tied or untied head) loads on both engines
and computes what transformers' `from_pretrained` model computes.

Tolerance: logprobs within 1e-4 absolute (float32 on both sides, different summation orders).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from platoon.local_server.backend import ModelBackend
from platoon.renderers.toy import TOY_TOKENIZER_DIR

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = [257, *b"user\nPick a letter.", 258, 10, 257, *b"assistant\nB"]


def saved_by_transformers(directory: Path, *, tied: bool) -> None:
    """A tiny random Qwen3 saved as transformers saves one (its vocabulary past the toy tokenizer's 265)."""
    config = transformers.Qwen3Config(
        vocab_size=272,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        tie_word_embeddings=tied,
        rope_theta=1_000_000.0,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config)
    with torch.no_grad():  # livelier than the 0.02 initialisation, so every layer matters
        for param in model.parameters():
            param.mul_(10 if param.ndim == 2 else 1).add_(0 if param.ndim == 2 else 0.1)
    model.to(torch.bfloat16).save_pretrained(directory)
    for file in TOY_TOKENIZER_DIR.iterdir():
        shutil.copy(file, directory / file.name)


@pytest.mark.parametrize("tied", [True, False], ids=["tied-head", "own-head"])
@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_both_engines_compute_what_transformers_computes_from_its_checkpoint(
    tmp_path: Path, engine: str, tied: bool
) -> None:
    directory = tmp_path / "qwen3"
    saved_by_transformers(directory, tied=tied)
    assert (directory / "model.safetensors").is_file()
    reference = transformers.Qwen3ForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([PROMPT[:-1]])).logits[0]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(PROMPT[1:])[:, None])[:, 0].numpy()

    backend = ModelBackend.create(str(directory), engine=engine)
    assert backend.engine.dims.tie_word_embeddings is tied
    computed = backend.engine.logprobs([PROMPT[:-1]], [np.array(PROMPT[1:])])[0]
    np.testing.assert_allclose(computed, expected, atol=1e-4)
    assert expected.std() > 0.1  # the model is far from uniform, so the comparison means something
