"""The guarantee sheet's grader faults on ORS environments, in process and on a server: one `platoon train` step of
the bandit harness over eight tasks, three of whose graders raise, hang or lose their service (faulty_grader.py).

Each environment kind is one real run (the toy model on the local Tinker server, the real openreward SDK), and
every guarantee is read from what the run left: the step's metrics row, the rollouts' records and trajectory
events; that no process of the run is left is checked after every guarantee test (tests/conftest.py). Timeouts are
hang guards, never margins.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faulty_grader import FAULTS, GRADED

from platoon.trajectory_events import by_collection, read_events

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"
PLATOON = [sys.executable, "-c", "import sys; from platoon.cli import main; sys.exit(main())"]
#: a hang guard on a whole run on a busy two-core machine, not a margin
HANG_GUARD = 600.0
#: the step deadline the run is given, so the hanging grader costs seconds rather than the default 300
STEP_TIMEOUT = 5
GROUP_SIZE = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def ors_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """faulty_grader.py on the SDK's own server; its URL."""
    port = _free_port()
    log = tmp_path_factory.mktemp("ors-server") / "server.log"
    env = {**os.environ, "OPENREWARD_DISABLE_UPDATE_CHECK": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "faulty_grader.py"), str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # a hang guard: importing the SDK takes seconds of CPU
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the ORS server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the ORS server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(30)


def _user_env(tmp_path: Path) -> dict[str, str]:
    """A user's environment: the local server's state under the test's site cache, faulty_grader importable."""
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\n")
    env = {**os.environ, "PLATOON_SITE": str(site), "PYTHONPATH": str(HERE)}
    for name in ("TINKER_API_KEY", "TINKER_BASE_URL", "TINKER_SAMPLE_TIMEOUT_SECONDS"):
        env.pop(name, None)
    return env


def _train(
    tmp_path: Path, service: str, *overrides: str, split: str = "train", env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One training step over the environment's tasks, as a user runs it; (the finished process, the run dir)."""
    tasks = len(GRADED) if split == "graded" else len(GRADED + FAULTS)
    argv = [
        "train",
        str(BANDIT),
        f"log_path={tmp_path}",
        f"train.batch_size={tasks}",
        f"train.workflow_config.group_size={GROUP_SIZE}",
        f"train.workflow_config.rollout_config.step_timeout={STEP_TIMEOUT}",
        "train.max_training_steps=1",
        "train.max_staleness=0",
        "checkpoint.every=0",
        f"environments=[{{service: '{service}', harness: platoon-bandit-answer, "
        f"dataset_kwargs: {{split_name: {split}}}}}]",
        *overrides,
    ]
    finished = subprocess.run(
        PLATOON + argv,
        env=env or _user_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    return finished, tmp_path / "bandit" / "run"


@contextlib.contextmanager
def _process(argv: list[str], env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A server process that prints its URL on its first line; stopped on exit."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://"), url
        yield proc, url
    finally:
        proc.kill()
        proc.wait()


def _metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _outcomes_by_task(run: Path) -> dict[str, list[dict[str, Any]]]:
    """The outcome of every rollout the run recorded (from its trajectory events on disk), by task."""
    found: dict[str, list[dict[str, Any]]] = {}
    for events in by_collection(read_events(run / "rollouts" / "train" / "0" / "events")).values():
        task = next(event for event in events if event["type"] == "trajectory_task_set")["task"]
        root = next(event for event in events if event["type"] == "trajectory_finished")
        found.setdefault(task["misc"]["ors"]["name"], []).append(root["misc"]["outcome"])
    return found


ENVIRONMENTS = {
    "in process": lambda request: "python://faulty_grader:FaultyGrader",
    "on a server": lambda request: f"ors+{request.getfixturevalue('ors_server')}/FaultyGrader",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "environment",
    [
        pytest.param(
            kind,
            marks=pytest.mark.guarantee(
                "A grader raises, hangs or loses its service",
                f"ORS {kind}",
                "each is an infrastructure outcome that trains nothing; the run ends within its step deadline with "
                "every rollout's record on disk and no process of the run left",
            ),
        )
        for kind in ENVIRONMENTS
    ],
)
def test_grader_faults_never_train_as_zero(
    environment: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    finished, run = _train(tmp_path, ENVIRONMENTS[environment](request))
    assert finished.returncode == 0, finished.stderr[-4000:]
    [row] = _metrics(run)

    outcomes = _outcomes_by_task(run)
    assert sorted(outcomes) == sorted(GRADED + FAULTS)
    for task in GRADED:
        assert sorted(o["rewards"]["reward"] for o in outcomes[task]) == [0.0, 1.0]
        assert {o["status"] for o in outcomes[task]} == {"scored"}
    # "raised RuntimeError: ..." in process, "raised on the server: ..." through the wire
    [(status, reason)] = {(o["status"], o["reason"]) for o in outcomes["raises"]}
    assert (
        status == "error"
        and reason.startswith("tool 'answer' raised ")
        and reason.endswith(": grader crashed")
    )
    [(status, reason)] = {(o["status"], o["reason"]) for o in outcomes["offline"]}
    assert status == "error" and "Connection refused" in reason, reason
    assert {(o["status"], o["reason"]) for o in outcomes["hangs"]} == {
        ("timeout", f"tool 'answer' did not return within rollout_config.step_timeout ({STEP_TIMEOUT} s)")
    }
    for faulty in FAULTS:
        assert all(o.get("rewards") in (None, {}) for o in outcomes[faulty]), outcomes[faulty]
    # Only the graded rollouts trained: one datum each (one model call), none of the faulty ones.
    graded = len(GRADED) * GROUP_SIZE
    assert row["train/batch/outcome/scored"] == graded
    assert row["train/datums/trajectories"] == graded
    assert row["train/datums/postmerge_datums"] == graded
    assert row["train/workload/training_batch/total_submitted_datums"] == graded


@pytest.mark.slow
@pytest.mark.guarantee(
    "The sampler answers 5xx, or never answers",
    "ORS in process, on a service of its own",
    "a 5xx is retried; a sample past `sample_timeout_seconds` ends its rollout as an infrastructure outcome that "
    "trains nothing; no process of the run left",
)
def test_sampler_faults_never_train_as_zero(tmp_path: Path) -> None:
    env = _user_env(tmp_path)
    service = [sys.executable, "-m", "platoon.local_server.process", "--dir", str(tmp_path / "service")]
    with (
        _process(service, env) as (server, upstream),
        _process([sys.executable, str(HERE / "sampler_proxy.py"), upstream], env) as (_, url),
    ):
        assert server.stdout is not None
        env["TINKER_API_KEY"] = server.stdout.readline().strip()  # the one key the service issued
        finished, run = _train(
            tmp_path,
            "python://faulty_grader:FaultyGrader",
            f"tinker_base_url={url}",
            "train.sample_timeout_seconds=5",
            split="graded",
            env=env,
        )
    assert finished.returncode == 0, finished.stderr[-4000:]
    [row] = _metrics(run)
    outcomes = [o for found in _outcomes_by_task(run).values() for o in found]
    assert len(outcomes) == len(GRADED) * GROUP_SIZE
    [stalled] = [o for o in outcomes if o["status"] != "scored"]
    assert stalled["status"] == "error" and "sample" in (stalled["reason"] or ""), stalled
    assert not stalled.get("rewards")
    # The stalled rollout made no datum; its group's other rollout, alone, has no advantage to learn from.
    assert row["train/batch/outcome/scored"] == len(outcomes) - 1
    assert row["train/datums/policy_excluded_trajectories"] == 1
    assert row["train/datums/postmerge_datums"] == len(outcomes) - 1
    assert row["train/workload/training_batch/total_submitted_datums"] == len(outcomes) - 2
