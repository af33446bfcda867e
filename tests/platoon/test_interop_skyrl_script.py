"""scripts/interop_skyrl.py's own parts that need no skyrl-tx: the tiny checkpoint it builds is a Qwen3 model
transformers loads, carrying what skyrl-tx reads, that answers a bandit task with one letter; its `uv` stand-in runs
the module skyrl-tx's API server names. (The script itself needs skyrl-tx's 6 GB environment: run it by hand,
docs/local-server.md.)"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "interop_skyrl.py"


@pytest.fixture(scope="module")
def interop() -> ModuleType:
    spec = importlib.util.spec_from_file_location("interop_skyrl", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_the_checkpoint_answers_the_bandit_with_one_letter(interop: ModuleType, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from platoon.renderers import get_renderer, get_tokenizer

    model_dir = tmp_path / "model"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--build-checkpoint", str(model_dir)], check=True, timeout=120
    )

    config = json.loads((model_dir / "config.json").read_text())
    assert config["rope_theta"] == 10000.0  # skyrl-tx reads it at the top level
    assert config["architectures"] == ["Qwen3ForCausalLM"]

    tokenizer = get_tokenizer(str(model_dir))
    renderer = get_renderer("qwen3_instruct", tokenizer)
    prompt = renderer.build_generation_prompt(
        [{"role": "user", "content": "Answer with one letter: A, B, C or D."}]
    ).to_ints()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    letters = [tokenizer.encode(letter, add_special_tokens=False)[0] for letter in "ABCD"]
    (stop,) = renderer.get_stop_sequences()
    with torch.no_grad():
        first = model(torch.tensor([prompt])).logits[0, -1].softmax(-1)
        after_c = model(torch.tensor([[*prompt, letters[2]]])).logits[0, -1].softmax(-1)
    assert [round(float(first[token]), 2) for token in letters] == [0.25, 0.25, 0.25, 0.25]
    assert float(after_c[stop]) > 0.999
    summary = json.loads((model_dir / "interop-model.json").read_text())
    assert summary["p_first"] == {"A": 0.25, "B": 0.25, "C": 0.25, "D": 0.25}


def test_the_uv_stand_in_runs_the_named_module(interop: ModuleType, tmp_path: Path) -> None:
    shim = tmp_path / "uv"
    shim.write_text(interop.UV_SHIM.format(python=sys.executable))
    shim.chmod(0o755)
    data = tmp_path / "data.json"
    data.write_text('{"b": 1, "a": 2}')
    # what skyrl-tx 0.3.0's API server runs to start its engine, with json.tool standing in for tx.tinker.engine
    ran = subprocess.run(
        [
            str(shim),
            "run",
            "--extra",
            "tinker",
            "--extra",
            "jax",
            "-m",
            "json.tool",
            "--sort-keys",
            str(data),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == {"a": 2, "b": 1}
    assert ran.stdout.index('"a"') < ran.stdout.index('"b"')
    refused = subprocess.run(
        [str(shim), "run", "--extra", "tinker"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert "expected '-m MODULE'" in refused.stderr


def test_sampler_paths_get_hosted_tinkers_spelling(interop: ModuleType) -> None:
    assert interop.sampler_weights_path("tinker://model_1/final") == "tinker://model_1/sampler_weights/final"
    same = "tinker://model_1/sampler_weights/final"
    assert interop.sampler_weights_path(same) == same
