"""A Hugging Face Qwen3 checkpoint directory as the local server's base model (numpy engine, the real tinker SDK).

The checkpoints here are written by the test in the format transformers' `save_pretrained` leaves: `config.json`,
bfloat16 safetensors (one file, or shards with `model.safetensors.index.json`) and the tokenizer's files. The torch
engine and transformers' own reading of a checkpoint it wrote are in test_pretrained_torch.py.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tinker import types

from platoon.gateway import tinker_sdk
from platoon.local_server.backend import ModelBackend
from platoon.local_server.pretrained import CheckpointError, checkpoint_problem, load_checkpoint
from platoon.local_server.qwen3_numpy import Qwen3Dims, Qwen3Numpy, initial_weights
from platoon.renderers.toy import TOY_TOKENIZER_DIR

#: the toy tokenizer has 265 tokens; like Qwen3's, the model's vocabulary is rounded up past them
DIMS = Qwen3Dims(
    vocab_size=272,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=24,
    rope_theta=1_000_000.0,
    tie_word_embeddings=False,
)
PROMPT = [257, *b"user\nPick a letter.", 258, 10, 257, *b"assistant\n"]


def config_json(dims: Qwen3Dims, **overrides: Any) -> dict[str, Any]:
    """A config.json as transformers 4.5x writes a Qwen3's."""
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": dims.vocab_size,
        "hidden_size": dims.hidden_size,
        "num_hidden_layers": dims.num_hidden_layers,
        "num_attention_heads": dims.num_attention_heads,
        "num_key_value_heads": dims.num_key_value_heads,
        "head_dim": dims.head_dim,
        "intermediate_size": dims.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": dims.rms_norm_eps,
        "rope_theta": dims.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": dims.max_position_embeddings,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": dims.tie_word_embeddings,
        "torch_dtype": "bfloat16",
    }
    return {**config, **overrides}


def bfloat16_bytes(array: np.ndarray) -> bytes:
    """float32 rounded to the nearest bfloat16 (ties to even), as torch's `.to(torch.bfloat16)` rounds."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def widened(array: np.ndarray) -> np.ndarray:
    """What a bfloat16 value reads back as in float32."""
    return (
        (np.frombuffer(bfloat16_bytes(array), "<u2").astype(np.uint32) << 16)
        .view(np.float32)
        .reshape(array.shape)
    )


def write_safetensors(path: Path, weights: dict[str, np.ndarray]) -> None:
    """A bfloat16 safetensors file, written by hand (numpy, and so `safetensors.numpy`, has no bfloat16)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, array in weights.items():
        blob = bfloat16_bytes(array)
        header[name] = {
            "dtype": "BF16",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format pads the header to 8 bytes
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def write_checkpoint(
    directory: Path, dims: Qwen3Dims = DIMS, *, shards: int = 1, seed: int = 3, **config: Any
) -> dict[str, np.ndarray]:
    """A checkpoint directory with the toy tokenizer; returns its weights as float32 reads them back."""
    directory.mkdir(parents=True)
    for file in TOY_TOKENIZER_DIR.iterdir():
        shutil.copy(file, directory / file.name)
    (directory / "config.json").write_text(json.dumps(config_json(dims, **config)))
    weights = {name: value * np.float32(10) for name, value in initial_weights(dims, seed).items()}
    names = list(weights)
    if shards == 1:
        write_safetensors(directory / "model.safetensors", weights)
    else:
        weight_map = {}
        for shard in range(shards):
            file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
            part = names[shard::shards]
            write_safetensors(directory / file, {name: weights[name] for name in part})
            weight_map |= dict.fromkeys(part, file)
        index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return {name: widened(value) for name, value in weights.items()}


@pytest.mark.parametrize("shards", [1, 3], ids=["one-file", "sharded"])
def test_a_bfloat16_checkpoint_with_its_own_head_loads_as_stored(tmp_path: Path, shards: int) -> None:
    stored = write_checkpoint(tmp_path / "qwen3-tiny", shards=shards)
    backend = ModelBackend.create(str(tmp_path / "qwen3-tiny"))
    assert backend.engine.dims == DIMS  # the config's sizes, not the toy model's
    assert backend.info()["note"].startswith(
        f"platoon local server: the Qwen3 checkpoint in {tmp_path / 'qwen3-tiny'};"
    )
    loaded = backend.engine.weights()
    assert list(loaded) == list(stored) and "lm_head.weight" in loaded
    for name, value in stored.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    # the untied head is what the logits come from: a model that used the embedding instead would differ
    reference = Qwen3Numpy(DIMS, stored).logprobs([PROMPT[:-1]], [np.array(PROMPT[1:])])[0]
    tied = Qwen3Numpy(
        Qwen3Dims(**{**vars(DIMS), "tie_word_embeddings": True}),
        {k: v for k, v in stored.items() if k != "lm_head.weight"},
    ).logprobs([PROMPT[:-1]], [np.array(PROMPT[1:])])[0]
    computed = backend.engine.logprobs([PROMPT[:-1]], [np.array(PROMPT[1:])])[0]
    np.testing.assert_allclose(computed, reference, atol=1e-6)
    assert np.abs(computed - tied).max() > 0.1


def test_the_sdk_trains_samples_and_checkpoints_a_loaded_checkpoint(tmp_path: Path, server, service) -> None:
    directory = tmp_path / "qwen3-tiny"
    write_checkpoint(directory)
    client = tinker_sdk.made(service.create_lora_training_client(base_model=str(directory), rank=8))
    info = client.get_info()
    assert info.model_data.model_name == str(directory)
    tokens = [*PROMPT, *b"B"]
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [0.0] * (len(PROMPT) - 1) + [1.0]},
    )
    before = client.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data[-1]
    after = before
    for _ in range(20):  # until "B" is the likeliest next token
        client.forward_backward([datum], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        after = client.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data[-1]
        if after > np.log(0.5):
            break
    assert before < np.log(0.5) < after  # the checkpoint's weights train

    sampler = tinker_sdk.made(client.save_weights_and_get_sampling_client())
    result = sampler.sample(
        types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=1, temperature=0.0)
    ).result()
    assert result.sequences[0].tokens == [ord("B")]  # greedy, after training towards "B"
    # a fresh training client from the saved state holds the trained weights
    state = client.save_state(name="state").result().path
    restored = tinker_sdk.made(service.create_training_client_from_state(state))
    again = restored.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data[-1]
    assert again == pytest.approx(after, abs=1e-6)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"model_type": "llama"}, "model_type 'llama'; the local server loads Qwen3 checkpoints"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            "RoPE scaling 'yarn', which the local server",
        ),
        ({"attention_bias": True}, "attention_bias true, which the local server's Qwen3 does not compute"),
        ({"hidden_size": None}, "int\\(\\) argument must be"),
        ({"num_hidden_layers": "two"}, "invalid literal"),
    ],
    ids=["llama", "yarn", "bias", "no-size", "bad-size"],
)
def test_a_config_the_local_model_does_not_compute_is_refused_in_one_line(
    tmp_path: Path, edit: dict[str, Any], message: str
) -> None:
    directory = tmp_path / "model"
    write_checkpoint(directory, **edit)
    problem = checkpoint_problem(str(directory))
    assert problem is not None and problem.startswith(f"{directory / 'config.json'}: ")
    assert "\n" not in problem
    with pytest.raises(CheckpointError, match=message):
        ModelBackend.create(str(directory))


def _bad_weights(directory: Path, change: str) -> None:
    if change == "escaping-shard":
        index = {
            "weight_map": {"model.embed_tokens.weight": "model.safetensors", "x": "../model.safetensors"}
        }
        (directory / "model.safetensors.index.json").write_text(json.dumps(index))
        (directory / "model.safetensors").unlink()
    elif change == "shape":
        write_safetensors(
            directory / "model.safetensors",
            initial_weights(Qwen3Dims(**{**vars(DIMS), "hidden_size": 8, "head_dim": 4}), 0),
        )
    else:
        (directory / "model.safetensors").write_bytes(b"not a safetensors file")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("escaping-shard", "names '../model.safetensors', which is not a file beside it"),
        ("shape", "has shape \\(272, 8\\), expected \\(272, 16\\)"),
        ("garbage", "not a readable safetensors file"),
    ],
)
def test_weights_that_do_not_fit_the_config_are_refused_naming_what(
    tmp_path: Path, change: str, message: str
) -> None:
    directory = tmp_path / "model"
    write_checkpoint(directory)
    _bad_weights(directory, change)
    with pytest.raises(CheckpointError, match=message) as raised:
        load_checkpoint(directory)
    assert "\n" not in str(raised.value)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "model"
    write_checkpoint(directory, Qwen3Dims(**{**vars(DIMS), "vocab_size": 200}))
    with pytest.raises(
        CheckpointError, match="its tokenizer has 265 tokens, more than the model's vocabulary of 200"
    ):
        ModelBackend.create(str(directory))


def test_config_validate_refuses_a_checkpoint_the_local_server_cannot_load(tmp_path: Path) -> None:
    directory = tmp_path / "model"
    write_checkpoint(directory, model_type="mistral")
    config = tmp_path / "train.yaml"
    repo = Path(__file__).resolve().parents[3]
    config.write_text(
        f"extends: {repo / 'examples' / 'bandit' / 'train.yaml'}\n"
        f"log_path: {tmp_path / 'runs'}\n"
        f"train:\n  model_name: {directory}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "platoon", "config", "validate", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 78, output
    assert f"train.model_name: {directory / 'config.json'}: model_type 'mistral'" in output
    assert "Traceback" not in output
