"""The evidence of a verifier run, from the real commands: `platoon rollout` of a Harbor task whose tests cannot
download their runner offline (in a Docker sandbox without network) shows the infrastructure outcome with its exit
code, seconds and output tail; the trajectory written with the run keeps it; `platoon viz` shows it in the
trajectory's outcome node. Here, not in tests/harbor, because it needs the `platoon-oracle` harness.

CI starts the Docker engine and builds `platoon-test/python:bookworm` first (`.ci/docker-engine start`).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from platoon.cli import main
from platoon.viz.model import EventModel, walk
from platoon.viz.sources import Replay, event_files

TEST_SH = """\
#!/bin/bash
python3 -c "import urllib.request as u; u.urlretrieve('https://astral.sh/uv/install.sh', '/tmp/uv.sh')" &&
  sh /tmp/uv.sh
uvx pytest /tests/test_outputs.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


@pytest.fixture
def offline_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env_name: str) -> Path:
    monkeypatch.chdir(tmp_path)
    for variable in ("TINKER_API_KEY", "TINKER_BASE_URL", "WANDB_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    task = tmp_path / "tasks" / "offline"
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "task.toml").write_text(
        '[environment]\ndocker_image = "platoon-test/python:bookworm"\nnetwork_mode = "no-network"\n'
    )
    (task / "instruction.md").write_text("Write 42 to /app/answer.txt.\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "solution" / "solve.sh").write_text("echo 42 > /app/answer.txt\n")
    config = tmp_path / "train.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            log_path: runs
            tinker_base_url: local
            train:
              model_name: platoon/toy
              renderer_name: qwen3_instruct
            environments:
              - service: harbor
                service_kwargs: {{dataset_dir: tasks, name: {env_name}, harbor_check: "off"}}
                harness: platoon-oracle
            """
        )
    )
    return config


@pytest.mark.slow
@pytest.mark.guarantee(
    "A verifier cannot reach the network",
    "Harbor task in Docker, `platoon rollout` and `platoon viz`",
    "the outcome's kind and evidence (exit code, seconds, the output's last 16 KiB) are shown and written with the trajectory",
)
def test_rollout_and_viz_show_why_an_offline_verifier_is_not_a_zero(offline_config, tmp_path, capsys):
    status = main(["rollout", str(offline_config), "--task", "offline", "--output-dir", "run"])
    captured = capsys.readouterr()
    assert status == 0, captured.err[-3000:]
    lines = captured.out.splitlines()
    # The root's outcome is untrainable (reward `-`), and the tree ends with the evidence and the output's tail.
    assert lines[1].startswith("agents 1") and "reward -  outcome invalid" in lines[1]
    [evidence] = [line for line in lines if line.startswith("evidence ")]
    assert evidence.startswith("evidence  exit 0  ") and evidence.endswith(
        "  mode separate  kind verifier_network"
    )
    tail = [line[2:] for line in lines if line.startswith("| ")]
    assert any("Temporary failure in name resolution" in line for line in tail)
    assert tail[-1] == "/tests/test.sh: line 4: uvx: command not found"

    # The trajectory written with the run keeps the evidence.
    [dump] = (tmp_path / "run").rglob("trajectory_collection.json")
    [root] = json.loads(dump.read_text())["trajectories"].values()
    outcome = root["misc"]["outcome"]
    assert (outcome["status"], outcome["failure_kind"]) == ("invalid", "verifier_network")
    assert outcome["evidence"]["exit_code"] == 0 and outcome["evidence"]["seconds"] > 0
    assert outcome["evidence"]["output"].endswith("uvx: command not found\n")

    # `platoon viz` folds the run's event files into a tree whose outcome node carries the evidence.
    model = EventModel()
    for path, record in Replay(event_files(recursive=[tmp_path / "run"])).take(None):
        model.apply(record, str(path))
    [node] = [node for node, _ in walk(model.tree()) if node.kind == "outcome"]
    assert node.label.startswith("outcome:invalid · verifier_network · exit 0 · ")
    assert node.style == "red"
    sections = {section.title: section for section in node.details}
    output = sections["grader output (last 16 KiB)"]
    assert output.kind == "text" and output.content.endswith("uvx: command not found\n")
    assert sections["evidence"].content["mode"] == "separate"


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("verifier_mode: sharde", "service_kwargs.verifier_mode: separate (a fresh sandbox grades"),
        (
            "verifier_classifiers: [netwrok]",
            "service_kwargs.verifier_classifiers[0]: 'netwrok' is not a classifier",
        ),
    ],
)
def test_config_validate_refuses_a_bad_grading_option_in_one_line(
    tmp_path, monkeypatch, capsys, option, message
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    (tmp_path / "tasks" / "t" / "tests").mkdir(parents=True)
    (tmp_path / "tasks" / "t" / "task.toml").write_text(
        '[environment]\ndocker_image = "platoon-test/python:bookworm"\n'
    )
    (tmp_path / "tasks" / "t" / "instruction.md").write_text("Nothing.\n")
    (tmp_path / "tasks" / "t" / "tests" / "test.sh").write_text(TEST_SH)
    config = tmp_path / "train.yaml"
    config.write_text(
        "log_path: runs\ntinker_base_url: local\n"
        "train: {model_name: platoon/toy, renderer_name: qwen3_instruct, max_training_steps: 1}\n"
        f"environments:\n  - service: harbor\n    service_kwargs: {{dataset_dir: tasks, {option}}}\n"
        "    harness: platoon-oracle\nstats: {wandb: {mode: disabled}}\n"
    )
    assert main(["config", "validate", str(config)]) == 78
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert message in said and "Traceback" not in said
