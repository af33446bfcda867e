"""`platoon.heap`: a run under the console script freezes its loaded heap; a library call leaves the caller's
garbage collector as it was. The runs themselves are checked where they run: tests/core/train/test_pipeline.py
(training) and tests/platoon/eval/test_eval.py (evaluation)."""

from __future__ import annotations

import gc
import weakref

import pytest

from platoon.heap import freeze_loaded_heap, owned_by_the_command


@pytest.fixture(autouse=True)
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_library_call_leaves_the_collector_alone():
    assert freeze_loaded_heap("a test") == 0
    assert gc.get_freeze_count() == 0


def test_under_the_command_what_is_alive_is_frozen_and_garbage_is_collected_first():
    class Cycle:
        pass

    garbage = Cycle()
    garbage.self = garbage  # type: ignore[attr-defined]
    gone = weakref.ref(garbage)
    del garbage
    with owned_by_the_command():
        frozen = freeze_loaded_heap("a test")
    assert frozen > 0 and gc.get_freeze_count() >= frozen
    assert gone() is None  # the cycle was collected before the freeze, not kept forever with the rest
    assert freeze_loaded_heap("after the command") == 0  # the command's hold ends with it


def test_a_caller_may_ask_for_the_freeze():
    assert freeze_loaded_heap("a benchmark", force=True) > 0
