"""TOML specs shipped by an installed distribution through the `platoon.harnesses` entry point, found by
`get_harness` like function harnesses, shown by `platoon harness list/show` and checked by
`platoon config validate`.

The distribution is real as far as `importlib.metadata` is concerned: a `.dist-info` with `entry_points.txt` and a
package on `sys.path`, in a temporary directory.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import platoon as pt
from platoon import plugins
from platoon.cli import main
from platoon.errors import ExtensionError
from platoon.harness.spec import HarnessSpec, SpecError

BASH_V1 = """
name = "acme-bash"
version = "1.2"
timeout_s = 600
max_steps = 20

[launch]
argv = ["python3", "{state_dir}/agent.py", "--base-url", "{base_url}/v1", "--temperature", "{options.temperature}"]
env = { ACME_API_KEY = "{api_key}" }
assets = { "agent.py" = "agent.py" }

[builtins]
tools = ["bash"]

[builtins.disable]
args = ["--no-bash"]

[final_message]
file = "final.txt"

[exit_codes]
3 = "completed"

[options.temperature]
type = "float"
default = 0.7
min = 0
max = 2
description = "sampling temperature"

[options.mode]
type = "str"
default = "fast"
allowed = ["fast", "careful"]
description = "how hard to think"
"""

BASH_V2 = """
name = "acme-bash"
version = "2.0"
[launch]
argv = ["acme-bash", "{instruction}"]
"""

LINT = """
name = "acme-lint"
version = "1"
dialect = "anthropic_messages"

[install]
commands = ["pip install acme-lint"]
toolchain = "acme-lint-1"

[install.recipe]
python = "3.12.4"
lock = "lint.lock"
cache = ["tiktoken"]

[launch]
argv = ["{toolchain}/bin/acme-lint", "--task", "{instruction}"]
env = { ANTHROPIC_API_KEY = "{api_key}", ANTHROPIC_BASE_URL = "{base_url}" }

[mcp]
args = ["--mcp", "{mcp_url}"]

[final_message]
stdout_regex = "^ANSWER: (.*)$"

[resources]
memory_mb = 256

[budget]
enforce = "gateway"
"""

MIX = 'name = "acme-mix"\nversion = "2"\n[launch]\nargv = ["acme-mix"]\n'
DUP = 'name = "acme-dup"\nversion = "1"\n[launch]\nargv = ["acme-dup"]\n'
SNEAKY = 'name = "platoon-sneaky"\nversion = "1"\n[launch]\nargv = ["x"]\n'

PLUGIN = '''
"""The hook of acme-specs: spec directories, spec paths, a loaded HarnessSpec and a function."""
from pathlib import Path

import platoon
from platoon.harness.spec import load_spec

SPECS = Path(__file__).parent / "specs"


@platoon.harness("acme-mix", version="1")
async def mix(ctx):
    """The function half of acme-mix."""


@platoon.hookimpl
def platoon_register_harnesses(name):
    if name == "acme-bash":
        return SPECS / "bash"
    if name == "acme-dup":
        return [str(SPECS / "dup" / "a.toml"), SPECS / "dup" / "b.toml"]
    if name == "acme-mix":
        return [load_spec(SPECS / "mix.toml"), mix]
    if name == "platoon-sneaky":
        return SPECS / "sneaky.toml"
    return None
'''


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))


@pytest.fixture
def acme_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_plugins: None) -> Iterator[Path]:
    """The distribution acme-specs 1.0 installed on sys.path; yields its specs directory."""
    site = tmp_path / "site"
    package = site / "acme_specs"
    specs = package / "specs"
    _write(
        package / "__init__.py",
        'from pathlib import Path\nLINT_SPEC = str(Path(__file__).parent / "specs" / "lint.toml")\n',
    )
    _write(package / "plugin.py", PLUGIN)
    _write(specs / "bash" / "v1.toml", BASH_V1)
    _write(specs / "bash" / "v2.toml", BASH_V2)
    _write(specs / "bash" / "agent.py", "print('agent')\n")
    _write(specs / "bash" / "notes.txt", "not a spec: the directory form reads *.toml only\n")
    _write(specs / "lint.toml", LINT)
    _write(specs / "lint.lock", "acme-lint==1 --hash=sha256:00\n")
    _write(specs / "mix.toml", MIX)
    _write(specs / "dup" / "a.toml", DUP)
    _write(specs / "dup" / "b.toml", DUP)
    _write(specs / "sneaky.toml", SNEAKY)
    dist_info = site / "acme_specs-1.0.dist-info"
    _write(
        dist_info / "METADATA",
        "Metadata-Version: 2.1\nName: acme-specs\nVersion: 1.0\nRequires-Dist: platoon-core>=0.2\n",
    )
    _write(
        dist_info / "entry_points.txt",
        """
        [platoon.harnesses]
        acme-bash = acme_specs.plugin
        acme-dup = acme_specs.plugin
        acme-lint = acme_specs:LINT_SPEC
        acme-mix = acme_specs.plugin
        platoon-sneaky = acme_specs.plugin
        """,
    )
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    plugins.reset()
    yield specs
    plugins.reset()
    for name in [m for m in sys.modules if m.split(".", 1)[0] == "acme_specs"]:
        del sys.modules[name]


def test_an_entry_point_ships_specs_by_directory_path_and_record(acme_specs):
    assert "acme_specs" not in sys.modules  # nothing is imported until a harness is named
    v1 = pt.get_harness("acme-bash@1")  # a dotted version prefix: @1 matches 1.2
    assert isinstance(v1, HarnessSpec)
    assert (v1.ref, v1.path) == ("acme-bash@1.2", acme_specs / "bash" / "v1.toml")
    assert pt.get_harness("acme-bash@2.0").launch.argv == ("acme-bash", "{instruction}")
    with pytest.raises(ExtensionError, match=r"ambiguous: it matches acme-bash@1\.2, acme-bash@2\.0"):
        pt.get_harness("acme-bash")
    lint = pt.get_harness("acme-lint")  # the entry point's value is the spec path itself
    assert isinstance(lint, HarnessSpec) and lint.dialect == "anthropic_messages"
    with pytest.raises(ExtensionError, match=r"acme-bash@3 is not registered \(registered versions: "):
        pt.get_harness("acme-bash@3")


def test_a_ref_matching_both_kinds_is_ambiguous(acme_specs):
    with pytest.raises(ExtensionError, match=r"'acme-mix' is ambiguous: it matches acme-mix@1, acme-mix@2"):
        pt.get_harness("acme-mix")
    assert pt.get_harness("acme-mix@1").kind == "function"
    assert pt.get_harness("acme-mix@2").kind == "spec"


def test_a_spec_beats_a_function_with_its_ref_and_says_so(acme_specs):
    async def imitation(ctx):
        pass

    pt.harness("acme-bash", version="2.0")(imitation)
    with pytest.warns(
        UserWarning, match=r"acme-bash@2\.0 is both a TOML spec \(.*v2\.toml\) and a function .*spec is used"
    ):
        found = pt.get_harness("acme-bash@2")
    assert isinstance(found, HarnessSpec)


def test_two_specs_with_one_ref_are_defined_twice(acme_specs):
    with pytest.raises(SpecError) as caught:
        pt.get_harness("acme-dup")
    assert str(caught.value) == (
        f"harness acme-dup@1 is defined twice: by {acme_specs / 'dup' / 'a.toml'} and by "
        f"{acme_specs / 'dup' / 'b.toml'}; give one of them another name or version"
    )


def test_a_third_party_cannot_ship_a_reserved_name(acme_specs, tmp_path):
    with pytest.raises(SpecError, match=r"sneaky\.toml: name: harness name 'platoon-sneaky' is reserved"):
        pt.get_harness("platoon-sneaky")
    local = tmp_path / "mine.toml"
    local.write_text(SNEAKY)
    with pytest.raises(SpecError, match=r"mine\.toml: name: .*reserved.*for example 'acme-sneaky'"):
        pt.get_harness(str(local))


def test_a_spec_path_loads_directly_and_is_refused_as_a_subagent_harness(acme_specs, tmp_path):
    from platoon.episode.subagents import resolve_function_harness

    path = acme_specs / "bash" / "v2.toml"
    assert pt.get_harness(str(path)) is pt.get_harness(str(path))  # loaded once per file version
    runner_line = (
        "harness acme-bash@2.0 is a TOML spec: a subagent runs a function harness (an @platoon.harness function "
        "or its ref); TOML specs run only as an episode's root agent"
    )
    for ref in ("acme-bash@2", pt.get_harness("acme-bash@2")):
        with pytest.raises(TypeError) as caught:
            resolve_function_harness(ref)
        assert str(caught.value) == runner_line


def test_harness_list_shows_specs_beside_functions(acme_specs, capsys):
    assert main(["harness", "list"]) == 0
    rows = {tuple(line.split()) for line in capsys.readouterr().out.splitlines()}
    assert ("acme-bash", "-", "-", "acme-specs", "acme_specs.plugin") in rows  # metadata only
    assert "acme_specs" not in sys.modules
    assert main(["harness", "list", "--load"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].split() == ["harness", "version", "kind", "distribution", "source"]
    rows = {tuple(line.split()) for line in lines[1:]}
    assert {
        ("acme-bash", "1.2", "spec", "acme-specs", str(acme_specs / "bash" / "v1.toml")),
        ("acme-bash", "2.0", "spec", "acme-specs", str(acme_specs / "bash" / "v2.toml")),
        ("acme-lint", "1", "spec", "acme-specs", str(acme_specs / "lint.toml")),
        ("acme-mix", "1", "function", "acme-specs", "acme_specs.plugin:mix"),
        ("acme-mix", "2", "spec", "acme-specs", str(acme_specs / "mix.toml")),
    } <= rows
    assert ("acme-dup", "-", "-", "acme-specs", "acme_specs.plugin", "(failed)") in rows
    errors = captured.err.splitlines()
    assert any(
        line.startswith(
            "platoon: acme-dup failed to load, so its harnesses are missing: harness acme-dup@1 is "
            "defined twice: by "
        )
        for line in errors
    ), errors


def test_harness_show_prints_a_specs_fields_and_options(acme_specs, capsys):
    assert main(["harness", "show", "acme-bash@1"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "acme-bash@1.2  (spec)",
        f"source: {acme_specs / 'bash' / 'v1.toml'}",
        "dialect: openai_chat",
        "timeout_s: 600",
        "max_steps: 20",
        "install: -",
        "install toolchain: -",
        "launch argv: python3 {state_dir}/agent.py --base-url {base_url}/v1 --temperature {options.temperature}",
        "launch env: ACME_API_KEY",
        "built-in tools: bash (can be disabled)",
        "final message: file final.txt",
        "exit codes: 3 completed (otherwise 0 completed, non-zero error)",
        "resources: memory_mb -",
        "step budget: enforced by the harness",
        "options:",
        "  option       type   default  values                description",
        "  temperature  float  0.7      0.0 to 2.0            sampling temperature",
        "  mode         str    fast     one of fast, careful  how hard to think",
    ]
    assert main(["harness", "show", "acme-lint"]) == 0
    assert capsys.readouterr().out.splitlines()[2:] == [
        "dialect: anthropic_messages",
        "timeout_s: -",
        "max_steps: -",
        "install: pip install acme-lint",
        "install toolchain: acme-lint-1",
        "launch argv: {toolchain}/bin/acme-lint --task {instruction}",
        "launch env: ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL",
        "built-in tools: -",
        "final message: last match of /^ANSWER: (.*)$/ in the output",
        "exit codes: - (otherwise 0 completed, non-zero error)",
        "mcp: enabled; args --mcp {mcp_url}",
        f"toolchain recipe: python 3.12.4; lock {acme_specs / 'lint.lock'}; cache tiktoken",
        "resources: memory_mb 256",
        "step budget: enforced by the gateway",
        "options: - (harness_options must be empty)",
    ]


def test_harness_show_refuses_a_broken_spec_with_one_line(acme_specs, tmp_path, capsys):
    assert main(["harness", "show", "acme-dup"]) == 78
    assert capsys.readouterr().err.startswith("platoon: harness acme-dup@1 is defined twice: by ")
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "acme-bad"\nversion = "1"\n[launch]\nargv = ["{api_key}"]\n')
    assert main(["harness", "show", str(bad)]) == 78
    captured = capsys.readouterr()
    assert captured.err == (
        f"platoon: {bad}: launch.argv.0: {{api_key}} may appear only in [launch.env] and [mcp.env] values "
        "(never in argv, files or paths)\n"
    )
    assert captured.out == ""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory without a site profile, with a task table and a spec of its own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("PLATOON_SITE", raising=False)
    (tmp_path / "tasks.jsonl").write_text('{"id": "t1", "goal": "say hi"}\n')
    _write(
        tmp_path / "agents" / "local.toml", 'name = "acme-local"\nversion = "1"\n[launch]\nargv = ["true"]\n'
    )
    return tmp_path


def _validate(capsys: pytest.CaptureFixture[str], path: Path, text: str) -> tuple[int, list[str]]:
    _write(path, text)
    code = main(["config", "validate", str(path.name)])
    return code, capsys.readouterr().out.splitlines()


def test_without_a_spec_runner_installed_a_spec_entry_is_refused_naming_the_package(
    acme_specs, project, capsys, monkeypatch
):
    infos = [info for info in plugins.entry_points() if info.kind != "spec_runner"]
    monkeypatch.setattr(plugins._state, "entry_points", infos)  # as if platoon-harnesses were not installed
    code, lines = _validate(
        capsys,
        project / "envs.yaml",
        """
        environments:
          - service: table
            service_kwargs: {path: tasks.jsonl}
            harness: acme-bash@1
        """,
    )
    assert code == 78
    assert lines == [
        "FAIL envs.yaml",
        "  environments.0.harness: harness acme-bash@1.2 is a TOML spec; running a TOML spec harness needs the spec "
        "runner, which no installed distribution provides: install it with `uv add platoon-harnesses` (or `pip "
        "install platoon-harnesses`)",
    ]
    with pytest.raises(ExtensionError, match=r"uv add platoon-harnesses"):
        plugins.get_spec_runner()


def test_config_validate_checks_harness_options_against_the_spec(acme_specs, project, capsys):
    spec = acme_specs / "bash" / "v1.toml"
    code, lines = _validate(
        capsys,
        project / "envs.yaml",
        """
        environments:
          - service: table
            service_kwargs: {path: tasks.jsonl}
            harness: acme-bash@1
            harness_options: {temprature: 0.5, mode: careful}
            eval_overrides: {harness_options: {mode: slow}}
        """,
    )
    assert code == 78
    assert lines == [
        "FAIL envs.yaml",
        f"  environments.0.harness_options.temprature: not an option of harness acme-bash@1.2 ({spec}) (did you "
        "mean temperature?); its options: temperature, mode",
        f'  environments.0.eval_overrides.harness_options.mode: "slow" is not one of "fast", "careful" (option mode '
        f"of harness acme-bash@1.2, {spec})",
        # platoon-core alone (CI's package step) has no spec runner: a run could not start the entry either
        *[
            f"  environments.0.harness: harness acme-bash@1.2 is a TOML spec; {missing}"
            for missing in [plugins.spec_runner_missing()]
            if missing is not None
        ],
    ]


def test_a_harness_mixture_shares_one_mapping_that_must_suit_each_spec(acme_specs, project, capsys):
    code, lines = _validate(
        capsys,
        project / "mix.yaml",
        """
        environments:
          - service: table
            service_kwargs: {path: tasks.jsonl}
            harness: {acme-bash@1: 1, agents/local.toml: 1}
            harness_options: {mode: careful}
        """,
    )
    assert code == 78
    local = project / "agents" / "local.toml"
    assert lines[0] == "FAIL mix.yaml"
    assert (
        f"  environments.0.harness_options.mode: harness acme-local@1 ({local}) takes no options: harness_options "
        "must be empty"
    ) in lines
    assert not any(
        "acme-bash@1.2 (" in line and "harness_options.mode" in line for line in lines
    )  # it suits acme-bash


def test_a_spec_that_does_not_load_fails_validation_with_its_line(acme_specs, project, capsys):
    _write(project / "agents" / "broken.toml", 'name = "acme-broken"\nversion = "1"\n[launch]\nargv = []\n')
    code, lines = _validate(
        capsys,
        project / "broken.yaml",
        """
        environments:
          - service: table
            service_kwargs: {path: tasks.jsonl}
            harness: agents/broken.toml
        """,
    )
    assert (code, lines) == (
        78,
        [
            "FAIL broken.yaml",
            f"  environments.0.harness: {project / 'agents' / 'broken.toml'}: launch.argv: must not be empty",
        ],
    )


def test_extensions_check_loads_the_specs_an_entry_point_gives(acme_specs, capsys):
    assert main(["extensions", "check", "acme-specs", "--load"]) == 78
    lines = capsys.readouterr().out.splitlines()
    assert any(
        line.startswith("error: acme-specs: harness acme-dup@1 is defined twice: by ") for line in lines
    ), lines
    assert any("platoon-sneaky' is reserved" in line for line in lines), lines
