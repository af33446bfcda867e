"""Harbor task directories and the ids of a local dataset directory."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from platoon.errors import ConfigError
from platoon_harbor.tasks import (
    TaskRefused,
    UnsetVariable,
    VariableNotPassed,
    discover_tasks,
    load_splits,
    load_task,
    parse_memory_mb,
    read_task,
    resolve_env,
    strip_canary,
    task_dirs_ids,
    unpassed_variables,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor-dataset" / "tasks"


def task(root: Path, name: str, toml: str = "", *, tests: bool = True, instruction: str = "Do it.\n") -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "task.toml").write_text(textwrap.dedent(toml))
    (path / "instruction.md").write_text(instruction)
    if tests:
        (path / "tests").mkdir()
        (path / "tests" / "test.sh").write_text("#!/bin/bash\n")
    return path


def test_the_example_tasks_parse_with_their_settings():
    ids = discover_tasks(EXAMPLES)
    assert list(ids) == ["fizzbuzz", "hello-file", "json-config", "word-count"]
    hello = read_task(ids["hello-file"], task_id="hello-file")
    assert hello.environment.docker_image == "platoon-test/python:bookworm"
    assert hello.environment.workdir == "/app"
    assert hello.agent.timeout_sec == 300
    assert hello.verifier.timeout_sec == 60 and hello.verifier.mode == "shared"
    assert hello.metadata == {"difficulty": "easy", "category": "files"}
    assert hello.instruction.startswith(
        "Create the file"
    )  # the canary comment and the blank after it are gone
    assert hello.has_tests and hello.has_solution


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<!-- CANARY string abc -->\n\n\nDo it.\n", "Do it.\n"),
        ("# canary GUID 123\n# BENCHMARK DATA SHOULD NEVER APPEAR. canary\n\nDo it.\n", "Do it.\n"),
        ("<!--\nharbor-canary GUID x\n-->\nDo it.\n", "Do it.\n"),
        ("# Title\n\nDo it.\n", "# Title\n\nDo it.\n"),  # a heading without "canary" stays
        ("<!-- a note -->\nDo it.\n", "<!-- a note -->\nDo it.\n"),
        ("Do it.\n<!-- canary -->\n", "Do it.\n<!-- canary -->\n"),  # only leading lines
    ],
)
def test_leading_canary_lines_and_the_blanks_after_them_are_stripped(text, expected):
    assert strip_canary(text) == expected


def test_env_values_resolve_from_the_host_at_open_and_an_unset_one_is_a_config_error():
    env = {"A": "${HOST_A}", "B": "${NOPE:-fallback}", "C": "x-${HOST_A}-y", "D": "plain"}
    assert resolve_env(env, passed={"HOST_A", "NOPE"}, environ={"HOST_A": "1"}) == {
        "A": "1",
        "B": "fallback",
        "C": "x-1-y",
        "D": "plain",
    }
    with pytest.raises(UnsetVariable) as info:
        resolve_env({"A": "${MISSING}"}, passed={"MISSING"}, what="[verifier].env", environ={})
    assert info.value.exit_code == 78
    assert "[verifier].env.A" in str(info.value) and "MISSING" in str(info.value)


def test_a_task_reads_only_the_host_variables_the_run_passes_on():
    """An untrusted dataset is data: `${TINKER_API_KEY}` in a task's env reads nothing unless the run names it."""
    host = {"TINKER_API_KEY": "tml-secret", "HOST_A": "1"}
    env = {"KEY": "${TINKER_API_KEY}", "A": "${HOST_A}"}
    with pytest.raises(VariableNotPassed) as refused:
        resolve_env(env, passed={"HOST_A"}, what="[environment].env", environ=host)
    assert str(refused.value) == (
        "[environment].env.KEY reads the host variable TINKER_API_KEY, which this run does not pass on to tasks: "
        "add it to service_kwargs.pass_env if the dataset may read it"
    )
    assert refused.value.exit_code == 78
    # A default is used instead of the host's value, never the secret.
    guarded = {"KEY": "${TINKER_API_KEY:-none}", "A": "${HOST_A}"}
    assert resolve_env(guarded, passed={"HOST_A"}, environ=host) == {"KEY": "none", "A": "1"}
    assert unpassed_variables(env, {"HOST_A"}, what="task t [environment].env") == [
        "task t [environment].env.KEY reads the host variable TINKER_API_KEY, which this run does not pass on to "
        "tasks: add it to service_kwargs.pass_env if the dataset may read it"
    ]
    assert unpassed_variables(guarded, set(), what="x") == [
        "x.A reads the host variable HOST_A, which this run "
        "does not pass on to tasks: add it to "
        "service_kwargs.pass_env if the dataset may read it"
    ]


def test_task_toml_keys_network_memory_healthcheck_and_legacy_forms(tmp_path):
    path = task(
        tmp_path,
        "t",
        """
        [task]
        name = "named"
        [environment]
        allow_internet = false
        memory = "2G"
        cpus = 2
        [environment.healthcheck]
        command = "true"
        retries = 5
        [[environment.mcp_servers]]
        name = "files"
        transport = "http"
        url = "http://127.0.0.1:9000/mcp"
        [agent]
        timeout_sec = 120
        network_mode = "public"
        [verifier]
        env = { TOKEN = "${T:-t}" }
        """,
    )
    t = read_task(path)
    assert t.id == t.name == "named"
    assert t.environment.network_mode == "no-network" and t.agent.network_mode == "public"
    assert t.environment.memory_mb == 2048 and t.environment.cpus == 2.0
    assert t.environment.healthcheck is not None and t.environment.healthcheck.retries == 5
    assert t.environment.healthcheck.budget_s == 0 + 6 * (30 + 5)
    assert t.environment.mcp_servers[0].transport == "streamable-http"
    assert t.verifier.env == {"TOKEN": "${T:-t}"}  # resolved at open, never at load
    assert parse_memory_mb("512M") == 512 and parse_memory_mb(1024) == 1024


@pytest.mark.parametrize(
    ("toml", "files", "fragment"),
    [
        ('steps = [{name = "a"}]', {}, "multi-step"),
        ('[environment]\nos = "windows"', {}, "only linux"),
        ('[[verifier.collect]]\ncommand = "tar czf /logs/artifacts/db.tgz /var/db"', {}, "1 collect hook(s)"),
        ('[verifier]\ncollect = "make dump"', {}, "[verifier].collect: expected a list"),
        ('artifacts = ["../secret"]', {}, "'..'"),
        ('artifacts = [{source = "/out", service = "db"}]', {}, "service 'db'"),
        (
            '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ndocker_image = "x"',
            {},
            "conflicts",
        ),
        ('[environment]\nnetwork_mode = "bridge"', {}, "network_mode"),
        ("[agent]\ntimeout_sec = -1", {}, "positive"),
        ("not toml [", {}, "not readable TOML"),
    ],
)
def test_tasks_no_entry_can_run_are_refused_at_load(tmp_path, toml, files, fragment):
    path = task(tmp_path, "t", toml)
    with pytest.raises(TaskRefused) as info:
        read_task(path)
    assert fragment in str(info.value)
    assert info.value.refused.startswith("task_config: ")


def test_schema_1_3_empty_collect_asks_for_nothing_and_loads(tmp_path):
    path = task(
        tmp_path,
        "exported",
        """\
        schema_version = "1.3"
        artifacts = ["/app/out.txt"]
        [verifier]
        environment_mode = "shared"
        timeout_sec = 30.0
        collect = []
        """,
    )
    loaded = load_task(path)
    assert loaded.verifier.mode == "shared" and loaded.verifier.timeout_sec == 30.0
    assert [a.source for a in loaded.artifacts] == ["/app/out.txt"]


def test_a_collect_hook_is_refused_in_one_line_naming_the_task_and_the_key(tmp_path):
    path = task(tmp_path, "hooked", '[[verifier.collect]]\ncommand = "pg_dump > /logs/artifacts/db.sql"\n')
    with pytest.raises(TaskRefused) as info:
        read_task(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message and "[verifier].collect" in message


def test_a_missing_instruction_or_test_script_is_refused(tmp_path):
    path = task(tmp_path, "no-tests", tests=False)
    with pytest.raises(TaskRefused, match=r"no tests/test\.sh"):
        read_task(path)
    path = task(tmp_path, "no-instruction")
    (path / "instruction.md").unlink()
    with pytest.raises(TaskRefused, match=r"no instruction\.md"):
        read_task(path)


def test_compose_stacks_are_refused_unless_trivial_and_task_users_only_under_agent_user_refuse(tmp_path):
    trivial = task(tmp_path, "trivial")
    (trivial / "environment").mkdir()
    (trivial / "environment" / "docker-compose.yaml").write_text("version: '3'\nservices:\n  main: {}\n")
    assert load_task(trivial).stack == "trivial"
    sidecars = task(tmp_path, "sidecars")
    (sidecars / "environment").mkdir()
    (sidecars / "environment" / "compose.yaml").write_text("services:\n  main: {}\n  db: {image: postgres}\n")
    with pytest.raises(TaskRefused, match="compose stack"):
        load_task(sidecars)
    user = task(tmp_path, "user", '[agent]\nuser = "agent"\n[verifier]\nuser = 1000\n')
    assert load_task(user).agent.user == "agent"  # run as it (whether the provider can is a run-start check)
    assert load_task(user).verifier.user == "1000"  # a uid
    assert load_task(user, agent_user="ignore").agent.user == "agent"
    with pytest.raises(TaskRefused, match="agent_user: refuse"):
        load_task(user, agent_user="refuse")


def test_storage_is_read_in_megabytes_or_the_legacy_size_form(tmp_path):
    sized = task(
        tmp_path, "sized", '[environment]\nstorage_mb = 50\n[verifier.environment]\nstorage = "1G"\n'
    )
    loaded = load_task(sized)
    assert loaded.environment.storage_mb == 50
    assert loaded.verifier.environment is not None and loaded.verifier.environment.storage_mb == 1024
    bad = task(tmp_path, "bad", '[environment]\nstorage = "lots"\n')
    with pytest.raises(TaskRefused, match=r"\[environment\]\.storage: storage 'lots' is not a size"):
        read_task(bad)


def test_ids_are_dir_names_at_the_top_and_relative_paths_below_skipping_hidden_dirs(tmp_path):
    task(tmp_path, "a")
    task(tmp_path / "group", "b")
    task(tmp_path / ".hidden", "c")
    task(tmp_path / "__pycache__", "d")
    task(tmp_path / "a" / "nested", "e")  # inside a task: not descended into
    assert list(discover_tasks(tmp_path)) == ["a", "group/b"]


def test_a_registry_names_the_tasks_that_exist_and_refuses_bad_paths(tmp_path):
    task(tmp_path / "tasks", "one")
    registry = {
        "name": "ds",
        "tasks": [{"name": "first", "path": "tasks/one"}, {"name": "gone", "path": "tasks/x"}],
    }
    (tmp_path / "registry.json").write_text(json.dumps(registry))
    assert discover_tasks(tmp_path) == {"first": tmp_path / "tasks" / "one"}
    (tmp_path / "registry.json").write_text(json.dumps([{"tasks": [{"name": "up", "path": "../elsewhere"}]}]))
    with pytest.raises(ConfigError, match=r"absolute or '\.\.'"):
        discover_tasks(tmp_path)
    (tmp_path / "registry.json").write_text(json.dumps({"tasks": [{"name": "g", "git_url": "https://x"}]}))
    with pytest.raises(ConfigError, match="git_url"):
        discover_tasks(tmp_path)


def test_task_dirs_and_split_manifests(tmp_path):
    a, b = task(tmp_path, "a"), task(tmp_path / "other", "b")
    assert task_dirs_ids([a, b]) == {"a": a, "b": b}
    with pytest.raises(ConfigError, match="duplicate"):
        task_dirs_ids([a, a])
    (tmp_path / "splits.json").write_text(json.dumps({"train": ["a"], "test": ["b"]}))
    assert load_splits("splits.json", tmp_path, ["a", "b"]) == {"train": ["a"], "test": ["b"]}
    with pytest.raises(ConfigError, match="unknown or refused"):
        load_splits({"train": ["zzz"]}, tmp_path, ["a"])
