"""Event files across processes: a resumed run appends to the step files an earlier process wrote, including one a
killed writer left ending mid-line (issue 35: the append opened the file write-only, then read its last byte)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from platoon.trajectory_events import by_collection, read_events

#: one process appends one rollout (collection id argv[2]) to the event file argv[1], then exits
APPEND_ONE = textwrap.dedent(
    """
    import sys
    from platoon.trajectory import Trajectory, TrajectoryCollection, TrajectoryStep
    from platoon.trajectory_events import append_events

    root = Trajectory(id=sys.argv[2] + "-root", steps=[TrajectoryStep()], reward=1.0)
    collection = TrajectoryCollection(id=sys.argv[2], trajectories={root.id: root})
    append_events(collection, sys.argv[1])
    """
)


def _append_in_a_new_process(path: Path, collection_id: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", APPEND_ONE, str(path), collection_id],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.guarantee(
    "A resumed run appends to the event files an earlier process wrote",
    "trajectory event files",
    "the new process's records are appended after the old ones",
)
def test_a_second_process_appends_to_an_event_file_a_first_process_wrote(tmp_path):
    path = tmp_path / "events" / "events_train_3.jsonl"
    _append_in_a_new_process(path, "first")
    _append_in_a_new_process(path, "second")
    groups = by_collection(read_events(path))
    assert sorted(groups) == ["first", "second"]
    assert [record["type"] for record in groups["second"]] == [record["type"] for record in groups["first"]]
    assert path.read_bytes().endswith(b"\n")


@pytest.mark.guarantee(
    "A writer is killed mid-line",
    "trajectory event files",
    "the next append starts on a line of its own; every whole record still reads",
)
def test_an_append_after_a_killed_writer_starts_on_a_line_of_its_own(tmp_path):
    path = tmp_path / "events" / "events_train_3.jsonl"
    _append_in_a_new_process(path, "whole")
    with path.open("ab") as torn:
        torn.write(b'{"type": "trajectory_created", "collection_id": "torn", "traj')  # killed mid-line
    _append_in_a_new_process(path, "after")
    lines = path.read_text().splitlines()
    assert lines[-1].startswith("{") and '"after"' in lines[-1]
    assert sorted(by_collection(read_events(path))) == ["after", "whole"]  # the torn line alone is skipped
