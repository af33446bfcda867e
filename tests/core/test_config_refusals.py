"""Config mistakes that used to pass silently or read badly, through the real command line: a key given twice, an
empty file, a problem reported under both train and eval, a section's rule that named no field. `platoon config
validate` and `platoon train` refuse each the same way, with exit 78 and one line.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from platoon.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def configs(tmp_path, monkeypatch):
    """Write configs into a temporary project (no site profile) and run from there: `configs(name=text, ...)`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("PLATOON_SITE", raising=False)

    def write(**files: str) -> None:
        for name, text in files.items():
            (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(text).lstrip("\n"))

    return write


def validate(capsys, name: str) -> tuple[int, list[str]]:
    code = main(["config", "validate", "--no-resolve", name])
    return code, capsys.readouterr().out.splitlines()


def train(capsys, name: str) -> tuple[int, list[str]]:
    code = main(["train", name])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.err.splitlines()


DUPLICATE = """
    log_path: runs
    train:
      model_name: platoon/toy
      renderer_name: qwen3_instruct
      max_training_steps: 5
      max_training_steps: 50
"""
DUPLICATE_LINE = (
    "dup.yaml:6: duplicate key 'max_training_steps' (first given on line 5): YAML would keep only the last value; "
    "give the key once"
)


@pytest.mark.guarantee(
    "A config key given twice",
    "`platoon config validate`, `platoon train`",
    "one line naming file and line, exit 78",
)
def test_a_key_given_twice_is_one_line_naming_file_and_line_from_validate_and_train(configs, capsys):
    configs(dup=DUPLICATE)
    assert validate(capsys, "dup.yaml") == (78, ["FAIL dup.yaml", f"  {DUPLICATE_LINE}"])
    assert train(capsys, "dup.yaml") == (78, [f"platoon: {DUPLICATE_LINE}"])


def test_a_key_given_twice_in_a_base_or_a_flow_mapping_is_refused_but_a_merge_key_may_be_overridden(
    configs, capsys
):
    configs(base="train: {model_name: a, model_name: b}\n", top="extends: base.yaml\nlog_path: runs\n")
    assert validate(capsys, "top.yaml") == (
        78,
        [
            "FAIL top.yaml",
            "  base.yaml:1: duplicate key 'model_name' (first given on line 1): YAML would keep only the last "
            "value; give the key once",
        ],
    )
    configs(
        anchors="""
        log_path: runs
        tinker_base_url: local
        train: {model_name: platoon/toy, renderer_name: qwen3_instruct, max_training_steps: 5}
        environments:
          - &entry {name: one, service: table, service_kwargs: {rows: [a]}}
          - <<: *entry
            name: two
        """
    )
    assert validate(capsys, "anchors.yaml") == (0, ["ok   anchors.yaml (PlatoonTinkerRLTrainerConfig)"])


EMPTY_LINE = (
    "empty.yaml: the config is empty: write a training config (train, environments) or an evaluation config "
    "(inference, environments); docs/reference/config.md lists the keys"
)


@pytest.mark.parametrize("text", ["", "# a config, some day\n"])
def test_an_empty_config_is_refused_the_same_by_validate_and_train(text, configs, capsys):
    configs(empty=text)
    assert validate(capsys, "empty.yaml") == (78, ["FAIL empty.yaml", f"  {EMPTY_LINE}"])
    assert train(capsys, "empty.yaml") == (78, [f"platoon: {EMPTY_LINE}"])


def test_a_problem_under_train_workflow_config_is_reported_once_not_again_under_eval(configs, capsys):
    # eval.workflow_config inherits rollout_config from train: its problems are train's, reported there only.
    configs(
        wf="""
        log_path: runs
        tinker_base_url: local
        train:
          model_name: platoon/toy
          renderer_name: qwen3_instruct
          max_training_steps: 5
          workflow_config:
            rollout_config: {bogus: 1, step_timeout: -5, verbose: false}
        environments:
          - service: table
            service_kwargs: {rows: [a]}
        """
    )
    code, lines = validate(capsys, "wf.yaml")
    assert code == 78
    assert lines == [
        "FAIL wf.yaml",
        "  train.workflow_config.rollout_config.step_timeout: Input should be greater than 0 (got -5)",
        "  train.workflow_config.rollout_config.bogus: unknown key",
    ]


def test_a_sections_rule_names_the_field_it_is_about(configs, capsys):
    configs(
        rules="""
        log_path: runs
        tinker_base_url: local
        train:
          model_name: platoon/toy
          renderer_name: qwen3_instruct
          max_training_steps: 5
          workflow_config:
            group_size: 2
            min_successful_group_size: 5
        environments:
          - service: table
            service_kwargs: {rows: [a]}
        """
    )
    assert validate(capsys, "rules.yaml") == (
        78,
        [
            "FAIL rules.yaml",
            "  train.workflow_config.min_successful_group_size: ValueError: min_successful_group_size (5) must be "
            "between 1 and group_size (2)",
        ],
    )


def test_a_misspelt_top_level_key_is_refused_by_validate_as_train_refuses_it(configs, capsys):
    # `trian:` picks no schema by its keys; validate used to pass the file unvalidated ("ok (no schema)").
    configs(typo="log_path: runs\ntrian:\n  model_name: platoon/toy\n")
    lines = ["train: required key is missing", "trian: unknown key; did you mean train?"]
    assert validate(capsys, "typo.yaml") == (78, ["FAIL typo.yaml", *[f"  {line}" for line in lines]])
    assert train(capsys, "typo.yaml") == (
        78,
        ["platoon: invalid config typo.yaml:", *[f"  {x}" for x in lines]],
    )
    # A file of known keys that picks no schema (a base to extend) is still left unvalidated.
    configs(base="checkpoint: {every: 10}\n")
    assert validate(capsys, "base.yaml") == (0, ["ok   base.yaml (no schema)"])


LOCAL_RUN = """
    log_path: runs
    tinker_base_url: local
    train: {model_name: platoon/toy, renderer_name: qwen3_instruct, batch_size: 1, max_training_steps: 5}
    environments:
      - service: table
        service_kwargs: {rows: [a]}
    stats: {wandb: {mode: disabled}}
"""


def refusal(capsys, *overrides: str) -> tuple[list[str], list[str]]:
    """The problem lines `platoon config validate` and then `platoon train` print for `run.yaml` + overrides."""
    assert main(["config", "validate", "run.yaml", *overrides]) == 78
    validated = [line.strip() for line in capsys.readouterr().out.splitlines()[1:]]
    assert main(["train", "run.yaml", *overrides]) == 78
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    # One problem is `platoon: <problem>`; more are indented under `platoon: invalid config:`.
    last = captured.err.splitlines()[-1]
    if last.startswith("platoon: "):
        return validated, [last.removeprefix("platoon: ")]
    return validated, [line.strip() for line in captured.err.splitlines() if line.startswith("  ")]


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["train.loss_fn=nope"],
            "train.loss_fn: the local server has no loss function 'nope'; it computes cross_entropy, "
            "importance_sampling, ppo, cispo, gspo, stable_reinforce",
        ),
        (
            ["train.workflow_config.group_size=1000000000"],
            "train.workflow_config.group_size: Input should be less than or equal to 1024 (got 1000000000)",
        ),
        (
            ["train.batch_size=100000"],
            "train.batch_size: Input should be less than or equal to 8192 (got 100000)",
        ),
        (
            ["train.batch_size=4096", "train.workflow_config.group_size=64"],
            "train: batch_size 4096 x workflow_config.group_size 64 = 262144 rollouts a step, more than 65536: "
            "lower one of them",
        ),
        (
            ["train.model_name=./no-such-model"],
            "train.model_name: the local server cannot serve './no-such-model': no such model directory; it serves "
            "platoon/toy, a model directory, or a Hugging Face model whose tokenizer `platoon prepare CONFIG` "
            "fetched",
        ),
    ],
)
def test_what_the_service_cannot_do_is_refused_by_validate_and_train_alike(
    configs, capsys, monkeypatch, overrides, line
):
    monkeypatch.setenv(
        "TINKER_API_KEY", "tml-" + "k" * 20
    )  # a hosted service's key, so only the config is wrong
    configs(run=LOCAL_RUN)
    validated, trained = refusal(capsys, *overrides)
    assert validated == [line]
    assert trained == [line]


def test_a_model_the_local_server_cannot_serve_offline_is_refused_with_what_it_serves(
    configs, capsys, monkeypatch
):
    from huggingface_hub import constants

    configs(run=LOCAL_RUN)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    validated, trained = refusal(capsys, "train.model_name=platoon/tyo")
    assert (
        validated
        == trained
        == [
            "train.model_name: the local server cannot serve 'platoon/tyo' (did you mean platoon/toy?): its tokenizer "
            "is not in the Hugging Face cache and HF_HUB_OFFLINE=1 keeps the hub out of reach; it serves platoon/toy, "
            "a model directory, or a Hugging Face model whose tokenizer `platoon prepare CONFIG` fetched"
        ]
    )
    # With the hub in reach it may have the model: nothing is said before the start asks it.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    status = main(["config", "validate", "run.yaml", "train.model_name=platoon/tyo"])
    assert status == 0, capsys.readouterr().out


def test_the_oldest_sdks_loss_functions_are_a_part_of_the_installed_sdks():
    # SDK_LOSS_FNS stands in for an SDK platoon cannot find; a loss the installed SDK lacks is tested in
    # tests/core/train/test_capability_check.py
    import typing

    from tinker.types import LossFnType

    from platoon.config.tinker import SDK_LOSS_FNS

    assert set(SDK_LOSS_FNS) <= set(typing.get_args(LossFnType))


TORCH_ENGINE_MISSING = (
    "local_server.engine: the local server's torch engine needs torch and transformers, which are not installed: "
    "pip install 'platoon-core[local-torch]' (or use the numpy engine)"
)


def test_the_torch_engine_without_torch_is_refused_naming_the_extra(configs, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as on a machine without torch
    configs(run=LOCAL_RUN)
    assert refusal(capsys, "local_server.engine=torch") == ([TORCH_ENGINE_MISSING], [TORCH_ENGINE_MISSING])
    # the default engine needs no torch
    assert main(["config", "validate", "run.yaml"]) == 0, capsys.readouterr().out


def test_an_evaluation_on_the_torch_engine_without_torch_is_refused_by_validate(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    evaluation = str(EXAMPLES / "bandit" / "eval.yaml")
    assert main(["config", "validate", evaluation, "local_server.engine=torch"]) == 78
    assert [line.strip() for line in capsys.readouterr().out.splitlines()[1:]] == [TORCH_ENGINE_MISSING]
    assert main(["config", "validate", evaluation, "local_server.engine=numpy"]) == 0


def test_an_evaluation_of_a_model_the_local_server_cannot_serve_is_refused_by_validate_and_eval_alike(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    evaluation = str(EXAMPLES / "bandit" / "eval.yaml")
    line = (
        "inference.model_name: the local server cannot serve './no-such-model': no such model directory; it serves "
        "platoon/toy, a model directory, or a Hugging Face model whose tokenizer `platoon prepare CONFIG` fetched"
    )
    assert main(["config", "validate", evaluation, "inference.model_name=./no-such-model"]) == 78
    assert [row.strip() for row in capsys.readouterr().out.splitlines()[1:]] == [line]
    assert main(["eval", evaluation, "inference.model_name=./no-such-model"]) == 78
    assert capsys.readouterr().err.splitlines()[-1] == f"platoon: {line}"
    assert not (tmp_path / "runs").exists()  # refused before anything was written
