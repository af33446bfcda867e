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


EPISODES = (
    "import gc\n"
    "from platoon.testing import run_episode\n"
    "from platoon.testing.number_search import react_binary_search\n"
    "def episode():\n"
    "    run_episode('train:0', service='python://platoon.envs.number_search.env:NumberSearchEnvironment',\n"
    "                harness='platoon-react', policy=react_binary_search)\n"
    "episode(); first = gc.get_freeze_count()\n"
    "gc.unfreeze(); episode()\n"
    "print(first, gc.get_freeze_count())\n"
)


def test_run_episode_freezes_once_per_process_after_its_first_episode(run_python):
    done = run_python(EPISODES)
    assert done.returncode == 0, done.stderr
    first, second = map(int, done.stdout.split())
    assert first > 100_000  # the loaded stack: the SDKs, the tokenizer, the renderer, the environment
    assert second < 1_000  # a second episode leaves the collector alone (the interpreter keeps a few hundred)


def test_platoon_freeze_heap_0_keeps_run_episode_off_the_collector(run_python):
    done = run_python(EPISODES, env={"PLATOON_FREEZE_HEAP": "0"})
    assert done.returncode == 0, done.stderr
    assert all(int(count) < 1_000 for count in done.stdout.split())


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_training_raises_the_thresholds_while_the_command_runs_and_restores_them(thresholds):
    from platoon.heap import RUN_THRESHOLDS, use_training_thresholds

    assert (
        use_training_thresholds() is False and gc.get_threshold() == thresholds
    )  # a library call: untouched
    with owned_by_the_command():
        assert use_training_thresholds() is True
        assert gc.get_threshold() == RUN_THRESHOLDS
    assert gc.get_threshold() == thresholds


def test_a_step_end_collects_the_cycles_the_step_left_once_the_thresholds_are_raised(thresholds):
    from platoon.heap import collect_at_step_end, use_training_thresholds

    class Cycle:
        pass

    assert collect_at_step_end() == 0.0  # CPython's thresholds: its own collections do the work
    with owned_by_the_command():
        use_training_thresholds()
        garbage = Cycle()
        garbage.self = garbage  # type: ignore[attr-defined]
        gone = weakref.ref(garbage)
        del garbage
        assert gone() is not None  # a cycle: reference counting cannot free it
        assert collect_at_step_end() > 0.0
        assert gone() is None
