"""Step budgets: linear reservation math, depth rules, verifier exemptions, atomicity."""

from __future__ import annotations

import math
import threading

import pytest

from platoon.episode.budget import BUDGET_GUIDANCE, BudgetError, BudgetTracker
from platoon.harness.agent import Budget


class Steps:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        return self.n


def test_linear_reserves_max_steps_plus_one_and_counts_descendants():
    tracker = BudgetTracker("linear")
    root_steps, child_steps = Steps(), Steps()
    root = tracker.add_agent("root", max_steps=20, steps=root_steps)
    assert isinstance(root, Budget)
    root_steps.n = 3
    assert root.remaining() == 17 and root.used() == 3

    hold = tracker.reserve(root, 5)
    assert hold.amount == 6
    assert root.remaining() == 11  # 20 - 3 used - 6 reserved
    child = tracker.add_agent("child", max_steps=5, steps=child_steps, parent=root)
    child_steps.n = 4
    assert child.remaining() == 1 and child.used() == 4
    assert root.used() == 7  # descendants count under linear budgets
    assert root.remaining() == 7  # 20 - 7 - 6: the reservation holds until the child returns

    tracker.release(hold)
    tracker.release(hold)  # idempotent
    assert root.remaining() == 13


def test_a_reservation_fails_when_remaining_is_below_the_request():
    tracker = BudgetTracker("linear")
    steps = Steps()
    root = tracker.add_agent("root", max_steps=10, steps=steps)
    tracker.reserve(root, 9)  # exactly 10
    with pytest.raises(BudgetError) as info:
        tracker.reserve(root, 1)
    assert info.value.reason == "step_budget"
    assert info.value.guidance == BUDGET_GUIDANCE
    assert "max_steps + 1" in info.value.guidance
    assert str(info.value) == "Requested 2 steps (max_steps 1 + 1) but only 0 remain."


def test_unbounded_agents_never_run_out():
    tracker = BudgetTracker("linear")
    for allocation in (None, 0):
        node = tracker.add_agent(f"a{allocation}", max_steps=allocation, steps=Steps())
        assert node.remaining() == math.inf
        tracker.reserve(node, 1000)
        assert node.remaining() == math.inf


def test_depth_aware_counts_own_steps_and_reserves_nothing():
    tracker = BudgetTracker("depth_aware", max_depth=1)
    root_steps, child_steps = Steps(), Steps()
    root = tracker.add_agent("root", max_steps=5, steps=root_steps)
    hold = tracker.reserve(root, 50)
    assert hold.amount == 0 and root.remaining() == 5
    child = tracker.add_agent("child", max_steps=50, steps=child_steps, parent=root)
    child_steps.n = 10
    assert root.used() == 0 and child.used() == 10 and child.remaining() == 40
    with pytest.raises(BudgetError) as info:
        tracker.reserve(child, 1)
    assert info.value.reason == "depth"


def test_linear_checks_depth_only_when_max_depth_is_set():
    deep = BudgetTracker("linear")
    node = deep.add_agent("root", max_steps=None, steps=Steps())
    for depth in range(6):
        deep.reserve(node, 1)
        node = deep.add_agent(f"d{depth}", max_steps=None, steps=Steps(), parent=node)
    assert node.depth == 6

    bounded = BudgetTracker("linear", max_depth=0)
    root = bounded.add_agent("root", max_steps=None, steps=Steps())
    with pytest.raises(BudgetError) as info:
        bounded.reserve(root, 1)
    assert info.value.reason == "depth"


def test_verifier_roots_and_one_level_of_helpers_are_exempt_from_max_depth():
    tracker = BudgetTracker("linear", max_depth=1)
    root = tracker.add_agent("root", max_steps=10, steps=Steps())
    tracker.reserve(root, 2)
    child = tracker.add_agent("child", max_steps=2, steps=Steps(), parent=root)
    with pytest.raises(BudgetError):
        tracker.reserve(child, 1)  # policy depth 2 > max_depth 1
    hold = tracker.reserve(child, 20, verifier=True)  # a verifier root: exempt, and holds no steps
    assert hold.amount == 0
    verifier = tracker.add_agent("verifier", max_steps=20, steps=Steps(), parent=child, verifier=True)
    tracker.reserve(verifier, 3)  # one level of helpers
    helper = tracker.add_agent("helper", max_steps=3, steps=Steps(), parent=verifier)
    assert helper.depth == 3  # max_depth + 2: the physical tree may exceed max_depth
    with pytest.raises(BudgetError) as info:
        tracker.reserve(helper, 1)
    assert info.value.reason == "verifier_depth"


def test_concurrent_reservations_are_atomic():
    tracker = BudgetTracker("linear")
    root = tracker.add_agent("root", max_steps=100, steps=Steps())
    granted: list[int] = []
    barrier = threading.Barrier(8)

    def grab() -> None:
        barrier.wait()
        for _ in range(10):
            try:
                granted.append(tracker.reserve(root, 1).amount)
            except BudgetError:
                pass

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(granted) == 100 and len(granted) == 50
    assert root.remaining() == 0


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="linear"):
        BudgetTracker("greedy")  # type: ignore[arg-type]
