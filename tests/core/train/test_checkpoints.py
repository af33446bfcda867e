"""Checkpoint records and keep_recovery pruning: names and cadence, the resume point, and
a pruning plan that never deletes a permanent checkpoint, the resume point or one rollouts may still sample.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from platoon.train.tinker.checkpoints import (
    CheckpointLog,
    CheckpointRow,
    Deletion,
    checkpoint_due,
    checkpoint_name,
    deletable_path,
)


def _paths(run: str, name: str) -> dict[str, str | None]:
    return {
        "state_path": f"tinker://{run}/weights/{name}",
        "sampler_path": f"tinker://{run}/sampler_weights/{name}",
    }


def _save(log: CheckpointLog, kind: str, batch: int, version: int, run: str = "r1") -> CheckpointRow:
    name = checkpoint_name(kind, batch)
    paths = _paths(run, name)
    return log.record(
        name,
        kind=kind,
        batch=batch,
        policy_version=version,
        optimizer_steps=batch * 2,
        wandb_run_id="w",
        state_path=paths["state_path"],
        sampler_path=paths["sampler_path"],
    )


def _delete_all(log: CheckpointLog, plan: list[Deletion]) -> None:
    for deletion in plan:
        for path in deletion.paths:
            log.record_deleted(
                path, name=deletion.name, policy_version=deletion.policy_version, result="deleted"
            )


# --- names, cadence, rows ---------------------------------------------------------------------------------------


def test_names() -> None:
    assert checkpoint_name("permanent", 12) == "000012"
    assert checkpoint_name("recovery", 7) == "recovery-000007"
    assert checkpoint_name("launch", 0) == "recovery-000000"
    assert checkpoint_name("interrupted", 3) == "000003_interrupted"
    assert checkpoint_name("final", 99) == "final"
    with pytest.raises(ValueError, match="unknown checkpoint kind"):
        checkpoint_name("other", 1)


def test_cadence_counts_steps_since_this_start() -> None:
    assert [checkpoint_due(s, 3, 1) for s in range(1, 7)] == [
        "recovery",
        "recovery",
        "permanent",
        "recovery",
        "recovery",
        "permanent",
    ]
    assert [checkpoint_due(s, 0, 2) for s in range(1, 5)] == [None, "recovery", None, "recovery"]
    assert [checkpoint_due(s, 2, None) for s in range(1, 5)] == [None, "permanent", None, "permanent"]


def test_deletable_paths() -> None:
    assert deletable_path("tinker://run-1/weights/recovery-000001")
    assert deletable_path("tinker://run-1/sampler_weights/recovery-000001")
    for path in (
        "tinker://run-1/other/recovery-000001",
        "tinker://run-1/weights/a/b",
        "/local/weights/recovery-000001",
        "tinker:///weights/x",
        "",
        None,
    ):
        assert not deletable_path(path), path


def test_rows_and_resume_point(tmp_path: Path) -> None:
    log = CheckpointLog(tmp_path)
    assert log.rows() == [] and log.latest_resumable() is None and log.resume_point() is None
    _save(log, "launch", 0, 0)
    row = _save(log, "permanent", 2, 2)
    data = json.loads((tmp_path / "checkpoints.jsonl").read_text().splitlines()[1])
    assert {
        k: data[k] for k in ("name", "kind", "batch", "policy_version", "optimizer_steps", "wandb_run_id")
    } == {
        "name": "000002",
        "kind": "permanent",
        "batch": 2,
        "policy_version": 2,
        "optimizer_steps": 4,
        "wandb_run_id": "w",
    }
    assert data["state_path"] == "tinker://r1/weights/000002" and "time" in data
    assert log.latest_resumable() == row
    point = log.resume_point(num_minibatches=4)
    assert point is not None and (point.start_batch, point.policy_version, point.optimizer_steps) == (2, 2, 4)
    assert point.wandb_run_id == "w"


def test_resume_reads_past_cut_off_and_sampler_only_rows(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints.jsonl"
    path.write_text(
        json.dumps({"name": "000004", "batch": 4, "state_path": "tinker://r/weights/000004"})
        + "\n"
        + json.dumps({"name": "x", "batch": 5, "sampler_path": "tinker://r/sampler_weights/x"})
        + "\n"
        + json.dumps({"name": "old", "step": 3})
        + "\nnot json\n"
        + '{"name": "000006", "batch": 6, "state_pa'  # a crash mid-append
    )
    log = CheckpointLog(tmp_path)
    point = log.resume_point(num_minibatches=3)
    # Defaults for rows without them: policy_version = batch, optimizer_steps = batch x minibatches.
    assert point is not None and (point.start_batch, point.policy_version, point.optimizer_steps) == (
        4,
        4,
        12,
    )
    assert [r.batch for r in log.rows()] == [4, 5, 3]  # `step` is read as the batch of early rows
    row = _save(log, "recovery", 6, 6)
    assert log.latest_resumable() == row and row.index == 3
    assert [r.name for r in log.rows()][-1] == "recovery-000006"


def test_kinds_are_inferred_from_names(tmp_path: Path) -> None:
    rows = [
        CheckpointRow.from_json({"name": name, "batch": 1})
        for name in ("recovery-000001", "000001", "000001_interrupted", "final")
    ]
    assert [r.kind for r in rows if r] == ["recovery", "permanent", "interrupted", "final"]
    assert [r.recovery for r in rows if r] == [True, False, False, False]
    assert CheckpointRow.from_json({"batch": 1}) is None
    assert CheckpointRow.from_json({"name": "x"}) is None


# --- pruning ----------------------------------------------------------------------------------------------------


def test_keep_recovery_keeps_the_newest_and_deletes_both_paths(tmp_path: Path) -> None:
    log = CheckpointLog(tmp_path)
    for batch in range(5):
        _save(log, "launch" if batch == 0 else "recovery", batch, batch)
    plan = log.plan(2, current_version=4, max_staleness=1)
    assert [d.name for d in plan.delete] == ["recovery-000000", "recovery-000001", "recovery-000002"]
    assert plan.delete[0].paths == (
        "tinker://r1/weights/recovery-000000",
        "tinker://r1/sampler_weights/recovery-000000",
    )
    assert plan.recovery_kept == 2
    _delete_all(log, plan.delete)
    deleted = [json.loads(line) for line in (tmp_path / "checkpoints_deleted.jsonl").read_text().splitlines()]
    assert set(deleted[0]) == {"path", "name", "policy_version", "result", "time"}
    assert deleted[0]["result"] == "deleted" and deleted[0]["policy_version"] == 0
    # Deleted checkpoints are no longer live: nothing more to delete, the two newest remain.
    again = log.plan(2, current_version=4, max_staleness=1)
    assert again.delete == [] and again.recovery_kept == 2


def test_protected_checkpoints(tmp_path: Path) -> None:
    log = CheckpointLog(tmp_path)
    _save(log, "launch", 0, 0)
    _save(log, "permanent", 1, 1)
    _save(log, "recovery", 2, 2)
    # A recovery row naming a path a permanent row names keeps that path.
    shared = _paths("r1", "000001")
    log.record(
        "recovery-000003",
        kind="recovery",
        batch=3,
        policy_version=3,
        state_path=shared["state_path"],
        sampler_path=shared["sampler_path"],
    )
    # Paths not shaped tinker://<run>/<weights|sampler_weights>/<name> are never deleted.
    log.record(
        "recovery-000004", kind="recovery", batch=4, policy_version=4, state_path="/x/y", sampler_path=None
    )
    for batch in (5, 6):
        _save(log, "recovery", batch, batch)
    plan = log.plan(1, current_version=6, max_staleness=0)
    assert [d.name for d in plan.delete] == ["recovery-000000", "recovery-000002", "recovery-000005"]
    assert (
        plan.recovery_kept == 3
    )  # the newest (also the resume point), the shared-path row, the unshaped one


def test_the_resume_point_and_rows_of_earlier_starts(tmp_path: Path) -> None:
    first = CheckpointLog(tmp_path)
    _save(first, "launch", 0, 0)
    _save(first, "recovery", 1, 1)
    _save(first, "recovery", 2, 2)
    # A new start: the same records, none saved by this start.
    second = CheckpointLog(tmp_path)
    resume = second.latest_resumable()
    assert resume is not None and resume.name == "recovery-000002"
    # An old resume point passed explicitly is kept even when older than keep_recovery allows.
    launch = _save(second, "launch", 2, 2, run="r2")
    for batch in (3, 4, 5):
        _save(second, "recovery", batch, batch, run="r2")
    plan = second.plan(1, resume_point=launch, current_version=5, max_staleness=1)
    names = [(d.name, d.paths[0].split("/")[2]) for d in plan.delete]
    assert ("recovery-000002", "r2") not in names  # the resume point given
    assert ("recovery-000004", "r2") not in names  # within staleness, saved this start
    # Earlier starts' recovery checkpoints are not sampled by this start's rollouts: deletable.
    assert ("recovery-000000", "r1") in names and ("recovery-000002", "r1") in names
    assert ("recovery-000003", "r2") in names


def test_unknown_versions_and_no_staleness_information_keep_this_starts_saves(tmp_path: Path) -> None:
    log = CheckpointLog(tmp_path)
    unknown = _paths("r1", "recovery-000000")
    log.record(
        "recovery-000000",
        kind="launch",
        batch=0,
        state_path=unknown["state_path"],
        sampler_path=unknown["sampler_path"],
    )
    for batch in (1, 2, 3):
        _save(log, "recovery", batch, batch)
    # Unknown version: kept.
    assert [d.name for d in log.prune(1, current_version=3, max_staleness=0)] == [
        "recovery-000001",
        "recovery-000002",
    ]
    # Nothing said about staleness: this start's saves are all kept.
    assert log.prune(1) == []
    # An in-use version of unknown value keeps all of them too.
    assert log.prune(1, sampling_versions_in_use=[None]) == []
    assert [d.name for d in log.prune(1, sampling_versions_in_use=[2])] == ["recovery-000001"]
    with pytest.raises(ValueError):
        log.prune(0)


@pytest.mark.parametrize("seed", range(6))
def test_pruning_over_many_steps_never_deletes_a_protected_checkpoint(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    keep, staleness, every, recovery_every = rng.randint(1, 3), rng.randint(0, 4), rng.choice([0, 4, 7]), 1
    version = 0
    deleted: set[str] = set()
    batch = 0
    for start, steps in enumerate([rng.randint(5, 25) for _ in range(3)]):
        run = f"r{start}"
        log = CheckpointLog(tmp_path)
        start_batch = batch
        _save(log, "launch", batch, version, run=run)
        for steps_completed in range(1, steps + 1):
            batch += 1
            version += 1
            kind = checkpoint_due(steps_completed, every, recovery_every)
            if kind is None:
                continue
            _save(log, kind, batch, version, run=run)
            # Rollouts in flight sample versions within max_staleness of the current one (some of them).
            window = range(max(0, version - staleness), version + 1)
            in_use = {v for v in window if rng.random() < 0.5}
            plan = log.plan(
                keep, sampling_versions_in_use=in_use, current_version=version, max_staleness=staleness
            )
            rows = log.rows()
            resume = log.latest_resumable()
            permanent = {p for r in rows if not r.recovery for p in r.paths}
            deleting = {p for d in plan.delete for p in d.paths}
            assert not deleting & permanent
            assert resume is not None and not deleting & set(resume.paths)
            assert not deleting & deleted  # nothing is deleted twice
            for d in plan.delete:
                assert d.name.startswith("recovery-")
                row = d.row
                assert row.policy_version is not None
                if row.index in log.saved_this_start:
                    assert version - row.policy_version > staleness
                assert row.policy_version not in in_use
            live_recovery = [
                r for r in rows if r.recovery and r.paths and not all(p in deleted for p in r.paths)
            ]
            newest = {p for r in live_recovery[-keep:] for p in r.paths}
            assert not deleting & newest
            _delete_all(log, plan.delete)
            deleted |= deleting
        assert batch - start_batch == steps
    assert deleted  # the run did prune
    # Every permanent checkpoint survived the whole run; recovery checkpoints did not pile up.
    rows = CheckpointLog(tmp_path).rows()
    assert all(not set(r.paths) & deleted for r in rows if not r.recovery)
    live = [r for r in rows if r.recovery and not set(r.paths) <= deleted]
    assert len(live) <= keep + staleness + 2
