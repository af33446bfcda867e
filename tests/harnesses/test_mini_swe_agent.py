"""The `mini-swe-agent@2.4.6` spec with the real package from PyPI, against platoon's real gateway.

The spec's own install command installs mini-swe-agent 2.4.6 once per test session into a HOME cached under
`.cache/` (gitignored), so a warm checkout installs nothing; a cold one downloads from PyPI (about 8 s here). The
`mini` CLI then runs as a subprocess with the argv and environment the spec renders (core's `load_spec` and
`render`, so the test checks the spec file, not a copy of it) against a `GatewayServer` over HTTP whose
`ScriptedPolicy` answers in tool calls: mini's `LitellmModel` speaks Chat Completions with one `bash` tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from platoon.gateway.core import BUDGET_STOP_CALL_PREFIX
from platoon.harness.registry import get_harness
from platoon.harness.spec import HarnessSpec, load_spec, render
from platoon.testing import make_gateway, tool_call

ROOT = Path(__file__).resolve().parents[2]
SPEC_FILE = ROOT / "packages/platoon-harnesses/src/platoon_harnesses/specs/mini-swe-agent/mini-swe-agent.toml"
#: the HOME the spec's install puts mini-swe-agent under (~/.local/bin, ~/.local/share/uv/tools, ~/.cache/uv)
CACHE = ROOT / ".cache" / "mini-swe-agent-2.4.6"
#: the variables a local placement keeps from the host that an install from PyPI needs
PASSED = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY")
PASSED += tuple(name.lower() for name in PASSED[3:])


def spec() -> HarnessSpec:
    return load_spec(SPEC_FILE)


def python312() -> str | None:
    """The path of a working Python 3.12 interpreter (this one's base first), or None."""
    candidates = [Path(sys.base_prefix) / "bin" / "python3.12", shutil.which("python3.12") or ""]
    candidates += sorted(Path("/root/.pyenv/versions").glob("3.12*/bin/python3.12"))
    for candidate in candidates:
        if not candidate or not Path(candidate).is_file():
            continue
        probe = subprocess.run(
            [str(candidate), "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 12))"],
            capture_output=True,
            check=False,
            timeout=60,
        )
        if probe.returncode == 0:
            return str(Path(candidate).resolve())
    return None


def python312_dir(directory: Path) -> str | None:
    """`directory`, holding only a `python3.12` linked to `python312()`, to put first on PATH; None without one.

    The install's `uv python find 3.12` finds this link, so the tool's venv is built on it (its `bin/python` points
    here): a mini that another test session is running goes through it. It is therefore replaced atomically and only
    when it points elsewhere, never removed and remade (a session would find no interpreter in between)."""
    found = python312()
    if found is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    link = directory / "python3.12"
    if not (link.is_symlink() and os.readlink(link) == found):
        staged = directory / f".python3.12.{os.getpid()}"
        staged.unlink(missing_ok=True)
        staged.symlink_to(found)
        os.replace(staged, link)
    return str(directory)


def interpreter_prefix(home: Path) -> str:
    """The prefix of the real interpreter the installed tool's venv runs on (its `bin/python` link resolved)."""
    venv_python = home / ".local/share/uv/tools/mini-swe-agent/bin/python"
    return str(Path(os.path.realpath(venv_python)).parents[1])


def host_env(home: Path, *, extra_path: str | None = None) -> dict[str, str]:
    path = os.environ.get("PATH", "/usr/bin:/bin")
    env = {"HOME": str(home), "PATH": f"{extra_path}:{path}" if extra_path else path}
    env.update({name: os.environ[name] for name in PASSED if name in os.environ})
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
    return env


@dataclass
class Installed:
    home: Path
    seconds: float  # how long the install command ran in this session
    output: str


@pytest.fixture(scope="session")
def installed() -> Installed:
    """mini-swe-agent 2.4.6 under the cached HOME, installed by the spec's own install command (a no-op when the
    cached one reports 2.4.6). One session at a time installs (a lock file beside the cache)."""
    harness = spec()
    assert harness.install is not None and len(harness.install.commands) == 1
    home = CACHE / "home"
    home.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = host_env(home, extra_path=python312_dir(CACHE / "python312"))
        started = time.perf_counter()
        result = subprocess.run(
            ["sh", "-c", harness.install.commands[0]],
            cwd=home,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            timeout=harness.install.timeout_s,
        )
        seconds = time.perf_counter() - started
    output = result.stdout + result.stderr
    if result.returncode != 0:
        if not os.environ.get("CI") and ("dns error" in output or "Connect" in output):
            pytest.skip(f"PyPI is not reachable here: {output.strip().splitlines()[-1]}")
        pytest.fail(f"the spec's install exited {result.returncode}:\n{output[-4000:]}")
    print(f"\nmini-swe-agent install (spec command): {seconds:.1f}s; {output.strip().splitlines()[-1]}")
    return Installed(home, seconds, output)


# ---------------------------------------------------------------------------------------------- the gateway


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
async def served(script: Any) -> AsyncIterator[Served]:
    """A gateway over `script` (a list or a function of the prompt) served on loopback, one rollout, its root."""
    from platoon.gateway.http import GatewayServer

    gateway = make_gateway(script if callable(script) else list(script))
    server = GatewayServer(gateway)
    await server.astart()
    rollout = gateway.open_rollout("r")
    agent = gateway.open_agent(rollout)
    try:
        yield Served(gateway, server, rollout, agent)
    finally:
        await server.astop()


@dataclass
class Ran:
    code: int
    output: str
    state: Path
    trajectory: dict[str, Any] | None
    final: str | None  # what the spec's [final_message] names: trajectory.json's info.submission


def final_message(harness: HarnessSpec, values: dict[str, Any]) -> str | None:
    """The `[final_message]` file + json_key rule (docs/harnesses.md): the dotted key's value (strings raw), None if missing."""
    found = harness.final_message
    assert found is not None and found.file is not None and found.json_key is not None
    try:
        value: Any = json.loads(Path(render(found.file, values)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for part in found.json_key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value if isinstance(value, str) else json.dumps(value)


async def run_mini(
    tmp_path: Path, installed: Installed, s: Served, *, max_steps: int, instruction: str
) -> Ran:
    """Launch mini as a local placement would: the spec's argv and env rendered (the served model name, the
    root agent's key), a state dir with `work/` as cwd, the allowlisted host variables (HOME is the cached one
    the install used)."""
    harness = spec()
    state = tmp_path / "state"
    work = state / "work"
    work.mkdir(parents=True)
    values: dict[str, Any] = {
        "instruction": instruction,
        "base_url": s.server.base_url,
        "api_key": s.agent.secret,
        "model": s.gateway.model_name,
        "workdir": str(work),
        "state_dir": str(state),
        "max_steps": max_steps,
    }
    argv = [render(part, values) for part in harness.launch.argv]
    env = host_env(installed.home)
    env.update({name: render(value, values) for name, value in harness.launch.env.items()})
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    async with asyncio.timeout(300):  # a hang guard, not a speed claim
        out, _ = await process.communicate()
    assert process.returncode is not None
    trajectory_file = state / "trajectory.json"
    trajectory = json.loads(trajectory_file.read_text()) if trajectory_file.exists() else None
    return Ran(
        process.returncode, out.decode(errors="replace"), state, trajectory, final_message(harness, values)
    )


def responses(ran: Ran) -> list[dict[str, Any]]:
    """The raw Chat Completions responses mini saved in its trajectory, in order (with its assistant messages, and
    with the format-error message a reply without a tool call becomes)."""
    assert ran.trajectory is not None
    return [m["extra"]["response"] for m in ran.trajectory["messages"] if "response" in m.get("extra", {})]


def assert_recorded(s: Served, ran: Ran, count: int) -> None:
    """Every model call mini made was answered through the Chat Completions dialect and recorded on the agent
    with its exact tokens."""
    assert len(s.agent.calls) == count == len(s.policy.calls)
    recorded = responses(ran)
    sampled = [r for r in recorded if not r["id"].startswith(BUDGET_STOP_CALL_PREFIX)]
    assert [r["id"] for r in sampled] == [c.call_id for c in s.agent.calls]
    assert {r["object"] for r in recorded} == {"chat.completion"}
    for call, policy_call in zip(s.agent.calls, s.policy.calls, strict=True):
        interaction = s.rollout.interactions[call.call_id]
        assert call.kind == "policy" and call.model == s.gateway.model_name
        assert call.usage["prompt_tokens"] == len(interaction.prompt_tokens) > 0
        assert call.usage["completion_tokens"] == len(interaction.sampled_tokens) > 0
        assert list(interaction.prompt_tokens) == list(policy_call.prompt_tokens)
        assert list(interaction.sampled_tokens) == list(policy_call.tokens)


# ---------------------------------------------------------------------------------------------- the spec


def test_the_spec_loads_and_is_registered_as_a_builtin():
    harness = spec()
    assert get_harness("mini-swe-agent@2.4.6") == harness
    assert get_harness("mini-swe-agent").path == SPEC_FILE  # type: ignore[union-attr]
    assert harness.timeout_s == 3600 and harness.max_steps == 100 and harness.dialect == "openai_chat"
    assert harness.install is not None and harness.install.timeout_s == 1200 and harness.toolchain is None
    assert harness.budget_enforce == "harness" and not harness.mcp_enabled and harness.options == {}
    assert (
        harness.builtins is not None
        and harness.builtins.tools == ("bash",)
        and not harness.builtins.can_disable
    )
    assert harness.final_message is not None
    assert (harness.final_message.file, harness.final_message.json_key) == (
        "{state_dir}/trajectory.json",
        "info.submission",
    )
    assert harness.exit_meaning(0) == "completed" and harness.exit_meaning(1) == "error"
    assert dict(harness.launch.env) == {
        "OPENAI_API_KEY": "{api_key}",
        "OPENAI_BASE_URL": "{base_url}/v1",
        "OPENAI_API_BASE": "{base_url}/v1",
        "MSWEA_CONFIGURED": "true",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "MSWEA_GLOBAL_CONFIG_DIR": "{state_dir}/mini-swe-agent-config",
    }


def test_the_instruction_is_an_argument_never_shell_text(tmp_path):
    """The `sh -c` text is constant; an instruction full of shell syntax reaches mini as one argument."""
    harness = spec()
    nasty = '\'; touch pwned; echo "$(id)" `id` {model} --yolo\n-x'
    values = {
        "instruction": nasty,
        "base_url": "http://gw",
        "model": "policy",
        "workdir": "/w",
        "state_dir": "/s",
        "max_steps": 7,
    }
    argv = [render(part, values) for part in harness.launch.argv]
    assert argv[:3] == ["sh", "-c", 'PATH="$HOME/.local/bin:$PATH"; export PATH; exec mini "$@"']
    assert argv[3:] == [
        "mini", "--yolo", "--exit-immediately", "--model", "openai/policy", f"--task={nasty}",
        "--output", "/s/trajectory.json", "--cost-limit", "0", "--config", "mini",
        "--config", "model.model_kwargs.timeout=3600", "--config", "agent.step_limit=7",
    ]  # fmt: skip
    # What the shell hands on: a stand-in `mini` on PATH prints its arguments as JSON.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mini").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (fake / "mini").chmod(0o755)
    out = subprocess.run(
        argv,
        env={"HOME": str(tmp_path), "PATH": f"{fake}:/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert json.loads(out) == argv[4:]
    assert not (tmp_path / "pwned").exists()


def test_the_install_script_is_posix_sh():
    harness = spec()
    assert harness.install is not None
    for shell in ("dash", "sh"):
        if shutil.which(shell):
            subprocess.run([shell, "-n", "-c", harness.install.commands[0]], check=True, timeout=60)


# ---------------------------------------------------------------------------------------------- runs


def test_install_is_cached_and_mini_reports_its_version(installed):
    assert (installed.home / ".local/bin/mini").exists()
    # The second run of the spec's install finds the CLI and installs nothing.
    harness = spec()
    assert harness.install is not None
    again = subprocess.run(
        ["sh", "-c", harness.install.commands[0]],
        cwd=installed.home,
        env=host_env(installed.home),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert "mini-swe-agent 2.4.6 is already installed" in again.stdout
    assert not (installed.home / ".config/mini-swe-agent").exists()  # --help ran with a scratch config dir


def test_mini_edits_a_file_and_submits_through_the_gateway(tmp_path, installed):
    script = [
        tool_call("bash", command="echo hello > made.txt && echo $((6 * 7)) > answer.txt && pwd"),
        tool_call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt"),
        "never asked",
    ]

    async def main() -> None:
        async with served(script) as s:
            ran = await run_mini(
                tmp_path,
                installed,
                s,
                max_steps=10,
                instruction="Write hello to made.txt and submit 6 * 7.",
            )
            assert ran.code == 0, ran.output
            work = ran.state / "work"
            assert (work / "made.txt").read_text() == "hello\n"
            assert ran.trajectory is not None
            assert ran.trajectory["info"]["exit_status"] == "Submitted"
            assert ran.trajectory["info"]["mini_version"] == "2.4.6"
            assert ran.final == "42\n"  # the spec's final message: info.submission
            assert_recorded(s, ran, 2)
            assert s.policy.remaining == 1
            assert [c.finish_reason for c in s.agent.calls] == ["tool_calls", "tool_calls"]
            assert [c.message["tool_calls"][0]["function"]["name"] for c in s.agent.calls] == ["bash", "bash"]
            # The task, mini's bash tool and the command's output as the policy saw them.
            prompts = [call.prompt for call in s.policy.calls]
            assert (
                "Write hello to made.txt and submit 6 * 7." in prompts[0] and '"name": "bash"' in prompts[0]
            )
            assert str(work.resolve()) in prompts[1]
            # Nothing of mini's own config landed in HOME: it lives in the state dir.
            assert (ran.state / "mini-swe-agent-config").is_dir()
            assert not (installed.home / ".config/mini-swe-agent").exists()

    asyncio.run(main())


def test_its_own_step_limit_is_max_steps_and_exits_0(tmp_path, installed):
    """`agent.step_limit={max_steps}`: mini stops itself after max_steps calls, exits 0 (a graded outcome)."""
    script = [tool_call("bash", command="echo step >> steps.txt")] * 3

    async def main() -> None:
        async with served(script) as s:
            ran = await run_mini(tmp_path, installed, s, max_steps=2, instruction="Keep going.")
            assert ran.code == 0, ran.output
            assert (ran.state / "work/steps.txt").read_text() == "step\nstep\n"
            assert ran.trajectory is not None and ran.trajectory["info"]["exit_status"] == "LimitsExceeded"
            assert ran.final == ""
            assert_recorded(s, ran, 2)
            assert s.policy.remaining == 1

    asyncio.run(main())


def test_a_gateway_enforced_budget_stops_it_with_the_stop_message(tmp_path, installed):
    """The budget a `[budget] enforce = "gateway"` run sets (what the runner does through
    `set_call_cap`): past max_steps the gateway answers, unsampled and unrecorded, with its stop message; mini
    reads a reply without a tool call as a format error and gives up after three in a row, exiting 0."""

    def policy(prompt: str) -> str:
        return tool_call("bash", command="echo step >> steps.txt")

    async def main() -> None:
        async with served(policy) as s:
            s.gateway.set_call_cap(s.agent, 2)
            ran = await run_mini(tmp_path, installed, s, max_steps=50, instruction="Keep going.")
            assert ran.code == 0, ran.output
            assert (ran.state / "work/steps.txt").read_text() == "step\nstep\n"
            assert ran.trajectory is not None
            assert ran.trajectory["info"]["exit_status"] == "RepeatedFormatError"
            assert_recorded(s, ran, 2)  # the stop replies are not sampled, so not recorded
            stops = [r for r in responses(ran) if r["id"].startswith(BUDGET_STOP_CALL_PREFIX)]
            assert len(stops) == 3
            for stop in stops:
                message = stop["choices"][0]["message"]
                assert message["content"].startswith("[platoon] The step budget of 2 model calls is used up")
                assert not message.get("tool_calls") and stop["choices"][0]["finish_reason"] == "stop"
            assert s.agent.misc["budget"] == {"enforce": "gateway", "max_steps": 2, "stops": 3}

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------- through the runner


class SixTimesSevenSession:
    """No tools of its own (mini brings bash); graded by what the sandbox's workdir holds when there is one."""

    def __init__(self, sandbox: Any = None) -> None:
        self.sandbox = sandbox
        self.instruction = None
        self.answer: str | None = None

    async def tools(self) -> list[Any]:
        return []

    async def call_tool(self, name: str, arguments: Any) -> Any:
        raise AssertionError(f"mini-swe-agent has no MCP tools; got a call of {name}")

    async def grade(self) -> Any:
        from platoon.envs.service import Outcome

        if self.sandbox is not None:
            found = await self.sandbox.exec(["cat", "/app/answer.txt"], cwd="/")
            self.answer = found.stdout if found.exit_code == 0 else None
        return Outcome("scored", rewards={"reward": 1.0 if self.answer == "42\n" else 0.0})

    async def fork(self, mode: Any = "shared", *, task: Any = None) -> SixTimesSevenSession:
        return self

    async def close(self) -> None:
        if self.sandbox is not None:
            await self.sandbox.stop()


class SixTimesSevenService:
    """One task; with a provider, each session gets a task sandbox (its spec from `sandbox_spec`, the rollout's
    session needs applied: the gateway's Unix socket as the route)."""

    name = "six-times-seven"

    def __init__(self, provider: Any = None, sandbox_spec: Any = None) -> None:
        self.provider = provider
        self.sandbox_spec = sandbox_spec
        self.sessions: list[SixTimesSevenSession] = []

    async def list_tasks(self, split: str) -> list[str]:
        return ["t0"]

    async def get_task(self, task_id: str) -> Any:
        from platoon.task import Task

        return Task(goal="Write 6 * 7 to answer.txt, then submit it.", id=task_id)

    async def open(self, task: Any, *, rollout_id: str, needs: Any = None) -> SixTimesSevenSession:
        sandbox = None
        if self.provider is not None:
            spec = self.sandbox_spec if needs is None else needs.apply(self.sandbox_spec)
            sandbox = await self.provider.start(spec)
        session = SixTimesSevenSession(sandbox)
        self.sessions.append(session)
        return session


SOLVE = [
    tool_call("bash", command="echo $((6 * 7)) > answer.txt && pwd"),
    tool_call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt"),
]


def assert_exact_tokens(episode: Any, count: int) -> None:
    call_ids = [step.misc["action_misc"]["completion_id"] for step in episode.root.steps]
    assert len(call_ids) == len(episode.policy.calls) == count
    for policy_call, call_id in zip(episode.policy.calls, call_ids, strict=True):
        interaction = episode.interactions[call_id]
        assert list(interaction.prompt_tokens) == list(policy_call.prompt_tokens)
        assert list(interaction.sampled_tokens) == list(policy_call.tokens)


def test_through_the_spec_runner_on_the_host(tmp_path, installed, monkeypatch):
    """Local placement: the runner runs the spec's install (it finds the cached CLI under HOME), launches mini in
    a private state dir with the allowlisted environment, and takes info.submission as the finish message."""
    from platoon.testing.episode import run_episode

    monkeypatch.setenv("HOME", str(installed.home))
    service = SixTimesSevenService()
    episode = run_episode(
        "t0", service=service, harness="mini-swe-agent", policy=SOLVE, output_dir=tmp_path / "out"
    )
    harness = episode.root.misc["harness"]
    assert harness["spec"] == "mini-swe-agent@2.4.6" and harness["placement"] == "local"
    assert harness["exit_code"] == 0 and harness["timed_out"] is False
    assert episode.outcome["status"] == "scored"
    assert episode.root.finish_message == "42\n"
    assert "Write 6 * 7 to answer.txt" in episode.policy.calls[0].prompt
    assert_exact_tokens(episode, 2)
    log = Path(harness["logs_path"]).read_text()
    assert "This is mini-swe-agent version 2.4.6." in log and "Saved trajectory" in log


def test_through_the_spec_runner_in_a_network_none_docker_sandbox(tmp_path, installed):
    """Task-sandbox placement: mini runs in a `network: none` container and reaches the gateway through the
    runner's route. The image (Debian's minimal base with Python 3.11, no pip, no curl, no CA certificates) cannot
    install mini-swe-agent itself, so the install made on the host is bound in read-only at the same path, with
    the Python 3.12 it was built on, and HOME points at it: the spec's install command runs in the sandbox, finds
    mini 2.4.6 there and installs nothing.

    The whole cache is bound, not only HOME: the tool's venv records the interpreter the install found, and a fresh
    install finds the `python3.12` link in the cache's `python312/` (put first on PATH), so its `bin/python` points
    there; without that directory `mini` has no interpreter in the container, its `--help` reports no version and
    the install script goes on to fetch uv, which a `network: none` container cannot."""
    from platoon.sandbox import Mount, SandboxSpec
    from platoon.testing.episode import run_episode
    from platoon_sandbox.docker import DockerProvider

    cache, home = str(CACHE), str(installed.home)
    assert installed.home.is_relative_to(CACHE)
    prefix = interpreter_prefix(installed.home)  # where the link chain from the venv ends
    sandbox_spec = SandboxSpec(
        image="docker://platoon-test/python:bookworm",
        network="none",
        workdir="/app",
        env={"HOME": home},
        mounts=(Mount(cache, cache), Mount(prefix, prefix)),
    )
    service = SixTimesSevenService(DockerProvider(), sandbox_spec)
    episode = run_episode(
        "t0", service=service, harness="mini-swe-agent", policy=SOLVE, output_dir=tmp_path / "out"
    )
    harness = episode.root.misc["harness"]
    log = Path(harness["logs_path"])
    # what went wrong, if it did
    said = (harness, episode.outcome, log.read_text()[-3000:] if log.is_file() else "no log")
    print(said)  # in full with the failure's captured output (an assertion message is cut short)
    assert harness["placement"] == "task_sandbox" and harness["exit_code"] == 0, said
    assert episode.outcome["status"] == "scored" and episode.reward == 1.0
    assert service.sessions[0].answer == "42\n"  # the file mini wrote in the sandbox's workdir
    assert episode.root.finish_message == "42\n"
    assert "/app" in episode.policy.calls[1].prompt  # `pwd` ran inside the container
    assert_exact_tokens(episode, 2)
