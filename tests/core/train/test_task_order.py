"""The training task order: the weighted fair interleave against its rule written out plainly, seeded passes
across epochs, resume, the `auto` shuffle, listing through table services, and `platoon config validate --tasks`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from platoon.cli import main
from platoon.config import load_config
from platoon.errors import ConfigError
from platoon.train.tinker.task_order import (
    Pool,
    TaskOrder,
    draw_harness,
    epoch_size,
    label_text,
    list_training_tasks,
    plan_lines,
    split_task_id,
    training_problems_after_listing,
)


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}::{i}" for i in range(n)]


def spec_stream(pools: list[Pool], n: int) -> list[tuple[str, str]]:
    """The weighted fair rule written out plainly: (label, task) for the first `n` slots."""
    groups = [p for p in pools if p.task_ids]
    weights = [len(p.task_ids) if p.weight == "tasks" else p.weight for p in groups]
    shares = [w / sum(weights) for w in weights]
    credits = [0.0] * len(groups)
    last = -1
    passes: list[list[str]] = [[] for _ in groups]
    pass_no = [-1] * len(groups)
    out: list[tuple[str, str]] = []
    for _ in range(n):
        credits = [c + s for c, s in zip(credits, shares, strict=True)]
        top = max(credits)
        order = [(last + 1 + k) % len(groups) for k in range(len(groups))]
        win = next(g for g in order if abs(credits[g] - top) <= 1e-12 or credits[g] > top)
        credits[win] -= 1
        last = win
        if not passes[win]:
            pass_no[win] += 1
            shuffled = list(groups[win].task_ids)
            random.Random(groups[win].seed + win * 10007 + pass_no[win] * 101).shuffle(shuffled)
            passes[win] = shuffled
        out.append((groups[win].label, passes[win].pop(0)))
    return out


MIXTURE = [
    Pool("a", 1.0, ids("a", 5), seed=3),
    Pool("b", 2.0, ids("b", 7), seed=3),
    Pool("c", 3.5, ids("c", 11), seed=3),
]


def drain(order: TaskOrder, batches: int) -> list[tuple[str | None, str]]:
    return [item for _ in range(batches) for item in order.next_batch()]


# -- the weighted fair interleave ------------------------------------------------------------------------------


def test_mixture_order_is_the_specs_credit_rule_over_many_steps():
    order = TaskOrder(MIXTURE, seed=0, batch_size=4, mode="auto")
    assert order.mode == "weighted"  # several entries always interleave by weight
    assert drain(order, 300) == spec_stream(MIXTURE, 1200)


def test_shares_converge_to_the_weights():
    order = TaskOrder(MIXTURE, seed=0, batch_size=8, mode="weighted")
    slots = 8 * 500
    counts = Counter(label for label, _ in drain(order, 500))
    total = 1.0 + 2.0 + 3.5
    for pool in MIXTURE:
        # The credit scheduler never strays more than a slot per group from the exact share.
        assert abs(counts[pool.label] - slots * pool.weight_value / total) <= len(MIXTURE)


def test_weight_tasks_draws_every_task_of_the_mixture_equally_often():
    pools = [
        Pool("x", "tasks", ids("x", 3)),
        Pool("y", "tasks", ids("y", 9)),
        Pool("z", "tasks", ids("z", 20)),
    ]
    order = TaskOrder(pools, batch_size=5, mode="weighted")
    assert order.share_of() == {"x": 3 / 32, "y": 9 / 32, "z": 20 / 32}
    assert order.epoch_size == 35 and order.steps_per_epoch == 7  # 32 rounded up to whole batches
    rounds = 10
    counts = Counter(task for _, task in order._labelled(order._items(0, 32 * rounds)))
    assert len(counts) == 32
    assert set(counts.values()) <= {rounds - 1, rounds, rounds + 1}
    assert sum(counts.values()) == 32 * rounds


def test_ties_scan_from_the_group_after_the_last_winner():
    pools = [Pool("p", 1.0, ["p"]), Pool("q", 1.0, ["q"]), Pool("r", 1.0, ["r"])]
    order = TaskOrder(pools, batch_size=1, mode="weighted")
    assert [task for _, task in drain(order, 7)] == ["p", "q", "r", "p", "q", "r", "p"]


def test_deterministic_under_the_seed_and_the_pool_seeds_change_it():
    again = TaskOrder(MIXTURE, batch_size=4, mode="weighted")
    assert drain(TaskOrder(MIXTURE, batch_size=4, mode="weighted"), 50) == drain(again, 50)
    reseeded = [Pool(p.label, p.weight, p.task_ids, seed=4) for p in MIXTURE]
    assert drain(TaskOrder(reseeded, batch_size=4, mode="weighted"), 50) != drain(
        TaskOrder(MIXTURE, batch_size=4, mode="weighted"), 50
    )


def test_each_group_draws_every_task_once_per_pass_and_passes_go_on_across_epochs():
    # `a` gets about 2 slots of each 9-slot epoch for its 5 tasks: its passes span epochs.
    pools = [Pool("a", 1.0, ids("a", 5), seed=7), Pool("b", 3.5, ids("b", 4), seed=7)]
    order = TaskOrder(pools, batch_size=3, mode="weighted")
    assert order.epoch_size == 9 and order.steps_per_epoch == 3
    drawn = [task for k in range(40) for _, task in order.epoch_items(k)]
    for i, pool in enumerate(pools):
        mine = [t for t in drawn if t.startswith(f"{pool.label}::")]
        n = len(pool.task_ids)
        passes = [mine[j : j + n] for j in range(0, len(mine) - n + 1, n)]
        assert len(passes) >= 10
        for p, one_pass in enumerate(passes):
            expected = list(pool.task_ids)
            random.Random(7 + i * 10007 + p * 101).shuffle(expected)
            assert one_pass == expected
    # The first epoch does not hold all of `a`'s tasks; its pass goes on in the second.
    first = [t for _, t in order.epoch_items(0) if t.startswith("a::")]
    assert 0 < len(first) < 5


def test_epochs_are_slices_of_one_stream_and_reading_back_regenerates():
    order = TaskOrder(MIXTURE, batch_size=4, mode="weighted")
    e1 = order.epoch_items(1)
    e0 = order.epoch_items(0)  # an earlier epoch than the last one read: regenerated from the start
    assert e0 + e1 == spec_stream(MIXTURE, 2 * order.epoch_size)
    assert order.batch(order.steps_per_epoch) == e1[:4]


def test_epoch_and_steps_per_epoch():
    order = TaskOrder(MIXTURE, batch_size=4, mode="weighted")
    assert order.epoch_size == 24 and order.steps_per_epoch == 6  # 23 tasks, rounded up
    assert order.epoch == 0
    drain(order, 6)
    assert (order.epoch, order.batches_drawn) == (1, 6)


def test_resume_from_state_continues_the_identical_order():
    whole = TaskOrder(MIXTURE, batch_size=4, mode="weighted")
    first = drain(whole, 7)
    cut = TaskOrder(MIXTURE, batch_size=4, mode="weighted")
    assert drain(cut, 7) == first
    state = json.loads(json.dumps(cut.state()))
    assert state["next_batch"] == 7 and state["epoch"] == 1
    resumed = TaskOrder.restore(MIXTURE, state, batch_size=4, mode="weighted")
    assert drain(resumed, 20) == drain(whole, 20)


def test_resume_of_the_auto_order_too():
    pool = [Pool("default", "tasks", [f"t{i}" for i in range(10)])]
    whole = TaskOrder(pool, seed=42, batch_size=3)
    drain(whole, 5)
    state = whole.state()
    rest = drain(whole, 8)
    assert drain(TaskOrder.restore(pool, state, seed=42, batch_size=3), 8) == rest


def test_restore_refuses_what_is_not_a_state():
    with pytest.raises(ValueError, match="not a task order state"):
        TaskOrder.restore(MIXTURE, {"position": 3}, batch_size=4)


def test_mixed_weights_and_empty_pools():
    with pytest.raises(ValueError, match="all numbers or all 'tasks'"):
        TaskOrder([Pool("a", 1.0, ["a::1"]), Pool("b", "tasks", ["b::1"])], batch_size=1)
    with pytest.raises(ValueError, match="no training tasks"):
        TaskOrder([Pool("a", "tasks", [])], batch_size=1)
    with pytest.raises(ValueError, match="not a positive finite number"):
        Pool("a", 0.0, ["x"])
    # An empty entry takes no share: the others split the slots.
    order = TaskOrder([Pool("a", 2.0, []), Pool("b", 1.0, ["b::1"]), Pool("c", 1.0, ["c::1"])], batch_size=2)
    assert order.share_of() == {"b": 0.5, "c": 0.5}


# -- a single entry, `task_order: auto` ------------------------------------------------------------------------


def test_auto_order_is_the_dataset_shuffle_over_concatenated_passes():
    tasks = [f"t{i}" for i in range(10)]
    order = TaskOrder([Pool("default", "tasks", tasks)], seed=42, batch_size=4)
    assert order.mode == "auto"
    assert order.epoch_size == 8 and order.steps_per_epoch == 2  # whole batches only
    stream = [tasks[int(i)] for p in range(4) for i in np.random.default_rng(42 + p * 101).permutation(10)]
    drawn = drain(order, 8)
    assert drawn == [("default", t) for t in stream[:32]]
    # The two tasks left over from the first epoch start the second instead of being dropped.
    assert order.epoch_items(1)[:2] == [("default", t) for t in stream[8:10]]


def test_auto_order_refuses_a_batch_larger_than_the_tasks():
    with pytest.raises(ValueError, match="batch_size 5 is larger than the 4 training tasks"):
        TaskOrder([Pool("default", "tasks", ["a", "b", "c", "d"])], batch_size=5)
    # Weighted order rounds up instead.
    order = TaskOrder([Pool("default", "tasks", ["a", "b", "c", "d"])], batch_size=5, mode="weighted")
    assert order.epoch_size == 5
    assert epoch_size(4, 5, "auto") == 0


def test_labels_from_a_label_column_and_helpers():
    pool = Pool("default", "tasks", ["t1", "t2"], labels={"t1": "alg", "t2": None})
    order = TaskOrder([pool], batch_size=2)
    assert sorted(order.next_batch(), key=lambda item: item[1]) == [("alg", "t1"), (None, "t2")]
    assert [label_text(v) for v in ("x", "", True, False, 3, 2.5, [1], None)] == [
        "x",
        None,
        "true",
        "false",
        "3",
        "2.5",
        None,
        None,
    ]
    assert split_task_id("math::7") == ("math", "7") and split_task_id("7") == (None, "7")


def test_harness_draw_is_the_sha256_walk_over_sorted_names():
    harness = {"zeta": 1.0, "alpha": 3.0}
    for task in ("t1", "t2", "t3", "t4"):
        point = int.from_bytes(hashlib.sha256(f"5:{task}".encode()).digest()[:8], "big") / 2**64 * 4.0
        assert draw_harness(harness, seed=5, task_id=task) == ("alpha" if point < 3.0 else "zeta")
    draws = Counter(draw_harness(harness, seed=0, task_id=f"t{i}") for i in range(2000))
    assert 1350 < draws["alpha"] < 1650


# -- listing through services ----------------------------------------------------------------------------------


def write_table(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture
def project(tmp_path, monkeypatch):
    """Two JSONL task tables and a config writer in a temporary project (the working directory)."""
    monkeypatch.chdir(tmp_path)
    write_table(
        tmp_path / "algebra.jsonl",
        [{"id": f"alg{i}", "goal": "solve", "topic": "easy" if i < 2 else "hard"} for i in range(6)]
        + [{"id": "alg-held", "goal": "solve", "split": "eval"}],
    )
    write_table(
        tmp_path / "geometry.jsonl", [{"id": f"geo{i}", "goal": "draw", "topic": "hard"} for i in range(3)]
    )

    def write(name: str, text: str) -> str:
        (tmp_path / name).write_text(textwrap.dedent(text))
        return name

    return write


MIXTURE_CONFIG = """
    log_path: runs
    train:
      model_name: platoon/toy
      renderer_name: qwen3_instruct
      batch_size: 4
      num_epochs: 3
    environments:
      - name: algebra
        service: table
        service_kwargs: {path: algebra.jsonl}
        dataset_kwargs: {split_name: [train]}
        exclude_tasks: [alg5, alg-held]
        seed: 1
      - name: geometry
        service: table
        service_kwargs: {path: geometry.jsonl}
"""


def listed(path: str, *overrides: str) -> tuple[Any, list[Pool]]:
    config = load_config(path, list(overrides), kind="train").config
    return config, asyncio.run(list_training_tasks(config, base_dir=Path.cwd()))


def test_listing_a_mixture_gives_prefixed_ids_labels_and_exclusions(project):
    config, pools = listed(project("c.yaml", MIXTURE_CONFIG))
    algebra, geometry = pools
    assert algebra.label == "algebra" and geometry.label == "geometry"
    assert algebra.task_ids == tuple(f"algebra::alg{i}" for i in range(5))
    assert geometry.task_ids == ("geometry::geo0", "geometry::geo1", "geometry::geo2")
    assert algebra.seed == 1 and algebra.entry == 0 and geometry.entry == 1
    # alg-held is a task of the eval split: excluding it is fine and leaves training as it is.
    assert algebra.excluded == {"train": {"listed": 6, "excluded": ["alg5"]}}
    order = TaskOrder(pools, batch_size=4, mode=config.train.task_order)
    labels = Counter(label for label, _ in drain(order, 16))
    assert labels == {"algebra": 40, "geometry": 24}  # weight: tasks, 5 : 3
    assert training_problems_after_listing(config, pools) == []


def test_listing_keys_limit_shuffle_and_a_single_entry(project):
    path = project(
        "s.yaml",
        """
        log_path: runs
        train: {model_name: m, renderer_name: qwen3_instruct, batch_size: 2, max_training_steps: 4}
        environments:
          - name: algebra
            service: table
            service_kwargs: {path: algebra.jsonl}
            dataset_kwargs: {split_name: [train, eval], shuffle_seed: 3, limit: 4}
        """,
    )
    _, (pool,) = listed(path)
    every = [f"alg{i}" for i in range(6)] + ["alg-held"]
    random.Random(3).shuffle(every)
    assert pool.label == "default"  # a single entry: raw ids and the label `default`
    assert pool.task_ids == tuple(every[:4])
    assert pool.excluded == {
        "train": {"listed": 6, "excluded": []},
        "eval": {"listed": 1, "excluded": []},
    }


def test_unknown_exclude_tasks_items_are_refused_with_the_prefix_hint(project):
    path = project("c.yaml", MIXTURE_CONFIG)
    with pytest.raises(ConfigError) as caught:
        listed(path, "environments.1.exclude_tasks=[geometry::geo1, nothing]")
    assert caught.value.problems == [
        "environments.1.exclude_tasks: 'geometry::geo1' names no task (by id or name) in any split of the 'table' "
        "service; exclude_tasks takes the entry's own task ids, without the `geometry::` prefix of mixture ids: "
        "write 'geo1'",
        "environments.1.exclude_tasks: 'nothing' names no task (by id or name) in any split of the 'table' service",
    ]


def test_excluding_every_task_is_refused(project):
    path = project("c.yaml", MIXTURE_CONFIG)
    with pytest.raises(
        ConfigError,
        match=re.escape("excludes all 3 training tasks of environments[geometry]; leave at least"),
    ):
        listed(path, "environments.1.exclude_tasks=[geo0, geo1, geo2]")


def test_label_by_a_dataset_column(project):
    path = project("c.yaml", MIXTURE_CONFIG)
    config, pools = listed(path, "train.label_by=topic")
    order = TaskOrder(pools, batch_size=4, mode="weighted")
    by_task = dict((task, label) for label, task in drain(order, 10))
    assert by_task["algebra::alg0"] == "easy" and by_task["algebra::alg3"] == "hard"
    assert by_task["geometry::geo0"] == "hard"
    assert training_problems_after_listing(config, pools) == []
    config, pools = listed(path, "train.label_by=topik")
    assert training_problems_after_listing(config, pools) == [
        "train.label_by: no training task has a value in column 'topik'; did you mean topic?"
    ]


def test_plan_lines_and_warnings(project):
    config, pools = listed(project("c.yaml", MIXTURE_CONFIG))
    assert plan_lines(config, pools) == [
        "training tasks: 8, drawn in epochs of 8 (2 batches of 4), 6 steps planned",
        "environments[algebra]: share 62.5% (weight tasks, 5 tasks), each task drawn about 3 times over the run's "
        "6 steps",
        "environments[geometry]: share 37.5% (weight tasks, 3 tasks), each task drawn about 3 times over the run's "
        "6 steps",
    ]
    config, pools = listed(
        "c.yaml", "environments.0.weight=1", "environments.1.weight=9", "train.num_epochs=1"
    )
    lines = plan_lines(config, pools)
    assert lines[1].startswith(
        "environments[algebra]: share 10.0% (weight 1, 5 tasks), each task drawn about 0.2"
    )
    assert lines[3:] == [
        "warning: environments[algebra]: about 1 draws over the run for its 5 tasks, so some never train; raise "
        "its weight or the run's steps",
        "warning: environments[geometry] draws each of its tasks 15.0x as often as environments[algebra] does "
        "(more than 4x); weight: tasks draws every task equally often",
    ]


def test_a_batch_larger_than_a_single_entrys_tasks(project):
    path = project(
        "s.yaml",
        """
        log_path: runs
        train: {model_name: m, renderer_name: qwen3_instruct, batch_size: 8, max_training_steps: 4}
        environments:
          - service: table
            service_kwargs: {path: geometry.jsonl}
        """,
    )
    config, pools = listed(path)
    assert training_problems_after_listing(config, pools) == [
        "train.batch_size: 8 is larger than the 3 training tasks: an epoch holds only whole batches; lower "
        "batch_size or list more tasks"
    ]
    # `weighted` rounds the epoch up instead.
    config, pools = listed(path, "train.task_order=weighted")
    assert training_problems_after_listing(config, pools) == []


# -- `platoon config validate --tasks` -------------------------------------------------------------------------


def validate(capsys, *argv: str) -> tuple[int, list[str]]:
    code = main(["config", "validate", "--no-resolve", *argv])
    return code, capsys.readouterr().out.splitlines()


def test_config_validate_tasks_prints_the_sampling_plan(project, capsys):
    path = project("c.yaml", MIXTURE_CONFIG)
    assert validate(capsys, "--tasks", path) == (
        0,
        [
            "ok   c.yaml (PlatoonTinkerRLTrainerConfig)",
            "  training tasks: 8, drawn in epochs of 8 (2 batches of 4), 6 steps planned",
            "  environments[algebra]: share 62.5% (weight tasks, 5 tasks), each task drawn about 3 times over the "
            "run's 6 steps",
            "  environments[geometry]: share 37.5% (weight tasks, 3 tasks), each task drawn about 3 times over the "
            "run's 6 steps",
        ],
    )


def test_config_validate_tasks_fails_on_post_listing_refusals(project, capsys):
    path = project("c.yaml", MIXTURE_CONFIG)
    code, lines = validate(capsys, "--tasks", path, "environments.0.exclude_tasks=[alg9]")
    assert code == 78
    assert lines == [
        "FAIL c.yaml",
        "  environments.0.exclude_tasks: 'alg9' names no task (by id or name) in any split of the 'table' service",
    ]
    code, lines = validate(
        capsys,
        "--tasks",
        path,
        "train.batch_size=9",
        "environments=[{service: table, service_kwargs: {path: geometry.jsonl}}]",
    )
    assert code == 78
    assert lines == [
        "FAIL c.yaml",
        "  train.batch_size: 9 is larger than the 3 training tasks: an epoch holds only whole batches; lower "
        "batch_size or list more tasks",
    ]


def test_config_validate_tasks_on_other_configs(project, capsys):
    path = project(
        "e.yaml", "environments:\n  - service: table\n    service_kwargs: {path: geometry.jsonl}\n"
    )
    assert validate(capsys, "--tasks", path) == (
        0,
        ["ok   e.yaml (EnvironmentsOnlyConfig)", "  tasks: only a training config's tasks are listed"],
    )
