"""Environment types of `platoon.envs.service` and `EpisodeContext`."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

import pytest

from platoon.envs.service import (
    EnvironmentService,
    EnvNotPrepared,
    EnvSession,
    EnvSetupError,
    ForkMode,
    Outcome,
    SessionNeeds,
    ToolResult,
    ToolSpec,
    open_accepts_needs,
)
from platoon.programs.context import EpisodeContext


def test_scored_outcome_reward_and_trainable() -> None:
    outcome = Outcome("scored", {"reward": 1, "aux": 0.5})
    assert outcome.reward == 1.0 and isinstance(outcome.reward, float)
    assert outcome.trainable
    assert outcome.primary == "reward" and outcome.reason is None and outcome.metadata == {}
    custom = Outcome("scored", {"pass": 0.25}, primary="pass", reason="tests")
    assert custom.reward == 0.25


def test_scored_outcome_needs_its_primary_key() -> None:
    with pytest.raises(ValueError, match="primary reward 'reward'"):
        Outcome("scored")
    with pytest.raises(ValueError, match="primary reward 'pass'"):
        Outcome("scored", {"reward": 1.0}, primary="pass")
    with pytest.raises(ValueError, match="finite number"):
        Outcome("scored", {"reward": math.nan})
    with pytest.raises(ValueError, match="finite number"):
        Outcome("scored", {"reward": True})


def test_outcome_statuses() -> None:
    for status in ("invalid", "error", "timeout", "cancelled"):
        outcome = Outcome(status)
        assert outcome.reward is None and not outcome.trainable
    with pytest.raises(ValueError, match="scored, invalid, error, timeout, cancelled"):
        Outcome("failed")  # type: ignore[arg-type]


def test_outcome_defaults_are_not_shared() -> None:
    a, b = Outcome("error"), Outcome("error")
    a.metadata["x"] = 1
    a.rewards["y"] = 1.0
    assert b.metadata == {} and b.rewards == {}


def test_infra_outcome() -> None:
    outcome = Outcome.infra("env_setup", reason="boom", metadata={"k": "v"})
    assert (outcome.status, outcome.failure_kind, outcome.reason, outcome.metadata) == (
        "error",
        "env_setup",
        "boom",
        {"k": "v"},
    )
    assert not outcome.trainable and outcome.reward is None
    table = Outcome.infra("no_grader", status="invalid", reason="self_grade")
    assert table.status == "invalid" and table.metadata == {}
    with pytest.raises(ValueError, match="scored"):
        Outcome.infra("x", status="scored")


def test_tool_spec_defaults_and_openai_form() -> None:
    spec = ToolSpec(
        "guess", "Guess a number.", {"type": "object", "properties": {"number": {"type": "integer"}}}
    )
    assert (spec.terminal, spec.read_only, spec.meta) == (False, False, None)
    assert spec.as_openai_tool() == {
        "type": "function",
        "function": {
            "name": "guess",
            "description": "Guess a number.",
            "parameters": {"type": "object", "properties": {"number": {"type": "integer"}}},
        },
    }
    assert ToolSpec("noargs", "", None).as_openai_tool()["function"]["parameters"] == {
        "type": "object",
        "properties": {},
    }


def test_tool_result_text_and_as_text() -> None:
    result = ToolResult.text("hi")
    assert result.content == [{"type": "text", "text": "hi"}]
    assert (result.is_error, result.finished, result.reward, result.metadata) == (False, False, None, {})
    assert ToolResult.text("bad", is_error=True).is_error
    mixed = ToolResult(
        [
            {"type": "text", "text": "line one"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "resource"},
            {"type": "text", "text": "line two"},
        ]
    )
    assert mixed.as_text() == "line one\n[image/png]\n[resource]\nline two"


def test_tool_result_as_text_reads_block_objects() -> None:
    @dataclass
    class Text:
        text: str
        type: str = "text"

    @dataclass
    class Image:
        data: str
        mimeType: str
        type: str = "image"

    assert ToolResult([Text("a"), Image("x", "image/jpeg")]).as_text() == "a\n[image/jpeg]"


def test_fork_mode_values() -> None:
    assert [m.value for m in ForkMode] == ["shared", "copy", "fresh"]
    assert ForkMode("copy") is ForkMode.COPY


@dataclass
class _Mount:
    source: str
    target: str
    read_only: bool = True


@dataclass
class _Spec:
    upstreams: dict[str, str] = field(default_factory=dict)
    mounts: list[_Mount] = field(default_factory=list)
    memory_mb: int | None = None


@dataclass(frozen=True)
class _FrozenSpec:
    upstreams: dict[str, str] = field(default_factory=dict)
    mounts: tuple[_Mount, ...] = ()
    memory_mb: int | None = None


def test_session_needs_apply_to_a_mutable_spec() -> None:
    spec = _Spec(
        upstreams={"api": "http://h:1", "gateway": "http://old"},
        mounts=[_Mount("/host/tc", "/opt/toolchain")],
        memory_mb=1024,
    )
    needs = SessionNeeds(
        upstreams={"gateway": "unix:///tmp/pgw/gw.sock"},
        mounts=(_Mount("/other", "/opt/toolchain"), _Mount("/data", "/data")),
        extra_memory_mb=2048,
    )
    assert needs.apply(spec) is spec
    assert spec.upstreams == {"api": "http://h:1", "gateway": "unix:///tmp/pgw/gw.sock"}
    assert [(m.source, m.target) for m in spec.mounts] == [("/host/tc", "/opt/toolchain"), ("/data", "/data")]
    assert spec.memory_mb == 3072


def test_session_needs_grow_memory_only_when_the_spec_has_a_limit() -> None:
    spec = _Spec()
    SessionNeeds(extra_memory_mb=2048).apply(spec)
    assert spec.memory_mb is None


def test_session_needs_apply_to_a_frozen_spec() -> None:
    spec = _FrozenSpec(memory_mb=512)
    updated = SessionNeeds({"gateway": "unix:///s"}, (_Mount("/a", "/a"),), 100).apply(spec)
    assert updated is not spec and spec.upstreams == {} and spec.mounts == ()
    assert updated.upstreams == {"gateway": "unix:///s"}
    assert isinstance(updated.mounts, tuple) and updated.mounts[0].target == "/a"
    assert updated.memory_mb == 612
    assert SessionNeeds().apply(spec) is spec


def test_env_setup_errors() -> None:
    error = EnvSetupError("env_connect", "cannot reach host")
    assert (error.failure_kind, str(error)) == ("env_connect", "cannot reach host")
    missing = EnvNotPrepared("run platoon prepare first")
    assert isinstance(missing, EnvSetupError)
    assert missing.failure_kind == "env_config" and str(missing) == "run platoon prepare first"


class _Session:
    task: Any = None
    instruction = "do it"
    sandbox = None

    async def tools(self) -> list[ToolSpec]:
        return []

    async def call_tool(self, name: str, arguments: Any) -> ToolResult:
        return ToolResult.text("")

    async def grade(self) -> Outcome:
        return Outcome("invalid")

    async def fork(self, mode: Any = "shared", *, task: Any = None) -> _Session:
        return self

    async def close(self) -> None:
        pass


class _Service:
    name = "fake"

    async def list_tasks(self, split: str) -> list[str]:
        return []

    async def get_task(self, task_id: str) -> Any:
        raise KeyError(task_id)

    async def open(self, task: Any, *, rollout_id: str, needs: SessionNeeds | None = None) -> _Session:
        return _Session()


def test_session_and_service_protocols() -> None:
    assert isinstance(_Session(), EnvSession)
    assert isinstance(_Service(), EnvironmentService)
    assert not isinstance(object(), EnvSession)


def test_open_accepts_needs() -> None:
    async def plain(task: Any, *, rollout_id: str) -> None: ...

    async def kwargs(task: Any, **kw: Any) -> None: ...

    assert open_accepts_needs(_Service().open)
    assert open_accepts_needs(kwargs)
    assert not open_accepts_needs(plain)


def test_episode_context_protocol_names_every_member() -> None:
    for name in (
        "task",
        "session",
        "config",
        "route",
        "root",
        "judges",
        "run",
        "grade",
        "judge_endpoint",
        "add_finalizer",
        "snapshot",
    ):
        assert getattr(EpisodeContext, name).__doc__, name
    assert {"behavior_judge", "tool_transform"} <= set(EpisodeContext.__annotations__)


def test_outcome_is_a_plain_dataclass() -> None:
    assert dataclasses.asdict(Outcome("scored", {"reward": 0.0})) == {
        "status": "scored",
        "rewards": {"reward": 0.0},
        "primary": "reward",
        "reason": None,
        "failure_kind": None,
        "metadata": {},
    }


def test_api_modules_import_nothing_heavy() -> None:
    code = textwrap.dedent(
        """
        import sys
        import platoon.envs, platoon.envs.service, platoon.task, platoon.trajectory, platoon.rewards
        import platoon.registry, platoon.gym, platoon.harness.agent
        heavy = {"pydantic", "openreward", "torch", "transformers", "tinker", "yaml", "typer", "docker", "mcp"}
        print(sorted(m for m in sys.modules if m.split(".")[0] in heavy or m.startswith("platoon.config")))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
