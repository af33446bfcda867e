"""`pt.EnvironmentEntry` (a named environment's partial entry) and the named hooks of `platoon.hooks`."""

from __future__ import annotations

import sys
import types

import pytest

import platoon as pt
from platoon import hooks, plugins
from platoon.envs import named
from platoon.errors import ExtensionError


def test_an_entry_is_a_validated_partial_environment_entry():
    entry = pt.EnvironmentEntry(
        "acme-maze",
        "1.2",
        description="Mazes.",
        service="table",
        harness="acme-walker",
        agents={"max_depth": 2},
        harness_defaults={"acme-walker": {"steps": 5}},
    )
    assert entry.ref == "acme-maze@1.2"
    first = entry.entry()
    first["agents"]["max_depth"] = 9  # a fresh copy every time
    assert entry.entry() == {"service": "table", "harness": "acme-walker", "agents": {"max_depth": 2}}
    assert entry.defaults_for("acme-walker@3") == {"steps": 5}
    assert entry.defaults_for("agents/walker.toml") == {}
    assert entry.defaults_for("acme_pkg.walk:walker") == {}
    with pytest.raises(ValueError, match="harness mixture cannot apply"):
        entry.defaults_for({"acme-walker": 1, "acme-runner": 2})


@pytest.mark.parametrize("key", ["name", "weight", "harness_options", "exclude_tasks", "workflow", "env"])
def test_keys_that_belong_to_the_config_are_refused(key):
    with pytest.raises(ValueError, match=f"{key}: a named environment cannot set it"):
        pt.EnvironmentEntry("acme-maze", **{key: "x"})


def test_entry_keys_are_checked_against_the_schema():
    with pytest.raises(ValueError) as caught:
        pt.EnvironmentEntry("acme-maze", service="table", sevice_kwargs={}, agents={"child_max_steps": 0})
    message = str(caught.value)
    assert message.startswith("environment acme-maze@1 is not a valid entry: ")
    assert "sevice_kwargs" in message and "agents.child_max_steps" in message
    with pytest.raises(
        ValueError, match=r"eval_overrides\.harness_options: a named environment cannot set it"
    ):
        pt.EnvironmentEntry("acme-maze", eval_overrides={"harness_options": {}})
    with pytest.raises(ValueError, match="naming rule"):
        pt.EnvironmentEntry("Acme Maze")


def test_an_entry_named_by_import_string(monkeypatch):
    module = types.ModuleType("acme_envs_for_test")
    module.MAZE = pt.EnvironmentEntry("acme-maze", service="table")
    module.NOT_AN_ENTRY = {"service": "table"}
    monkeypatch.setitem(sys.modules, "acme_envs_for_test", module)
    assert named.get_environment("acme_envs_for_test:MAZE") is module.MAZE
    with pytest.raises(ExtensionError, match=r"is dict, not a platoon\.EnvironmentEntry"):
        named.get_environment("acme_envs_for_test:NOT_AN_ENTRY")


def test_named_hooks_combine_registered_functions_and_plugin_hookimpls(fresh_plugins):
    def counters() -> dict[str, float]:
        return {"sandboxes": 1.0}

    hooks.register("rollout_worker.telemetry", counters)
    hooks.register("rollout_worker.telemetry", counters)  # once per function
    plugin = types.ModuleType("acme_telemetry_plugin")

    @pt.hookimpl
    def platoon_rollout_worker_telemetry() -> dict[str, float]:
        return {"gpus": 0.0}

    plugin.platoon_rollout_worker_telemetry = platoon_rollout_worker_telemetry
    plugins.plugin_manager().register(plugin)
    try:
        functions = hooks.hooks("rollout_worker.telemetry")
        assert [fn() for fn in functions] == [{"sandboxes": 1.0}, {"gpus": 0.0}]
        assert hooks.hooks("trajectory.error_completion_ids") == []
        with pytest.raises(ValueError, match=r"unknown hook 'rollout\.telemetry'; the hooks are: "):
            hooks.register("rollout.telemetry", counters)
    finally:
        hooks.clear()
