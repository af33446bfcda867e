"""The viewer's model without Textual: event files of real number-search rollouts folded into the tree (labels,
colours, forks, verifiers, steps, details), a training run's rollouts grouped by step and filtered, labels cut at
word boundaries, search, OpenHands steps and ORS bridge turns, and the sources (tailing through growth, truncation
and replacement, looked at less often while nothing changes; replay merged by time; dumps converted)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from platoon.trajectory import TrajectoryCollection
from platoon.viz.model import (
    EventModel,
    Node,
    TrajectoryState,
    collection_node,
    fit,
    parse_filter,
    search,
    steps_node,
    task_info,
    view,
    walk,
)
from platoon.viz.sources import (
    POLL_INTERVAL,
    POLL_LONGEST,
    Backoff,
    FileTail,
    Replay,
    Tailer,
    convert_dumps,
    event_files,
    parse_lines,
)


def records_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def model_of(*paths: Path) -> EventModel:
    model = EventModel()
    for path, record in Replay(list(paths)).take(None):
        model.apply(record, str(path))
    return model


def by_kind(roots: list[Node], kind: str) -> list[Node]:
    return [node for node, _ in walk(roots) if node.kind == kind]


def test_a_codeact_rollout_becomes_collection_trajectory_task_and_steps(runs):
    records = records_of(runs.codeact)
    collection_id = records[0]["collection_id"]
    root_id = records[0]["trajectory_id"]
    steps = [r["step"]["misc"] for r in records if r["type"] == "trajectory_step_added"]
    [collection] = model_of(runs.codeact).tree()
    assert collection.label == (
        f"collection: task:number_search.train.3 · reward:1.000 · index:3 · split:train · "
        f"trajs:solver=1,verifier=0 · id:{collection_id[:8]}"
    )
    [trajectory] = collection.children
    assert trajectory.label == f"traj:{root_id[:8]} · subtree:solver=1,verifier=0 · reward:1.000"
    assert trajectory.style == "green"
    task, steps_group, outcome = trajectory.children
    assert (outcome.kind, outcome.label, outcome.style) == ("outcome", "outcome:scored", None)
    assert task.label == "task:number_search.train.3 · index:3 · split:train · " + records[1]["task"]["goal"]
    assert steps_group.label == f"steps ({len(steps)})"
    for index, (node, step) in enumerate(zip(steps_group.children, steps, strict=True)):
        thought = step["thought"].strip().splitlines()[0]
        marker = "[output] [reward 1]" if index == len(steps) - 1 else "[output]"
        assert node.label == f'step {index}: {step["code"]} · "{thought}"  {marker}'
        assert [child.kind for child in node.children] == ["thought", "code", "output"]
        code = next(s for s in node.details if s.title == "code")
        assert (code.kind, code.content) == ("code", step["code"])
    # The finish is in the last step's output: the run really found the target.
    assert "correctly!" in steps[-1]["output"]


def test_a_tool_calling_rollout_shows_its_calls(runs):
    records = records_of(runs.react)
    calls = [
        r["step"]["misc"]["message"]["tool_calls"][0]["function"]
        for r in records
        if r["type"] == "trajectory_step_added"
    ]
    [collection] = model_of(runs.react).tree()
    steps = by_kind([collection], "steps")[0].children
    labels = [node.label for node in steps]
    numbers = [json.loads(call["arguments"])["number"] for call in calls]
    assert labels[:-1] == [f"step {i}: guess(number={n})" for i, n in enumerate(numbers[:-1])]
    assert labels[-1] == f"step {len(numbers) - 1}: guess(number={numbers[-1]})  [reward 1]"


def test_forks_sit_under_their_parent_and_verifiers_under_what_they_verify(runs):
    records = records_of(runs.tree)
    created = [r for r in records if r["type"] == "trajectory_created"]
    root, child, verifier = (r["trajectory_id"] for r in created)
    assert created[1]["trajectory"]["parent_info"]["id"] == root
    [collection] = model_of(runs.tree).tree()
    assert "trajs:solver=2,verifier=1" in collection.label
    [root_node] = collection.children
    assert root_node.label.startswith(f"traj:{root[:8]} · subtree:solver=2,verifier=1 · reward:")
    fork, verifier_node = root_node.children[3:]  # after the task, the steps and the outcome
    fork_step = created[1]["trajectory"]["parent_info"]["fork_step"]
    assert fork.label == f"fork from {root[:8]} @ step {fork_step}"
    [child_node] = fork.children
    assert child_node.label.startswith(f"traj:{child[:8]} · subtree:solver=1,verifier=0 · reward:")
    assert child_node.children[0].label.endswith("Suggest a first guess for this range.")
    assert verifier_node.kind == "verifier" and verifier_node.style == "dim"
    assert verifier_node.label.startswith(f"verifier:{verifier[:8]} · reward:")


def test_a_verifier_naming_what_it_verifies_sits_there_and_a_child_before_its_parent_waits_at_the_top():
    model = EventModel()

    def created(tid: str, parent: str | None = None, **misc: Any) -> dict[str, Any]:
        info = {"id": parent, "fork_step": 2} if parent else None
        trajectory = {"id": tid, "parent_info": info, "misc": misc}
        return {
            "type": "trajectory_created",
            "collection_id": "c",
            "trajectory_id": tid,
            "trajectory": trajectory,
        }

    model.apply(created("child", "root"))
    assert [n.label.split(" ·")[0] for n in model.tree()[0].children] == ["traj:child"]  # parent not here yet
    model.apply(created("root"))
    model.apply(created("check", "root", verifier_of="child", agent={"role": "verifier"}))
    [root] = model.tree()[0].children
    fork = root.children[1]
    assert fork.label == "fork from root @ step 2"
    [child] = fork.children
    assert child.children[-1].label.startswith("verifier:check")
    assert "subtree:solver=2,verifier=1" in root.label and "subtree:solver=1,verifier=1" in child.label


def test_rewards_are_coloured_only_once_finished():
    model = EventModel()
    base = {"collection_id": "c", "trajectory_id": "t"}
    model.apply({**base, "type": "trajectory_created", "trajectory": {"id": "t"}})
    assert model.tree()[0].children[0].style is None
    assert model.tree()[0].children[0].label.endswith("reward:…")
    for reward, style in ((0.0, "red"), (-1, "red"), (0.5, "yellow"), (1.0, "green"), (2, "green")):
        model.apply({**base, "type": "trajectory_finished", "reward": reward, "misc": {}})
        assert model.tree()[0].children[0].style == style


def test_reading_a_file_twice_shows_the_same_tree(runs):
    once = model_of(runs.tree)
    twice = model_of(runs.tree)
    twice.apply_all(records_of(runs.tree), str(runs.tree))
    labels = [[n.label for n, _ in walk(m.tree())] for m in (once, twice)]
    assert labels[0] == labels[1]


def test_replay_merges_files_by_time(runs):
    files = [runs.tree, runs.codeact, runs.react]
    replay = Replay(files)
    times = [record["ts"] for _, record in replay.records]
    assert times == sorted(times) and len(times) == sum(len(records_of(f)) for f in files)
    # one record at a time, then restart
    first = replay.take(1)
    assert replay.position == 1 and not replay.done
    assert len(replay.take(None)) == len(times) - 1 and replay.done
    replay.restart()
    assert replay.take(1) == first


def test_search_groups_matches_by_trajectory(runs):
    records = records_of(runs.codeact)
    target = next(r for r in records if r["type"] == "trajectory_task_set")["task"]["misc"]["target"]
    roots = model_of(runs.codeact, runs.react).tree()
    groups = search(roots, f"guess({target})")
    [group] = groups
    assert group.label.startswith("collection: task:number_search.train.3")
    assert [hit.kind for hit in group.hits] == ["step", "code"]
    assert search(roots, "  ") == []
    # case-insensitive, over details as well as labels; a collection's own node groups apart from its trajectories
    groups = search(roots, "NUMBER_SEARCH")
    assert [g.key for g in groups] == [key for root in roots for key in (root.key, root.children[0].key)]


def test_task_labels_from_misc_keys_and_openreward_references():
    reference = base64.urlsafe_b64encode(
        json.dumps({"environment": "acme/math", "name": "algebra-7", "index": 7, "split": "test"}).encode()
    ).decode()
    info = task_info({"id": "openreward:v1:" + reference.rstrip("="), "goal": "Solve it.\nShow work."})
    assert info.parts(with_goal=True) == [
        "env:acme/math",
        "task:algebra-7",
        "index:7",
        "split:test",
        "Solve it. Show work.",
    ]
    assert task_info({"id": "x", "misc": {"environment": "bandit", "split": "train"}}).parts(
        with_goal=False
    ) == [
        "env:bandit",
        "task:x",
        "split:train",
    ]
    assert (
        task_info({"id": "openreward:v1:%%%"}).task_id == "openreward:v1:%%%"
    )  # not decodable: shown as it is
    assert task_info(None).parts(with_goal=True) == []


def openhands_step() -> dict[str, Any]:
    """A step as an OpenHands harness records it: action events paired with observations by tool_call_id."""

    def action(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        call = {"name": "call_tool", "arguments": json.dumps({"name": name, "arguments": arguments})}
        return {"kind": "ActionEvent", "id": f"a-{call_id}", "tool_call_id": call_id, "tool_call": call}

    def observation(call_id: str, text: str, *, error: bool = False) -> dict[str, Any]:
        content = [{"type": "text", "text": text}]
        return {
            "kind": "ObservationEvent",
            "tool_call_id": call_id,
            "observation": {"content": content, "is_error": error},
        }

    return {
        "misc": {
            "action_events": [
                action("1", "emails.send_email", {"to": "a@x"}),
                action("2", "emails.send_email", {"to": "b@x"}),
                action("3", "excel.create_workbook", {"name": "q3"}),
            ],
            "observation_events": [
                observation("1", "sent"),
                observation("2", "sent"),
                observation("3", "disk full", error=True),
            ],
            "reward_misc": {"openreward/final_payload": {"score": 0.5, "passed": ["a"]}},
        }
    }


def test_openhands_steps_resolve_call_tool_collapse_repeats_and_surface_errors():
    trajectory = TrajectoryState(
        "t", steps=[{"misc": {"message": {"content": "system prompt..."}}}, openhands_step()]
    )
    trajectory.steps[0] = {"misc": {"action_events": [], "message": {"content": "You are an agent."}}}
    group = steps_node(trajectory, "k", "auto")
    setup, step = group.children
    assert setup.label == "step 0: setup"
    assert step.label == "step 1: emails.send_email x2, excel.create_workbook  [1 error]  [final]"
    assert step.style == "red"
    labels = [child.label for child in step.children]
    assert labels == [
        'emails.send_email(to="a@x") → sent',
        'emails.send_email(to="b@x") → sent',
        'excel.create_workbook(name="q3") → error: disk full',
        'final: {"score": 0.5, "passed": ["a"]}',
    ]
    # auto switches per step: a CodeAct step in the same trajectory keeps its CodeAct summary
    trajectory.steps.append({"misc": {"code": "print(1)", "output": "1"}})
    assert steps_node(trajectory, "k", "auto").children[2].label == "step 2: print(1)  [output]"
    # forced modes
    assert steps_node(trajectory, "k", "openhands").children[2].label == "step 2: (no action)"
    assert steps_node(trajectory, "k", "codeact").children[1].label == "step 1: (no action)"


def test_ors_bridge_events_are_grouped_per_turn():
    def event(kind: str, time: float, **payload: Any) -> dict[str, Any]:
        return {"type": kind, "time": time, "session": "s1", "payload": payload}

    model = EventModel()
    for record in [
        event("session_started", 1.0),
        event("task_requested", 1.1),
        event("tool_call", 2.0, name="guess", arguments={"number": 5}),
        event("tool_result", 2.1, text="Too low"),
        event("tool_call", 3.0, name="guess", arguments={"number": 7}),
        event("tool_error", 3.1, error="boom"),
        event("session_closing", 4.0),
    ]:
        assert model.apply(record) == "bridge:s1"
    [session] = model.tree()
    assert session.label == "bridge:s1 · turns:2 · events:7"
    setup, first, second = session.children
    assert setup.label == "turn 0: session_started, task_requested"
    assert first.label.startswith("turn 1: guess(number=5) → ") and "Too low" in first.label
    assert second.label.startswith("turn 2: guess(number=7)") and second.style == "red"
    assert [leaf.label for leaf in second.children] == ["tool_call", "tool_error", "session_closing"]


def test_a_tailed_file_is_read_as_lines_complete_and_again_after_truncation_or_replacement(tmp_path, runs):
    lines = runs.codeact.read_text().splitlines(keepends=True)
    path = tmp_path / "events.jsonl"
    tail = FileTail(path)
    assert tail.poll() == ([], False)  # not there yet
    path.write_text(lines[0] + lines[1][:10])
    records, reset = tail.poll()
    assert [r["type"] for r in records] == ["trajectory_created"] and not reset
    with path.open("a") as handle:
        handle.write(lines[1][10:] + lines[2])
    records, reset = tail.poll()
    assert [r["type"] for r in records] == ["trajectory_task_set", "trajectory_step_added"]
    assert tail.poll() == ([], False)
    path.write_text(lines[0])  # truncated: shorter than what was read
    records, reset = tail.poll()
    assert reset and [r["type"] for r in records] == ["trajectory_created"]
    replacement = tmp_path / ".events.jsonl.1.tmp"
    replacement.write_text("".join(lines))  # as long as... a rename is a new inode, read from the start
    os.replace(replacement, path)
    records, reset = tail.poll()
    assert reset and len(records) == len(lines)


def test_the_tailer_finds_files_in_directories_and_new_ones_as_they_appear(tmp_path, runs):
    flat, deep = tmp_path / "flat", tmp_path / "deep"
    (deep / "a" / "b").mkdir(parents=True)
    flat.mkdir()
    (flat / "one.jsonl").write_text(runs.codeact.read_text())
    (flat / ".one.jsonl.9.tmp").write_text("in progress")
    (flat / "notes.txt").write_text("not events")
    tailer = Tailer(directories=[flat], recursive=[deep])
    assert list(tailer.tails) == [flat / "one.jsonl"]
    (deep / "a" / "b" / "two.jsonl").write_text(runs.react.read_text())
    (flat / "three.jsonl").write_text("")
    seen: set[Path] = set()
    for _ in range(5):  # the recursive directory is rescanned every few polls
        seen |= {path for path, _, _ in tailer.poll()}
    assert seen == {flat / "one.jsonl", deep / "a" / "b" / "two.jsonl"}
    assert set(tailer.tails) == {flat / "one.jsonl", flat / "three.jsonl", deep / "a" / "b" / "two.jsonl"}
    assert event_files([], [flat]) == [flat / "one.jsonl", flat / "three.jsonl"]


def test_forgetting_a_source_drops_only_its_collections(runs):
    model = model_of(runs.codeact, runs.react)
    assert len(model.collections) == 2
    gone = model.forget_source(str(runs.codeact))
    assert gone == {records_of(runs.codeact)[0]["collection_id"]} and len(model.collections) == 1


def test_dumps_become_event_files_with_the_same_tree(tmp_path, runs):
    dump = runs.dump_of(runs.tree)
    collection = TrajectoryCollection.from_dict(json.loads(dump.read_text()))
    lines = tmp_path / "dumps.jsonl"
    lines.write_text(json.dumps(collection.to_dict()) + "\n\n")
    files = convert_dumps([dump, lines], tmp_path / "out")
    assert len(files) == 2 and all(f.parent == tmp_path / "out" / "events" for f in files)
    shown = [n.label for n, _ in walk(model_of(files[0]).tree())]
    assert shown == [n.label for n, _ in walk(model_of(runs.tree).tree())]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "trajectories": {"t": {}}}\n')
    try:
        convert_dumps([bad], tmp_path / "out")
    except ValueError as exc:
        assert str(exc).startswith(f"{bad}:1: not a trajectory collection dump")
    else:
        raise AssertionError("expected ValueError")


def test_torn_and_foreign_lines_are_skipped():
    assert parse_lines([b'{"a": 1}', b"{torn", b"[1, 2]", b"", b'{"b": 2}']) == [{"a": 1}, {"b": 2}]


def test_a_file_rewritten_longer_between_two_polls_is_read_again(tmp_path, runs):
    path = tmp_path / "events.jsonl"
    path.write_text(runs.codeact.read_text().splitlines(keepends=True)[0])
    tail = FileTail(path)
    assert len(tail.poll()[0]) == 1
    path.write_text(runs.react.read_text())  # same inode, and longer than what was read
    records, reset = tail.poll()
    assert reset and records == records_of(runs.react)


# ---------------------------------------------------------------------------------------------------------------
# A training run's rollouts: groups, filters; labels that fit; the tail's back-off


def training_model(runs: Any, *, drop_context: bool = False) -> EventModel:
    """The training layout's rollouts read as the viewer reads them; `drop_context` strips what the records say
    about their step, as files written before they said it."""
    model = EventModel()
    for path in sorted((runs.training / "rollouts").rglob("*.jsonl")):
        for record in records_of(path):
            if drop_context:
                record = {
                    k: v
                    for k, v in record.items()
                    if k not in ("scope", "training_step", "policy_version", "label")
                }
            model.apply(record, str(path))
    return model


def tops(model: EventModel, text: str = "") -> list[Node]:
    nodes = {cid: collection_node(c, "auto") for cid, c in model.collections.items()}
    return view(model.collections.values(), nodes, parse_filter(text))


def test_a_training_run_is_grouped_by_step_and_policy_version_newest_first(runs):
    model = training_model(runs)
    groups = tops(model)
    assert [g.key for g in groups] == [
        "g:train:step4",
        "g:train:step3",
        "g:eval:step2",
        "g:train:step2",
        "g:train:step1",
    ]
    assert all(not g.expand and not any(c.expand for c in g.children) for g in groups)
    assert [len(g.children) for g in groups] == [8, 8, 2, 8, 8]
    [summary] = groups[0].details
    assert summary.content["policy_versions"] == [3] and summary.content["outcomes"] == {
        "error": 2,
        "scored": 6,
    }
    assert summary.content["reward"] == {
        "avg": 4 / 6,
        "min": 0.0,
        "max": 1.0,
        "count": 6,
    }  # failures are not 0s
    # files written before the records said their step: training's layout still groups them, by policy version
    older = tops(training_model(runs, drop_context=True))
    assert [g.label.split(" · ")[:2] for g in older] == [
        ["eval @ step 2", "2 rollouts"],
        ["policy v3", "8 rollouts"],
        ["policy v2", "8 rollouts"],
        ["policy v1", "8 rollouts"],
        ["policy v0", "8 rollouts"],
    ]
    # rollouts of no step (platoon eval, platoon rollout) are listed as they are; a lone one open
    [alone] = tops(model_of(runs.react))
    assert alone.kind == "collection" and alone.expand


def test_filter_terms_select_rollouts_and_name_what_is_wrong(runs):
    model = training_model(runs)

    def shown(text: str) -> int:
        return sum(len(g.children) for g in tops(model, text))

    assert shown("") == 34
    assert shown("outcome:error") == shown("outcome:harness_crash") == 8
    assert shown("outcome:error,scored") == 34
    assert shown("reward>=1") == shown("reward=1") == shown("reward>0.5") == 16 + 2
    assert shown("reward<1") == shown("reward<=0") == shown("reward:..0.5") == 8  # errors have no reward
    assert shown("reward:0..1") == 26
    assert shown("task:train:4") == shown("task:bandit.train.4") == 4
    assert shown("step:2") == shown("step:2..2") == 8 + 2 and shown("step:3..") == 16
    label = next(c.label for c in model.collections.values() if c.step == 3)
    assert label is not None and shown(f"label:{label.lower()}") == 4
    assert shown("reward>=1 step:1 task:train:2") == 2
    for bad, says in (
        ("rewrd>1", "unknown filter term 'rewrd>1': use reward>=X, reward<X, reward:A..B, outcome:KIND"),
        ("reward>x", "unknown filter term 'reward>x'"),
        ("reward:..", "filter term 'reward:..' has no bound: write reward:A..B, reward:A.. or reward:..B"),
        ("outcome:", "unknown filter term 'outcome:'"),
    ):
        with pytest.raises(ValueError, match="^" + says.replace("(", r"\(").replace(".", r"\.")):
            parse_filter(bad)


@pytest.mark.parametrize(
    ("text", "width", "cut"),
    [
        ("Answer with one letter: D, A, B or C.", 20, "Answer with one…"),
        ("task:bandit.train.18 · index:18 · split:train", 30, "task:bandit.train.18…"),
        ("guess(number=497) · guess(number=250)", 24, "guess(number=497)…"),
        ("step 0: print(numbers, key=value)", 22, "step 0: print(…"),
        ("step 0: print(numbers, key=value)", 24, "step 0: print(numbers…"),
        ("/a/very/long/path/without/any/space", 12, "/a/very/lon…"),  # one word: cut inside it
        ("fits as it is", 13, "fits as it is"),
    ],
)
def test_labels_are_cut_at_a_word_boundary(text, width, cut):
    assert fit(text, width) == cut and len(cut) <= width


def test_the_tail_looks_less_often_while_nothing_changes_and_reads_only_what_grew(tmp_path, runs):
    backoff = Backoff()
    assert [backoff.after(False) for _ in range(6)] == [
        0.4,
        0.8,
        1.6,
        POLL_LONGEST,
        POLL_LONGEST,
        POLL_LONGEST,
    ]
    assert backoff.after(True) == POLL_INTERVAL
    path = tmp_path / "events.jsonl"
    path.write_text(runs.react.read_text())
    tail = FileTail(path)
    assert tail.poll()[0] and tail.reads == 1
    for _ in range(5):
        assert tail.poll() == ([], False)
    assert tail.reads == 1  # an unchanged file is only stat'ed
