"""The TOML spec runner end to end: a small command-line agent (tests/harnesses/spec_agent, standard library only)
launched by a spec, reaching a scripted policy through the real gateway over HTTP and the environment's tools over
MCP; on the host, and in `network: none` sandboxes (docker, and a process sandbox) through the gateway route.

What is checked: the final message reaches the trajectory, every model call is recorded with its exact tokens, an
agent that hangs is killed at its deadline with every process gone, a crash is untrainable (never a 0), the
gateway-enforced budget stops the agent with the synthetic stop, an option the spec does not take is refused with
one line, and a local agent sees only allowlisted host variables.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from platoon.envs.service import Outcome, SessionNeeds, ToolResult, ToolSpec
from platoon.episode.spec_runs import spec_runner
from platoon.gateway.core import BUDGET_STOP_MESSAGE
from platoon.harness.spec import load_spec
from platoon.task import Task
from platoon.testing import tool_call
from platoon.testing.episode import run_episode
from platoon.testing.number_search import react_binary_search as binary_search

AGENT_DIR = Path(__file__).with_name("spec_agent")
PYTHON_IMAGE = "docker://platoon-test/python:bookworm"
SUBMIT = "\n" + tool_call("submit", {"answer": "42"})


# ---------------------------------------------------------------------------------------------- the environment


class AnswerSession:
    """One tool, `submit` (it ends the episode); graded 1 for the answer 42. With a sandbox, the sandbox is the
    task's and goes with the session."""

    def __init__(self, task: Task, sandbox: Any = None) -> None:
        self.task = task
        self.instruction = None
        self.sandbox = sandbox
        self.answers: list[str] = []
        self.marked_at_close: list[str] = []

    async def tools(self) -> list[ToolSpec]:
        schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
        return [ToolSpec("submit", "Submit the final answer.", schema)]

    async def call_tool(self, name: str, arguments: Any) -> ToolResult:
        self.answers.append(str(arguments.get("answer")))
        result = ToolResult.text("correct" if self.answers[-1] == "42" else "wrong")
        result.finished = True
        return result

    async def grade(self) -> Outcome:
        return Outcome("scored", rewards={"reward": 1.0 if self.answers == ["42"] else 0.0})

    async def fork(self, mode: Any = "shared", *, task: Task | None = None) -> AnswerSession:
        return self

    async def close(self) -> None:
        if self.sandbox is not None:
            # What still carries a harness marker when the session closes (the runner's kill ran before).
            found = await self.sandbox.exec(
                ["sh", "-c", "grep -lzs PLATOON_HARNESS_AGENT= /proc/[0-9]*/environ || true"], cwd="/"
            )
            self.marked_at_close = found.stdout.split()
            await self.sandbox.stop()


class AnswerService:
    """A service of one task; with a provider its sessions get a `network: none` sandbox built from the session
    needs the rollout passes (the gateway's Unix socket as the upstream `gateway`)."""

    name = "answer"

    def __init__(self, provider: Any = None, image: str = "local", memory_mb: int | None = None) -> None:
        self.provider = provider
        self.image = image
        self.memory_mb = memory_mb
        self.needs: list[SessionNeeds | None] = []
        self.sessions: list[AnswerSession] = []

    async def list_tasks(self, split: str) -> list[str]:
        return ["t0"]

    async def get_task(self, task_id: str) -> Task:
        return Task(goal="What is six times seven? Submit the answer.", id=task_id)

    async def open(self, task: Task, *, rollout_id: str, needs: SessionNeeds | None = None) -> AnswerSession:
        self.needs.append(needs)
        sandbox = None
        if self.provider is not None:
            from platoon.sandbox import SandboxSpec

            spec = SandboxSpec(image=self.image, network="none", workdir="/app", memory_mb=self.memory_mb)
            if needs is not None:
                spec = needs.apply(spec)
            sandbox = await self.provider.start(spec)
            await sandbox.exec(
                ["mkdir", "-p", "/app"], cwd="/"
            )  # the process provider maps it, never makes it
        session = AnswerSession(task, sandbox)
        self.sessions.append(session)
        return session


# ---------------------------------------------------------------------------------------------- helpers


def spec_file(tmp_path: Path, extra: str = "") -> Path:
    """The test agent's spec (copied with its script), `extra` TOML appended."""
    folder = tmp_path / "agent"
    folder.mkdir(exist_ok=True)
    shutil.copy(AGENT_DIR / "agent.py", folder / "agent.py")
    (folder / "agent.toml").write_text((AGENT_DIR / "agent.toml").read_text() + extra)
    return folder / "agent.toml"


def run(tmp_path: Path, policy: Any, *, mode: str = "chat", service: Any = None, **kwargs: Any) -> Any:
    spec = kwargs.pop("spec", None) or spec_file(tmp_path)
    options = kwargs.pop("harness_options", {"mode": mode})
    return run_episode(
        "t0",
        service=service or AnswerService(),
        harness=load_spec(spec),
        policy=policy,
        harness_options=options,
        output_dir=tmp_path / "out",
        **kwargs,
    )


def log_text(episode: Any) -> str:
    return Path(episode.root.misc["harness"]["logs_path"]).read_text()


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie waiting to be reaped."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.fixture
def launched_markers(monkeypatch):
    """The markers this test's launches get: a process check looks for exactly these, never for another test
    session's agents that happen to run on the same machine at the same time."""
    from platoon_harnesses.spec_runner import runner

    markers: list[str] = []
    make = runner.new_marker

    def recording(slug: str) -> str:
        markers.append(make(slug))
        return markers[-1]

    monkeypatch.setattr(runner, "new_marker", recording)
    return markers


def live_marked(markers: list[str]) -> list[int]:
    """The live processes carrying one of `markers` (exactly)."""
    assert markers, "the agent was never launched"
    return [pid for marker in markers for pid in marked_processes(marker + "\0") if alive(pid)]


def marked_processes(prefix: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            data = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if f"PLATOON_HARNESS_AGENT={prefix}".encode() in data:
            found.append(int(name))
    return found


@pytest.fixture
def quick_grace():
    runner = spec_runner()
    before = runner.grace_s
    runner.grace_s = 1.0
    yield runner
    runner.grace_s = before


# ---------------------------------------------------------------------------------------------- on the host


def test_a_local_agent_submits_through_mcp_and_its_final_message_and_exact_tokens_are_recorded(tmp_path):
    service = AnswerService()
    episode = run(tmp_path, [SUBMIT], service=service)
    assert episode.outcome["status"] == "scored" and episode.reward == 1.0
    assert service.sessions[0].answers == ["42"]  # the tool call came over the gateway's MCP plane
    root = episode.root
    assert root.finish_message == "correct"  # the tool result that finished the episode, from the final file
    harness = root.misc["harness"]
    assert harness["spec"] == "acme-test-agent@1" and harness["kind"] == "spec"
    assert harness["placement"] == "local" and harness["exit_code"] == 0 and harness["timed_out"] is False
    assert harness["logs_path"] == str(tmp_path / "out" / "harness" / Path(harness["logs_path"]).name)
    assert "TOOL submit" in log_text(episode) and "FINAL: correct" in log_text(episode)
    # every model call is on the root with the exact tokens the policy saw and sampled
    calls = episode.policy.calls
    call_ids = [step.misc["action_misc"]["completion_id"] for step in root.steps]
    assert len(calls) == len(call_ids) == 1
    interaction = episode.interactions[call_ids[0]]
    assert list(interaction.prompt_tokens) == list(calls[0].prompt_tokens)
    assert list(interaction.sampled_tokens) == list(calls[0].tokens)
    assert "What is six times seven?" in calls[0].prompt
    # its state dir is gone (named as its log; other tests' agents may be running beside it)
    state_root = Path(os.environ.get("TMPDIR", "/tmp")) / f"platoon-harness-{os.getuid()}"
    slug = Path(harness["logs_path"]).stem
    assert slug.startswith("acme-test-agent-") and not (state_root / slug).exists()


def test_a_local_agent_sees_only_allowlisted_host_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("PLATOON_TEST_HOST_SECRET", "do-not-leak")
    monkeypatch.setenv("NO_PROXY", "example.org")
    episode = run(tmp_path, [], mode="env")
    seen = json.loads(episode.root.finish_message)
    assert "PLATOON_TEST_HOST_SECRET" not in seen
    assert "PATH" in seen and "HOME" in seen
    assert seen["AGENT_MODEL"] == episode.gateway.model_name  # {model}: the served model
    assert seen["NO_PROXY"] == "example.org,127.0.0.1,localhost,::1"
    assert seen["PLATOON_HARNESS_AGENT"].startswith("acme-test-agent-")


@pytest.mark.guarantee(
    "A command-line agent hangs (and a child of it leaves its group, ignoring SIGTERM)",
    "TOML-spec agent on the host",
    "killed at its deadline with every process it started; an untrainable `timeout`, never a 0",
)
def test_an_agent_that_hangs_is_killed_at_its_deadline_with_every_process_gone(
    tmp_path, quick_grace, launched_markers
):
    episode = run(tmp_path, [], mode="hang", rollout={"timeout": 2, "verbose": False})
    outcome = episode.outcome
    assert outcome["status"] == "timeout" and outcome["reason"] == "agent_timeout"  # untrainable, not a 0
    harness = episode.root.misc["harness"]
    assert harness["timed_out"] is True and harness["exit_code"] is None
    text = log_text(episode)
    pids = [int(n) for n in re.findall(r"(?:CHILD|SELF) (\d+)", text)]
    assert len(pids) == 2  # the agent and a child that left its process group and ignores TERM
    assert not [pid for pid in pids if alive(pid)]
    assert not live_marked(launched_markers)


@pytest.mark.guarantee(
    "A command-line agent crashes",
    "TOML-spec agent on the host",
    "an untrainable `harness_crash` naming its exit code and last output, never a 0",
)
def test_an_agent_that_crashes_is_untrainable_not_zero(tmp_path):
    episode = run(tmp_path, [], mode="crash")
    outcome = episode.outcome
    assert outcome["status"] == "error" and outcome["failure_kind"] == "harness_crash"
    assert episode.reward is None
    assert episode.root.misc["harness"]["exit_code"] == 7
    assert "exited with code 7" in outcome["reason"] and "about to crash" in outcome["reason"]


def test_the_gateway_enforced_budget_stops_the_agent_with_the_synthetic_stop(tmp_path):
    spec = spec_file(tmp_path, '\n[budget]\nenforce = "gateway"\n')
    episode = run(tmp_path, ["one", "two", "three"], mode="budget", spec=spec, max_steps=2)
    root = episode.root
    assert root.finish_message == BUDGET_STOP_MESSAGE.format(n=2)
    assert len(episode.policy.calls) == 2 and len(root.steps) == 2  # the stop is neither sampled nor recorded
    assert root.misc["budget"] == {"enforce": "gateway", "max_steps": 2, "stops": 1}
    assert episode.outcome["status"] == "scored" and episode.outcome["reason"] == "budget"


def test_an_option_the_spec_does_not_declare_is_refused_with_one_line(tmp_path):
    spec = spec_file(tmp_path)
    episode = run(tmp_path, [], harness_options={"mood": "calm"}, spec=spec)
    outcome = episode.outcome
    assert outcome["status"] == "error" and outcome["failure_kind"] == "harness_config"
    assert outcome["reason"] == (
        f"harness_options.mood: not an option of harness acme-test-agent@1 ({spec}) (did you mean mode?); "
        "its options: mode"
    )
    assert episode.policy.calls == []


def test_a_failing_install_is_a_setup_failure(tmp_path):
    spec = spec_file(tmp_path, "")
    text = spec.read_text().replace(
        "[launch]", '[install]\ncommands = ["echo no luck; exit 3"]\n\n[launch]', 1
    )
    spec.write_text(text)
    episode = run(tmp_path, [], spec=spec)
    outcome = episode.outcome
    assert outcome["failure_kind"] == "harness_setup"
    assert "exited with 3: no luck" in outcome["reason"]


def test_task_sandbox_placement_without_a_sandbox_is_a_config_failure(tmp_path):
    episode = run(tmp_path, [], placement="task_sandbox")
    assert episode.outcome["failure_kind"] == "harness_config"
    assert "has no task sandbox" in episode.outcome["reason"]


# ---------------------------------------------------------------------------------------------- in a sandbox


def sandbox_provider(name: str) -> tuple[Any, str]:
    if name == "docker":
        from platoon_sandbox.docker import DockerProvider

        return DockerProvider(), PYTHON_IMAGE
    from platoon_sandbox import netns
    from platoon_sandbox.process import ProcessProvider

    problem = netns.unavailable()
    if problem is not None:
        pytest.fail(f"the process provider has no network namespace here: {problem}", pytrace=False)
    return ProcessProvider(), "local"


@pytest.mark.parametrize("provider_name", ["docker", "process"])
def test_an_agent_in_a_network_none_sandbox_reaches_the_model_and_tools_through_the_route(
    tmp_path, provider_name
):
    provider, image = sandbox_provider(provider_name)
    service = AnswerService(provider, image)
    episode = run(tmp_path, [SUBMIT], service=service)
    needs = service.needs[0]
    assert needs is not None and needs.upstreams["gateway"].startswith("unix://")
    socket_dir = Path(needs.upstreams["gateway"].removeprefix("unix://")).parent
    assert not socket_dir.exists()  # the rollout's socket dir goes with it
    assert episode.outcome["status"] == "scored" and episode.reward == 1.0
    assert service.sessions[0].answers == ["42"]
    root = episode.root
    assert root.finish_message == "correct"
    harness = root.misc["harness"]
    assert harness["placement"] == "task_sandbox" and harness["exit_code"] == 0
    assert "http://127.0.0.1:" in log_text(episode) or "TOOL submit" in log_text(episode)
    call_ids = [step.misc["action_misc"]["completion_id"] for step in root.steps]
    assert [list(episode.interactions[c].sampled_tokens) for c in call_ids] == [
        c.tokens for c in episode.policy.calls
    ]


@pytest.mark.parametrize("provider_name", ["docker", "process"])
def test_an_agent_that_hangs_in_a_sandbox_is_killed_by_its_marker(
    tmp_path, provider_name, quick_grace, launched_markers
):
    provider, image = sandbox_provider(provider_name)
    service = AnswerService(provider, image)
    episode = run(tmp_path, [], mode="hang", service=service, rollout={"timeout": 3, "verbose": False})
    assert episode.outcome["status"] == "timeout"
    assert episode.root.misc["harness"]["timed_out"] is True
    assert service.sessions[0].marked_at_close == []  # killed by marker before the session closed
    assert not live_marked(launched_markers)


@pytest.mark.guarantee(
    "A command-line agent is killed by its sandbox's memory limit",
    "TOML-spec agent in Docker",
    "an untrainable `harness_crash` (exit 137), never a 0",
)
def test_an_agent_killed_by_the_sandbox_memory_limit_is_untrainable_not_zero(tmp_path):
    provider, image = sandbox_provider("docker")
    service = AnswerService(provider, image, memory_mb=128)
    episode = run(tmp_path, [], mode="oom", service=service)
    outcome = episode.outcome
    assert episode.root.misc["harness"]["exit_code"] == 137  # SIGKILLed by the kernel's OOM killer
    assert outcome["status"] == "error" and outcome["failure_kind"] == "harness_crash"
    assert episode.reward is None  # never a score of 0
    assert "survived" not in (episode.root.finish_message or "")


# ---------------------------------------------------------------------------------------------- platoon-bash


def test_platoon_bash_solves_number_search_on_the_host_with_exact_tokens(tmp_path):
    from platoon.envs.number_search import SERVICE

    episode = run_episode(
        "train:2", service=SERVICE, harness="platoon-bash", policy=binary_search, output_dir=tmp_path / "out"
    )
    assert episode.outcome["status"] == "scored" and episode.reward == 1.0
    root = episode.root
    assert root.finish_message.endswith("correctly!")
    assert root.misc["harness"]["spec"] == "platoon-bash@1" and root.misc["harness"]["placement"] == "local"
    call_ids = [step.misc["action_misc"]["completion_id"] for step in root.steps]
    assert len(call_ids) == len(episode.policy.calls) >= 3
    for policy_call, call_id in zip(episode.policy.calls, call_ids, strict=True):
        interaction = episode.interactions[call_id]
        assert list(interaction.prompt_tokens) == list(policy_call.prompt_tokens)
        assert list(interaction.sampled_tokens) == list(policy_call.tokens)


def test_platoon_bash_runs_a_command_and_an_mcp_tool_in_a_network_none_docker_sandbox(tmp_path):
    provider, image = sandbox_provider("docker")
    service = AnswerService(provider, image)
    script = ["\n" + tool_call("bash", {"command": "echo $((6 * 7)) | tee answer.txt"}), SUBMIT]
    episode = run_episode(
        "t0", service=service, harness="platoon-bash", policy=script, output_dir=tmp_path / "out"
    )
    assert episode.outcome["status"] == "scored" and episode.reward == 1.0
    assert service.sessions[0].answers == ["42"]
    assert episode.root.finish_message == "correct"
    assert episode.root.misc["harness"]["placement"] == "task_sandbox"
    second_prompt = episode.policy.calls[1].prompt
    assert "exit code 0\n42" in second_prompt  # the bash tool ran inside the sandbox


def test_platoon_rollout_runs_platoon_bash_on_number_search(tmp_path, monkeypatch, capsys):
    import yaml

    from platoon.cli import main
    from platoon.testing import serve_policy

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("PLATOON_SITE", "TINKER_BASE_URL", "TINKER_API_KEY", "TINKER_SAMPLE_TIMEOUT_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    config = {
        "inference": {
            "model_name": "platoon/toy",
            "renderer_name": "qwen3_instruct",
            "workflow": {"rollout_config": {"verbose": False, "max_steps": 12}},
        },
        "environments": [{"env": "platoon-number-search", "harness": "platoon-bash"}],
    }
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(config))
    with serve_policy(binary_search):
        status = main(["rollout", "eval.yaml", "--task", "val:0", "--json-output"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    [root] = summary["agents"]
    assert root["reward"] == 1.0 and root["steps"] >= 1
    [run_dir] = (tmp_path / "runs" / "adhoc").iterdir()
    collection = json.loads((run_dir / "trajectory_collection.json").read_text())
    trajectory = next(iter(collection["trajectories"].values()))
    harness = trajectory["misc"]["harness"]
    assert harness["spec"] == "platoon-bash@1" and harness["exit_code"] == 0
    assert Path(harness["logs_path"]).is_file() and Path(harness["logs_path"]).is_relative_to(run_dir)


# ---------------------------------------------------------------------------------------------- more runner rules


def test_repeated_cancellation_does_not_cut_the_kill_short(tmp_path, quick_grace):
    import asyncio

    from platoon.testing.episode import arun_episode

    logs = tmp_path / "out" / "harness"

    async def main() -> list[int]:
        task = asyncio.ensure_future(
            arun_episode(
                "t0",
                service=AnswerService(),
                harness=load_spec(spec_file(tmp_path)),
                harness_options={"mode": "hang"},
                output_dir=tmp_path / "out",
            )
        )
        pids: list[int] = []
        for _ in range(600):  # until the agent and its child are up
            await asyncio.sleep(0.05)
            text = "".join(p.read_text() for p in logs.glob("*.log")) if logs.is_dir() else ""
            pids = [int(n) for n in re.findall(r"(?:CHILD|SELF) (\d+)", text)]
            if len(pids) == 2:
                break
        assert len(pids) == 2
        for _ in range(5):  # cancelled again and again while the kill waits out its grace
            task.cancel()
            await asyncio.sleep(0.1)
        with pytest.raises(asyncio.CancelledError):
            await task
        return pids

    pids = asyncio.run(main())
    assert not [pid for pid in pids if alive(pid)]


def test_a_stdout_regex_gives_the_last_match_and_exit_codes_remap(tmp_path):
    spec = spec_file(tmp_path)
    text = spec.read_text().replace(
        '[final_message]\nfile = "final.txt"', '[final_message]\nstdout_regex = "TOOL (\\\\w+)"'
    )
    spec.write_text(text.replace('3 = "completed"', '3 = "completed"\n7 = "completed"'))
    episode = run(tmp_path, [SUBMIT, SUBMIT], spec=spec)
    assert episode.root.finish_message == "submit"  # group 1 of the last match in the output
    crashed = run(tmp_path, [], mode="crash", spec=spec)
    assert crashed.outcome["status"] == "scored"  # exit 7 is mapped to completed: graded
    assert crashed.root.misc["harness"]["exit_code"] == 7


def test_install_runs_once_per_install_spec_and_host(tmp_path):
    count = tmp_path / "installs"
    spec = spec_file(tmp_path)
    spec.write_text(
        spec.read_text().replace("[launch]", f'[install]\ncommands = ["echo once >> {count}"]\n\n[launch]', 1)
    )
    for _ in range(2):
        assert run(tmp_path, [SUBMIT], spec=spec).reward == 1.0
    assert count.read_text() == "once\n"


def test_a_sandboxed_agent_is_policy_only(tmp_path):
    provider, image = sandbox_provider("process")
    episode = run(tmp_path, [], mode="aux", service=AnswerService(provider, image))
    assert episode.root.finish_message == "aux refused 403"
    local = run(tmp_path, ["an aux answer"], mode="aux")
    assert local.root.finish_message == "aux allowed"  # on the host the key is not next to model-written code


@pytest.mark.parametrize("provider_name", ["local", "docker"])
def test_a_toolchain_is_staged_and_bound_at_its_build_path(tmp_path, provider_name):
    toolchain = tmp_path / "toolchains" / "acme-tc"
    (toolchain / "bin").mkdir(parents=True)
    (toolchain / "bin" / "hello").write_text("hello from the toolchain\n")
    spec = spec_file(tmp_path)
    spec.write_text(
        spec.read_text()
        .replace(
            "[launch]",
            f'[install]\ncommands = ["cat {{toolchain}}/bin/hello"]\ntoolchain = "{toolchain}"\n\n[launch]',
            1,
        )
        .replace('AGENT_MODEL = "{model}"', 'AGENT_MODEL = "{model}", AGENT_TOOLCHAIN = "{toolchain}"')
    )
    service = AnswerService(*sandbox_provider("docker")) if provider_name == "docker" else AnswerService()
    episode = run(tmp_path, [], mode="env", spec=spec, service=service)
    assert episode.outcome["status"] == "scored", episode.outcome
    assert json.loads(episode.root.finish_message)["AGENT_TOOLCHAIN"] == str(toolchain)
    if provider_name == "docker":
        [mount] = service.needs[0].mounts
        assert mount.target == str(toolchain) and mount.read_only and mount.source != str(toolchain)


def test_an_agent_cancelled_while_it_starts_is_ended_before_the_cancellation_goes_on():
    import asyncio
    import subprocess
    import threading

    from platoon_harnesses.spec_runner import host_process
    from platoon_harnesses.spec_runner.kill import end_local

    ended: list[tuple[int, int | None]] = []

    async def end(process: Any) -> None:
        await end_local(process, "-", 1.0)
        ended.append((process.pid, process.returncode))

    async def main() -> None:
        # every starter thread busy: the start waits its turn, so the cancellation lands while it starts
        release = threading.Event()
        pool = host_process._starter_pool()
        for _ in range(host_process.STARTER_THREADS):
            pool.submit(release.wait)
        task = asyncio.ensure_future(
            host_process.start(
                ["sleep", "60"], on_cancel=end, stdin=subprocess.DEVNULL, start_new_session=True
            )
        )
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # the cancellation waits for the start
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    [(pid, code)] = ended
    assert code == -15 and not alive(pid)  # SIGTERMed by the cleanup, not left running


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "thread"])
def test_a_host_process_is_awaited_to_its_exit_code_through_a_timed_out_wait(monkeypatch, pidfd):
    import asyncio
    import subprocess

    from platoon_harnesses.spec_runner import host_process

    if not pidfd:  # a kernel or seccomp policy without pidfds: a thread waits instead

        def refused(pid: int, flags: int = 0) -> int:
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(host_process.os, "pidfd_open", refused)

    async def main() -> tuple[int, int, int | None]:
        async def end(process: Any) -> None:
            raise AssertionError("not cancelled")

        quick = await host_process.start(["sh", "-c", "exit 7"], on_cancel=end, stdin=subprocess.DEVNULL)
        slow = await host_process.start(
            ["sh", "-c", "sleep 0.5; exit 3"], on_cancel=end, stdin=subprocess.DEVNULL
        )
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(slow.wait(), 0.01)
        return await quick.wait(), await slow.wait(), slow.returncode

    assert asyncio.run(main()) == (7, 3, 3)
