"""Run-start task checks: a service's optional `check_tasks(split, ids)` is asked about the tasks a run would
use, and a refusal stops `platoon config validate`, training's and evaluation's starts and `platoon rollout` with
one line and exit 78 (docs/harbor.md, "Checking a dataset", gives Harbor's checks).

The service here is a task table whose `check_tasks` refuses tasks that need a GPU, as Harbor's refuses GPU tasks on
a provider without one; it records what it was asked, so the tests also see that excluded and limited-away tasks
are not checked.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest

from platoon.cli import main
from platoon.envs.service import task_check_refusals

SERVICE_MODULE = textwrap.dedent(
    """
    import json
    from pathlib import Path

    from platoon.envs.service import EnvSetupError
    from platoon.envs.table import TaskTableService

    ASKED = Path(__file__).with_name("asked.jsonl")


    class GpuCheckedTable(TaskTableService):
        async def check_tasks(self, split, ids):
            with ASKED.open("a") as asked:
                asked.write(json.dumps([split, ids]) + "\\n")
            gpu = [task_id for task_id in ids if task_id.startswith("gpu")]
            if gpu:
                raise EnvSetupError("env_config", f"tasks {', '.join(gpu)} need a GPU, and this site has none")


    class BrokenCheck(TaskTableService):
        async def check_tasks(self, split, ids):
            raise RuntimeError("the provider's probe crashed")
    """
)

ROWS = [
    {"id": "t0", "goal": "say C", "answer": "C"},
    {"id": "gpu-1", "goal": "say C", "answer": "C"},
    {"id": "t2", "goal": "say C", "answer": "C", "split": "test"},
    {"id": "gpu-3", "goal": "say C", "answer": "C", "split": "test"},
]

TRAIN = """
    log_path: runs
    tinker_base_url: local
    train:
      model_name: platoon/toy
      renderer_name: qwen3_instruct
      batch_size: 1
      max_training_steps: 1
    environments:
      - service: checkedenv:{cls}
        service_kwargs: {{path: tasks.jsonl}}
        harness: platoon-bandit-answer
{extra}
    stats:
      wandb: {{mode: disabled}}
"""

EVAL = """
    tinker_base_url: local
    split: test
    inference:
      model_name: platoon/toy
      renderer_name: qwen3_instruct
    environments:
      - service: checkedenv:GpuCheckedTable
        service_kwargs: {{path: tasks.jsonl}}
        harness: platoon-bandit-answer
{extra}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "checkedenv.py").write_text(SERVICE_MODULE)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "checkedenv", raising=False)  # each test imports its own copy
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(project: Path, name: str, template: str, *, cls: str = "GpuCheckedTable", extra: str = "") -> str:
    (project / name).write_text(
        textwrap.dedent(template.format(cls=cls, extra=textwrap.indent(extra, " " * 8)))
    )
    return name


def asked(project: Path) -> list[list[object]]:
    path = project / "asked.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def validate(capsys: pytest.CaptureFixture[str], config: str) -> tuple[int, list[str]]:
    code = main(["config", "validate", config])
    return code, capsys.readouterr().out.splitlines()


def test_a_training_start_refuses_tasks_the_service_refuses(project, capsys):
    config = write(project, "train.yaml", TRAIN)
    assert validate(capsys, config) == (
        78,
        ["FAIL train.yaml", "  environments.0: tasks gpu-1 need a GPU, and this site has none"],
    )
    assert asked(project) == [["train", ["t0", "gpu-1"]]]


def test_excluded_tasks_are_not_checked_and_the_rest_pass(project, capsys):
    config = write(project, "train.yaml", TRAIN, extra="exclude_tasks: [gpu-1]")
    assert validate(capsys, config) == (0, ["ok   train.yaml (PlatoonTinkerRLTrainerConfig)"])
    assert asked(project) == [["train", ["t0"]]]


def test_a_check_that_crashes_is_one_line_too(project, capsys):
    config = write(project, "train.yaml", TRAIN, cls="BrokenCheck")
    assert validate(capsys, config) == (
        78,
        [
            "FAIL train.yaml",
            "  environments.0: checking the tasks of split 'train' failed: RuntimeError: the provider's probe "
            "crashed",
        ],
    )


def test_an_evaluation_start_checks_its_split_and_limit(project, capsys):
    config = write(project, "eval.yaml", EVAL)
    code, lines = validate(capsys, config)
    assert (code, lines) == (
        78,
        ["FAIL eval.yaml", "  environments.0: tasks gpu-3 need a GPU, and this site has none"],
    )
    assert asked(project)[-1] == ["test", ["t2", "gpu-3"]]
    # With the GPU task limited away, the evaluation starts.
    config = write(project, "eval.yaml", EVAL, extra="eval_dataset_kwargs: {limit: 1}")
    assert validate(capsys, config) == (0, ["ok   eval.yaml (PlatoonEvalConfig)"])
    assert asked(project)[-1] == ["test", ["t2"]]


def test_platoon_rollout_refuses_a_refused_task_before_it_starts_anything(project, capsys):
    config = write(project, "eval.yaml", EVAL)
    assert main(["rollout", config, "--task", "gpu-3", "--output-dir", "out"]) == 78
    assert capsys.readouterr().err.splitlines()[-1] == (
        "platoon: --task 'gpu-3': environments[default] refuses it: tasks gpu-3 need a GPU, and this site has none"
    )
    assert asked(project) == [["test", ["gpu-3"]]]
    assert not (project / "out").exists()


def test_a_service_without_check_tasks_is_not_asked():
    class Plain:
        pass

    assert asyncio.run(task_check_refusals(Plain(), [("train", "a")])) == []
