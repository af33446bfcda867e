"""The `harbor` service against real sandboxes: the dataset check of the example dataset in
Docker, every forgery refused and none scored, the tools' output rules, infra failures, and the process provider.

CI starts the Docker engine and builds `platoon-test/python:bookworm` first (`.ci/docker-engine start`, then source
the env file it prints): the Docker tests never skip. Each test's sandboxes carry a per-test `platoon.env` label
(the service `name`), and each test ends by checking that no container with it is left.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon.envs.service import EnvSetupError
from platoon.errors import ConfigError
from platoon_harbor.service import HarborService

PYTHON_IMAGE = "platoon-test/python:bookworm"
EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "harbor-dataset" / "tasks"


def docker_binary() -> str:
    return os.environ.get("PLATOON_DOCKER", "docker")


def containers(name: str) -> list[str]:
    result = subprocess.run(
        [docker_binary(), "ps", "--all", "--quiet", "--filter", f"label=platoon.env={name}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.stdout.split()


@pytest.fixture(scope="module")
def engine() -> None:
    binary = docker_binary()
    reachable = shutil.which(binary) is not None and (
        subprocess.run([binary, "info"], capture_output=True, timeout=60).returncode == 0
    )
    if not reachable:
        pytest.fail(
            f"no Docker engine answers at DOCKER_HOST={os.environ.get('DOCKER_HOST', '(unset)')}: run "
            "`.ci/docker-engine start` and source the env file it prints",
            pytrace=False,
        )
    if subprocess.run([binary, "image", "inspect", PYTHON_IMAGE], capture_output=True).returncode != 0:
        pytest.fail(f"image {PYTHON_IMAGE} is missing: `.ci/docker-engine start` builds it", pytrace=False)


@pytest.fixture
def env_name(engine: None) -> Iterator[str]:
    """A per-test service name (the `platoon.env` label); no container may carry it after the test."""
    name = f"harbor-test-{uuid.uuid4().hex[:10]}"
    yield name
    left = containers(name)
    if left:
        subprocess.run([docker_binary(), "rm", "--force", *left], capture_output=True, timeout=120)
        pytest.fail(f"the test left {len(left)} container(s) behind", pytrace=False)


def write_task(
    root: Path,
    name: str,
    *,
    test_sh: str = "echo 0 > /logs/verifier/reward.txt\n",
    solve_sh: str | None = None,
    toml: str = "",
    image: str | None = PYTHON_IMAGE,
    top: str = "",
) -> Path:
    """A task directory `root/name` with these scripts; `toml` is added after an `[environment]` naming `image`,
    `top` (top-level keys) before it."""
    task = root / name
    (task / "tests").mkdir(parents=True)
    head = f'[environment]\ndocker_image = "{image}"\n' if image else ""
    (task / "task.toml").write_text(textwrap.dedent(top) + head + textwrap.dedent(toml))
    (task / "instruction.md").write_text(f"Task {name}.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + textwrap.dedent(test_sh))
    if solve_sh is not None:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text("#!/bin/bash\n" + textwrap.dedent(solve_sh))
    return task


def run[T](coro: Any) -> Any:
    return asyncio.run(coro)


async def opened(service: HarborService, task_id: str) -> Any:
    return await service.open(await service.get_task(task_id), rollout_id=f"r-{uuid.uuid4().hex[:8]}")


async def agent_then_grade(service: HarborService, task_id: str, *commands: str) -> tuple[Any, list[str]]:
    """Open a session, run `commands` through the bash tool as an agent would, grade, close."""
    session = await opened(service, task_id)
    try:
        outputs = [(await session.call_tool("bash", {"command": c})).as_text() for c in commands]
        return await session.grade(), outputs
    finally:
        await session.close()


async def solve_then_grade(service: HarborService, task_id: str, *, solve: bool = True) -> Any:
    """What platoon-oracle (solve) or platoon-noop (not) does, then grading."""
    session = await opened(service, task_id)
    try:
        if solve:
            result = await session.run_solution()
            assert result.exit_code == 0, result
        return await session.grade()
    finally:
        await session.close()


# --- the dataset check ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_example_task_scores_1_after_its_solution_and_0_untouched(env_name):
    """The dataset check at the session level (tests/platoon/harbor runs it through run_episode and the harnesses)."""
    service = HarborService(dataset_dir=str(EXAMPLE_TASKS), name=env_name)
    ids = run(service.list_tasks("train"))
    assert ids == ["fizzbuzz", "hello-file", "json-config", "word-count"]
    for task_id in ids:
        for solve, expected in ((True, 1.0), (False, 0.0)):
            outcome = run(solve_then_grade(service, task_id, solve=solve))
            assert (outcome.status, outcome.rewards["reward"]) == ("scored", expected), (task_id, outcome)
            assert not outcome.metadata.get("platoon_zero"), (task_id, outcome)


# --- forgeries: each refused, none scored -----------------------------------------------------------------------

# The agent's program, run by the tests (as graders run agent code): it may plant anything under /logs/verifier.
RUNS_AGENT_CODE = "cd /app && bash /app/run.sh\nexit 0\n"


@pytest.fixture
def forgery(tmp_path: Path, env_name: str) -> HarborService:
    write_task(tmp_path, "runs-agent-code", test_sh=RUNS_AGENT_CODE)
    write_task(tmp_path, "honest", test_sh="echo 0 > /logs/verifier/reward.txt\necho graded\n")
    return HarborService(dataset_dir=str(tmp_path), name=env_name)


def plant(script: str) -> str:
    """A bash command that writes the agent's /app/run.sh."""
    return f"cat > /app/run.sh <<'EOF'\n{textwrap.dedent(script)}EOF"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("echo 1 > /tmp/r\nln -s /tmp/r /logs/verifier/reward.txt\n", "reward_file_not_regular"),
        (
            "mkdir -p /tmp/d && echo 1 > /tmp/d/reward.txt\nrm -rf /logs/verifier && ln -s /tmp/d /logs/verifier\n",
            "reward_file_not_regular",
        ),
        ("mkfifo /logs/verifier/reward.txt\n", "reward_file_not_regular"),
        ("mkdir /logs/verifier/reward.json\necho 1 > /logs/verifier/reward.txt\n", "reward_file_not_regular"),
        ("head -c 2000000 /dev/zero | tr '\\0' '1' > /logs/verifier/reward.txt\n", "reward_file_too_large"),
    ],
    ids=["symlinked-file", "symlinked-dir", "fifo", "directory", "oversized"],
)
def test_reward_files_that_are_not_regular_score_a_platoon_zero(forgery, script, reason):
    outcome, _ = run(agent_then_grade(forgery, "runs-agent-code", plant(script)))
    assert (outcome.status, outcome.rewards, outcome.reason) == ("scored", {"reward": 0.0}, reason)
    assert outcome.metadata["platoon_zero"] is True


@pytest.mark.slow
def test_a_process_the_agent_left_running_cannot_rewrite_the_reward(forgery):
    rewriter = (
        "nohup bash -c 'while true; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
        "sleep 0.02; done' > /dev/null 2>&1 &\necho started"
    )
    outcome, outputs = run(
        agent_then_grade(forgery, "honest", rewriter, "sleep 0.3; cat /logs/verifier/reward.txt")
    )
    assert outputs[1].strip() == "1"  # it was running when grading began
    assert (outcome.status, outcome.rewards) == ("scored", {"reward": 0.0})
    assert not outcome.metadata.get("platoon_zero")
    assert "graded" in outcome.metadata["test_output"]


@pytest.mark.slow
def test_a_deleted_working_directory_scores_a_platoon_zero(forgery):
    outcome, _ = run(agent_then_grade(forgery, "honest", "cd / && rm -rf /app"))
    assert (outcome.status, outcome.rewards, outcome.reason) == ("scored", {"reward": 0.0}, "workdir_missing")
    assert outcome.metadata["platoon_zero"] is True
    assert "missing" in outcome.metadata["verifier_cwd_error"]


@pytest.mark.slow
def test_a_workdir_replaced_by_a_file_scores_a_platoon_zero(forgery):
    outcome, _ = run(agent_then_grade(forgery, "honest", "cd / && rm -rf /app && echo x > /app"))
    assert (outcome.reason, outcome.metadata["platoon_zero"]) == ("workdir_missing", True)
    assert "not a directory" in outcome.metadata["verifier_cwd_error"]


@pytest.mark.slow
def test_tests_tampered_with_before_grading_are_replaced(forgery):
    tamper = "mkdir -p /tests && printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && chmod 000 /tests"
    outcome, _ = run(agent_then_grade(forgery, "honest", tamper))
    assert (outcome.status, outcome.rewards) == ("scored", {"reward": 0.0})
    assert "graded" in outcome.metadata["test_output"]


@pytest.mark.slow
def test_reward_files_written_before_grading_are_removed(forgery):
    forge = (
        "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
        "echo '{\"reward\": 1}' > /logs/verifier/reward.json && chmod 000 /logs/verifier"
    )
    outcome, _ = run(agent_then_grade(forgery, "honest", forge))
    assert (outcome.status, outcome.rewards) == ("scored", {"reward": 0.0})


@pytest.mark.slow
def test_a_symlinked_logs_directory_is_replaced_before_the_tests(forgery):
    forge = "mkdir -p /tmp/fake/verifier && echo 1 > /tmp/fake/verifier/reward.txt && rm -rf /logs && ln -s /tmp/fake /logs"
    outcome, _ = run(agent_then_grade(forgery, "honest", forge))
    assert (outcome.status, outcome.rewards) == ("scored", {"reward": 0.0})


@pytest.mark.slow
def test_the_agent_never_sees_the_tests_and_they_are_removed_after_grading(forgery):
    async def go() -> tuple[str, Any, str]:
        session = await opened(forgery, "honest")
        try:
            before = (await session.call_tool("bash", {"command": "ls -A /tests 2>&1; echo done"})).as_text()
            outcome = await session.grade()
            after = (await session.call_tool("bash", {"command": "ls -A /tests 2>&1; echo done"})).as_text()
            return before, outcome, after
        finally:
            await session.close()

    before, outcome, after = run(go())
    assert "test.sh" not in before and "test.sh" not in after
    assert outcome.status == "scored"


# --- infra failures are never zeros -----------------------------------------------------------------------------


@pytest.mark.slow
def test_verifier_timeout_missing_reward_and_unset_verifier_env_are_untrainable(tmp_path, env_name):
    write_task(tmp_path, "slow", test_sh="sleep 30\n", toml="[verifier]\ntimeout_sec = 1\n")
    write_task(tmp_path, "silent", test_sh="echo no reward\n")
    write_task(tmp_path, "needs-var", toml='[verifier]\nenv = { TOKEN = "${PLATOON_TEST_UNSET_VAR}" }\n')
    service = HarborService(dataset_dir=str(tmp_path), name=env_name, pass_env=["PLATOON_TEST_UNSET_VAR"])
    slow, _ = run(agent_then_grade(service, "slow"))
    assert (slow.status, slow.failure_kind) == ("invalid", "verifier_timeout")
    silent, _ = run(agent_then_grade(service, "silent"))
    assert (silent.status, silent.failure_kind) == ("error", "verifier_no_reward")
    assert "no reward" in silent.metadata["test_output"]
    unset, _ = run(agent_then_grade(service, "needs-var"))
    assert (unset.status, unset.failure_kind) == ("error", "verifier_setup")


def test_a_task_reading_a_host_variable_the_run_does_not_pass_on_is_refused_at_run_start(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TINKER_API_KEY", "tml-host-secret")
    write_task(tmp_path, "greedy", toml='[verifier]\nenv = { KEY = "${TINKER_API_KEY}" }\n')
    write_task(tmp_path, "modest", toml='env = { LANG = "${LANG:-C.UTF-8}" }\n')
    service = HarborService(dataset_dir=str(tmp_path))
    with pytest.raises(EnvSetupError) as refused:
        run(service.check_tasks("train", ["greedy", "modest"]))
    assert refused.value.failure_kind == "env_config"
    assert str(refused.value) == (
        "Harbor task greedy [verifier].env.KEY reads the host variable TINKER_API_KEY, which this run does not pass "
        "on to tasks: add it to service_kwargs.pass_env if the dataset may read it"
    )
    run(service.check_tasks("train", ["modest"]))  # a default stands in for a variable not passed
    run(
        HarborService(dataset_dir=str(tmp_path), pass_env=["TINKER_API_KEY"]).check_tasks("train", ["greedy"])
    )
    with pytest.raises(ConfigError, match=r"^service_kwargs.pass_env: a list of variable names"):
        HarborService(dataset_dir=str(tmp_path), pass_env="TINKER_API_KEY")


@pytest.mark.slow
def test_a_provider_start_failure_is_infra_sandbox_start(tmp_path, env_name):
    write_task(tmp_path, "no-image", image="platoon-test/no-such-image:never")
    service = HarborService(dataset_dir=str(tmp_path), name=env_name)
    with pytest.raises(EnvSetupError) as info:
        run(opened(service, "no-image"))
    assert info.value.failure_kind == "sandbox_start"


@pytest.mark.slow
def test_an_unhealthy_task_is_infra_env_healthcheck(tmp_path, env_name):
    toml = '[environment.healthcheck]\ncommand = "test -f /ready"\ninterval_sec = 0.1\ntimeout_sec = 5\nretries = 2\n'
    write_task(tmp_path, "unhealthy", toml=toml)
    service = HarborService(dataset_dir=str(tmp_path), name=env_name)
    with pytest.raises(EnvSetupError) as info:
        run(opened(service, "unhealthy"))
    assert info.value.failure_kind == "env_healthcheck"


@pytest.mark.slow
def test_a_reward_contract_over_a_real_reward_json(env_name):
    service = HarborService(
        dataset_dir=str(EXAMPLE_TASKS), name=env_name, reward={"primary": "reward", "components": ["reward"]}
    )
    outcome = run(solve_then_grade(service, "fizzbuzz"))
    assert (outcome.status, outcome.failure_kind) == ("invalid", "verifier_unexpected_keys")


# --- the environment tools --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_tools_output_rules_in_a_real_sandbox(tmp_path, env_name):
    write_task(tmp_path, "tools")
    service = HarborService(dataset_dir=str(tmp_path), name=env_name, tool_timeout_s=2)

    async def go() -> dict[str, Any]:
        session = await opened(service, "tools")
        call = session.call_tool
        try:
            specs = await session.tools()
            out: dict[str, Any] = {
                "names": [s.name for s in specs],
                "flags": [(s.terminal, s.read_only) for s in specs],
            }
            out["plain"] = (await call("bash", {"command": "echo hi; pwd"})).as_text()
            out["mixed"] = (await call("bash", {"command": "echo out; echo err >&2; exit 3"})).as_text()
            out["silent"] = (await call("bash", {"command": "true"})).as_text()
            out["slow"] = await call("bash", {"command": "sleep 10"})
            out["long"] = (await call("bash", {"command": "head -c 50000 /dev/zero | tr '\\0' x"})).as_text()
            out["write"] = (
                await call("write", {"path": "pkg/mod.py", "content": "a = 1\nb = 2\nc = 3\n"})
            ).as_text()
            await call("bash", {"command": "printf '#!/bin/sh\\necho 1\\n' > run.sh && chmod 755 run.sh"})
            await call("write", {"path": "/app/run.sh", "content": "#!/bin/sh\necho 2\n"})
            out["mode"] = (await call("bash", {"command": "stat -c %a run.sh && ./run.sh"})).as_text()
            out["view"] = (await call("view", {"path": "pkg/mod.py"})).as_text()
            out["range"] = (await call("view", {"path": "pkg/mod.py", "view_range": [2, -1]})).as_text()
            out["bad_range"] = await call("view", {"path": "pkg/mod.py", "view_range": [5, 9]})
            await call("bash", {"command": "mkdir -p .git deep/er/est && touch .hidden deep/er/est/f"})
            out["listing"] = (await call("view", {"path": "."})).as_text()
            out["edit"] = (
                await call("edit", {"path": "pkg/mod.py", "old_str": "b = 2", "new_str": "b = 20"})
            ).as_text()
            await call("write", {"path": "dup.txt", "content": "x\nx\n"})
            out["dup"] = await call("edit", {"path": "dup.txt", "old_str": "x", "new_str": "y"})
            out["empty"] = await call("edit", {"path": "dup.txt", "old_str": "", "new_str": "y"})
            out["missing"] = await call("view", {"path": "nope.txt"})
            out["unknown"] = await call("rm", {"path": "x"})
            return out
        finally:
            await session.close()

    out = run(go())
    assert out["names"] == ["bash", "view", "write", "edit"]
    assert out["flags"] == [(False, False)] * 4
    assert out["plain"] == "hi\n/app\n"
    assert out["mixed"] == "out\n\n[stderr]\nerr\n\n[exit code 3]"
    assert out["silent"] == "[no output]"
    assert out["slow"].as_text().endswith("[command timed out after 2 s]")
    assert len(out["long"]) == 30_000 and "characters cut" in out["long"]
    assert out["write"] == "Wrote 18 bytes to /app/pkg/mod.py."
    assert out["mode"] == "755\n2\n"
    assert out["view"] == "     1\ta = 1\n     2\tb = 2\n     3\tc = 3"
    assert out["range"] == "     2\tb = 2\n     3\tc = 3"
    assert out["bad_range"].is_error
    listing = out["listing"].splitlines()
    assert "/app/deep/er" in listing and "/app/deep/er/est" not in listing
    assert not any("/." in line for line in listing[1:])
    assert out["edit"].endswith("     1\ta = 1\n     2\tb = 20\n     3\tc = 3")
    assert out["dup"].is_error and "2 times" in out["dup"].as_text()
    assert out["empty"].is_error
    assert out["missing"].is_error and "nope.txt" in out["missing"].as_text()
    assert out["unknown"].is_error


@pytest.mark.slow
def test_forks_share_copy_or_start_afresh_and_a_closed_session_refuses(tmp_path, env_name):
    write_task(tmp_path, "forks")
    service = HarborService(dataset_dir=str(tmp_path), name=env_name)

    async def go() -> dict[str, str]:
        session = await opened(service, "forks")
        await session.call_tool("bash", {"command": "echo parent > /app/state"})
        shared = await session.fork("shared")
        copy = await session.fork("copy")
        fresh = await session.fork("fresh")
        await shared.call_tool("bash", {"command": "echo shared >> /app/state"})
        out = {}
        for label, view in (("parent", session), ("copy", copy), ("fresh", fresh)):
            out[label] = (await view.call_tool("bash", {"command": "cat /app/state 2>&1 || true"})).as_text()
        for view in (shared, copy, fresh):
            await view.close()
        out["after_shared_close"] = (await session.call_tool("bash", {"command": "echo alive"})).as_text()
        await session.close()
        out["closed"] = (await session.call_tool("bash", {"command": "echo x"})).as_text()
        return out

    out = run(go())
    assert out["parent"] == "parent\nshared\n"
    assert out["copy"] == "parent\n"
    assert "No such file" in out["fresh"]
    assert out["after_shared_close"] == "alive\n"
    assert "closed" in out["closed"]


def test_calls_take_turns_and_an_expired_wait_is_refused_unrun(tmp_path, env_name):
    write_task(tmp_path, "turns")
    service = HarborService(dataset_dir=str(tmp_path), name=env_name, queue_timeout_s=0.5)

    async def go() -> tuple[Any, Any, str]:
        session = await opened(service, "turns")
        try:
            first = asyncio.ensure_future(session.call_tool("bash", {"command": "sleep 2; echo first"}))
            await asyncio.sleep(0.2)
            second = await session.call_tool(
                "bash", {"command": "echo second > /app/ran"}, on_behalf_of="other"
            )
            done = await first
            ran = (await session.call_tool("bash", {"command": "cat /app/ran 2>&1 || true"})).as_text()
            return done, second, ran
        finally:
            await session.close()

    done, second, ran = run(go())
    assert done.as_text() == "first\n"
    assert second.is_error and second.metadata["error_reason"] == "env_busy"
    assert "No such file" in ran  # the refused call never ran


# --- service_kwargs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"dataset_dir": "x", "datset": 1}, "service_kwargs.datset: not an option of service harbor"),
        ({}, "name the tasks"),
        ({"dataset_dir": "x", "task_dirs": ["y"]}, "exclude each other"),
        ({"dataset_dir": "x", "tool_timeout_s": 0}, "tool_timeout_s: a positive number"),
        ({"dataset_dir": "x", "concurrent_tools": ["rm"]}, "concurrent_tools"),
        ({"dataset_dir": "x", "agent_user": "root"}, "agent_user"),
        ({"dataset_dir": "x", "workdir": "app"}, "absolute"),
        ({"dataset_dir": "x", "reward": {"range": [2, 1]}}, "range"),
        ({"dataset_dir": "x", "splits": {}, "holdout": {"fraction": 0.1}}, "holdout and splits"),
    ],
)
def test_bad_service_kwargs_are_one_line_config_errors(kwargs, fragment):
    with pytest.raises(ConfigError) as info:
        HarborService(**kwargs)
    assert info.value.exit_code == 78
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_a_config_naming_service_harbor_resolves_to_this_service(tmp_path):
    from platoon.envs.resolve import resolve_service

    write_task(tmp_path, "a", toml="[agent]\ntimeout_sec = 100\n[verifier]\ntimeout_sec = 50\n")
    service = resolve_service("harbor", {"dataset_dir": str(tmp_path), "agent_timeout_multiplier": 2})
    assert isinstance(service, HarborService)
    assert run(service.list_tasks("train")) == ["a"]
    assert run(service.list_splits()) == ["train"]
    task = run(service.get_task("a"))
    assert task.goal == "Task a.\n" and task.misc["harbor"]["task_dir"] == str(tmp_path / "a")
    assert service.agent_timeout_s("a") == 200
    # 2 x 600 start (the agents' sandbox and the verifier's, separate by default) + no healthcheck + 50 verifier
    # + 120 grading + 30 close
    assert service.rollout_overhead_s("a") == 1400


def test_a_dataset_directory_lists_the_splits_of_its_splits_file_and_refuses_others(tmp_path):
    for name in ("a", "b", "c"):
        write_task(tmp_path, name)
    write_task(tmp_path, "hooked", toml='[[verifier.collect]]\ncommand = "true"\n')  # refused at load
    (tmp_path / "splits.json").write_text('{"train": ["a", "b"], "val": ["c", "hooked"]}')
    service = HarborService(dataset_dir=str(tmp_path))
    assert run(service.list_splits()) == ["train", "val"]
    assert run(service.list_tasks("train")) == ["a", "b"]
    assert run(service.list_tasks("val")) == ["c"]  # the refused task is left out, never run
    with pytest.raises(ConfigError) as refused:
        run(service.list_tasks("test"))
    assert str(refused.value) == "harbor: no split 'test'; known splits: train, val"
    assert refused.value.exit_code == 78
    # An explicit `splits:` manifest still wins over the dataset's file.
    chosen = HarborService(dataset_dir=str(tmp_path), splits={"eval": ["b"]})
    assert run(chosen.list_splits()) == ["eval"] and run(chosen.list_tasks("eval")) == ["b"]
    # Without a splits file only `train` exists: a named split no longer lists every task.
    (tmp_path / "splits.json").unlink()
    plain = HarborService(dataset_dir=str(tmp_path))
    assert run(plain.list_tasks("train")) == ["a", "b", "c"]
    with pytest.raises(ConfigError, match=r"^harbor: no split 'val'; known splits: train$"):
        run(plain.list_tasks("val"))


def test_a_malformed_splits_file_is_one_line_naming_the_file(tmp_path):
    write_task(tmp_path, "a")
    (tmp_path / "splits.json").write_text('{"train": "a"}')
    with pytest.raises(ConfigError) as info:
        run(HarborService(dataset_dir=str(tmp_path)).list_splits())
    assert str(info.value) == f"{tmp_path / 'splits.json'}.train: expected a list of task ids"


# --- the process provider ---------------------------------------------------------------------------------------

# On the process provider file contents are not translated: scripts prefix sandbox paths with $PLATOON_SANDBOX_ROOT.
PROCESS_TEST = """\
R="${PLATOON_SANDBOX_ROOT:-}"
if [ "$(cat "$R/app/answer.txt" 2>/dev/null)" = 42 ]; then echo 1 > "$R/logs/verifier/reward.txt"
else echo 0 > "$R/logs/verifier/reward.txt"; fi
"""


@pytest.mark.parametrize(("solve", "reward"), [(True, 1.0), (False, 0.0)])
def test_the_process_provider_runs_and_grades_a_task(tmp_path, solve, reward):
    write_task(
        tmp_path / "tasks",
        "answer",
        image=None,
        test_sh=PROCESS_TEST,
        solve_sh='echo 42 > "${PLATOON_SANDBOX_ROOT:-}/app/answer.txt"\n',
    )
    service = HarborService(
        dataset_dir=str(tmp_path / "tasks"),
        provider="process",
        provider_options={"scratch_root": str(tmp_path)},
    )
    outcome = run(solve_then_grade(service, "answer", solve=solve))
    assert (outcome.status, outcome.rewards["reward"]) == ("scored", reward)
    assert not list((tmp_path / f"platoon-sandboxes-{os.getuid()}").glob("process-*"))  # stopped and removed


def test_process_provider_grading_refuses_a_symlinked_reward_and_a_deleted_workdir(tmp_path):
    write_task(tmp_path / "tasks", "t", image=None, test_sh=PROCESS_TEST)
    service = HarborService(
        dataset_dir=str(tmp_path / "tasks"),
        provider="process",
        provider_options={"scratch_root": str(tmp_path)},
    )

    async def go(*commands: str) -> Any:
        outcome, _ = await agent_then_grade(service, "t", *commands)
        return outcome

    deleted = run(go("cd / && rm -rf /app"))
    assert (deleted.reason, deleted.metadata["platoon_zero"]) == ("workdir_missing", True)
    left = run(go("echo 42 > /app/answer.txt"))
    assert (left.status, left.rewards) == ("scored", {"reward": 1.0})


# --- a fetched dataset ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_fetched_dataset_runs_from_its_lock_and_an_unfetched_one_is_not_prepared(tmp_path, env_name):
    from platoon.envs.service import EnvNotPrepared
    from platoon_harbor.datasets import FetchSettings, fetch

    kwargs = {"dataset": str(EXAMPLE_TASKS), "cache": str(tmp_path / "cache"), "name": env_name}
    with pytest.raises(EnvNotPrepared, match="platoon prepare"):
        run(HarborService(**kwargs).list_tasks("train"))  # rollouts never fetch
    fetch(FetchSettings.from_kwargs(kwargs, cache=tmp_path / "cache"))
    service = HarborService(**kwargs)
    assert run(service.list_tasks("train")) == ["fizzbuzz", "hello-file", "json-config", "word-count"]
    task = run(service.get_task("hello-file"))
    assert str(tmp_path / "cache" / "tasks") in task.misc["harbor"]["task_dir"]
    assert run(solve_then_grade(service, "hello-file")).rewards == {"reward": 1.0}


# --- separate verifier ------------------------------------------------------------------------------------------

SEPARATE_TEST = """\
cd /app
ok=1
[ "$(cat /app/out/answer.txt 2>/dev/null)" = 42 ] || ok=0
[ -e /app/out/link ] && ok=0          # a symlink is never carried over
[ -e /app/out/skip.log ] && ok=0      # excluded
[ "$(cat /logs/artifacts/note.txt 2>/dev/null)" = note ] || ok=0
[ -e /app/stray.txt ] && ok=0         # not an artifact
echo $ok > /logs/verifier/reward.txt
"""


@pytest.mark.slow
def test_a_separate_verifier_gets_only_the_artifacts_and_main_is_released(tmp_path, env_name):
    top = 'artifacts = [{ source = "out", exclude = ["*.log"] }]\n'
    toml = f'[verifier.environment]\ndocker_image = "{PYTHON_IMAGE}"\n'
    write_task(tmp_path, "separate", test_sh=SEPARATE_TEST, toml=toml, top=top)
    service = HarborService(dataset_dir=str(tmp_path), name=env_name)

    async def go() -> tuple[Any, Any, Any, Any]:
        session = await opened(service, "separate")
        try:
            await session.call_tool(
                "bash",
                {
                    "command": "mkdir -p out /logs/artifacts && echo 42 > out/answer.txt && ln -s /etc/passwd "
                    "out/link && echo x > out/skip.log && echo note > /logs/artifacts/note.txt && echo y > stray.txt"
                },
            )
            first = await session.grade()
            after = await session.call_tool("bash", {"command": "echo hi"})
            again = await session.grade()  # regraded from the kept artifacts
            left = containers(env_name)
            return first, after, again, left
        finally:
            await session.close()

    first, after, again, left = run(go())
    assert (first.status, first.rewards) == ("scored", {"reward": 1.0}), first
    assert first.metadata["verifier_mode"] == "separate"
    assert sorted(first.metadata["artifacts"]) == ["/app/out", "/logs/artifacts"]
    assert first.metadata["artifacts_skipped"] == ["/app/out/link (symlink)"]
    assert after.is_error and after.metadata["error_reason"] == "session_graded"
    assert (again.status, again.rewards) == ("scored", {"reward": 1.0})
    assert left == []  # main released, every verifier stopped


@pytest.mark.slow
def test_a_verifier_image_that_bundles_its_tests_keeps_them(tmp_path, env_name):
    """A verifier built from tests/Dockerfile carries /tests itself (nothing uploads them): grading makes only
    /logs/verifier afresh there, never /tests."""
    from platoon_harbor import images

    test_sh = "grep -q bundled /tests/marker.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    task = write_task(
        tmp_path, "bundled", test_sh=test_sh, toml='[verifier]\nenvironment_mode = "separate"\n'
    )
    (task / "tests" / "marker.txt").write_text(
        f"bundled {uuid.uuid4().hex}\n"
    )  # a key (an image) of this test's own
    (task / "tests" / "Dockerfile").write_text(f"FROM {PYTHON_IMAGE}\nCOPY test.sh marker.txt /tests/\n")
    image_map = images.ImageMap(tmp_path / "images.json")
    built = images.build_keys(list(images.plan_tasks([task])[1].values()), image_map, builder="docker")
    try:
        assert [result.status for result in built] == ["built"], built
        service = HarborService(
            dataset_dir=str(tmp_path), image_map=str(tmp_path / "images.json"), name=env_name
        )
        outcome, _ = run(agent_then_grade(service, "bundled", "rm -rf /tests"))
        assert (outcome.status, outcome.rewards) == ("scored", {"reward": 1.0}), outcome
        assert outcome.metadata["verifier_mode"] == "separate"
    finally:
        tags = [result.entry["image"] for result in built if result.entry]
        subprocess.run([docker_binary(), "rmi", "--force", *tags], capture_output=True, timeout=120)


@pytest.mark.slow
def test_a_verifier_that_cannot_start_is_infra_verifier_start(tmp_path, env_name):
    toml = '[verifier.environment]\ndocker_image = "platoon-test/no-such-verifier:never"\n'
    write_task(tmp_path, "bad-verifier", toml=toml)
    service = HarborService(dataset_dir=str(tmp_path), name=env_name)
    outcome, _ = run(agent_then_grade(service, "bad-verifier"))
    assert (outcome.status, outcome.failure_kind) == ("error", "verifier_start")
    assert outcome.metadata["verifier_mode"] == "separate"


def test_a_verifier_dockerfile_without_an_image_map_is_not_prepared(tmp_path):
    from platoon.envs.service import EnvNotPrepared

    task = write_task(tmp_path, "built-verifier", toml='[verifier]\nenvironment_mode = "separate"\n')
    (task / "tests" / "Dockerfile").write_text(f"FROM {PYTHON_IMAGE}\nCOPY . /tests/\n")
    service = HarborService(dataset_dir=str(tmp_path))
    with pytest.raises(EnvNotPrepared, match="image map"):
        run(opened(service, "built-verifier"))


# --- run-start checks -------------------------------------------------------------------------------------


def test_a_run_start_refuses_a_task_the_provider_cannot_run(tmp_path, monkeypatch, capsys):
    """`check_tasks` is asked at the start of a run (here through `platoon config validate`, which makes the
    start's checks): a GPU task on the docker provider, which has no GPUs, stops it with one line and 78."""
    from platoon.cli import main

    dataset = tmp_path / "dataset"
    write_task(dataset, "cpu")
    write_task(dataset, "gpu", toml="gpus = 1\n")
    assert run(HarborService(dataset_dir=str(dataset)).check_tasks("train", ["cpu"])) is None
    (tmp_path / "train.yaml").write_text(
        textwrap.dedent(
            f"""
            log_path: {tmp_path / "runs"}
            tinker_base_url: local
            train: {{model_name: platoon/toy, renderer_name: qwen3_instruct, batch_size: 1, max_training_steps: 1}}
            environments:
              - service: harbor
                service_kwargs: {{dataset_dir: {dataset}, provider: docker, harbor_check: off}}
                harness: platoon-bandit-answer
            stats: {{wandb: {{mode: disabled}}}}
            """
        )
    )
    assert main(["config", "validate", str(tmp_path / "train.yaml")]) == 78
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  environments.0: Harbor task gpu needs 1 GPU(s); provider docker has none"
    ]
