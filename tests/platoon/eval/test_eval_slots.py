"""`platoon eval` with `inference.workflow.use_subprocesses` (docs/evaluation.md, "Subprocess slots"): rollouts in real
slot processes, against the local Tinker-compatible server and a hosted model; a hanging rollout killed at its
hard timeout and a dying slot, each replaced; nothing a stopped rollout started survives.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from eval_support import (
    HOSTED_KEY,
    HOSTED_KEY_ENV,
    binary_search,
    files_containing,
    number_search_eval,
    only_dir,
)

from platoon.cli import main
from platoon.rollouts.workers.ipc import is_running
from platoon.testing import serve_policy

SLOT_LINE = re.compile(r"slot (\d+) \(pid (\d+)\) runs rollout (\d+) of (\S+)")


@pytest.fixture
def scratch(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node scratch dir of the test's own, for the slots' socket and registry."""
    path = workdir / "scratch"
    path.mkdir()
    monkeypatch.setenv("PLATOON_NODE_SCRATCH", str(path))
    return path


@pytest.fixture
def local_tinker(monkeypatch: pytest.MonkeyPatch, tinker_server: Any) -> Any:
    monkeypatch.setenv("TINKER_BASE_URL", tinker_server.base_url)
    monkeypatch.setenv("TINKER_API_KEY", tinker_server.api_key)  # the one key the server issued
    return tinker_server


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err.splitlines()


def slot_lines(out_dir: Path) -> list[tuple[int, int, int, str]]:
    """(slot, pid, rollout, task) of every rollout the slot logs say they ran."""
    found = []
    for log in sorted((out_dir / "slots").glob("slot-*.log")):
        for match in SLOT_LINE.finditer(log.read_text()):
            found.append((int(match[1]), int(match[2]), int(match[3]), match[4]))
    return found


def shape(value: Any) -> Any:
    """The keys of a report, recursively (values dropped), for comparing two reports' shapes."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return None


def gone_soon(pids: list[int], seconds: float = 60.0) -> bool:
    """Poll until none of `pids` runs; False after `seconds` (a hang guard, generous for a busy machine)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(is_running(pid, None) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def local_server_eval(**workflow: Any) -> dict[str, Any]:
    # The random toy model writes bytes, not tool calls: each episode ends after its first reply, scored 0.
    return number_search_eval(
        workflow={
            "num_rollouts_per_task": 2,
            "num_concurrent_workers": 4,
            "rollout_config": {
                "verbose": False,
                "max_steps": 2,
                "sampling_precedence": "config",
                "inference_params": {"max_completion_tokens": 8},
            },
            **workflow,
        }
    )


def test_number_search_in_slots_reports_as_in_process_and_never_sees_a_served_policy(
    workdir, write_config, capsys, scratch, local_tinker
):
    status, out, err = run(["eval", str(write_config(local_server_eval(), "inline.yaml"))], capsys)
    assert status == 0, err
    inline = json.loads(out)
    inline_dir = only_dir(workdir / "runs" / "eval" / "platoon-toy")

    config = write_config(local_server_eval(use_subprocesses=True, subprocess_max_workers=2), "slots.yaml")
    # A policy served in this process would win every game; slots never see it.
    with serve_policy(binary_search):
        status, out, err = run(["eval", str(config)], capsys)
    assert status == 0, err
    assert "rolling out 2 tasks x 2 on split eval (4 at once, in up to 2 subprocess slots)" in "\n".join(err)
    summary = json.loads(out)
    for result in (inline, summary):
        result.pop("elapsed_seconds")
    assert summary == inline
    assert summary["successful_rollouts"] == 0 and summary["failed_rollouts"] == 4

    out_dir = next(p for p in (workdir / "runs" / "eval" / "platoon-toy").iterdir() if p != inline_dir)
    report = json.loads((out_dir / "reports" / "final_report.json").read_text())
    inline_report = json.loads((inline_dir / "reports" / "final_report.json").read_text())
    metrics = report.pop("workflow_specific_metrics")
    assert metrics == {
        "rollouts_run": 4,
        "rollouts_reused": 0,
        "subprocess_slots_started": 2,
        "subprocess_slots_replaced": 0,
    }
    inline_report.pop("workflow_specific_metrics")
    assert shape(report) == shape(inline_report)
    assert report["usage"]["policy"]["total"]["calls"] == 4

    # Every rollout ran in one of at most two slot processes, none of them this one, and none outlives the run.
    ran = slot_lines(out_dir)
    assert sorted((rollout, task) for _, _, rollout, task in ran) == [
        (0, "val:0"),
        (0, "val:1"),
        (1, "val:0"),
        (1, "val:1"),
    ]
    pids = {pid for _, pid, _, _ in ran}
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids
    assert gone_soon(list(pids))
    assert files_containing(out_dir, local_tinker.api_key) == []
    assert files_containing(scratch, local_tinker.api_key) == []
    assert not list((scratch / f"platoon-rollout-ipc-{os.getuid()}" / "workers").iterdir())


def test_a_hosted_model_in_slots_keeps_the_key_out_of_every_file(
    workdir, write_config, capsys, scratch, hosted_server
):
    hosted = {
        "base_url": hosted_server.base_url,
        "api_key_env": HOSTED_KEY_ENV,
        "max_retries": 0,
        "max_concurrent_requests": 2,
    }
    data = number_search_eval(model_name="my-hosted-model", renderer_name=None, hosted=hosted)
    data["inference"]["workflow"].update(use_subprocesses=True, subprocess_max_workers=2)
    status, out, err = run(["eval", str(write_config(data))], capsys)
    assert status == 0, err
    summary = json.loads(out)
    assert (summary["total_rollouts"], summary["successful_rollouts"], summary["errored_rollouts"]) == (
        4,
        4,
        0,
    )
    out_dir = only_dir(workdir / "runs" / "eval" / "my-hosted-model")
    report = json.loads((out_dir / "reports" / "final_report.json").read_text())
    assert report["model"]["served_models"] == ["served-model-2025"]
    assert report["workflow_specific_metrics"]["subprocess_slots_started"] == 2
    assert {task for _, _, _, task in slot_lines(out_dir)} == {"val:0", "val:1"}
    # Every non-probe call came from a slot, with the key the evaluation sent it (never through its environment).
    assert hosted_server.calls and all(
        c["headers"]["authorization"] == f"Bearer {HOSTED_KEY}" for c in hosted_server.calls
    )
    assert files_containing(out_dir, HOSTED_KEY) == []
    assert files_containing(scratch, HOSTED_KEY) == []
    assert HOSTED_KEY not in out + "\n".join(err)


def test_max_concurrent_requests_below_the_slot_count_is_refused(
    workdir, write_config, capsys, hosted_server
):
    hosted = {"base_url": hosted_server.base_url, "api_key_env": HOSTED_KEY_ENV, "max_concurrent_requests": 2}
    data = number_search_eval(model_name="my-hosted-model", renderer_name=None, hosted=hosted)
    data["inference"]["workflow"]["use_subprocesses"] = True  # 4 slots: one per concurrent rollout
    status, _, err = run(["eval", str(write_config(data))], capsys)
    assert status == 78
    assert any(
        "hosted.max_concurrent_requests (2) is split across the worker processes and must be at least their "
        "number (workflow.num_concurrent_workers 4, as subprocess_max_workers is not set)" in line
        for line in err
    )
    assert not (workdir / "runs").exists()


SLOT_HARNESSES = '''
"""Harnesses of the slot tests: by task, hang (blocking the event loop), kill their process, or finish."""

import os
import signal
import subprocess
import time
from pathlib import Path

from platoon.harness.agent import AgentResult
from platoon.harness.function import harness


@harness("test-slots-misbehave")
async def misbehave(ctx):
    where = Path(ctx.options["dir"])
    task = str(ctx.task.id)
    if task == "val:0":
        same_group = subprocess.Popen(["sleep", "600"])
        own_session = subprocess.Popen(["sleep", "600"], start_new_session=True)
        (where / "sleepers").write_text(f"{same_group.pid} {own_session.pid} {os.getpid()}")
        time.sleep(3600)  # only the hard timeout ends this
    if task == "val:1":
        (where / "crashed").write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return AgentResult("completed")
'''


@pytest.mark.parametrize("start", ["forked", "exec"])
def test_a_hanging_rollout_and_a_dying_slot_are_errors_and_their_slots_are_replaced(
    start, workdir, write_config, capsys, caplog, scratch, local_tinker, monkeypatch, tmp_path
):
    from platoon.rollouts import slots
    from platoon.rollouts.workers.forkserver import ForkServer, ForkServerUnavailable

    if start == "exec":
        # A fork server that cannot start (its interpreter broken, say): the slots start by exec instead.
        async def unavailable(*_args: Any, **_kwargs: Any) -> ForkServer:
            raise ForkServerUnavailable("the fork server did not start (this test stops it)")

        monkeypatch.setattr(ForkServer, "start", unavailable)

    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "slot_harnesses.py").write_text(textwrap.dedent(SLOT_HARNESSES))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(modules), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.syspath_prepend(str(modules))
    # The hard timeout is the rollout timeout (2.5 s) + the finalize grace, made short here. The dying and the
    # finishing rollouts must get through their harness's import inside it on a loaded CI machine.
    monkeypatch.setattr(slots, "FINALIZE_GRACE_SECONDS", 1.0)
    monkeypatch.setattr(slots, "SANDBOX_STOP_SECONDS", 0.5)
    monkeypatch.setattr(slots, "BACKSTOP_SECONDS", 2.0)
    monkeypatch.setattr(slots, "PARENT_WAIT_SECONDS", 5.0)
    marks = tmp_path / "marks"
    marks.mkdir()
    data = number_search_eval(
        workflow={
            "num_rollouts_per_task": 1,
            "num_concurrent_workers": 1,
            "use_subprocesses": True,
            "subprocess_max_workers": 1,
            "rollout_config": {"verbose": False, "max_steps": 2, "timeout": 2.5},
        }
    )
    entry = data["environments"][0]
    entry.update(harness="slot_harnesses:misbehave", harness_options={"dir": str(marks)})
    entry["eval_dataset_kwargs"]["limit"] = 3
    # val:0 sleeps for an hour: the command returns only because the hard timeout ended that rollout
    status, out, err = run(["eval", str(write_config(data))], capsys)
    assert status == 0, err
    assert ("slots start by exec" in caplog.text) == (start == "exec")
    summary = json.loads(out)
    assert (summary["total_rollouts"], summary["errored_rollouts"], summary["valid_rollouts"]) == (3, 2, 1)
    assert summary["outcome_status_counts"] == {"none": 2, "scored": 1}

    out_dir = only_dir(workdir / "runs" / "eval" / "platoon-toy")
    hung = json.loads((out_dir / "rollouts" / "val_0" / "rollout_0" / "metadata.json").read_text())
    assert hung["status"] == "errored"
    assert hung["error"].startswith(
        "hard_timeout: the rollout passed its hard timeout of 3.5 s; its slot (pid "
    )
    crashed = json.loads((out_dir / "rollouts" / "val_1" / "rollout_0" / "metadata.json").read_text())
    assert crashed["status"] == "errored" and crashed["error"].startswith("worker_crashed: the slot process")
    report = json.loads((out_dir / "reports" / "final_report.json").read_text())
    # One slot at a time: the hung one and the dead one were each replaced.
    assert report["workflow_specific_metrics"]["subprocess_slots_started"] == 3
    assert report["workflow_specific_metrics"]["subprocess_slots_replaced"] == 2
    assert [slot for slot, *_ in slot_lines(out_dir)] == [1, 2, 3]

    sleepers = [int(pid) for pid in (marks / "sleepers").read_text().split()]
    crashed_pid = int((marks / "crashed").read_text())
    assert gone_soon([*sleepers, crashed_pid]), "a process of a stopped rollout survived"
    assert not list((scratch / f"platoon-rollout-ipc-{os.getuid()}" / "workers").iterdir())
