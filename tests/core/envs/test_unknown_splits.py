"""An unknown split is refused before a run starts, whatever the service: training, evaluation and `platoon config
validate` ask the service's `list_splits` before listing a split by name, and a name it lacks is one line with the
known splits and exit 78 (issue 35: a split that did not exist used to evaluate every task).

The service here lists every task whatever split it is asked for, as Harbor's did: only the run-start check stands
between a misspelt split and a run on the wrong tasks.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from platoon.cli import main

SERVICE_MODULE = textwrap.dedent(
    """
    from platoon.task import Task


    class AnySplit:
        name = "anysplit"

        def __init__(self, **kwargs):
            pass

        async def list_splits(self):
            return ["train", "val"]

        async def list_tasks(self, split):
            return ["t0", "t1"]  # every task, whatever the split: the run start must refuse unknown names

        async def get_task(self, task_id):
            return Task(id=task_id, goal="say C", misc={"answer": "C"})

        async def open(self, task, rollout_id):
            raise NotImplementedError("these tests never roll out")
    """
)

TRAIN = """
    log_path: runs
    tinker_base_url: local
    train:
      model_name: platoon/toy
      renderer_name: qwen3_instruct
      batch_size: 1
      max_training_steps: 1
    environments:
      - service: anysplitenv:AnySplit
        harness: platoon-bandit-answer
{extra}
    stats:
      wandb: {{mode: disabled}}
"""

EVAL = """
    tinker_base_url: local
    split: {split}
    inference:
      model_name: platoon/toy
      renderer_name: qwen3_instruct
    environments:
      - service: anysplitenv:AnySplit
        harness: platoon-bandit-answer
{extra}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "anysplitenv.py").write_text(SERVICE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "anysplitenv", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def validate(
    capsys: pytest.CaptureFixture[str], project: Path, template: str, **fields: str
) -> tuple[int, list[str]]:
    extra = textwrap.indent(fields.pop("extra", ""), " " * 8)
    (project / "run.yaml").write_text(textwrap.dedent(template.format(extra=extra, **fields)))
    code = main(["config", "validate", "run.yaml"])
    return code, capsys.readouterr().out.splitlines()


def test_training_on_a_split_the_service_lacks_is_refused_with_the_known_ones(project, capsys):
    assert validate(capsys, project, TRAIN, extra="dataset_kwargs: {split_name: [train, valid]}") == (
        78,
        [
            "FAIL run.yaml",
            "  environments.0.dataset_kwargs.split_name: no split 'valid'; known splits: train, val",
        ],
    )
    code, lines = validate(capsys, project, TRAIN, extra="dataset_kwargs: {split_name: val}")
    assert code == 0, lines


def test_training_that_evaluates_a_split_the_service_lacks_is_refused_before_it_starts(project, capsys):
    evaluates = "eval_dataset_kwargs: {split_name: tst}"
    refused = "environments.0.eval_dataset_kwargs.split_name: no split 'tst'; known splits: train, val"
    template = TRAIN.replace("    stats:", "    eval: {{every: 1}}\n    stats:")
    assert validate(capsys, project, template, extra=evaluates) == (78, ["FAIL run.yaml", f"  {refused}"])
    # `platoon train` refuses it at the same point: before the local server starts or the run dir is written.
    assert main(["train", "run.yaml"]) == 78
    assert refused in capsys.readouterr().err
    assert not (project / "runs").exists()
    # Without evaluation during training the eval split is not listed, so nothing is refused.
    code, lines = validate(capsys, project, TRAIN, extra=evaluates)
    assert code == 0, lines


def test_evaluating_a_split_the_service_lacks_is_refused_with_the_known_ones(project, capsys):
    assert validate(capsys, project, EVAL, split="test") == (
        78,
        ["FAIL run.yaml", "  environments.0: no split 'test'; known splits: train, val"],
    )
    assert validate(capsys, project, EVAL, split="eval", extra="eval_dataset_kwargs: {split_name: vall}") == (
        78,
        [
            "FAIL run.yaml",
            "  environments.0.eval_dataset_kwargs.split_name: no split 'vall'; known splits: train, val",
        ],
    )
    assert validate(capsys, project, EVAL, split="eval") == (0, ["ok   run.yaml (PlatoonEvalConfig)"])
