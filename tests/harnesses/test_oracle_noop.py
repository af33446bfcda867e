"""platoon-oracle and platoon-noop; the four function harnesses through the real entry points."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import platoon
from platoon.harness.agent import AgentResult
from platoon.harness.function import FunctionHarness
from platoon_harnesses.noop import noop
from platoon_harnesses.oracle import oracle


def _load_fakes() -> Any:
    name = "platoon_harness_test_fakes"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("fakes.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


fakes = _load_fakes()


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


class SolvableSession:
    def __init__(self, result: Any) -> None:
        self.result = result
        self.runs = 0

    async def run_solution(self) -> Any:
        self.runs += 1
        return self.result


def test_noop_completes_at_once() -> None:
    ctx = fakes.FakeContext()
    assert asyncio.run(noop(ctx)) == AgentResult("completed")
    assert ctx.chats == [] and ctx.tool_calls == []


def test_oracle_runs_the_solution_and_annotates() -> None:
    session = SolvableSession(ExecResult(0, "x" * 2500, "err"))
    ctx = fakes.FakeContext(session=session)
    assert asyncio.run(oracle(ctx)) == AgentResult("completed", final_message="solve.sh exited with 0")
    assert session.runs == 1 and ctx.chats == []
    annotation = ctx.misc["oracle"]
    assert annotation["exit_code"] == 0 and annotation["timed_out"] is False
    assert annotation["output"] == ("x" * 2500 + "err")[-2000:]


def test_oracle_non_zero_exit_still_completes_and_a_timeout_is_timeout() -> None:
    ctx = fakes.FakeContext(session=SolvableSession({"exit_code": 2, "output": "boom", "timed_out": False}))
    assert asyncio.run(oracle(ctx)).final_message == "solve.sh exited with 2"
    ctx = fakes.FakeContext(session=SolvableSession(ExecResult(137, "", "", timed_out=True)))
    assert asyncio.run(oracle(ctx)) == AgentResult("timeout")
    assert ctx.misc["oracle"] == {"exit_code": 137, "timed_out": True, "output": ""}


def test_oracle_without_run_solution_is_an_error() -> None:
    result = asyncio.run(oracle(fakes.FakeContext(session=object())))
    assert result.status == "error"
    assert result.error is not None and "needs a session with run_solution()" in result.error


# ------------------------------------------------------------------------------------------------ entry points


@pytest.mark.parametrize(
    ("name", "code"),
    [("platoon-react", False), ("platoon-codeact", True), ("platoon-oracle", False), ("platoon-noop", False)],
)
def test_harnesses_resolve_through_the_entry_points(name: str, code: bool) -> None:
    record = platoon.get_harness(name)
    assert isinstance(record, FunctionHarness)
    assert record.name == name and record.version == "1" and record.executes_model_code is code
    assert record.source.startswith("platoon_harnesses.")


def test_listing_and_loading_stay_light() -> None:
    script = """
import json, sys
from platoon.cli import main
code = main(["harness", "list"])
import platoon
loaded = [platoon.get_harness(n).name for n in ("platoon-react", "platoon-codeact", "platoon-oracle", "platoon-noop")]
print(json.dumps({"code": code, "loaded": loaded, "ipython": sorted(m for m in sys.modules if m.startswith("IPython"))}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    lines = done.stdout.strip().splitlines()
    report = json.loads(lines[-1])
    listing = "\n".join(lines[:-1])
    assert report["code"] in (0, None)
    for name in ("platoon-react", "platoon-codeact", "platoon-oracle", "platoon-noop"):
        assert name in listing
    assert report["loaded"] == ["platoon-react", "platoon-codeact", "platoon-oracle", "platoon-noop"]
    assert report["ipython"] == []  # neither listing nor loading the harnesses imports IPython


def test_end_to_end_noop_scores_zero_and_oracle_needs_run_solution() -> None:
    from platoon.envs.number_search import SERVICE
    from platoon.testing.episode import run_episode

    noop_run = run_episode("train:0", service=SERVICE, harness="platoon-noop", policy=[])
    assert noop_run.outcome is not None
    assert (noop_run.outcome["status"], noop_run.reward, noop_run.outcome["reason"]) == (
        "scored",
        0.0,
        "no_submit",
    )
    assert noop_run.root.steps == []
    oracle_run = run_episode("train:0", service=SERVICE, harness="platoon-oracle", policy=[])
    assert oracle_run.outcome is not None
    assert (oracle_run.outcome["status"], oracle_run.outcome["failure_kind"]) == ("error", "harness_crash")
    assert "needs a session with run_solution()" in oracle_run.outcome["reason"]
