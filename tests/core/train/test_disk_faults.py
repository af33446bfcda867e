"""Unwritable and full disks, for real: a `log_path` that is a file, a read-only mount, an eval `output_dir` that is a
file, a tiny tmpfs that fills in the middle of a run. A run refuses what it cannot write at start (one line, 78, and
`platoon config validate` says the same); a disk that fills mid-run stops it at the step boundary with one line (exit
1), leaves every record file parsable, and the same command resumes once there is space.

The mounts need root and a kernel that lets this process mount (a container without CAP_SYS_ADMIN does not): those
tests skip, saying why, only when `mount` itself fails.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.harness.agent import AgentResult
from platoon.harness.function import harness

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"
BANDIT_EVAL = REPO / "examples" / "bandit" / "eval.yaml"


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here (mount {' '.join(args)}: {done.stderr.strip() or done.returncode})")


def _umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A read-only bind mount (read-only for root too, unlike chmod)."""
    source, where = tmp_path / "source", tmp_path / "read-only"
    source.mkdir()
    where.mkdir()
    _mount("--bind", str(source), str(where))
    try:
        _mount("-o", "remount,bind,ro", str(where))
        yield where
    finally:
        _umount(where)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: room for a run's records, and quick to fill."""
    where = tmp_path / "disk"
    where.mkdir()
    _mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where))
    try:
        yield where
    finally:
        _umount(where)


def _fill(disk: Path) -> Path:
    """Write a file on `disk` until the disk is full; returns it."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def _error_lines(err: str) -> list[str]:
    # progress lines of a start (site profile, sample timeout, what a quiet start is doing) are not about the refusal
    return [
        line
        for line in err.splitlines()
        if "site profile" not in line
        and not line.startswith("platoon: sample timeout")
        and not re.fullmatch(r"platoon: .* \(\d+ s\)\.\.\.", line)
    ]


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site profile whose cache (the local server's checkpoints) is in the test's directory, off the small disk."""
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    return profile


# ---------------------------------------------------------------------------------------------------------------
# Refused at start: train, eval and config validate say the same one line


@pytest.mark.guarantee(
    "`log_path` is a file",
    "any run",
    "refused before any service starts, also by `platoon config validate`: one line, exit 78",
)
def test_a_log_path_that_is_a_file_is_one_line_and_78_and_validate_says_so(tmp_path, site, capsys):
    log_path = tmp_path / "not-a-dir"
    log_path.write_text("a file\n")
    message = (
        f"log_path: {log_path} is a file, not a directory, so {log_path}/bandit/run cannot be created; set "
        "log_path to a directory"
    )
    assert main(["train", str(BANDIT), f"log_path={log_path}"]) == 78
    assert _error_lines(capsys.readouterr().err) == [f"platoon: {message}"]
    assert main(["train", str(BANDIT), f"log_path={log_path}", "watchdog.max_restarts=1"]) == 78  # supervised
    assert _error_lines(capsys.readouterr().err) == [f"platoon: {message}"]
    assert main(["config", "validate", str(BANDIT), f"log_path={log_path}"]) == 78
    assert capsys.readouterr().out.splitlines() == [f"FAIL {BANDIT}", f"  {message}"]
    assert log_path.read_text() == "a file\n"


@pytest.mark.guarantee(
    "`log_path` on a read-only mount",
    "any run",
    "refused before any service starts: one line, exit 78",
)
def test_a_read_only_log_path_is_refused_before_anything_starts(read_only_dir, site, capsys, monkeypatch):
    from platoon.local_server import process

    started: list[str] = []
    monkeypatch.setattr(process, "LocalServerChild", lambda **kw: started.append("server"))
    message = f"log_path: {read_only_dir} is on a read-only file system; set log_path to a writable directory"
    assert main(["train", str(BANDIT), f"log_path={read_only_dir}"]) == 78
    assert _error_lines(capsys.readouterr().err) == [f"platoon: {message}"]
    assert started == []  # the local server was not started
    assert main(["config", "validate", str(BANDIT), f"log_path={read_only_dir}"]) == 78
    assert capsys.readouterr().out.splitlines() == [f"FAIL {BANDIT}", f"  {message}"]


@pytest.mark.guarantee(
    "The disk is full at start",
    "any run",
    "refused before any service starts: one line, exit 78",
)
def test_a_full_disk_at_start_is_refused_with_one_line(small_disk, site, capsys):
    _fill(small_disk)
    message = f"log_path: {small_disk} is on a disk with no space left; set log_path to a writable directory"
    assert main(["train", str(BANDIT), f"log_path={small_disk}"]) == 78
    assert _error_lines(capsys.readouterr().err) == [f"platoon: {message}"]
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_an_eval_output_dir_that_is_a_file_is_one_line_and_78_and_validate_says_so(
    tmp_path, site, capsys, monkeypatch
):
    monkeypatch.setenv("TINKER_BASE_URL", "local")
    output = tmp_path / "report.txt"
    output.write_text("a file\n")
    message = (
        f"inference.output_dir: {output} is a file, not a directory; set inference.output_dir to a directory"
    )
    assert main(["eval", str(BANDIT_EVAL), f"inference.output_dir={output}"]) == 78
    assert _error_lines(capsys.readouterr().err) == [f"platoon: {message}"]
    assert main(["config", "validate", str(BANDIT_EVAL), f"inference.output_dir={output}"]) == 78
    assert capsys.readouterr().out.splitlines() == [f"FAIL {BANDIT_EVAL}", f"  {message}"]


def test_an_eval_output_dir_on_a_read_only_mount_is_refused(read_only_dir, site, capsys, monkeypatch):
    monkeypatch.setenv("TINKER_BASE_URL", "local")
    output = read_only_dir / "eval"
    message = (
        f"inference.output_dir: {read_only_dir} is on a read-only file system; set inference.output_dir to a "
        "writable directory"
    )
    assert main(["eval", str(BANDIT_EVAL), f"inference.output_dir={output}"]) == 78
    assert _error_lines(capsys.readouterr().err) == [f"platoon: {message}"]


# ---------------------------------------------------------------------------------------------------------------
# A disk that fills in the middle of a run

FILLS_DISK = "test-disk-faults-fills-the-disk"
_fill_at: dict[str, Any] = {"rollout": 0, "seen": 0, "disk": None}


@harness(FILLS_DISK)
async def _fills_the_disk(ctx: Any) -> AgentResult:
    """The bandit's answer; the rollout numbered `_fill_at["rollout"]` first fills the run's disk."""
    _fill_at["seen"] += 1
    if _fill_at["seen"] == _fill_at["rollout"]:
        _fill(_fill_at["disk"])
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=1)
    await ctx.call_tool("answer", {"letter": reply.text or ""})
    return AgentResult(final_message=reply.text)


def _lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSONL file as a row: fails on a line that does not parse."""
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.guarantee(
    "The disk fills mid-run",
    "bandit, training",
    "stops at the step boundary with one line, exit 1; every record parses, a torn row is kept in `<file>.torn`; the step is redone on resume",
)
def test_a_disk_that_fills_mid_run_stops_at_the_step_boundary_with_one_line_and_resumes(
    small_disk, site, capsys
):
    harness(FILLS_DISK)(
        _fills_the_disk
    )  # again: another test may have cleared the registry since this loaded
    rollouts_per_step = 2 * 4
    # max_staleness 0: step 2's rollouts start after step 1 is done, so the disk fills during step 2
    _fill_at.update(rollout=rollouts_per_step + 1, seen=0, disk=small_disk)
    argv = [
        "train",
        str(BANDIT),
        f"log_path={small_disk}",
        "train.batch_size=2",
        "train.workflow_config.group_size=4",
        "train.max_staleness=0",
        "train.max_training_steps=3",
        "checkpoint.every=1",
        f"environments=[{{env: platoon-bandit, harness: {FILLS_DISK}}}]",
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "step 1/3" in err and "step 2/3" not in err
    (line,) = [line for line in err.splitlines() if "no space" in line]
    assert line.startswith(f"platoon: could not write {small_disk}/bandit/run/")
    assert line.endswith(
        "no space left on its disk; free space there and run the same command again (a training run resumes "
        "from its last checkpoint)"
    )
    run = small_disk / "bandit" / "run"
    assert [row["step"] for row in _lines(run / "metrics.jsonl")] == [1]  # every line parses
    assert [row["name"] for row in _lines(run / "checkpoints.jsonl")] == ["recovery-000000", "000001"]
    assert not (run / "process.json").exists()

    # A writer that died mid-row (an older platoon on a full disk, a power cut) left half a row at the end.
    half = '{"step": 2, "train/batch/task_rew'
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write(half)
    (small_disk / "filler").unlink()
    _fill_at.update(rollout=0, seen=0)
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "resuming at step 2 from 000001" in err
    assert (
        f"platoon: {run / 'metrics.jsonl'} ended in a cut-off row ({len(half)} bytes, from a write that never finished); "
        "cut it off so the file parses, kept in metrics.jsonl.torn"
    ) in err.splitlines()
    assert [row["step"] for row in _lines(run / "metrics.jsonl")] == [1, 2, 3]
    assert (run / "metrics.jsonl.torn").read_text() == half + "\n"
    assert [row["name"] for row in _lines(run / "checkpoints.jsonl")][-1] == "final"


# ---------------------------------------------------------------------------------------------------------------
# The record files themselves


def test_a_jsonl_append_on_a_full_disk_leaves_no_half_line_and_is_one_line(small_disk):
    from platoon.rollouts.records import RunDirWriteError, append_jsonl, read_jsonl

    path = small_disk / "rows.jsonl"
    append_jsonl(path, {"step": 1})
    _fill(small_disk)
    with pytest.raises(RunDirWriteError) as caught:
        append_jsonl(path, {"step": 2, "payload": "x" * 200_000})  # more than the disk's last free page
    assert str(caught.value) == (
        f"could not write {path}: no space left on its disk; free space there and run the same command again (a "
        "training run resumes from its last checkpoint)"
    )
    assert caught.value.exit_code == 1 and caught.value.errno == errno.ENOSPC
    assert path.read_text() == '{"step": 1}\n'
    assert read_jsonl(path) == [{"step": 1}]


def test_an_atomic_json_write_on_a_full_disk_keeps_the_old_file_and_leaves_no_partial(small_disk):
    from platoon.rollouts.records import RunDirWriteError, write_json_atomic

    path = small_disk / "lock.json"
    write_json_atomic(path, {"version": 1})
    _fill(small_disk)
    with pytest.raises(RunDirWriteError):
        write_json_atomic(path, {"version": 2, "payload": "x" * 200_000})
    assert json.loads(path.read_text()) == {"version": 1}
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "lock.json"]


def test_validate_checks_the_eval_runs_dir_when_no_output_dir_is_set(tmp_path, site, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("a file where the runs directory goes\n")
    assert main(["config", "validate", str(BANDIT_EVAL)]) == 78
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (
        f"  inference.output_dir: {tmp_path / 'runs'} is a file, not a directory, so {tmp_path / 'runs' / 'eval'} "
        "cannot be created; set inference.output_dir to a directory"
    )


def test_the_probe_leaves_nothing_behind(tmp_path):
    from platoon.rollouts.records import writable_dir_problem

    assert writable_dir_problem(tmp_path / "a" / "b", key="log_path") is None
    assert list(tmp_path.iterdir()) == []
    assert os.access(tmp_path, os.W_OK)
