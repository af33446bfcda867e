"""Loading a TOML harness spec: what a valid spec holds, and every mistake refused at
load as one line that names the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from platoon.errors import ConfigError
from platoon.harness.spec import HarnessSpec, SpecError, load_spec


def test_a_valid_spec_loads_into_an_immutable_record(write_spec, spec_dir):
    spec = load_spec(write_spec())
    assert isinstance(spec, HarnessSpec)
    assert (spec.ref, spec.kind, spec.source) == ("acme-bash@1.2", "spec", str(spec_dir / "spec.toml"))
    assert (spec.dialect, spec.timeout_s, spec.max_steps) == ("openai_chat", 600.0, 20)
    assert spec.install is not None and spec.install.recipe is not None
    assert (spec.install.commands, spec.install.toolchain, spec.install.timeout_s) == (
        ("python3 --version",),
        "acme-tools",
        300.0,
    )
    recipe = spec.install.recipe
    assert recipe.lock == spec_dir / "requirements.lock"  # shipped files resolve next to the spec
    assert dict(recipe.generate) == {"share/config.json": spec_dir / "gen.py"}
    assert recipe.cache == ("tiktoken",)
    assert spec.launch.argv[1] == "{state_dir}/agent.py"
    assert dict(spec.launch.assets) == {"agent.py": spec_dir / "agent.py"}
    assert spec.builtins is not None and spec.builtins.can_disable and spec.builtins.tools == ("bash",)
    assert spec.mcp is not None and spec.mcp_enabled and spec.mcp.config_file == "mcp.json"
    assert spec.final_message is not None and (spec.final_message.file, spec.final_message.json_key) == (
        "final.txt",
        "info.answer",
    )
    assert dict(spec.exit_codes) == {3: "completed", 5: "error"}
    assert [spec.exit_meaning(c) for c in (0, 3, 5, 1, None)] == [
        "completed",
        "completed",
        "error",
        "error",
        "error",
    ]
    assert (spec.resources_memory_mb, spec.budget_enforce) == (512, "gateway")
    assert spec.option_defaults() == {"temperature": 0.7, "mode": "fast", "retries": 1, "replay": True}
    assert spec.options["temperature"].min == 0.0 and isinstance(spec.options["temperature"].min, float)
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.launch.env["X"] = "y"  # type: ignore[index]
    assert hash(spec) == hash(load_spec(spec.path))


def test_defaults_of_a_minimal_spec(write_spec):
    spec = load_spec(write_spec('name = "acme-min"\nversion = "1"\n[launch]\nargv = ["true"]\n'))
    assert (spec.dialect, spec.timeout_s, spec.max_steps, spec.install, spec.mcp) == (
        "openai_chat",
        None,
        None,
        None,
        None,
    )
    assert (spec.budget_enforce, dict(spec.options), dict(spec.exit_codes)) == ("harness", {}, {})
    assert not spec.mcp_enabled


def test_an_mcp_table_is_enabled_unless_set_false(write_spec):
    text = 'name = "acme-m"\nversion = "1"\n[launch]\nargv = ["a"]\n[mcp]\n'
    assert load_spec(write_spec(text + 'args = ["--mcp", "{mcp_url}"]\n')).mcp_enabled
    assert not load_spec(write_spec(text + "enabled = false\n")).mcp_enabled


#: (id, text in BASE, what replaces it, the key the error names, a fragment of the error)
MISTAKES = [
    # 3.1 top level
    (
        "unknown-top-key",
        'name = "acme-bash"',
        'name = "acme-bash"\nnmae = "x"',
        "nmae",
        "unknown key (did you mean name?)",
    ),
    ("missing-name", 'name = "acme-bash"', "", "name", "required"),
    ("bad-name", '"acme-bash"', '"Acme Bash"', "name", "does not follow the naming rule"),
    ("name-ending-toml", '"acme-bash"', '"acme.toml"', "name", "does not follow the naming rule"),
    ("name-not-a-string", '"acme-bash"', "3", "name", "must be a string, not an int"),
    ("bad-version", '"1.2"', '"1 2"', "version", "does not follow the version rule"),
    (
        "unknown-dialect",
        "timeout_s = 600",
        'timeout_s = 600\ndialect = "openai"',
        "dialect",
        '"openai" is not one of',
    ),
    ("zero-timeout", "timeout_s = 600", "timeout_s = 0", "timeout_s", "must be a positive number, not 0"),
    (
        "string-timeout",
        "timeout_s = 600",
        'timeout_s = "600"',
        "timeout_s",
        "must be a positive number, not a str",
    ),
    (
        "fractional-max-steps",
        "max_steps = 20",
        "max_steps = 2.5",
        "max_steps",
        "positive whole number, not a float",
    ),
    (
        "bool-max-steps",
        "max_steps = 20",
        "max_steps = true",
        "max_steps",
        "positive whole number, not a bool",
    ),
    # 3.2 [install]
    (
        "unknown-install-key",
        "timeout_s = 300",
        "timeout_s = 300\ncomands = []",
        "install.comands",
        "did you mean commands?",
    ),
    (
        "commands-not-a-list",
        '["python3 --version"]',
        '"make"',
        "install.commands",
        "must be a list of strings, not a str",
    ),
    ("empty-command", '["python3 --version"]', '["  "]', "install.commands.0", "must not be empty"),
    (
        "bad-toolchain",
        '"acme-tools"',
        '"../tools"',
        "install.toolchain",
        "neither an absolute path nor a toolchain name",
    ),
    (
        "install-timeout",
        "timeout_s = 300",
        "timeout_s = -1",
        "install.timeout_s",
        "must be a positive number",
    ),
    (
        "recipe-without-toolchain",
        'toolchain = "acme-tools"\n',
        "",
        "install.recipe",
        "needs install.toolchain",
    ),
    ("recipe-python", 'python = "3.12"', 'python = "3"', "install.recipe.python", "is not a CPython version"),
    ("recipe-without-python", 'python = "3.12"\n', "", "install.recipe.python", "required"),
    (
        "recipe-lock-missing",
        '"requirements.lock"',
        '"missing.lock"',
        "install.recipe.lock",
        "missing.lock does not exist",
    ),
    (
        "recipe-lock-absolute",
        '"requirements.lock"',
        '"/etc/hosts"',
        "install.recipe.lock",
        "relative to the spec",
    ),
    ("recipe-cache", '["tiktoken"]', '["pip"]', "install.recipe.cache.0", '"pip" is not a known cache'),
    (
        "generate-escapes",
        '"share/config.json"',
        '"../config.json"',
        "install.recipe.generate.../config.json",
        "'..' parts",
    ),
    (
        "generate-absolute",
        '"share/config.json"',
        '"/config.json"',
        "install.recipe.generate./config.json",
        "relative path",
    ),
    (
        "generate-script-missing",
        '= "gen.py"',
        '= "nope.py"',
        "install.recipe.generate.share/config.json",
        "does not exist",
    ),
    (
        "unknown-recipe-key",
        'python = "3.12"',
        'python = "3.12"\npin = 1',
        "install.recipe.pin",
        "unknown key",
    ),
    # 3.2 [launch]
    (
        "empty-argv",
        'argv = ["{toolchain}',
        'argv = []\nold = ["{toolchain}',
        "launch.argv",
        "must not be empty",
    ),
    (
        "argv-not-strings",
        '"--steps", "{max_steps}"',
        '"--steps", 20',
        "launch.argv.5",
        "must be a string, not an int",
    ),
    (
        "env-name",
        "ACME_OPTIONS =",
        '"ACME-OPTIONS" =',
        "launch.env.ACME-OPTIONS",
        "not an environment variable name",
    ),
    (
        "env-value",
        'ACME_OPTIONS = "{options}"',
        "ACME_OPTIONS = 1",
        "launch.env.ACME_OPTIONS",
        "must be a string",
    ),
    (
        "asset-missing",
        '"agent.py" = "agent.py"',
        '"agent.py" = "nope.py"',
        "launch.assets.agent.py",
        "does not exist",
    ),
    (
        "asset-absolute",
        '"agent.py" = "agent.py"',
        '"agent.py" = "/bin/sh"',
        "launch.assets.agent.py",
        "relative",
    ),
    (
        "unknown-launch-key",
        "[launch]\n",
        '[launch]\ncwd = "/"\n',
        "launch.cwd",
        "unknown key; [launch] takes argv",
    ),
    # 3.2 [builtins], [mcp], [final_message], [exit_codes], [resources], [budget]
    ("empty-disable", 'args = ["--no-bash"]', "", "builtins.disable", "needs args and/or env"),
    ("tools-not-list", 'tools = ["bash"]', 'tools = "bash"', "builtins.tools", "must be a list of strings"),
    ("mcp-enabled", "[mcp]\n", '[mcp]\nenabled = "yes"\n', "mcp.enabled", "must be true or false, not a str"),
    ("mcp-config-file", "[mcp]\n", '[mcp]\nconfig_file = "../mcp.json"\n', "mcp.config_file", "'..' parts"),
    (
        "file-and-regex",
        'file = "final.txt"',
        'file = "final.txt"\nstdout_regex = "x"',
        "final_message",
        "exactly one of",
    ),
    (
        "json-key-without-file",
        'file = "final.txt"',
        'stdout_regex = "ANSWER: (.*)"',
        "final_message.json_key",
        "needs file",
    ),
    (
        "bad-regex",
        'file = "final.txt"\njson_key = "info.answer"',
        'stdout_regex = "("',
        "final_message.stdout_regex",
        "does not compile",
    ),
    ("json-key-path", '"info.answer"', '"info..answer"', "final_message.json_key", "not a dotted path"),
    ("exit-code-key", '3 = "completed"', 'x = "completed"', "exit_codes.x", "not an integer exit code"),
    (
        "exit-code-meaning",
        '3 = "completed"',
        '3 = "ok"',
        "exit_codes.3",
        '"ok" is not one of completed, error',
    ),
    (
        "memory-zero",
        "memory_mb = 512",
        "memory_mb = 0",
        "resources.memory_mb",
        "positive whole number, not 0",
    ),
    (
        "memory-float",
        "memory_mb = 512",
        "memory_mb = 1.5",
        "resources.memory_mb",
        "positive whole number, not a float",
    ),
    ("unknown-resource", "memory_mb = 512", "memory_mb = 512\ncpus = 2", "resources.cpus", "unknown key"),
    (
        "budget-enforcer",
        'enforce = "gateway"',
        'enforce = "agent"',
        "budget.enforce",
        '"agent" is not one of harness, gateway',
    ),
    (
        "table-not-table",
        '[budget]\nenforce = "gateway"\n',
        'budget = "gateway"\n',
        "budget",
        "must be a table, not a str",
    ),
    # 2.7 [options]
    ("option-name", "[options.mode]", "[options.Mode]", "options.Mode", "not an option name"),
    ("option-type-missing", 'type = "str"\n', "", "options.mode.type", "required"),
    (
        "option-type",
        'type = "str"',
        'type = "list"',
        "options.mode.type",
        '"list" is not one of bool, int, float, str',
    ),
    ("option-default-missing", 'default = "fast"\n', "", "options.mode.default", "required"),
    (
        "option-default-type",
        "default = 1\n",
        'default = "1"\n',
        "options.retries.default",
        '"1" is a str, not an int',
    ),
    (
        "bool-is-not-int",
        "default = 1\n",
        "default = true\n",
        "options.retries.default",
        "true is a bool, not an int",
    ),
    (
        "default-below-min",
        "default = 1\n",
        "default = -1\n",
        "options.retries.default",
        "below the minimum 0",
    ),
    (
        "default-not-allowed",
        'default = "fast"',
        'default = "slow"',
        "options.mode.default",
        '"slow" is not one of "fast", "careful"',
    ),
    (
        "float-default-nan",
        "default = 0.7",
        "default = nan",
        "options.temperature.default",
        "not a finite float",
    ),
    (
        "allowed-on-float",
        "min = 0\nmax = 2",
        "allowed = [1.0]",
        "options.temperature.allowed",
        "applies to int and str",
    ),
    ("allowed-empty", '["fast", "careful"]', "[]", "options.mode.allowed", "non-empty list"),
    (
        "allowed-twice",
        '["fast", "careful"]',
        '["fast", "fast"]',
        "options.mode.allowed.1",
        '"fast" is listed twice',
    ),
    (
        "allowed-wrong-type",
        '["fast", "careful"]',
        '["fast", 2]',
        "options.mode.allowed.1",
        "2 is an int, not a str",
    ),
    (
        "min-on-str",
        'allowed = ["fast", "careful"]',
        "min = 1",
        "options.mode.min",
        "applies to int and float",
    ),
    (
        "int-bound-float",
        "default = 1\nmin = 0",
        "default = 1\nmin = 0.5",
        "options.retries.min",
        "0.5 is a float, not an int",
    ),
    (
        "min-above-max",
        "min = 0\nmax = 2",
        "min = 3\nmax = 2",
        "options.temperature.max",
        "2.0 is below min 3.0",
    ),
    (
        "multi-line-description",
        '"sampling temperature"',
        '"""sampling\ntemperature"""',
        "options.temperature.description",
        "one line",
    ),
    (
        "unknown-option-key",
        "default = true\n",
        "default = true\nchoices = [true]\n",
        "options.replay.choices",
        "unknown key",
    ),
    # 3.3 placeholders, per location
    (
        "unknown-placeholder",
        '"{state_dir}/agent.py"',
        '"{work_dir}/agent.py"',
        "launch.argv.1",
        "unknown placeholder {work_dir} (did you mean {workdir}?)",
    ),
    (
        "api-key-in-argv",
        '"{base_url}/v1"',
        '"{api_key}"',
        "launch.argv.3",
        "{api_key} may appear only in [launch.env] and [mcp.env]",
    ),
    (
        "api-key-in-files",
        '= "{instruction}"',
        '= "{api_key}"',
        "launch.files.instruction.md",
        "{api_key} may appear only",
    ),
    (
        "api-key-in-mcp-args",
        '"--mcp-url", "{mcp_url}"',
        '"--key", "{api_key}"',
        "mcp.args.1",
        "{api_key} may appear only",
    ),
    (
        "api-key-in-disable",
        'args = ["--no-bash"]',
        'env = { K = "{api_key}" }',
        "builtins.disable.env.K",
        "{api_key} may appear only",
    ),
    (
        "options-in-install",
        '["python3 --version"]',
        '["pip install acme=={options.mode}"]',
        "install.commands.0",
        "options render only in",
    ),
    (
        "undeclared-option",
        '"{options.temperature}"',
        '"{options.temprature}"',
        "launch.argv.7",
        "does not declare (did you mean options.temperature?)",
    ),
    (
        "options-in-asset-path",
        '"agent.py" = "agent.py"',
        '"{options.mode}.py" = "agent.py"',
        "launch.assets.{options.mode}.py",
        "options render only in",
    ),
    (
        "mcp-url-outside-mcp",
        '"{base_url}/v1"',
        '"{mcp_url}"',
        "launch.argv.3",
        "{mcp_url} may appear only inside [mcp]",
    ),
    (
        "config-path-in-template",
        """'{"url": "{mcp_url}"}'""",
        """'{"path": "{mcp_config_path}"}'""",
        "mcp.config_template",
        "{mcp_config_path} may appear only in [mcp] args and env",
    ),
    (
        "options-in-config-template",
        """'{"url": "{mcp_url}"}'""",
        """'{"o": {options}}'""",
        "mcp.config_template",
        "options render only in",
    ),
    (
        "api-key-in-final-file",
        '"final.txt"',
        '"{api_key}.txt"',
        "final_message.file",
        "{api_key} may appear only",
    ),
    (
        "options-in-final-file",
        '"final.txt"',
        '"{options.mode}.txt"',
        "final_message.file",
        "options render only in",
    ),
    (
        "dotted-builtin",
        '"{state_dir}/agent.py"',
        '"{state_dir.parent}/agent.py"',
        "launch.argv.1",
        "unknown placeholder {state_dir.parent}",
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "key", "fragment"), [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES]
)
def test_each_mistake_is_one_line_naming_file_and_key(write_spec, base, old, new, key, fragment):
    assert base.count(old) == 1, f"the test's anchor {old!r} must occur once in the base spec"
    text = base.replace(old, new)
    if old.startswith("[budget]"):
        text = new + base.replace(old, "")  # a top-level key goes before the first table
    path = write_spec(text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    message = str(caught.value)
    assert "\n" not in message, message
    assert message.startswith(f"{path}: {key}: "), message
    assert fragment in message, message
    assert isinstance(caught.value, ConfigError) and caught.value.exit_code == 78


def test_launch_is_required(write_spec):
    path = write_spec('name = "acme-x"\nversion = "1"\n')
    with pytest.raises(SpecError, match=r": launch: required$"):
        load_spec(path)


def test_placeholders_that_need_their_table(write_spec):
    head = 'name = "acme-x"\nversion = "1"\n[launch]\n'
    path = write_spec(head + 'argv = ["{toolchain}/bin/agent"]\n')
    with pytest.raises(SpecError, match=r"launch\.argv\.0: \{toolchain\} needs install\.toolchain$"):
        load_spec(path)
    path = write_spec(head + 'argv = ["a"]\n[mcp]\nargs = ["{mcp_config_path}"]\n')
    with pytest.raises(SpecError, match=r"mcp\.args\.0: \{mcp_config_path\} needs mcp\.config_template$"):
        load_spec(path)
    path = write_spec(head + 'argv = ["a", "{options}"]\n')
    assert load_spec(path).launch.argv[1] == "{options}"  # all options as JSON (here {}) may always render


def test_literal_braces_are_not_placeholders(write_spec):
    text = (
        'name = "acme-x"\nversion = "1"\n[launch]\n'
        'argv = ["sh", "-c", "echo ${HOME} {\\"a\\": 1} {Upper} {a-b}", "{options}"]\n'
        '[builtins.disable]\nargs = ["--flags={options}"]\n'
    )
    spec = load_spec(write_spec(text))
    assert spec.launch.argv[2] == 'echo ${HOME} {"a": 1} {Upper} {a-b}'


def test_file_problems_are_one_line(spec_dir: Path, write_spec):
    missing = spec_dir / "none.toml"
    with pytest.raises(SpecError, match=rf"^{missing}: no such harness spec file$"):
        load_spec(missing)
    with pytest.raises(SpecError, match=rf"^{spec_dir}: is a directory"):
        load_spec(spec_dir)
    broken = write_spec('name = "acme-x"\nversion = \n')
    with pytest.raises(SpecError) as caught:
        load_spec(broken)
    assert str(caught.value).startswith(f"{broken}: not valid TOML: ") and "\n" not in str(caught.value)


def test_the_documented_example_spec_loads(tmp_path):
    """docs/harnesses.md's complete example is a spec that loads (kept honest by this test)."""
    import re

    docs = Path(__file__).resolve().parents[3] / "docs" / "harnesses.md"
    section = docs.read_text().split("## Command-line agents: TOML specs", 1)[1]
    example = re.search(r"```toml\n(.*?)```", section, re.S)
    assert example is not None
    (tmp_path / "agent.py").write_text("")
    (tmp_path / "acme-bash.toml").write_text(example.group(1))
    spec = load_spec(tmp_path / "acme-bash.toml")
    assert spec.ref == "acme-bash@1" and spec.mcp_enabled and list(spec.options) == ["temperature"]
