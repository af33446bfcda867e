"""Reward processors as an extension gives them: a `RewardProcessor` record whose `fn` is an import string is
imported when the processor is named, and one that cannot be imported or is not callable is refused at start (78,
one line naming the processor and its import string) by every command that runs one, and by `config validate`.
Whichever door a processor comes in by (`register_reward_processor`, a hookimpl, an entry point's value), it lands
in one registry: one lookup finds it, and two different functions under one name are one error naming both."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from platoon import plugins, registry
from platoon.cli import main
from platoon.errors import ExtensionError

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "bandit" / "train.yaml"
EVAL = REPO / "examples" / "bandit" / "eval.yaml"

PLUGIN = textwrap.dedent(
    '''
    """acme-scoring's hook: its reward processors name their functions by import string."""
    import platoon
    from platoon.hookspecs import RewardProcessor

    PROCESSORS = {
        "acme-lazy": RewardProcessor("acme-lazy", "a quarter point for trying", "acme_scoring.scores:bonus"),
        "acme-missing": RewardProcessor("acme-missing", "a typo in its fn", "acme_scoring.scores:bonsu"),
        "acme-unimportable": RewardProcessor("acme-unimportable", "a module not there", "acme_nowhere:bonus"),
        "acme-threshold": RewardProcessor("acme-threshold", "names a number", "acme_scoring.scores:THRESHOLD"),
    }
    LAZY = PROCESSORS["acme-lazy"]


    @platoon.hookimpl
    def platoon_register_reward_processors(name):
        return PROCESSORS.get(name)
    '''
)

SCORES = textwrap.dedent(
    """
    THRESHOLD = 0.5


    def bonus(trajectory):
        return 0.5 * float(trajectory["reward"]) + 0.25, {"reward/bonus": 0.25}
    """
)


@pytest.fixture
def acme_scoring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_plugins: None) -> Path:
    """The distribution acme-scoring installed on sys.path: its module and its dist-info with the entry points."""
    site = tmp_path / "site-packages"
    package = site / "acme_scoring"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PLUGIN)
    (package / "scores.py").write_text(SCORES)
    info = site / "acme_scoring-1.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-scoring\nVersion: 1.0.0\n")
    names = ("acme-lazy", "acme-missing", "acme-unimportable", "acme-threshold")
    (info / "entry_points.txt").write_text(
        "[platoon.reward_processors]\n"
        + "".join(f"{name} = acme_scoring\n" for name in names)
        # the 0.2.0 form: the entry point's value is the processor itself
        + "acme-direct = acme_scoring.scores:bonus\n"
    )
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    plugins.reset()
    yield site
    for name in [n for n in sys.modules if n.split(".")[0] == "acme_scoring"]:
        del sys.modules[name]


def test_an_import_string_fn_is_imported_when_the_processor_is_named(acme_scoring):
    assert "acme_scoring.scores" not in sys.modules  # nothing is imported before the name is used
    processor = plugins.get_reward_processor("acme-lazy")
    assert processor({"reward": 1.0}) == (0.75, {"reward/bonus": 0.25})
    assert processor is sys.modules["acme_scoring.scores"].bonus


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        (
            "acme-missing",
            "reward processor 'acme-missing' (acme-scoring): cannot import 'acme_scoring.scores:bonsu': "
            "'acme_scoring.scores' has no attribute 'bonsu'",
        ),
        (
            "acme-unimportable",
            "reward processor 'acme-unimportable' (acme-scoring): cannot import 'acme_nowhere:bonus': "
            "importing 'acme_nowhere' failed (ModuleNotFoundError: No module named 'acme_nowhere')",
        ),
        (
            "acme-threshold",
            "reward processor 'acme-threshold' (acme-scoring) is a float, not a callable "
            "fn(trajectory_dict) -> (score, components)",
        ),
    ],
)
def test_a_processor_that_cannot_run_is_one_line_naming_it(acme_scoring, name, problem):
    with pytest.raises(ExtensionError) as caught:
        plugins.get_reward_processor(name)
    assert str(caught.value) == problem


def test_a_registered_record_and_an_import_string_naming_a_record_resolve_too(acme_scoring, monkeypatch):
    from platoon import registry
    from platoon.hookspecs import RewardProcessor

    record = RewardProcessor("acme-registered", "by register_reward_processor", "acme_scoring.scores:bonus")
    monkeypatch.setitem(registry._registries["reward_processor"], "acme-registered", record)
    assert plugins.get_reward_processor("acme-registered")({"reward": 0.0}) == (0.25, {"reward/bonus": 0.25})
    # `module:attr` naming a record (not the function) gives the record's function
    assert plugins.get_reward_processor("acme_scoring:LAZY") is sys.modules["acme_scoring.scores"].bonus


@pytest.fixture
def processors(monkeypatch: pytest.MonkeyPatch) -> None:
    """What this test registers by code is gone after it."""
    monkeypatch.setitem(
        registry._registries, "reward_processor", dict(registry._registries["reward_processor"])
    )


def _mine(trajectory):
    return 1.0, {}


def _impostor(trajectory):
    return 0.0, {}


def test_every_door_lands_in_one_lookup(acme_scoring, processors):
    registry.register_reward_processor("acme-mine", _mine)
    by_hook = plugins.get_reward_processor("acme-lazy")
    by_entry_point = plugins.get_reward_processor("acme-direct")
    bonus = sys.modules["acme_scoring.scores"].bonus
    assert by_hook is bonus and by_entry_point is bonus
    assert plugins.get_reward_processor("acme-mine") is _mine
    assert {
        name: registry.lookup("reward_processor", name) for name in ("acme-mine", "acme-lazy", "acme-direct")
    } == {
        "acme-mine": _mine,
        "acme-lazy": bonus,
        "acme-direct": bonus,
    }
    assert {"acme-mine", "acme-lazy", "acme-direct"} <= set(registry.registered("reward_processor"))


def test_code_taking_a_name_an_entry_point_gives_is_one_error_naming_both(acme_scoring, processors):
    registry.register_reward_processor("acme-lazy", _impostor)
    with pytest.raises(ExtensionError) as caught:
        plugins.get_reward_processor("acme-lazy")
    assert str(caught.value) == (
        "reward processor 'acme-lazy' (acme-scoring): reward_processor 'acme-lazy' is already registered to "
        f"{__name__}:_impostor; cannot register acme_scoring.scores:bonus under it"
    )


def test_an_entry_point_taking_a_name_first_refuses_code_under_it(acme_scoring, processors):
    plugins.get_reward_processor("acme-direct")
    with pytest.raises(ValueError) as caught:
        registry.register_reward_processor("acme-direct", _impostor)
    assert str(caught.value) == (
        "reward_processor 'acme-direct' is already registered to acme_scoring.scores:bonus; "
        f"cannot register {__name__}:_impostor under it"
    )
    # the same function again, by code, is no conflict
    assert registry.register_reward_processor("acme-direct", sys.modules["acme_scoring.scores"].bonus)


def test_forgetting_the_plugins_forgets_what_they_registered_not_what_code_did(acme_scoring, processors):
    registry.register_reward_processor("acme-mine", _mine)
    plugins.get_reward_processor("acme-lazy")
    plugins.reset()
    assert registry.lookup("reward_processor", "acme-lazy") is None
    assert registry.lookup("reward_processor", "acme-mine") is _mine


COMMANDS = {
    "config validate": ["config", "validate", str(TRAIN)],
    "train": ["train", str(TRAIN)],
    "rollout": ["rollout", str(TRAIN), "--task", "train:0"],
    "eval": ["eval", str(EVAL)],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_a_processor_that_does_not_import_before_it_starts(
    acme_scoring, tmp_path, monkeypatch, capsys, command
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLATOON_SITE", "/dev/null")
    monkeypatch.setenv("TINKER_BASE_URL", "local")
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    place = (
        f"inference.output_dir={tmp_path / 'runs'}" if command == "eval" else f"log_path={tmp_path / 'runs'}"
    )
    argv = [*COMMANDS[command], place, "environments.0.reward_processor=acme-missing"]
    assert main(argv) == 78
    captured = capsys.readouterr()
    said = captured.out + captured.err  # config validate reports on stdout, the run commands on stderr
    assert (
        "environments.0.reward_processor: reward processor 'acme-missing' (acme-scoring): cannot import "
        "'acme_scoring.scores:bonsu': 'acme_scoring.scores' has no attribute 'bonsu'"
    ) in said
    assert "Traceback" not in said
    assert not (tmp_path / "runs").exists()  # refused before anything was written or started


def test_extensions_check_load_resolves_each_processors_import_string(acme_scoring, capsys):
    assert main(["extensions", "check", "acme-scoring", "--load"]) == 78
    said = capsys.readouterr()
    report = said.out + said.err
    assert "cannot import 'acme_scoring.scores:bonsu'" in report
    assert "cannot import 'acme_nowhere:bonus'" in report
    assert "reward processor 'acme-threshold' (acme-scoring) is a float, not a callable" in report
    assert "acme-lazy" not in report  # the one that resolves is not a problem
    assert "Traceback" not in report
