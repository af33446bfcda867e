"""Mistakes a user can make at the command line: each is a clear message and an exit code, never a traceback."""

from __future__ import annotations

import pytest

from platoon.cli import main

FILES = {
    "bad.yaml": b"a: [1, 2\n",
    "list.yaml": b"- 1\n- 2\n",
    "binary.yaml": b"\x00\x01\xff\xfe",
    "base.yaml": b"log_path: runs\ntrain: {model_name: m, renderer_name: r, max_training_steps: 1}\n",
    "renderer.yaml": (
        b"log_path: runs\ntinker_base_url: local\n"
        b"train: {model_name: m, renderer_name: qwen3_instrct, max_training_steps: 1}\n"
        b"environments: [{service: table, service_kwargs: {rows: [a]}}]\n"
    ),
}

CASES = [
    (["config", "show", "bad.yaml"], 78, "bad.yaml: invalid YAML: "),
    (["config", "show", "list.yaml"], 78, "list.yaml: the top level must be a mapping, got a list"),
    (["config", "show", "binary.yaml"], 78, "binary.yaml: not a YAML file (its bytes are not UTF-8 text)"),
    (["config", "show", "."], 78, ".: is a directory, not a config file"),
    (["config", "show", "base.yaml", "--schema", "nope"], 78, "expected module:Class"),
    (
        ["config", "show", "base.yaml", "--schema", "no_module_here:Cls"],
        78,
        "No module named 'no_module_here'",
    ),
    (["config", "show", "base.yaml", "=3"], 78, "override '=3' is not of the form key=value or key+=value"),
    (["config", "show", "base.yaml", "train+=x"], 78, "+= appends to a list, but train is a mapping"),
    (["config", "show", "base.yaml", "train.batch_size=1.5"], 78, "train.batch_size: '1.5' is not an int"),
    (["env", "list", "bad.yaml"], 78, "bad.yaml: invalid YAML: "),
    (["env", "list", "binary.yaml"], 78, "binary.yaml: not a YAML file"),
    (["env", "show", "no_module_here:ENV"], 78, "environment: cannot import 'no_module_here:ENV'"),
    (["harness", "show", "a:b:c"], 78, "harness: not an import string: 'a:b:c'"),
    (["program", "show", "x y"], 78, "unknown program 'x y'"),
    (["extensions", "show", ""], 78, "'' is neither a component nor a distribution"),
    (["extensions", "list", "--kind"], 64, "Option '--kind' requires an argument"),
    (
        ["config", "validate", "--kind", "yaml", "base.yaml"],
        64,
        "'yaml' is not one of auto, train, eval, none",
    ),
    (["train"], 64, "Missing argument 'CONFIG'"),
    (["tinker", "serve", "--port", "99999"], 64, "99999 is not in the range 0<=x<=65535"),
    (["train", "renderer.yaml"], 78, "unknown renderer 'qwen3_instrct' (did you mean qwen3_instruct"),
]


@pytest.mark.parametrize(("argv", "code", "message"), CASES, ids=[" ".join(c[0]) or "-" for c in CASES])
def test_bad_input_is_one_clear_message(argv, code, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name, content in FILES.items():
        (tmp_path / name).write_bytes(content)
    assert main(argv) == code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    assert message in captured.err
