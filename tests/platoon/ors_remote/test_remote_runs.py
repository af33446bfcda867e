"""`ors+http://` entries in whole commands: an eval and a training run leave no session open on the servers, a
worker killed with SIGKILL has its sessions closed by the next start, and a server that is not there at start is
one line and exit 78 (`platoon config validate`, `platoon eval`, `platoon train`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from platoon.cli import main
from platoon.testing import serve_policy

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


BANDIT = REPO / "examples" / "bandit" / "train.yaml"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    for name in ("TINKER_BASE_URL", "TINKER_API_KEY", "TINKER_SAMPLE_TIMEOUT_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def eval_config(workdir: Path, service: str) -> Path:
    data: dict[str, Any] = {
        "tinker_base_url": "local",
        "inference": {
            "model_name": "platoon/toy",
            "renderer_name": "qwen3_instruct",
            "workflow": {
                "num_rollouts_per_task": 2,
                "num_concurrent_workers": 2,
                "rollout_config": {"verbose": False, "max_steps": 2},
            },
        },
        "environments": [
            {"service": service, "harness": "platoon-react", "service_kwargs": {"task_indices": [0, 1, 2]}}
        ],
        "split": "train",
    }
    path = workdir / "eval.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def recorded(session_dir: Path) -> list[str]:
    """The sessions every process's registry file lists as open."""
    return [s["sid"] for f in session_dir.glob("*.json") for s in json.loads(f.read_text())["sessions"]]


def answer_seven(prompt: str) -> str:
    return "7"  # a plain reply: the harness hands it to the terminal `submit`


def test_an_eval_leaves_no_session_open(servers, workdir, capsys, session_dir):
    a, b = servers
    config = eval_config(workdir, f"ors+http://{a.host},{b.host}/GuessEnv?variant=guessenv")
    with serve_policy(answer_seven):
        status = main(["eval", str(config)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    assert (summary["total_rollouts"], summary["valid_rollouts"], summary["successful_rollouts"]) == (6, 6, 2)
    assert (a.open_sessions(), b.open_sessions()) == (0, 0)
    assert recorded(session_dir) == []


@pytest.mark.slow
def test_a_training_run_leaves_no_session_open(servers, workdir, capsys, session_dir):
    a, _ = servers
    service = f"ors+http://{a.host}/BanditEnvironment?variant=banditenvironment"
    argv = [
        "train",
        str(BANDIT),
        f"log_path={workdir}",
        "train.batch_size=1",
        "train.workflow_config.group_size=4",
        "train.max_training_steps=2",
        "checkpoint.every=0",
        f"environments=[{{service: '{service}', harness: platoon-bandit-answer}}]",
    ]
    status = main(argv)
    assert status == 0, capsys.readouterr().err
    rows = [
        json.loads(line) for line in (workdir / "bandit" / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["train/batch/outcome/scored"] == 4.0 for row in rows)
    assert a.open_sessions() == 0
    assert recorded(session_dir) == []


WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from platoon.envs.resolve import resolve_service

    async def main():
        service = resolve_service(sys.argv[1])
        session = await service.open(await service.get_task("train:0"), rollout_id="worker")
        print(session.env.sid, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_a_killed_worker_s_sessions_are_closed_by_the_next_start(servers, workdir, session_dir):
    a, _ = servers
    service = f"ors+http://{a.host}/GuessEnv?variant=guessenv"
    env = {**os.environ, "PLATOON_ORS_SESSION_DIR": str(session_dir), "TINKER_BASE_URL": "local"}
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, service], stdout=subprocess.PIPE, env=env, text=True
    )
    assert worker.stdout is not None
    sid = worker.stdout.readline().strip()
    assert sid and a.open_sessions() == 1
    [record] = session_dir.glob("*.json")
    assert [s["sid"] for s in json.loads(record.read_text())["sessions"]] == [sid]
    assert record.stat().st_mode & 0o777 == 0o600
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    # SIGKILL runs no cleanup: the server still holds the session, the record is still there
    assert a.open_sessions() == 1 and record.exists()
    # the next start (here `platoon config validate`, which lists the tasks) deletes it
    config = eval_config(workdir, service)
    done = subprocess.run(
        [sys.executable, "-m", "platoon", "config", "validate", str(config)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert a.open_sessions() == 0
    assert not record.exists()


def test_a_server_not_there_at_start_is_one_line_and_78(workdir, capsys):
    host = f"127.0.0.1:{free_port()}"
    config = eval_config(workdir, f"ors+http://{host}/GuessEnv?variant=guessenv")
    # (eval's listing names the exception's type before the service's own message)
    line = (
        f"environments.0: listing split 'train' failed: ValueError: GuessEnv: no ORS server answers (servers from "
        f"the service URI): http://{host}: connection refused"
    )
    assert main(["config", "validate", str(config)]) == 78
    assert capsys.readouterr().out.splitlines() == [f"FAIL {config}", f"  {line}"]
    assert main(["eval", str(config)]) == 78
    err = capsys.readouterr().err
    assert err.endswith(f"platoon: {line}\n")


@pytest.mark.slow
def test_a_training_config_naming_a_server_not_there_is_78(workdir, capsys):
    host = f"127.0.0.1:{free_port()}"
    entries = (
        f"environments=[{{service: 'ors+http://{host}/BanditEnvironment', harness: platoon-bandit-answer}}]"
    )
    line = (
        "environments.0: listing split 'train' failed: BanditEnvironment: no ORS server answers (servers from the "
        f"service URI): http://{host}: connection refused"
    )
    assert main(["config", "validate", str(BANDIT), entries]) == 78
    assert capsys.readouterr().out.splitlines() == [f"FAIL {BANDIT}", f"  {line}"]
    assert main(["train", str(BANDIT), entries, f"log_path={workdir}"]) == 78
    assert capsys.readouterr().err.endswith(f"platoon: {line}\n")


def test_a_mixture_reaching_one_server_under_two_names_is_refused_at_start(workdir, capsys):
    config = eval_config(workdir, "ors+http://127.0.0.1:9/GuessEnv")
    data = yaml.safe_load(config.read_text())
    data["environments"] = [
        {"name": "guess", "service": "ors+http://127.0.0.1:9/GuessEnv", "harness": "platoon-react"},
        {"name": "search", "service": "ors+http://127.0.0.1:9/NumberSearch", "harness": "platoon-react"},
    ]
    config.write_text(yaml.safe_dump(data))
    assert main(["config", "validate", str(config)]) == 78
    assert capsys.readouterr().out.splitlines() == [
        f"FAIL {config}",
        "  environments.1.service: 'NumberSearch' and environments.0's 'GuessEnv' reach http://127.0.0.1:9 without "
        "?variant=, so both would get its default environment: name each with ?variant=<name>",
    ]
