"""The dataset check (issue 35, item 2): `platoon harbor check CONFIG` runs platoon-oracle and platoon-noop on every
task in its Docker sandbox, offline; a task whose tests fetch their runner from the internet and a task whose tests
pass untouched are quarantined with reasons a user can act on; training refuses an unchecked dataset (naming the
command) and then skips the quarantined tasks, one line each.

The private Docker engine (.ci/docker-engine) has no network and the image `platoon-test/python:bookworm`.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from platoon.cli import main
from platoon.envs.service import Outcome
from platoon_harbor.check import judge

IMAGE = "platoon-test/python:bookworm"
#: the harness of the configs the fast tests only validate (core's own: these tests also run with platoon-harbor alone)
ANSWER = "platoon-bandit-answer"

SOUND_TEST = """#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
# Installs its test runner from the internet first, as two tasks of the dataset did: offline the download
# fails, the script goes on, writes 0 and exits 0.
FETCHING_TEST = """#!/bin/bash
python3 -c "import urllib.request; urllib.request.urlretrieve('https://pypi.org/packages/source/p/pytest/pytest-8.3.4.tar.gz', '/tmp/runner.tar.gz')" \\
  || echo "installing the test runner failed"
if [ -f /tmp/runner.tar.gz ] && [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
exit 0
"""
# Passes whatever the agent did.
LENIENT_TEST = """#!/bin/bash
echo 1 > /logs/verifier/reward.txt
"""


def make_task(root: Path, name: str, test: str, *, offline: bool = False) -> None:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    network = "allow_internet = false\n" if offline else ""
    (task / "task.toml").write_text(
        f'[task]\nname = "{name}"\n\n[environment]\ndocker_image = "{IMAGE}"\nworkdir = "/app"\n{network}\n'
        "[agent]\ntimeout_sec = 120\n\n[verifier]\ntimeout_sec = 60\n"
    )
    (task / "instruction.md").write_text("Write 42 into /app/answer.txt.\n")
    (task / "tests" / "test.sh").write_text(test)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho 42 > /app/answer.txt\n")


CONFIG = """log_path: runs
tinker_base_url: local
train:
  model_name: platoon/toy
  renderer_name: qwen3_instruct
  batch_size: 1
  max_training_steps: 1
  workflow_config: {group_size: 2}
environments:
  - service: harbor
    service_kwargs: {dataset_dir: tasks, name: ENV}
    harness: HARNESS
stats: {experiment_name: check, wandb: {mode: disabled}}
"""


@pytest.fixture
def env_name() -> Iterator[str]:
    """The sandboxes' `platoon.env` label for this test; no container may carry it afterwards."""
    docker = os.environ.get("PLATOON_DOCKER", "docker")
    if subprocess.run([docker, "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        pytest.fail(f"no Docker engine with {IMAGE}: run `.ci/docker-engine start` and source its env file")
    name = f"check-{uuid.uuid4().hex[:10]}"
    yield name
    listed = [docker, "ps", "--all", "--quiet", "--filter", f"label=platoon.env={name}"]
    left = subprocess.run(listed, capture_output=True, text=True).stdout.split()
    if left:
        subprocess.run([docker, "rm", "--force", *left], capture_output=True)
        pytest.fail(f"the test left {len(left)} container(s) behind", pytrace=False)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env_name: str) -> Path:
    """A dataset of three tasks (sound, fetching its runner offline, passing untouched) and a training config."""
    monkeypatch.chdir(tmp_path)
    for variable in ("TINKER_API_KEY", "TINKER_BASE_URL", "WANDB_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    make_task(tmp_path / "tasks", "sound", SOUND_TEST)
    make_task(tmp_path / "tasks", "fetches-runner", FETCHING_TEST, offline=True)
    make_task(tmp_path / "tasks", "passes-untouched", LENIENT_TEST)
    (tmp_path / "train.yaml").write_text(CONFIG.replace("ENV", env_name).replace("HARNESS", "platoon-oracle"))
    return tmp_path


@pytest.mark.slow
@pytest.mark.guarantee(
    "A task whose tests fetch their runner from the internet, or pass without the agent",
    "Harbor dataset in Docker, offline",
    "`platoon harbor check` quarantines it with the verifier's own reason; training refuses an unchecked dataset and skips quarantined tasks, one line each",
)
def test_the_check_quarantines_unsound_tasks_and_training_skips_them(
    project: Path, env_name: str, capsys
) -> None:
    # unchecked: training refuses before any rollout, naming the command; config validate says the same
    assert main(["train", "train.yaml"]) == 78
    refused = capsys.readouterr().err
    assert "the dataset check has no verdict for 3 task(s)" in refused
    assert "run `platoon harbor check train.yaml`" in refused and not Path("runs").exists()
    assert main(["config", "validate", "train.yaml"]) == 78
    assert "run `platoon harbor check train.yaml`" in capsys.readouterr().out

    assert main(["harbor", "check", "train.yaml"]) == 0  # quarantines are results, not errors
    out = capsys.readouterr().out.splitlines()
    header, *rows = out[: out.index(next(line for line in out if line.startswith("quarantined ")))]
    assert header.split() == ["task", "oracle", "noop", "seconds", "verdict"]
    table = {row.split()[0]: row.split() for row in rows}
    assert table["sound"][1:3] == ["1", "0"] and table["sound"][4] == "ok"
    assert table["fetches-runner"][4] == "quarantined" and table["passes-untouched"][4] == "quarantined"
    assert table["passes-untouched"][1:3] == ["1", "1"]
    reasons = {
        line.split(":")[0].removeprefix("quarantined "): line
        for line in out
        if line.startswith("quarantined ")
    }
    # the reason names the harness, what it scored against what it must, and the verifier's own words
    fetching = reasons["fetches-runner"]
    assert "oracle" in fetching and "Temporary failure in name resolution" in fetching, fetching
    assert (
        "noop scored 1 (min 0): the tests pass without the agent doing anything"
        in reasons["passes-untouched"]
    )
    assert out[-1].startswith("environments[0] check: 3 task(s) checked, 2 quarantined (")
    check_file = Path(out[-1].rsplit("(", 1)[1].rstrip(")"))
    recorded = json.loads(check_file.read_text())["tasks"]
    assert {k: v["verdict"] for k, v in recorded.items()} == {
        "sound": "ok",
        "fetches-runner": "quarantined",
        "passes-untouched": "quarantined",
    }
    assert all(v["digest"].startswith("sha256:") for v in recorded.values())

    # checked: training runs on the sound task alone and says which tasks it skipped and why, one line each
    assert main(["train", "train.yaml"]) == 0
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "quarantined by the dataset check" in line]
    assert len(skipped) == 2, err[-3000:]
    assert skipped[0].startswith(f"platoon: {env_name}: task fetches-runner skipped") or skipped[
        1
    ].startswith(f"platoon: {env_name}: task fetches-runner skipped")
    assert any(f"{env_name}: task passes-untouched skipped" in line for line in skipped)
    assert "reward 1.000 over 2 rollouts" in err  # the sound task's group: the quarantined ones never ran

    # an edited task has no verdict for its new content: the run refuses again until it is checked
    (project / "tasks" / "sound" / "instruction.md").write_text("Write 42 into /app/answer.txt, please.\n")
    assert main(["config", "validate", "train.yaml"]) == 78
    assert "no verdict for 1 task(s) (e.g. sound;" in capsys.readouterr().out
    assert main(["config", "validate", "train.yaml", "environments.0.service_kwargs.harbor_check=warn"]) == 0
    assert main(["config", "validate", "train.yaml", "environments.0.service_kwargs.harbor_check=off"]) == 0


def test_a_bad_harbor_check_value_is_one_line(tmp_path: Path, capsys) -> None:
    make_task(tmp_path / "tasks", "sound", SOUND_TEST)
    config = tmp_path / "train.yaml"
    config.write_text(
        CONFIG.replace("ENV", "h")
        .replace("name: h", "name: h, harbor_check: strict")
        .replace("HARNESS", ANSWER)
    )
    assert main(["config", "validate", str(config)]) == 78
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert "service_kwargs.harbor_check: required, warn or off; got 'strict'" in said
    assert "Traceback" not in said


def scored(reward: float) -> Outcome:
    return Outcome("scored", {"reward": reward}, metadata={"test_output": "collected 3 items\n3 passed\n"})


def test_the_verdict_needs_the_oracle_at_the_maximum_and_the_noop_at_the_minimum() -> None:
    bounds = (0.0, 1.0)
    assert judge(scored(1.0), scored(0.0), bounds, {}) is None
    partial = judge(scored(0.5), scored(0.0), bounds, {})
    assert partial is not None and partial.startswith("oracle scored 0.5 (max 1): its solution does not pass")
    assert "verifier output: collected 3 items 3 passed" in partial
    broken = Outcome.infra(
        "verifier_missing_tool",
        status="invalid",
        reason="a verifier log classifier matched",
        metadata={"test_output": "bash: pytest: command not found\n"},
    )
    reason = judge(broken, scored(0.0), bounds, {})
    assert reason == (
        "oracle was not scored: invalid (verifier_missing_tool): a verifier log classifier matched: verifier output: "
        "bash: pytest: command not found"
    )
    noop_error = judge(scored(1.0), broken, bounds, {})
    assert noop_error is not None and noop_error.startswith(
        "noop was not scored: invalid (verifier_missing_tool)"
    )
    assert judge(None, scored(0.0), bounds, {"platoon-oracle": "OSError: boom"}) == (
        "oracle produced no outcome: OSError: boom"
    )
    # the verifier's output is the task's: a terminal escape in it reaches no terminal
    escaped = judge(
        Outcome("scored", {"reward": 0.0}, metadata={"test_output": "\x1b[2Jgone"}), scored(0.0), bounds, {}
    )
    assert escaped is not None and escaped.endswith("verifier output: ?[2Jgone")
    # a reward contract's range moves both bounds
    assert judge(scored(10.0), scored(-1.0), (-1.0, 10.0), {}) is None
    assert judge(scored(10.0), scored(0.0), (-1.0, 10.0), {}) is not None


def test_the_check_of_a_dataset_not_fetched_names_prepare(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    make_task(tmp_path / "dataset", "sound", SOUND_TEST)
    Path("train.yaml").write_text(
        CONFIG.replace("dataset_dir: tasks, name: ENV", f"dataset: {tmp_path / 'dataset'}").replace(
            "HARNESS", ANSWER
        )
    )
    assert main(["harbor", "check", "train.yaml"]) == 78
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "is not fetched" in captured.err and captured.err.rstrip().endswith("platoon prepare train.yaml")
    assert not (tmp_path / "cache" / "harbor" / "locks").exists()  # nothing checked, nothing written


def test_an_evaluation_config_runs_an_unchecked_dataset_by_default(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """`harbor_check` defaults by the config's kind: `required` for training (the test above), `warn` for evaluation."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    make_task(tmp_path / "tasks", "sound", SOUND_TEST)
    Path("eval.yaml").write_text(
        "tinker_base_url: local\nsplit: train\n"
        "inference: {model_name: platoon/toy, renderer_name: qwen3_instruct, output_dir: out}\n"
        "environments: [{service: harbor, service_kwargs: {dataset_dir: tasks, name: unchecked-eval}, harness: platoon-bandit-answer}]\n"
    )
    assert main(["config", "validate", "eval.yaml"]) == 0, capsys.readouterr()
    assert (
        "unchecked-eval: the dataset is not checked: run `platoon harbor check CONFIG`"
        in capsys.readouterr().err
    )
    Path("strict.yaml").write_text(
        Path("eval.yaml")
        .read_text()
        .replace("dataset_dir: tasks", "dataset_dir: tasks, harbor_check: required")
    )
    assert main(["config", "validate", "strict.yaml"]) == 78
    assert "run `platoon harbor check strict.yaml`" in capsys.readouterr().out
