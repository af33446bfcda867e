"""The `openhands@1.54.0` spec: its recipe lock, its options, and run_openhands.py for real.

The spec's toolchain pins CPython 3.12.14, which `platoon toolchain build` downloads with `uv python install`; where
that download is impossible (here, python-build-standalone is unreachable) the tests build the same closure from the
spec's hash-locked requirements.lock into a virtual environment of a Python 3.12 already on the machine, cached under
`.cache/` (about 40 s cold), and launch run_openhands.py with the argv and environment the spec renders,
`{toolchain}` being that environment. The model is a `ScriptedPolicy` behind platoon's real gateway over HTTP.
The script's argument checks and exit-code mapping are also tested without the SDK (platoon's own interpreter).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from platoon.harness.registry import get_harness
from platoon.harness.spec import HarnessSpec, SpecError, check_options, load_spec, option_values, render
from platoon.testing import make_gateway, tool_call

ROOT = Path(__file__).resolve().parents[2]
SPEC_DIR = ROOT / "packages/platoon-harnesses/src/platoon_harnesses/specs/openhands"
SPEC_FILE = SPEC_DIR / "openhands.toml"
SCRIPT = SPEC_DIR / "run_openhands.py"
LOCK = SPEC_DIR / "requirements.lock"
CACHE = ROOT / ".cache" / "openhands-1.54.0"
REAL_UV = shutil.which("uv")


def spec() -> HarnessSpec:
    return load_spec(SPEC_FILE)


def script_module() -> Any:
    """run_openhands.py imported as a module (it imports only the standard library at the top)."""
    found = importlib.util.spec_from_file_location("run_openhands_under_test", SCRIPT)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def launch(
    values: Mapping[str, Any], options: Mapping[str, Any] | None = None
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The spec's argv, env and files rendered as a runner renders them (options checked, defaults filled)."""
    harness = spec()
    filled = {**values, **option_values(harness, check_options(harness, options or {}))}
    argv = [render(part, filled) for part in harness.launch.argv]
    env = {name: render(value, filled) for name, value in harness.launch.env.items()}
    files = {render(path, filled): render(content, filled) for path, content in harness.launch.files.items()}
    return argv, env, files


def python312() -> str | None:
    """A working Python 3.12 already on this machine (this interpreter's base first), or None."""
    candidates = [Path(sys.base_prefix) / "bin" / "python3.12", shutil.which("python3.12") or ""]
    candidates += sorted(Path("/root/.pyenv/versions").glob("3.12*/bin/python3.12"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            probe = subprocess.run(
                [str(candidate), "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 12))"],
                capture_output=True,
                check=False,
                timeout=60,
            )
            if probe.returncode == 0:
                return str(Path(candidate).resolve())
    return None


# ---------------------------------------------------------------------------------------------- the spec


def test_the_spec_loads_and_is_registered_as_a_builtin():
    harness = spec()
    assert get_harness("openhands@1.54.0") == harness
    assert get_harness("openhands").path == SPEC_FILE  # type: ignore[union-attr]
    assert harness.timeout_s == 3600 and harness.max_steps == 30 and harness.dialect == "openai_chat"
    assert harness.toolchain == "openhands-1.54.0" and harness.resources_memory_mb == 2048
    assert harness.install is not None and harness.install.commands == ()
    recipe = harness.install.recipe
    assert (
        recipe is not None
        and recipe.python == "3.12.14"
        and recipe.lock == LOCK
        and recipe.cache == ("tiktoken",)
    )
    assert harness.option_defaults() == {
        "reasoning_replay": True,
        "request_timeout_s": 3600,
        "num_retries": 0,
        "condenser": "none",
    }
    assert harness.builtins is not None and not harness.builtins.can_disable
    assert harness.builtins.tools == ("terminal", "file_editor", "task_tracker", "finish", "think")
    assert not harness.mcp_enabled and harness.budget_enforce == "harness"
    assert harness.final_message is not None and harness.final_message.file == "{state_dir}/final_message.txt"
    assert [harness.exit_meaning(code) for code in (0, 1, 2, 3, 4, None)] == [
        "completed", "error", "error", "completed", "completed", "error"
    ]  # fmt: skip
    assert dict(harness.launch.assets) == {"run_openhands.py": SCRIPT}


def test_the_lock_is_the_hash_locked_closure_of_sdk_and_tools():
    text = LOCK.read_text()
    assert "uv pip compile --generate-hashes --python-version 3.12.14 --python-platform linux" in text
    pins: dict[str, str] = {}
    for block in text.split("\n"):
        if block and not block[0].isspace() and not block.startswith("#"):
            name, _, version = block.split(" ")[0].partition("==")
            assert version, f"not pinned: {block}"
            pins[name] = version
    assert pins["openhands-sdk"] == "1.54.0" and pins["openhands-tools"] == "1.54.0"
    assert "litellm" in pins and "tiktoken" in pins and len(pins) > 100
    # Every requirement carries its hashes (pip's --require-hashes refuses the file otherwise).
    entries = [e for e in text.split("\n") if e and not e[0].isspace() and not e.startswith("#")]
    assert text.count("--hash=sha256:") >= len(entries)
    for entry in entries:
        assert entry.endswith("\\"), f"no hash follows {entry}"


def test_the_launch_renders_the_options_as_arguments():
    values = {
        "instruction": "Fix it.",
        "base_url": "http://gw",
        "api_key": "sk-agent",
        "model": "policy",
        "workdir": "/w",
        "state_dir": "/s",
        "max_steps": 30,
        "toolchain": "/tc",
    }
    argv, env, files = launch(
        values, {"condenser": "llm_summarizing", "num_retries": 2, "reasoning_replay": False}
    )
    assert argv == [
        "/tc/bin/python3", "-I", "/s/run_openhands.py", "--instruction-file", "/s/instruction.md",
        "--max-iterations", "30", "--final-message-file", "/s/final_message.txt", "--reasoning-replay", "false",
        "--llm-timeout", "3600", "--num-retries", "2", "--condenser", "llm_summarizing",
    ]  # fmt: skip
    assert env == {
        "LLM_MODEL": "openai/policy",
        "LLM_BASE_URL": "http://gw/v1",
        "LLM_API_KEY": "sk-agent",
        "HOME": "/s",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "TIKTOKEN_CACHE_DIR": "/tc/share/tiktoken",
        "OPENHANDS_SUPPRESS_BANNER": "1",
    }
    assert files == {"instruction.md": "Fix it."}
    for bad in ({"num_retries": 11}, {"condenser": "summarize"}, {"request_timeout_s": 0}, {"replay": True}):
        with pytest.raises(SpecError) as caught:
            check_options(spec(), bad)
        assert "\n" not in str(caught.value)


# ---------------------------------------------------------------------------------------------- the script alone


def test_the_script_compiles_and_imports_only_the_standard_library_at_the_top(tmp_path):
    py_compile.compile(str(SCRIPT), cfile=str(tmp_path / "run_openhands.pyc"), doraise=True)
    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    top = {
        alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names
    }
    top |= {
        node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module
    }
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, top


def run_script(args: list[str], env: Mapping[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The script under platoon's own interpreter, which has no OpenHands SDK."""
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), *args],
        env={"PATH": os.environ["PATH"], **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_bad_arguments_and_a_missing_environment_exit_2_with_one_line(tmp_path):
    (tmp_path / "task.md").write_text("Do it.")
    good = ["--instruction-file", "task.md", "--final-message-file", "final.txt", "--max-iterations", "3"]
    env = {"LLM_MODEL": "openai/policy", "LLM_BASE_URL": "http://127.0.0.1:9/v1", "LLM_API_KEY": "sk-secret"}
    for extra, what in [
        (["--num-retries", "11"], "from 0 to 10"),
        (["--condenser", "summarize"], "invalid choice"),
        (["--reasoning-replay", "maybe"], "expected true or false"),
        (["--llm-timeout", "0"], "at least 1"),
    ]:
        ran = run_script([*good, *extra], env, tmp_path)
        assert ran.returncode == 2 and what in ran.stderr, ran.stderr
        assert [line for line in ran.stderr.splitlines() if "error:" in line] != []
        assert ran.stdout == ""
    ran = run_script(good[:4], env, tmp_path)  # no --max-iterations
    assert ran.returncode == 2 and "--max-iterations" in ran.stderr
    ran = run_script(good, {k: v for k, v in env.items() if k != "LLM_API_KEY"}, tmp_path)
    assert ran.returncode == 2 and ran.stderr == "run_openhands.py: set LLM_API_KEY in the environment\n"
    ran = run_script(["--instruction-file", "missing.md", *good[2:]], env, tmp_path)
    assert ran.returncode == 2 and ran.stderr.startswith("run_openhands.py: cannot read --instruction-file")


def test_without_the_sdk_it_prints_its_settings_and_exits_1(tmp_path):
    (tmp_path / "task.md").write_text("Do it.")
    args = ["--instruction-file", "task.md", "--final-message-file", "final.txt", "--max-iterations", "3"]
    env = {"LLM_MODEL": "openai/policy", "LLM_BASE_URL": "http://127.0.0.1:9/v1", "LLM_API_KEY": "sk-secret"}
    ran = run_script([*args, "--reasoning-replay", "false", "--condenser", "llm_summarizing"], env, tmp_path)
    assert ran.returncode == 1
    first, *_ = ran.stdout.splitlines()
    assert first.startswith("openhands: settings ")
    assert json.loads(first.removeprefix("openhands: settings ")) == {
        "model": "openai/policy",
        "base_url": "http://127.0.0.1:9/v1",
        "max_iterations": 3,
        "reasoning_replay": False,
        "llm_timeout": 3600,
        "num_retries": 0,
        "condenser": "llm_summarizing",
        "workspace": str(tmp_path),
        "sdk": "1.54.0",
    }
    assert "the OpenHands SDK is not importable here" in ran.stderr
    assert "sk-secret" not in ran.stdout + ran.stderr
    assert not (tmp_path / "final.txt").exists()


def test_the_exit_code_mapping():
    module = script_module()
    assert module.exit_code("finished", []) == 0
    assert module.exit_code("error", ["MaxIterationsReached"]) == 3
    assert (
        module.exit_code("finished", ["MaxIterationsReached"]) == 3
    )  # the limit wins: it is what ended the run
    assert module.exit_code("stuck", []) == 4
    assert module.exit_code("error", ["LLMBadRequestError"]) == 1
    assert module.exit_code("running", []) == 1 and module.exit_code("idle", []) == 1


# ---------------------------------------------------------------------------------------------- real runs


@dataclass
class Toolchain:
    path: Path  # a virtual environment holding the lock's closure: `{toolchain}/bin/python3` runs the script
    seconds: float  # how long building it took in this session (0 when the cached one matched the lock)


@pytest.fixture(scope="session")
def toolchain() -> Toolchain:
    """The spec's lock installed (hashes required, as `platoon toolchain build` installs it) into a virtual
    environment of a local Python 3.12, cached under `.cache/` and keyed by the lock's SHA-256."""
    python = python312()
    if REAL_UV is None or python is None:
        if os.environ.get("CI"):
            pytest.fail("uv and a Python 3.12 are needed to install the OpenHands closure")
        pytest.skip("needs uv and a Python 3.12 on this machine")
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    venv = CACHE / "venv"
    stamp = CACHE / "lock.sha256"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == digest and (venv / "bin/python3").exists():
            return Toolchain(venv, 0.0)
        shutil.rmtree(venv, ignore_errors=True)
        stamp.unlink(missing_ok=True)
        started = time.perf_counter()
        for command in (
            [REAL_UV, "venv", "--quiet", "--python", python, str(venv)],
            [
                REAL_UV, "pip", "install", "--python", str(venv / "bin/python3"), "--require-hashes",
                "--compile-bytecode", "--link-mode", "copy", "-r", str(LOCK),
            ],
        ):  # fmt: skip
            result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1200)
            if result.returncode != 0:
                output = result.stdout + result.stderr
                if not os.environ.get("CI") and ("dns error" in output or "Connect" in output):
                    pytest.skip(f"PyPI is not reachable here: {output.strip().splitlines()[-1]}")
                pytest.fail(f"{' '.join(command)} exited {result.returncode}:\n{output[-4000:]}")
        seconds = time.perf_counter() - started
        stamp.write_text(digest)
    print(f"\nopenhands closure installed from requirements.lock in {seconds:.1f}s")
    return Toolchain(venv, seconds)


@dataclass
class Served:
    gateway: Any
    server: Any
    rollout: Any
    agent: Any

    @property
    def policy(self) -> Any:
        return self.gateway.sampler


@contextlib.asynccontextmanager
async def served(script: Any, **gateway: Any) -> AsyncIterator[Served]:
    from platoon.gateway.http import GatewayServer

    made = make_gateway(script if callable(script) else list(script), **gateway)
    server = GatewayServer(made)
    await server.astart()
    rollout = made.open_rollout("r")
    agent = made.open_agent(rollout)
    try:
        yield Served(made, server, rollout, agent)
    finally:
        await server.astop()


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str
    state: Path
    final: str | None


async def run_openhands(
    tmp_path: Path,
    toolchain: Toolchain,
    s: Served,
    *,
    max_steps: int,
    instruction: str,
    options: Mapping[str, Any] | None = None,
) -> Ran:
    """Launch the script as a local placement would: the spec rendered with `{toolchain}` = the environment, its
    files and asset in a state dir, `work/` as cwd, PATH and the rendered env only."""
    harness = spec()
    state = tmp_path / "state"
    work = state / "work"
    work.mkdir(parents=True)
    values = {
        "instruction": instruction,
        "base_url": s.server.base_url,
        "api_key": s.agent.secret,
        "model": s.gateway.model_name,
        "workdir": str(work),
        "state_dir": str(state),
        "max_steps": max_steps,
        "toolchain": str(toolchain.path),
    }
    argv, env, files = launch(values, options)
    for path, content in files.items():
        (state / path).write_text(content, encoding="utf-8")
    for path, source in harness.launch.assets.items():
        shutil.copyfile(source, state / render(path, values))
    env |= {
        "PATH": os.environ["PATH"],
        "NO_PROXY": "127.0.0.1,localhost,::1",
        "no_proxy": "127.0.0.1,localhost,::1",
    }
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    async with asyncio.timeout(600):  # a hang guard, not a speed claim
        out, err = await process.communicate()
    assert process.returncode is not None
    final_file = state / "final_message.txt"
    final = final_file.read_text(encoding="utf-8") if final_file.exists() else None
    return Ran(process.returncode, out.decode(errors="replace"), err.decode(errors="replace"), state, final)


def assert_recorded(s: Served, count: int) -> None:
    """Every model call was recorded on the agent, through the Chat Completions dialect, with its exact tokens."""
    assert len(s.agent.calls) == count == len(s.policy.calls)
    for call, policy_call in zip(s.agent.calls, s.policy.calls, strict=True):
        interaction = s.rollout.interactions[call.call_id]
        assert call.kind == "policy" and call.model == s.gateway.model_name
        assert call.usage["prompt_tokens"] == len(interaction.prompt_tokens) > 0
        assert call.usage["completion_tokens"] == len(interaction.sampled_tokens) > 0
        assert list(interaction.prompt_tokens) == list(policy_call.prompt_tokens)
        assert list(interaction.sampled_tokens) == list(policy_call.tokens)


def test_openhands_runs_a_command_and_finishes(tmp_path, toolchain):
    script = [
        tool_call("terminal", command="echo hello > made.txt && echo key=[${LLM_API_KEY:-}] > key.txt"),
        tool_call("finish", message="made.txt says hello"),
        "never asked",
    ]

    async def main() -> None:
        async with served(script) as s:
            ran = await run_openhands(
                tmp_path, toolchain, s, max_steps=5, instruction="Write hello to made.txt."
            )
            assert ran.code == 0, ran.stdout + ran.stderr
            work = ran.state / "work"
            assert (work / "made.txt").read_text() == "hello\n"
            assert (work / "key.txt").read_text() == "key=[]\n"  # the agent's shell never saw the key
            assert ran.final == "made.txt says hello"
            first = ran.stdout.splitlines()[0]
            assert json.loads(first.removeprefix("openhands: settings "))["workspace"] == str(work)
            assert "openhands: status finished, errors [], exit 0" in ran.stdout
            assert s.agent.secret not in ran.stdout + ran.stderr
            assert_recorded(s, 2)
            assert s.policy.remaining == 1
            # The tools offered: terminal, file_editor, task_tracker, finish and think; no delegation, no browser.
            offered = s.policy.calls[0].prompt
            names = re.findall(r'"type": "function", "function": \{"name": "([^"]+)"', offered)
            assert sorted(names) == ["file_editor", "finish", "task_tracker", "terminal", "think"]
            assert "Write hello to made.txt." in offered

    asyncio.run(main())


def test_reasoning_replay_makes_every_prompt_extend_the_last_call(tmp_path, toolchain):
    """With replay on, reasoning and whitespace-only text go back as sampled, so under a renderer that keeps
    history reasoning each prompt extends the last call's tokens (the gateway reuses them); off, they do not."""
    think = "<think>\nI should look first.\n</think>\n\n  \n"
    script = [
        think + tool_call("terminal", command="ls"),
        think + tool_call("terminal", command="echo done > done.txt"),
        tool_call("finish", message="done"),
    ]
    renderer = {"renderer": "qwen3", "renderer_kwargs": {"strip_thinking_from_history": False}}

    async def main(replay: bool) -> list[dict[str, Any]]:
        async with served(script, **renderer) as s:
            ran = await run_openhands(
                tmp_path / str(replay),
                toolchain,
                s,
                max_steps=5,
                instruction="Do it.",
                options={"reasoning_replay": replay},
            )
            assert ran.code == 0, ran.stdout + ran.stderr
            assert_recorded(s, 3)
            assert s.agent.calls[0].message["reasoning_content"] == "\nI should look first.\n"
            return [
                {**call.generation["history"], "previous": previous.call_id}
                for previous, call in zip(s.agent.calls, s.agent.calls[1:], strict=False)
            ]

    on = asyncio.run(main(True))
    assert [(h["extends"], h["segment"]) for h in on] == [(h["previous"], None) for h in on]
    assert all(h["reused_tokens"] > 0 for h in on)
    off = asyncio.run(main(False))
    assert [h["segment"] for h in off] == ["reasoning_dropped", "reasoning_dropped"]


def test_the_iteration_limit_exits_3(tmp_path, toolchain):
    counter = iter(range(1000))

    def policy(prompt: str) -> str:  # a different command each turn, so the stuck detector stays quiet
        return tool_call("terminal", command=f"echo {next(counter)} >> turns.txt")

    async def main() -> None:
        async with served(policy) as s:
            ran = await run_openhands(tmp_path, toolchain, s, max_steps=2, instruction="Keep going.")
            assert ran.code == 3, ran.stdout + ran.stderr
            assert spec().exit_meaning(ran.code) == "completed"
            assert (ran.state / "work/turns.txt").read_text() == "0\n1\n"
            assert "errors ['MaxIterationsReached'], exit 3" in ran.stdout
            assert_recorded(s, 2)

    asyncio.run(main())


def test_a_loop_is_stopped_as_stuck_with_exit_4(tmp_path, toolchain):
    def policy(prompt: str) -> str:  # the same command and the same output, over and over
        return tool_call("terminal", command="echo again")

    async def main() -> None:
        async with served(policy) as s:
            ran = await run_openhands(tmp_path, toolchain, s, max_steps=20, instruction="Keep going.")
            assert ran.code == 4, ran.stdout + ran.stderr
            assert spec().exit_meaning(ran.code) == "completed"
            assert "openhands: status stuck" in ran.stdout
            assert 3 <= len(s.agent.calls) < 20

    asyncio.run(main())
