"""The policy's key never reaches a harness's environment (docs/gateway.md): a function harness that
reads `os.environ`, or runs `env` in a shell, finds neither the hosted key's variable nor TINKER_API_KEY, in
process and in subprocess slots (forked from the fork server or started by exec), while its model calls still
authenticate with the key the evaluation read once.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from eval_support import HOSTED_KEY, HOSTED_KEY_ENV, number_search_eval

from platoon.cli import main

#: an OpenAI-style variable, as a user would name it
KEY_ENV = "OPENAI_API_KEY"

KEY_HARNESSES = '''
"""A harness that writes what its process's environment holds (and what a shell it starts sees), then chats."""

import json
import os
import subprocess
import uuid
from pathlib import Path

from platoon.harness.agent import AgentResult
from platoon.harness.function import harness


@harness("test-keys-inspect")
async def inspect(ctx):
    shell = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
    facts = {"environ": dict(os.environ), "shell": shell, "pid": os.getpid()}
    (Path(ctx.options["dir"]) / f"facts-{uuid.uuid4().hex}.json").write_text(json.dumps(facts))
    await ctx.chat([{"role": "user", "content": "Guess a number between 1 and 10."}], max_tokens=4)
    return AgentResult("completed")
'''


@pytest.fixture
def inspect_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The inspecting harness importable here and in slot processes; returns the directory its facts go to."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "key_harnesses.py").write_text(textwrap.dedent(KEY_HARNESSES))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(modules), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.syspath_prepend(str(modules))
    facts = tmp_path / "facts"
    facts.mkdir()
    return facts


@pytest.fixture
def scratch(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = workdir / "scratch"
    path.mkdir()
    monkeypatch.setenv("PLATOON_NODE_SCRATCH", str(path))
    return path


def inspecting_eval(facts: Path, *, slots: bool, **inference: Any) -> dict[str, Any]:
    data = number_search_eval(**inference)
    workflow = data["inference"]["workflow"]
    workflow.update(num_rollouts_per_task=1, num_concurrent_workers=2)
    if slots:
        workflow.update(use_subprocesses=True, subprocess_max_workers=2)
    data["environments"][0].update(harness="key_harnesses:inspect", harness_options={"dir": str(facts)})
    return data


def run_eval(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    status = main(["eval", str(config)])
    captured = capsys.readouterr()
    summary = json.loads(captured.out) if status == 0 else {}
    return status, summary, captured.err


def seen_environments(facts: Path) -> list[dict[str, Any]]:
    found = [json.loads(path.read_text()) for path in sorted(facts.glob("facts-*.json"))]
    assert len(found) == 2, "each of the two rollouts ran the harness"
    return found


def assert_no_key(found: list[dict[str, Any]], variable: str, key: str) -> None:
    for facts in found:
        assert variable not in facts["environ"]
        assert key not in json.dumps(facts["environ"])
        assert f"{variable}=" not in facts["shell"] and key not in facts["shell"]


def no_fork_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork server that cannot start: slots start by exec instead."""
    from platoon.rollouts.workers.forkserver import ForkServer, ForkServerUnavailable

    async def unavailable(*_args: Any, **_kwargs: Any) -> ForkServer:
        raise ForkServerUnavailable("the fork server did not start (this test stops it)")

    monkeypatch.setattr(ForkServer, "start", unavailable)


@pytest.mark.parametrize("where", ["in_process", "forked_slots", "exec_slots"])
def test_a_harness_never_finds_the_hosted_key_in_its_environment_yet_its_calls_authenticate(
    where, workdir, write_config, capsys, scratch, hosted_server, inspect_harness, monkeypatch
):
    monkeypatch.delenv(HOSTED_KEY_ENV)
    monkeypatch.setenv(KEY_ENV, HOSTED_KEY)
    if where == "exec_slots":
        no_fork_server(monkeypatch)
    hosted = {"base_url": hosted_server.base_url, "api_key_env": KEY_ENV, "max_retries": 0}
    data = inspecting_eval(
        inspect_harness,
        slots=where != "in_process",
        model_name="my-hosted-model",
        renderer_name=None,
        hosted=hosted,
    )
    status, summary, err = run_eval(write_config(data), capsys)
    assert status == 0, err
    assert summary["total_rollouts"] == 2 and summary["errored_rollouts"] == 0
    found = seen_environments(inspect_harness)
    assert ({facts["pid"] for facts in found} == {os.getpid()}) == (where == "in_process")
    assert_no_key(found, KEY_ENV, HOSTED_KEY)
    # Every harness call reached the server with the key the evaluation read once (else it answers 401).
    assert len(hosted_server.calls) == 2
    assert all(c["headers"]["authorization"] == f"Bearer {HOSTED_KEY}" for c in hosted_server.calls)
    # A caller running the evaluation in its own process gets its environment back.
    assert os.environ[KEY_ENV] == HOSTED_KEY


@pytest.mark.parametrize("where", ["in_process", "forked_slots"])
def test_a_harness_never_finds_the_tinker_key_in_its_environment_yet_samples(
    where, workdir, write_config, capsys, scratch, tinker_server, inspect_harness, monkeypatch
):
    monkeypatch.setenv("TINKER_BASE_URL", tinker_server.base_url)
    tinker_key = tinker_server.api_key  # the one key the local server issued
    monkeypatch.setenv("TINKER_API_KEY", tinker_key)
    data = inspecting_eval(inspect_harness, slots=where != "in_process")
    status, summary, err = run_eval(write_config(data), capsys)
    assert status == 0, err
    assert summary["total_rollouts"] == 2 and summary["errored_rollouts"] == 0
    assert_no_key(seen_environments(inspect_harness), "TINKER_API_KEY", tinker_key)
    assert os.environ["TINKER_API_KEY"] == tinker_key
