"""Config mistakes that used to pass silently or read badly, through the real command line: a key given twice, an
empty file, a problem reported under both train and eval, a section's rule that named no field. `platoon config
validate` and `platoon train` refuse each the same way, with exit 78 and one line.
"""

from __future__ import annotations

import textwrap

import pytest

from platoon.cli import main


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
