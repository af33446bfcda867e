"""The `platoon-bash@1` spec and its agent script, run as real processes.

The script runs as a subprocess against platoon's real gateway served over HTTP (a `ScriptedPolicy` answers) and
the gateway's real MCP plane bound to an in-process ORS environment session, launched with the argv the spec
renders. An MCP server of the `mcp` SDK covers what the plane does not do (sessions, SSE replies, pages, DELETE).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp.types as mcp_types  # the SDK server's handlers are typed with it (the SDK reads the hints)
import pytest
from openreward.environments import Environment, TextBlock, ToolOutput, terminal, tool
from pydantic import BaseModel

from platoon.harness.registry import get_harness
from platoon.harness.spec import HarnessSpec, render
from platoon.testing import make_gateway, tool_call

SPEC_DIR = Path(__file__).resolve().parents[2] / (
    "packages/platoon-harnesses/src/platoon_harnesses/specs/platoon-bash"
)
SCRIPT = SPEC_DIR / "platoon_bash.py"


def script_module() -> Any:
    """The agent script imported as a module (for the pieces a scripted model cannot reach)."""
    import importlib.util

    found = importlib.util.spec_from_file_location("platoon_bash_under_test", SCRIPT)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------- the environment


class Guess(BaseModel):
    number: int


class Answer(BaseModel):
    answer: str


class GuessEnv(Environment):
    """`guess` a number, terminal `submit` (reward 1 on 42); every call is kept on the class for the test."""

    guesses: list[int] = []

    def __init__(self, task_spec: dict[str, Any] = {}, secrets: dict[str, str] = {}) -> None:  # noqa: B006
        super().__init__(task_spec, secrets)

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"task_name": "t0"}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Find the number.")]

    @tool
    async def guess(self, params: Guess) -> ToolOutput:
        """Guess the number."""
        GuessEnv.guesses.append(params.number)
        return ToolOutput(blocks=[TextBlock(text="right" if params.number == 42 else "wrong")], reward=0.0)

    @terminal
    @tool
    async def submit(self, params: Answer) -> ToolOutput:
        """Submit the answer; ends the episode."""
        reward = 1.0 if params.answer == "42" else 0.0
        return ToolOutput(blocks=[TextBlock(text=f"submitted {params.answer}")], reward=reward, finished=True)


# ---------------------------------------------------------------------------------------------- harness helpers


@dataclass
class Served:
    gateway: Any
    server: Any
    rollout: Any
    agent: Any
    session: Any

    @property
    def policy(self) -> Any:
        return self.gateway.sampler

    def prompts(self) -> list[str]:
        return [call.prompt for call in self.policy.calls]


@contextlib.asynccontextmanager
async def served(script: Sequence[str], *, mcp: bool = True) -> AsyncIterator[Served]:
    """A gateway over `script` served on loopback with its MCP plane, one rollout, its root agent bound to a
    fresh `GuessEnv` session."""
    from platoon.envs.ors.inprocess import InProcessOrsService
    from platoon.gateway.http import GatewayServer
    from platoon.gateway.mcp import bind_tools, mount_mcp

    GuessEnv.guesses = []
    gateway = make_gateway(list(script))
    server = GatewayServer(gateway)
    if mcp:
        mount_mcp(server)
    await server.astart()
    rollout = gateway.open_rollout("r")
    agent = gateway.open_agent(rollout)
    service = InProcessOrsService(GuessEnv)
    session = await service.open(await service.get_task("train:0"), rollout_id="r")
    bind_tools(agent, session)
    try:
        yield Served(gateway, server, rollout, agent, session)
    finally:
        await session.close()
        await server.astop()


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str
    final: str | None  # the final-message file's text, None when it was not written
    state: Path


def spec() -> HarnessSpec:
    found = get_harness("platoon-bash@1")
    assert isinstance(found, HarnessSpec)
    return found


def launch_argv(state: Path, base_url: str, mcp_url: str | None, max_steps: int, python: str) -> list[str]:
    """What a runner launches: the spec's argv (and `[mcp] args` when tools are served) rendered, its files
    written and its asset copied into the state dir; `python3` is the interpreter under test."""
    harness = spec()
    values: dict[str, Any] = {
        "instruction": "Find the number.",
        "base_url": base_url,
        "model": "policy",
        "workdir": str(state / "work"),
        "state_dir": str(state),
        "max_steps": max_steps,
        "mcp_url": mcp_url,
    }
    for path, content in harness.launch.files.items():
        (state / render(path, values)).write_text(render(content, values), encoding="utf-8")
    for path, source in harness.launch.assets.items():
        shutil.copyfile(source, state / render(path, values))
    argv = [render(part, values) for part in harness.launch.argv]
    if mcp_url is not None:
        assert harness.mcp is not None
        argv += [render(part, values) for part in harness.mcp.args]
    assert argv[0] == "python3"
    return [python, *argv[1:]]


async def run_agent(
    tmp_path: Path,
    base_url: str,
    key: str,
    *,
    mcp_url: str | None = None,
    max_steps: int = 10,
    python: str = sys.executable,
    extra: Sequence[str] = (),
    started: Any = None,
    env_extra: dict[str, str] | None = None,
) -> Ran:
    """Launch the agent as a runner would (its own state dir, `work/` as cwd, a small environment) and wait for
    it; `started(process, state)` is awaited once it runs."""
    state = tmp_path / "state"
    work = state / "work"
    work.mkdir(parents=True, exist_ok=True)
    argv = [*launch_argv(state, base_url, mcp_url, max_steps, python), *extra]
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PLATOON_API_KEY": key,
        "NO_PROXY": "127.0.0.1,localhost,::1",
        "no_proxy": "127.0.0.1,localhost,::1",
        **(env_extra or {}),
    }
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    if started is not None:
        await started(process, state)
    async with asyncio.timeout(300):  # a hang guard, not a speed claim
        out, err = await process.communicate()
    final_file = state / "final_message.txt"
    final = final_file.read_text(encoding="utf-8") if final_file.exists() else None
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode(), final, state)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_gone(pid: int) -> bool:
    """Whether `pid` has exited (gone, or a zombie nobody has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def until_gone(pid: int) -> None:
    """Wait for a SIGKILLed process to be gone (its signal is delivered asynchronously); a hang guard only."""
    async with asyncio.timeout(30):
        while not process_gone(pid):
            await asyncio.sleep(0.01)


def oldest_python() -> tuple[str, str] | None:
    """(path, "3.N") of the oldest python3 of at least 3.8 on this machine, when it is older than 3.12."""
    found: list[tuple[tuple[int, int], str]] = []
    candidates = [shutil.which(f"python3.{minor}") for minor in range(8, 12)]
    candidates += [str(p) for p in Path("/root/.pyenv/versions").glob("3.*/bin/python3")]
    candidates += ["/usr/bin/python3"]
    for candidate in {c for c in candidates if c and Path(c).exists()}:
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys; print(*sys.version_info[:2])"],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout.split()
        except (OSError, subprocess.SubprocessError):
            continue
        version = (int(out[0]), int(out[1]))
        if (3, 8) <= version < (3, 12):
            found.append((version, candidate))
    if not found:
        return None
    (major, minor), path = min(found)
    return path, f"{major}.{minor}"


OLD_PYTHON = oldest_python()
PYTHONS = [
    pytest.param(sys.executable, id="python3"),
    pytest.param(
        OLD_PYTHON[0] if OLD_PYTHON else None,
        id=f"python{OLD_PYTHON[1]}" if OLD_PYTHON else "oldest-python3",
        marks=pytest.mark.skipif(OLD_PYTHON is None, reason="no python3 from 3.8 to 3.11 on this machine"),
    ),
]


# ---------------------------------------------------------------------------------------------- the spec


def test_the_spec_loads_is_registered_and_ships_the_script(tmp_path):
    harness = spec()
    assert harness.ref == "platoon-bash@1" and harness.path == SPEC_DIR / "platoon-bash.toml"
    assert harness.timeout_s == 1800 and harness.max_steps == 50 and harness.install is None
    assert harness.dialect == "openai_chat" and harness.budget_enforce == "harness"
    assert dict(harness.launch.env) == {"PLATOON_API_KEY": "{api_key}"}
    assert dict(harness.launch.files) == {"instruction.md": "{instruction}"}
    assert dict(harness.launch.assets) == {"platoon_bash.py": SCRIPT}
    assert harness.builtins is not None and harness.builtins.tools == ("bash",)
    assert not harness.builtins.can_disable
    assert harness.mcp_enabled and harness.mcp is not None and harness.mcp.args == ("--mcp-url", "{mcp_url}")
    assert harness.final_message is not None and harness.final_message.file == "{state_dir}/final_message.txt"
    assert harness.exit_meaning(3) == "completed" and harness.exit_meaning(0) == "completed"
    assert harness.exit_meaning(2) == "error" and harness.exit_meaning(4) == "error"
    argv = launch_argv(tmp_path, "http://gw", "http://gw/mcp", 50, "python3")
    assert argv == [
        "python3", "-S", f"{tmp_path}/platoon_bash.py", "--base-url", "http://gw/v1", "--model", "policy",
        "--instruction-file", f"{tmp_path}/instruction.md", "--final-message-file", f"{tmp_path}/final_message.txt",
        "--max-turns", "50", "--mcp-url", "http://gw/mcp",
    ]  # fmt: skip
    assert (tmp_path / "instruction.md").read_text() == "Find the number."
    assert (tmp_path / "platoon_bash.py").read_bytes() == SCRIPT.read_bytes()


def test_platoon_harness_show_prints_the_spec():
    result = subprocess.run(
        [sys.executable, "-m", "platoon", "harness", "show", "platoon-bash"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "platoon-bash@1  (spec)" in result.stdout
        and "mcp: enabled; args --mcp-url {mcp_url}" in result.stdout
    )


def test_the_script_uses_only_the_standard_library():
    import ast

    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


# ---------------------------------------------------------------------------------------------- runs


@pytest.mark.parametrize("python", PYTHONS)
def test_bash_then_an_mcp_tool_then_a_final_answer(tmp_path, python):
    script = [
        tool_call(
            "bash", command="echo hello > made.txt && mkdir sub && echo $((6 * 7)) > sub/answer.txt && pwd"
        ),
        tool_call("guess", number=42),
        "The number is 42.",
    ]

    async def main() -> None:
        async with served(script) as s:
            ran = await run_agent(
                tmp_path, s.server.base_url, s.agent.secret, mcp_url=f"{s.server.base_url}/mcp", python=python
            )
            assert ran.code == 0, ran.stderr
            work = ran.state / "work"
            assert (work / "made.txt").read_text() == "hello\n"
            assert (work / "sub/answer.txt").read_text() == "42\n"
            assert GuessEnv.guesses == [42]  # the MCP tool really ran in the environment session
            assert [c["name"] for c in s.agent.misc["tool_calls"]] == ["guess"]
            assert ran.final == "The number is 42."
            assert ran.stdout.splitlines()[-1] == "The number is 42."
            assert (
                ">>> bash: echo hello > made.txt" in ran.stdout and '>>> guess {"number": 42}' in ran.stdout
            )
            # The tools the model was offered, and the results it saw.
            prompts = s.prompts()
            assert len(prompts) == 3
            assert '"name": "bash"' in prompts[0] and '"name": "guess"' in prompts[0]
            assert '"name": "submit"' in prompts[0]
            assert "environment's own tools" in prompts[0]
            assert f"exit code 0\n{work.resolve()}\n" in prompts[1]
            assert "right" in prompts[2].split(tool_call("guess", number=42), 1)[1]
            # Every model call was recorded on the agent with its exact tokens.
            assert len(s.agent.calls) == 3
            for call, policy_call in zip(s.agent.calls, s.policy.calls, strict=True):
                interaction = s.rollout.interactions[call.call_id]
                assert call.kind == "policy"
                assert call.usage["prompt_tokens"] == len(interaction.prompt_tokens) > 0
                assert call.usage["completion_tokens"] == len(interaction.sampled_tokens) > 0
                assert list(interaction.prompt_tokens) == list(policy_call.prompt_tokens)
                assert list(interaction.sampled_tokens) == list(policy_call.tokens)
            assert [c.finish_reason for c in s.agent.calls] == ["tool_calls", "tool_calls", "stop"]
            # The assistant turns go back as they came, so each prompt extends the last call's tokens.
            exact = [s.rollout.interactions[call.call_id] for call in s.agent.calls]
            for before, after in itertools.pairwise(exact):
                sent = list(before.prompt_tokens) + list(before.sampled_tokens)
                assert list(after.prompt_tokens[: len(sent)]) == sent

    asyncio.run(main())


def test_a_finished_tool_result_ends_the_run_with_its_text(tmp_path):
    script = [tool_call("submit", answer="42"), "never asked"]

    async def main() -> None:
        async with served(script) as s:
            ran = await run_agent(
                tmp_path, s.server.base_url, s.agent.secret, mcp_url=f"{s.server.base_url}/mcp"
            )
            assert ran.code == 0, ran.stderr
            assert ran.final == "submitted 42"
            assert len(s.agent.calls) == 1 and s.policy.remaining == 1
            assert s.session.finished

    asyncio.run(main())


def test_the_turn_limit_exits_3_without_a_final_message(tmp_path):
    script = [tool_call("bash", command="echo turn >> turns.txt")] * 3

    async def main() -> None:
        async with served(script) as s:
            ran = await run_agent(tmp_path, s.server.base_url, s.agent.secret, max_steps=2)
            assert ran.code == 3, ran.stderr
            assert ran.final is None
            assert (ran.state / "work/turns.txt").read_text() == "turn\nturn\n"
            assert len(s.agent.calls) == 2 and s.policy.remaining == 1
            assert "the turn limit (2) is reached" in ran.stdout
            # Without --mcp-url the model is offered bash alone, and told nothing of environment tools.
            assert '"name": "guess"' not in s.prompts()[0] and "environment's own tools" not in s.prompts()[0]

    asyncio.run(main())


def test_invalid_arguments_and_unknown_tools_are_answered_without_a_call(tmp_path):
    script = [tool_call("nope", x=1) + "\n" + tool_call("bash", cmd="ls"), "giving up"]

    async def main() -> None:
        async with served(script) as s:
            ran = await run_agent(
                tmp_path, s.server.base_url, s.agent.secret, mcp_url=f"{s.server.base_url}/mcp"
            )
            assert ran.code == 0, ran.stderr
            assert ran.final == "giving up"
            results = s.prompts()[1]
            assert "error: unknown tool 'nope'; the available tools are: bash, guess, submit" in results
            assert 'error: bash needs {"command": "<a shell command>"}' in results
            assert GuessEnv.guesses == [] and "tool_calls" not in s.agent.misc

    asyncio.run(main())


def test_arguments_that_are_not_a_json_object_reach_no_tool():
    # The gateway's parser never emits such a call, so the agent's handling is checked in process.
    module = script_module()
    args = module.parse_args(
        ["--base-url", "u", "--model", "m", "--instruction-file", "i", "--final-message-file", "f"]
    )
    agent = module.Agent(args, "key", mcp=None)  # an MCP call would fail: there is no client
    agent.add_mcp_tools([{"name": "guess", "inputSchema": {"type": "object"}}, {"name": "bash"}])
    assert agent.names() == ["bash", "guess"]
    for raw in ("[42]", '"oops"', "{not json", 7):
        text, done = agent.call("guess", raw)
        assert text.startswith("error: the arguments of guess must be a JSON object; got ") and not done
    assert agent.call("bash", '{"command": 1}') == (
        'error: bash needs {"command": "<a shell command>"}',
        False,
    )
    assert module.parse_arguments("") == {} and module.parse_arguments(None) == {}
    assert module.parse_arguments({"a": 1}) == {"a": 1}


def test_the_launched_command_line_is_read_as_argparse_reads_it(tmp_path):
    module = script_module()
    argv = launch_argv(tmp_path, "http://gw", "http://gw/mcp", 7, "python3")[3:]
    quick = module.quick_args(argv)
    assert quick is not None  # what the runner launches skips argparse
    # the `--option=value` form is argparse's alone
    joined = [f"{option}={value}" for option, value in zip(argv[::2], argv[1::2], strict=True)]
    assert module.quick_args(joined) is None
    assert vars(quick) == vars(module.parse_args(joined))
    assert vars(quick) == {
        "base_url": "http://gw/v1",
        "model": "policy",
        "instruction_file": f"{tmp_path}/instruction.md",
        "final_message_file": f"{tmp_path}/final_message.txt",
        "max_turns": 7,
        "mcp_url": "http://gw/mcp",
        "command_timeout": 120.0,
    }
    for unusual in (argv[:-1], [*argv, "--max-turns", "3"], [*argv[:8], "--max-turns", "x"], ["--help"]):
        assert module.quick_args(unusual) is None


def test_an_http_proxy_in_the_environment_is_used_unless_no_proxy_covers_the_host(tmp_path):
    async def main() -> None:
        async with served(["done"]) as s:
            proxy = {"http_proxy": f"http://127.0.0.1:{closed_port()}"}
            ran = await run_agent(tmp_path, s.server.base_url, s.agent.secret, env_extra=proxy)
            assert ran.code == 0 and ran.final == "done", ran.stderr  # loopback is in NO_PROXY
            bypass_off = {**proxy, "NO_PROXY": "", "no_proxy": ""}
            ran = await run_agent(tmp_path, s.server.base_url, s.agent.secret, env_extra=bypass_off)
            assert ran.code == 2 and "cannot connect" in ran.stderr  # it went to the (closed) proxy
            assert s.policy.remaining == 0 and len(s.agent.calls) == 1

    asyncio.run(main())


def test_requests_share_a_kept_alive_connection_and_one_the_server_closed_is_replaced(monkeypatch):
    import http.server
    import threading

    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    module = script_module()
    connections: list[Any] = []
    closed = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            connections.append(self.client_address)

        def do_POST(self) -> None:
            sent = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/sse":  # an MCP reply as one SSE event, the stream's end in the same write
                event = f"event: message\ndata: {json.dumps({'jsonrpc': '2.0', 'id': sent['id'], 'result': {}})}\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(f"{len(event):x}\r\n{event}\r\n0\r\n\r\n".encode())
                return
            reply = json.dumps({"path": self.path, "sent": sent}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
            self.close_connection = self.path == "/last"  # closed without a `Connection: close`

        def log_message(self, *args: Any) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        def shutdown_request(self, request: Any) -> None:
            super().shutdown_request(request)
            closed.set()

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def post(path: str, value: int) -> Any:
        response = module._post_json(base + path, {"n": value}, {}, 30)
        try:
            return json.loads(response.read())
        finally:
            response.close()

    try:
        assert post("/a", 1) == {"path": "/a", "sent": {"n": 1}}
        assert module.McpClient(base + "/sse", "").request("tools/list", {}) == {}
        assert post("/last", 2) == {"path": "/last", "sent": {"n": 2}}
        assert len(connections) == 1
        assert closed.wait(30)
        assert post("/b", 3) == {"path": "/b", "sent": {"n": 3}}
        assert len(connections) == 2
    finally:
        server.shutdown()
        server.server_close()


def test_a_command_timeout_kills_its_process_group(tmp_path):
    command = "sleep 300 & echo $! > bg.pid; echo started; sleep 300"
    script = [tool_call("bash", command=command), "stopped"]

    async def main() -> None:
        async with served(script, mcp=False) as s:
            ran = await run_agent(
                tmp_path, s.server.base_url, s.agent.secret, extra=["--command-timeout", "1"]
            )
            assert ran.code == 0, ran.stderr
            assert "command timed out after 1s\nstarted\n" in s.prompts()[1]
            assert "<<< command timed out after 1s" in ran.stdout
            await until_gone(int((ran.state / "work/bg.pid").read_text()))

    asyncio.run(main())


def test_a_command_that_leaves_a_background_process_returns_at_once_and_the_process_dies_with_the_agent(
    tmp_path,
):
    command = "sleep 300 > /dev/null 2>&1 & echo $! > bg.pid; echo started"
    script = [
        tool_call("bash", command=command),
        tool_call("bash", command="kill -0 $(cat bg.pid) && echo alive"),
        "ok",
    ]

    async def main() -> None:
        async with served(script, mcp=False) as s:
            ran = await run_agent(
                tmp_path, s.server.base_url, s.agent.secret, extra=["--command-timeout", "60"]
            )
            assert ran.code == 0, ran.stderr
            assert "exit code 0\nstarted\n" in s.prompts()[1]  # not a timeout: the wait is for bash itself
            assert "exit code 0\nalive\n" in s.prompts()[2]  # it kept running between commands
            await until_gone(int((ran.state / "work/bg.pid").read_text()))  # killed when the agent exited

    asyncio.run(main())


def test_sigterm_kills_the_running_command_and_its_group(tmp_path):
    # The commands run in sessions of their own, so a TERM to the agent's process group would miss them.
    script = [tool_call("bash", command="sleep 300 & echo $! > bg.pid; sleep 300"), "never asked"]

    async def terminate(process: Any, state: Path) -> None:
        async with asyncio.timeout(60):  # a hang guard: the command writes the file at once
            while not (state / "work/bg.pid").exists() or not (state / "work/bg.pid").read_text().strip():
                await asyncio.sleep(0.01)
        process.send_signal(signal.SIGTERM)

    async def main() -> None:
        async with served(script, mcp=False) as s:
            ran = await run_agent(tmp_path, s.server.base_url, s.agent.secret, started=terminate)
            assert ran.code == 128 + signal.SIGTERM and ran.final is None
            await until_gone(int((ran.state / "work/bg.pid").read_text()))
            assert len(s.agent.calls) == 1

    asyncio.run(main())


def test_output_is_merged_and_cut_to_its_last_16000_characters(tmp_path):
    command = "echo to-stderr >&2; python3 -c \"print('x' * 20000 + 'END')\"; exit 7"
    script = [tool_call("bash", command=command), "done"]

    async def main() -> None:
        async with served(script, mcp=False) as s:
            ran = await run_agent(tmp_path, s.server.base_url, s.agent.secret)
            assert ran.code == 0, ran.stderr
            result = s.prompts()[1].rsplit("<tool_response>\n", 1)[1]
            assert result.startswith(
                "exit code 7\n" + "x" * (16000 - 4) + "END\n"
            )  # stderr's line is cut off

    asyncio.run(main())
    module = script_module()
    assert module.run_bash("echo out; echo err >&2; exit 3", 10) == "exit code 3\nout\nerr\n"
    assert module.run_bash("kill -9 $$", 10) == "exit code 137\n"  # killed by a signal: 128 + 9, as bash says
    assert module.run_bash("read line; echo read:$?", 10) == "exit code 0\nread:1\n"  # stdin is /dev/null


def test_a_failing_model_endpoint_exits_2(tmp_path):
    async def main() -> None:
        async with served([]) as s:  # the script is empty: the policy fails, the gateway answers 500
            ran = await run_agent(tmp_path, s.server.base_url, s.agent.secret)
            assert ran.code == 2 and ran.final is None
            assert "the model request to" in ran.stderr and "HTTP 5" in ran.stderr
            assert s.agent.calls == []
            ran = await run_agent(tmp_path, s.server.base_url, "not-a-key")
            assert ran.code == 2 and "HTTP 401" in ran.stderr
        ran = await run_agent(tmp_path, f"http://127.0.0.1:{closed_port()}", "key")
        assert ran.code == 2 and "cannot connect" in ran.stderr

    asyncio.run(main())


def test_an_unreachable_mcp_url_exits_4_before_any_model_call(tmp_path):
    async def main() -> None:
        async with served(["never asked"]) as s:
            gone = f"http://127.0.0.1:{closed_port()}/mcp"
            ran = await run_agent(tmp_path, s.server.base_url, s.agent.secret, mcp_url=gone)
            assert ran.code == 4 and ran.final is None
            assert "MCP is unavailable" in ran.stderr and "cannot connect" in ran.stderr
            ran = await run_agent(
                tmp_path, s.server.base_url, s.agent.secret, mcp_url=f"{s.server.base_url}/nope"
            )
            assert ran.code == 4 and "HTTP 404" in ran.stderr
            assert s.agent.calls == [] and s.policy.remaining == 1

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------- the SDK's server


@contextlib.asynccontextmanager
async def sdk_server(seen: list[tuple[str, str | None, str | None]]) -> AsyncIterator[str]:
    """An `mcp` SDK server (stateful streamable HTTP, SSE replies) with tools in two pages, one named `bash`;
    `seen` gets (HTTP method, JSON-RPC method, session id) of every request. Yields its URL."""
    import uvicorn
    from mcp.server.lowlevel import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from sse_starlette.sse import AppStatus

    # sse-starlette (the SDK's SSE replies) keeps one exit event per process, bound to the first loop that waited
    # on it: each test runs its own loop.
    AppStatus.should_exit_event = None

    server: Server[Any, Any] = Server("paged")
    first = [
        mcp_types.Tool(name="bash", description="a clash", inputSchema={"type": "object"}),
        mcp_types.Tool(name="echo", description="echo", inputSchema={"type": "object", "properties": {"text": {"type": "string"}}}),
    ]  # fmt: skip
    second = [mcp_types.Tool(name="later", description="on page two", inputSchema={"type": "object"})]

    @server.list_tools()
    async def list_tools(request: mcp_types.ListToolsRequest) -> mcp_types.ListToolsResult:
        cursor = request.params.cursor if request.params else None
        if cursor is None:
            return mcp_types.ListToolsResult(tools=first, nextCursor="page-2")
        return mcp_types.ListToolsResult(tools=second)

    @server.call_tool()
    async def call_tool(name: str, arguments: dict[str, Any]) -> list[Any]:
        return [
            mcp_types.TextContent(type="text", text=f"{name}: {arguments.get('text')}"),
            mcp_types.ImageContent(type="image", data="aGk=", mimeType="image/png"),
        ]

    manager = StreamableHTTPSessionManager(app=server)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        method = json.loads(body).get("method") if body else None
        seen.append((scope["method"], method, headers.get("mcp-session-id")))
        replay = [{"type": "http.request", "body": body, "more_body": False}]

        async def again() -> Any:
            return replay.pop() if replay else await receive()

        await manager.handle_request(scope, again, send)

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    uv = uvicorn.Server(config)
    async with manager.run():
        task = asyncio.create_task(uv.serve())
        while not uv.started:
            await asyncio.sleep(0.01)
        port = uv.servers[0].sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            uv.should_exit = True
            await task


@pytest.mark.parametrize("python", PYTHONS)
def test_sessions_sse_pages_and_delete_against_the_sdk_server(tmp_path, python):
    script = [tool_call("echo", text="hi"), "done"]

    async def main() -> None:
        seen: list[tuple[str, str | None, str | None]] = []
        async with served(script, mcp=False) as s, sdk_server(seen) as url:
            ran = await run_agent(tmp_path, s.server.base_url, s.agent.secret, mcp_url=url, python=python)
            assert ran.code == 0, ran.stderr
            assert "warning: the MCP tool 'bash' is skipped" in ran.stderr
            prompt = s.prompts()[0]
            assert prompt.count('"name": "bash"') == 1 and '"name": "later"' in prompt  # the second page too
            assert "echo: hi\n[image]" in s.prompts()[1]
        session = seen[1][2]
        assert seen[0][:2] == ("POST", "initialize") and seen[0][2] is None and session
        assert seen[1:] == [
            ("POST", "notifications/initialized", session),
            ("POST", "tools/list", session),
            ("POST", "tools/list", session),
            ("POST", "tools/call", session),
            ("DELETE", None, session),
        ]

    asyncio.run(main())
