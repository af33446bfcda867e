"""An episode leaves no reference cycles behind: once the caller drops its `EpisodeRun`, reference counting frees
the episode's gateway, recorder and records at once, so a loop of episodes leaves nothing for a full garbage
collection to walk."""

from __future__ import annotations

import gc
import weakref

from platoon.testing import ScriptedPolicy, run_episode
from platoon.testing.number_search import react_binary_search

NUMBER_SEARCH = {
    "service": "python://platoon.envs.number_search.env:NumberSearchEnvironment",
    "harness": "platoon-react",
}


def test_dropping_the_run_frees_the_episode_without_the_garbage_collector(tmp_path):
    run_episode(
        "train:0", **NUMBER_SEARCH, policy=ScriptedPolicy(react_binary_search), output_dir=tmp_path / "0"
    )
    gc.collect()
    gc.disable()
    try:
        run = run_episode(
            "train:1", **NUMBER_SEARCH, policy=ScriptedPolicy(react_binary_search), output_dir=tmp_path / "1"
        )
        assert run.reward == 1.0 and len(run.policy.calls) > 1
        gateway, policy = weakref.ref(run.gateway), weakref.ref(run.policy)
        del run
        assert gateway() is None and policy() is None
    finally:
        gc.enable()
