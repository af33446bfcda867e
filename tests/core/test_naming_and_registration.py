"""Names, versions and references, and the rules of registering harnesses and programs in code."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import platoon as pt
from platoon import plugins, registry
from platoon.errors import ExtensionError
from platoon.naming import check_name, check_version, pick_version, version_matches
from platoon.programs import get_program


@pytest.mark.parametrize("name", ["acme-solver", "acme.solver_2", "x", "a1-b2.c3"])
def test_valid_names(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["Acme", "acme solver", "acme--x", "-acme", "acme-", "acme.toml", "", 3])
def test_invalid_names(name):
    with pytest.raises(ValueError, match="naming rule"):
        check_name(name)


@pytest.mark.parametrize("version", ["1", "2.4.6", "1.0+local", "1_0-rc1"])
def test_valid_versions(version):
    assert check_version(version) == version


@pytest.mark.parametrize("version", ["", "1..2", ".1", "1 2"])
def test_invalid_versions(version):
    with pytest.raises(ValueError, match="version rule"):
        check_version(version)


def test_version_prefixes_match_at_dots():
    assert version_matches("2.4.6", "2")
    assert version_matches("2.4.6", "2.4")
    assert version_matches("2.4.6", "2.4.6")
    assert not version_matches("24.1", "2")
    assert pick_version("h", "2", ["1", "2.4.6"], kind="harness") == "2.4.6"
    with pytest.raises(ValueError, match=r"ambiguous: it matches h@1, h@2; name one, for example h@2"):
        pick_version("h", None, ["1", "2"], kind="harness")


def test_harness_decorator_registers_and_returns_the_function(fresh_plugins):
    async def solve(ctx):
        """Solve it."""

    decorated = pt.harness("acme-unit", version="3")(solve)
    assert decorated is solve
    record = pt.get_harness("acme-unit")
    assert isinstance(record, pt.FunctionHarness)
    assert (record.ref, record.runtime, record.executes_model_code) == ("acme-unit@3", "inline", False)
    assert record.source.endswith(":test_harness_decorator_registers_and_returns_the_function.<locals>.solve")
    # re-registering the same function (a module re-import) replaces the record
    pt.harness("acme-unit", version="3")(solve)
    assert pt.get_harness("acme-unit@3").fn is solve


def test_harness_decorator_checks(fresh_plugins):
    def sync(ctx):
        pass

    with pytest.raises(TypeError, match="must be an async function"):
        pt.harness("acme-sync")(sync)
    with pytest.raises(ValueError, match="naming rule"):
        pt.harness("Acme")
    with pytest.raises(ValueError, match="only runtime is 'inline'"):
        pt.harness("acme-x", runtime="process")

    async def other(ctx):
        pass

    with pytest.raises(ValueError, match=r"reserved for platoon's own components; .* 'acme-react'"):
        pt.harness("platoon-react")(other)
    with pytest.raises(ValueError, match="reserved"):
        pt.harness("mini-swe-agent")(other)


def test_different_function_under_one_ref_names_both(fresh_plugins):
    async def first(ctx):
        pass

    async def second(ctx):
        pass

    pt.harness("acme-twin")(first)
    with pytest.raises(ValueError, match=r"acme-twin@1 is defined twice: by .*first and by .*second"):
        pt.harness("acme-twin")(second)


def test_get_harness_by_import_string(fresh_plugins):
    with pytest.raises(
        ExtensionError, match=r"'python://platoon.programs.builtin:single' is not an @platoon.harness"
    ):
        pt.get_harness("python://platoon.programs.builtin:single")
    with pytest.raises(
        ExtensionError,
        match=r"^harness: cannot import 'no_such_module:fn': importing 'no_such_module' failed \(ModuleNotFoundError",
    ):
        pt.get_harness("no_such_module:fn")
    # a .toml path is loaded directly (tests/core/harness_spec covers specs): a missing file is one line
    with pytest.raises(ExtensionError, match=r"agents/bash\.toml: no such harness spec file$"):
        pt.get_harness("agents/bash.toml")


def test_unknown_harness_lists_what_exists(fresh_plugins):
    async def solve(ctx):
        pass

    pt.harness("acme-solver")(solve)
    with pytest.raises(ExtensionError) as caught:
        pt.get_harness("acme-solvr")
    message = str(caught.value)
    assert message.startswith("unknown harness 'acme-solvr' (did you mean acme-solver?). installed: ")
    assert "; registered by code in this process: acme-solver@1; " in message
    assert "registered: none" not in message
    assert "provide one with @platoon.harness" in message


def test_an_unknown_name_lists_what_is_installed_not_an_empty_registry(fresh_plugins):
    # nothing registered by code: the message says what installed packages provide, not "registered: none"
    with pytest.raises(ExtensionError) as caught:
        get_program("acme-nothing")
    message = str(caught.value)
    assert message.startswith(
        "unknown program 'acme-nothing'. installed: gym (platoon-core), single (platoon-core); "
    )
    assert "registered" not in message.split("; provide one")[0]


def test_programs(fresh_plugins):
    single = get_program("single")
    assert (single.ref, single.source) == ("single@1", "platoon.programs.builtin:single")
    assert get_program("gym@1").name == "gym"

    @pt.program("acme-loop", version="2")
    async def loop(ep):
        """Loop."""

    assert get_program("acme-loop").ref == "acme-loop@2"
    plain = get_program("platoon.rewards:zero_subagent_rewards")  # an undecorated callable by module:attr
    assert (plain.name, plain.version, plain.ref) == ("platoon.rewards:zero_subagent_rewards", "", plain.name)
    with pytest.raises(TypeError, match="not a callable"):
        get_program("platoon.errors:EX_CONFIG")
    with pytest.raises(ValueError, match="reserved"):
        pt.program("single")(loop)
    with pytest.raises(ExtensionError, match="unknown program 'acme-lop' \\(did you mean acme-loop\\?\\)"):
        get_program("acme-lop")


def test_a_gym_loop_belongs_to_its_callers_module(fresh_plugins):
    class Env:
        async def reset(self, task):
            return "start"

        async def step(self, action):
            return "end", 1.0, True

    play = pt.gym.loop(Env)
    assert play.__module__ == __name__
    with pytest.raises(ValueError, match="reserved"):
        pt.harness("platoon-gym-walker")(play)
    assert pt.harness("acme-gym-walker")(play) is play
    assert pt.get_harness("acme-gym-walker").source == f"{__name__}:gym_loop[{Env.__qualname__}]"


HARNESS_PLUGIN = textwrap.dedent(
    '''
    """acme-dup's hook: it answers with an @platoon.harness function."""
    import platoon


    @platoon.harness("acme-dup")
    async def solve(ctx):
        """acme's solver."""


    @platoon.hookimpl
    def platoon_register_harnesses(name):
        return solve if name == "acme-dup" else None
    '''
)


@pytest.fixture
def acme_dup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_plugins: None) -> Iterator[None]:
    """The distribution acme-dup installed on sys.path: a harness entry point whose hook gives `acme-dup`."""
    site = tmp_path / "site-packages"
    (site / "acme_dup").mkdir(parents=True)
    (site / "acme_dup" / "__init__.py").write_text(HARNESS_PLUGIN)
    info = site / "acme_dup-1.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-dup\nVersion: 1.0.0\n")
    (info / "entry_points.txt").write_text("[platoon.harnesses]\nacme-dup = acme_dup\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    plugins.reset()
    yield
    sys.modules.pop("acme_dup", None)


def test_a_harness_by_hook_and_by_decorator_share_one_lookup(acme_dup):
    async def mine(ctx):
        pass

    pt.harness("acme-mine")(mine)
    by_hook = pt.get_harness("acme-dup")
    assert isinstance(by_hook, pt.FunctionHarness) and by_hook.fn is sys.modules["acme_dup"].solve
    assert pt.get_harness("acme-mine").fn is mine
    records = registry.HARNESSES.records()
    assert records["acme-dup@1"] is by_hook and records["acme-mine@1"].fn is mine


def test_a_decorator_taking_the_name_a_hook_gives_is_one_error_naming_both(acme_dup):
    async def mine(ctx):
        pass

    pt.harness("acme-dup")(mine)
    with pytest.raises(ExtensionError) as caught:
        pt.get_harness("acme-dup")
    assert str(caught.value).startswith(
        "acme-dup (acme-dup, entry point platoon.harnesses: acme_dup) failed to load: ValueError: harness "
        f"acme-dup@1 is defined twice: by {__name__}:"
    )
    assert str(caught.value).endswith(
        ".<locals>.mine and by acme_dup:solve; give one of them another name or version"
    )


def test_a_hook_taking_a_name_first_refuses_a_decorator_under_it(acme_dup):
    pt.get_harness("acme-dup")

    async def mine(ctx):
        pass

    with pytest.raises(
        ValueError, match=r"^harness acme-dup@1 is defined twice: by acme_dup:solve and by .*mine;"
    ):
        pt.harness("acme-dup")(mine)
