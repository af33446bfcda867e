"""Third-party extensions, really installed: listed without import, loaded when named, refused or reported when bad."""

from __future__ import annotations

import json
import sys

import pytest

import platoon as pt
from platoon import plugins
from platoon.cli import main
from platoon.envs import named
from platoon.errors import ExtensionError

NOT_IMPORTED = "import sys; print(sorted(m for m in sys.modules if m.startswith('acme')))"


def test_listing_reads_metadata_without_importing(extension_dirs, run_python):
    code = (
        "import io, contextlib\n"
        "from platoon.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        "    for argv in (['extensions', 'list'], ['harness', 'list'], ['program', 'list'], ['env', 'list'],\n"
        "                 ['--help']):\n"
        "        assert main(argv) == 0, argv\n"
        "print(buf.getvalue())\n" + NOT_IMPORTED
    )
    result = run_python(code, path=(extension_dirs["main"],))
    assert result.returncode == 0, result.stderr
    *listing, imported = result.stdout.rstrip().splitlines()
    assert imported == "[]"
    text = "\n".join(listing)
    assert "acme-solver" in text and "acme-twice" in text and "acme-arith" in text
    # the broken extension is listed like any other: listing never imports it, so nothing has failed yet
    assert "acme_broken.plugin" in text


def test_extensions_list_json_records(with_extensions, capsys):
    assert main(["extensions", "list", "--json-output"]) == 0
    records = json.loads(capsys.readouterr().out)
    by_name = {(r["kind"], r["name"]): r for r in records}
    solver = by_name[("harness", "acme-solver")]
    assert solver == {
        "kind": "harness",
        "name": "acme-solver",
        "distribution": "acme-agents",
        "version": "1.3.0",
        "value": "acme_agents.plugin",
        "status": "ok",
        "builtin": False,
        "requires": ["platoon-core<0.3,>=0.2"],
    }
    assert by_name[("harness", "acme-future")]["status"] == "incompatible"
    assert by_name[("program", "single")]["builtin"] is True
    # first-party first
    assert [r["builtin"] for r in records] == sorted((r["builtin"] for r in records), reverse=True)
    assert "acme_agents" not in sys.modules


def test_harness_is_loaded_when_named(with_extensions):
    assert "acme_agents" not in sys.modules
    record = pt.get_harness("acme-solver@2")
    assert record.ref == "acme-solver@2.1"
    assert record.source == "acme_agents.solver:solve_v2"
    assert pt.get_harness("acme-solver@1.0").fn.__name__ == "solve"
    assert "acme_agents.solver" in sys.modules
    # loading acme-agents imported nothing of the other extensions
    assert "acme_broken" not in sys.modules and "acme_future" not in sys.modules


def test_bare_name_with_two_versions_is_ambiguous(with_extensions):
    with pytest.raises(ExtensionError, match=r"ambiguous: it matches acme-solver@1.0, acme-solver@2.1"):
        pt.get_harness("acme-solver")


def test_program_environment_and_reward_processor_load_by_name(with_extensions):
    from platoon.programs import get_program

    program = get_program("acme-twice")
    assert program.ref == "acme-twice@1" and program.source == "acme_agents.programs:twice"
    entry = named.get_environment("acme-arith")
    assert entry.ref == "acme-arith@2"
    assert entry.entry() == {"service": "table", "harness": "acme-solver"}
    assert entry.defaults_for("acme-solver@2") == {"temperature": 0.5}
    bonus = plugins.get_reward_processor("acme-bonus")  # an entry point naming the callable itself
    assert bonus({"reward": 1.0}) == (2.0, {"reward/bonus": 1.0})


def test_incompatible_requirement_is_refused_with_one_line(with_extensions, capsys):
    with pytest.raises(ExtensionError) as caught:
        pt.get_harness("acme-future")
    message = str(caught.value)
    assert message == (
        "acme-future 0.1.0 requires platoon>=9.0, but platoon 0.2.0 is running: install a version of acme-future "
        "that supports platoon 0.2.0, or set PLATOON_IGNORE_EXTENSION_REQUIREMENTS=1"
    )
    assert "acme_future" not in sys.modules
    assert main(["harness", "show", "acme-future"]) == 78
    assert capsys.readouterr().err == f"platoon: {message}\n"


def test_ignore_requirements_variable_downgrades_to_a_warning(with_extensions, monkeypatch):
    monkeypatch.setenv("PLATOON_IGNORE_EXTENSION_REQUIREMENTS", "yes")
    with pytest.warns(UserWarning, match="acme-future 0.1.0 requires platoon>=9.0"):
        record = pt.get_harness("acme-future")
    assert record.ref == "acme-future@1"


def test_broken_extension_is_reported_by_name_and_breaks_nothing_else(with_extensions, capsys):
    with pytest.raises(
        ExtensionError, match=r"acme-broken \(acme-broken, .*\) failed to load: RuntimeError: "
    ):
        pt.get_harness("acme-broken")
    # the recorded failure is raised again, unchanged; other extensions still load
    with pytest.raises(ExtensionError, match="acme-broken cannot find its model weights"):
        pt.get_harness("acme-broken")
    assert pt.get_harness("acme-solver@1").ref == "acme-solver@1.0"
    capsys.readouterr()
    assert main(["harness", "list"]) == 0
    captured = capsys.readouterr()
    rows = [line.split() for line in captured.out.splitlines()]
    assert rows[0] == ["harness", "version", "kind", "distribution", "source"]
    assert ["acme-solver", "1.0", "function", "acme-agents"] in [row[:4] for row in rows]
    assert "acme_broken.plugin (failed)" in captured.out
    assert (
        "platoon: acme-broken failed to load, so its harnesses are missing: RuntimeError: acme-broken cannot find "
        "its model weights"
    ) in captured.err.splitlines()


def test_harness_list_shows_versions_and_load_imports_the_entry_points_to_show_them(with_extensions, capsys):
    assert main(["harness", "list"]) == 0
    captured = capsys.readouterr()
    rows = {tuple(line.split()[:3]) for line in captured.out.splitlines()[1:]}
    assert ("acme-solver", "-", "-") in rows  # metadata only: not imported, so its versions are not known yet
    assert "acme_agents" not in sys.modules
    assert "`platoon harness list --load` imports them to show theirs" in captured.err
    assert main(["harness", "list", "--load"]) == 0
    rows = {tuple(line.split()[:4]) for line in capsys.readouterr().out.splitlines()[1:]}
    assert {
        ("acme-solver", "1.0", "function", "acme-agents"),
        ("acme-solver", "2.1", "function", "acme-agents"),
    } <= rows


def test_extensions_check(with_extensions, capsys):
    assert main(["extensions", "check"]) == 78
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "1 error(s), 0 warning(s)"
    assert lines[0].startswith("error: acme-future: acme-future 0.1.0 requires platoon>=9.0")
    assert main(["extensions", "check", "acme-agents", "--load"]) == 0
    assert capsys.readouterr().out == "ok: no problems found\n"
    assert main(["extensions", "check", "acme-broken", "--load"]) == 78
    assert "error: acme-broken: acme-broken (acme-broken, entry point" in capsys.readouterr().out


def test_extensions_show(with_extensions, capsys):
    assert main(["extensions", "show", "acme-solver"]) == 0
    text = capsys.readouterr().out
    assert "acme-solver  (harness)\nversion: unknown until it is loaded (--load imports it)\n" in text
    assert "distribution: acme-agents 1.3.0\nentry point: platoon.harnesses: acme-solver\n" in text
    assert "requires: platoon-core<0.3,>=0.2\nstatus: ok\n" in text
    assert "acme_agents" not in sys.modules
    assert main(["extensions", "show", "acme-solver", "--load"]) == 0
    assert "version: 1.0, 2.1\n" in capsys.readouterr().out
    assert main(["extensions", "show", "single"]) == 0
    assert "requires: - (part of platoon)" in capsys.readouterr().out
    assert main(["extensions", "show", "nobody"]) == 78
    assert main(["extensions", "show", "acme_agents.solver:solve"]) == 78
    capsys.readouterr()
    assert main(["extensions", "show", "acme-broken", "--load"]) == 78
    captured = capsys.readouterr()
    # what failed, once: no "unknown until it is loaded" after --load, no repeated "failed to load"
    assert "version: unknown: it failed to load\n" in captured.out
    assert "status: failed to load: RuntimeError: acme-broken cannot find its model weights\n" in captured.out
    assert captured.err == (
        "platoon: acme-broken (acme-broken) failed to load: RuntimeError: acme-broken cannot find its model weights\n"
    )


def test_show_and_check_take_the_same_names(with_extensions, capsys):
    # a distribution, spelled as `check` takes it: what it requires and what it provides, nothing imported
    for spelling in ("acme-agents", "acme_agents", "Acme.Agents"):
        assert main(["extensions", "show", spelling]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[:3] == [
            "acme-agents 1.3.0  (distribution)",
            "requires: platoon-core<0.3,>=0.2",
            "provides:",
        ]
        rows = [line.split() for line in lines[4:]]
        assert ["harness", "acme-solver", "ok", "acme_agents.plugin"] in rows
        assert ["reward_processor", "acme-bonus", "ok", "acme_agents.rewards:bonus"] in rows
    assert "acme_agents" not in sys.modules
    assert main(["extensions", "show", "acme-agents", "--kind", "program", "--json-output"]) == 0
    [block] = json.loads(capsys.readouterr().out)
    assert (block["distribution"], [c["name"] for c in block["components"]]) == (
        "acme-agents",
        ["acme-twice"],
    )
    # (spelled acme-broken it is its harness's name: a component's name comes first)
    assert main(["extensions", "show", "acme_broken", "--load"]) == 78
    captured = capsys.readouterr()
    assert "  harness  acme-broken  failed  acme_broken.plugin" in captured.out
    assert "platoon: acme-broken (acme-broken) failed to load: RuntimeError:" in captured.err
    # a component name checks the distribution that provides it
    assert main(["extensions", "check", "acme-agents", "--load"]) == 0
    by_distribution = capsys.readouterr().out
    assert main(["extensions", "check", "acme-solver", "--load"]) == 0
    assert capsys.readouterr().out == by_distribution == "ok: no problems found\n"
    # a name that is neither: one line, the same from both, instead of `check` finding nothing wrong with nothing
    unknown = "'nobody' is neither a component nor a distribution of an installed extension"
    for command in ("show", "check"):
        assert main(["extensions", command, "nobody"]) == 78
        captured = capsys.readouterr()
        assert captured.err == f"platoon: {unknown} (see `platoon extensions list`)\n" and captured.out == ""


def test_two_distributions_claiming_one_name(extension_dirs, monkeypatch, fresh_plugins):
    monkeypatch.syspath_prepend(str(extension_dirs["clash"]))
    monkeypatch.syspath_prepend(str(extension_dirs["main"]))
    plugins.reset()
    with pytest.raises(ExtensionError) as caught:
        pt.get_harness("acme-solver@1")
    message = str(caught.value)
    assert "harness 'acme-solver' is claimed by two distributions:" in message
    assert "acme-agents (platoon.harnesses: acme_agents.plugin)" in message
    assert "acme-clash (platoon.harnesses: acme_clash.plugin)" in message
    # a third party cannot shadow a first-party component: its entry point is never imported
    from platoon.programs import get_program

    assert get_program("single").source == "platoon.programs.builtin:single"
    assert "acme_clash" not in sys.modules


def test_check_and_list_report_two_distributions_claiming_one_name(
    extension_dirs, monkeypatch, fresh_plugins, capsys
):
    # acme-agents and acme-clash both declare the harness acme-solver: a run naming it fails, so check fails first
    monkeypatch.syspath_prepend(str(extension_dirs["clash"]))
    monkeypatch.syspath_prepend(str(extension_dirs["main"]))
    plugins.reset()
    conflict = (
        "error: acme-agents, acme-clash: harness 'acme-solver' is claimed by two distributions: "
        "acme-agents (platoon.harnesses: acme_agents.plugin) and acme-clash (platoon.harnesses: "
        "acme_clash.plugin); uninstall one of them"
    )
    for argv in (["extensions", "check"], ["extensions", "check", "acme-agents", "--load"]):
        assert main(argv) == 78
        lines = capsys.readouterr().out.splitlines()
        assert lines.count(conflict) == 1, lines
    assert main(["extensions", "check", "acme-agents", "--load"]) == 78
    assert capsys.readouterr().out.splitlines()[-1] == "1 error(s), 0 warning(s)"
    assert main(["extensions", "list", "--kind", "harness", "--json-output"]) == 0
    statuses = {(r["name"], r["distribution"]): r["status"] for r in json.loads(capsys.readouterr().out)}
    assert statuses[("acme-solver", "acme-agents")] == statuses[("acme-solver", "acme-clash")] == "conflict"
    assert "acme_clash" not in sys.modules  # checking never imports a conflicting claim


def test_check_reports_reserved_names_and_missing_upper_bounds(
    extension_dirs, monkeypatch, fresh_plugins, capsys
):
    monkeypatch.syspath_prepend(str(extension_dirs["clash"]))
    plugins.reset()
    assert main(["extensions", "check", "acme-clash"]) == 78
    out = capsys.readouterr().out
    assert (
        "error: acme-clash: platoon.programs: single: 'single' is reserved for platoon's own components"
        in out
    )
    assert "warning: acme-clash: requires platoon-core>=0.2 without an upper bound" in out
    assert "warning: acme-clash: names components with more than one owner prefix (acme, single)" in out
    assert out.splitlines()[-1] == "1 error(s), 2 warning(s)"


def test_environment_show(with_extensions, capsys):
    assert main(["env", "show", "acme-arith"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("acme-arith@2\nsource: acme-agents (platoon.environments: acme_agents.plugin)\n")
    assert "description: Two-digit sums, graded by the table service.\n" in out
    assert "entry:\n  service: table\n  harness: acme-solver\nharness_defaults:\n  acme-solver:\n" in out
