"""Training against platoon's local server with the real SDK: with in-flight sampling (SDK 0.38) a rollout that
spans an update keeps its session and records both versions exactly; a straggler the cutoff drops has its sample
cancelled on the server, which frees the engine (SDK 0.38; 0.16.1 has no cancel and abandons it)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.harness.agent import AgentResult
from platoon.harness.function import harness

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"
INFLIGHT = ["train.sampling_client_kind=inflight", "train.max_staleness=1"]


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    return profile


SPANS = "test-inflight-spans-an-update"
STRAGGLES = "test-inflight-straggles"
#: the instructions (tasks) seen so far, in the order their first rollout started
_tasks: list[str] = []
#: rollouts started, per instruction
_seen: dict[str, int] = {}
#: rollouts that have done what they do before the update
_ready = [0]
_started = [0]


def _run_dir(log_path: Path) -> Path:
    return log_path / "bandit" / "run"


def _step_logged(log_path: Path, step: int) -> bool:
    metrics = _run_dir(log_path) / "metrics.jsonl"
    if not metrics.exists():
        return False
    return any(
        json.loads(line).get("train/step") == step for line in metrics.read_text().splitlines() if line
    )


@harness(SPANS)
async def _spans_an_update(ctx: Any) -> AgentResult:
    """Two tasks of two rollouts, all four open at once (each holds the in-flight client of version 0). The first
    task's rollouts sample and answer, which lets step 1 train and publish version 1. The second task's first rollout
    samples before that and again after it; its second samples only after it. In each task one rollout answers right,
    so each group has an update."""
    if ctx.instruction not in _tasks:
        _tasks.append(ctx.instruction)
    spans = ctx.instruction != _tasks[0]
    _seen[ctx.instruction] = rank = _seen.get(ctx.instruction, 0) + 1
    messages = [{"role": "user", "content": ctx.instruction}]
    reply = None
    if not (spans and rank == 2):
        reply = await ctx.chat(messages, max_tokens=1)
    _ready[0] += 1
    for _ in range(
        1200
    ):  # a gate, not a timer: no rollout ends before all four opened and sampled what they do first
        if _ready[0] >= 4:
            break
        await asyncio.sleep(0.05)
    if spans:
        for _ in range(2400):  # step 1 logs its metrics once version 1 is live
            if _step_logged(ctx_log_path[0], 1):
                break
            await asyncio.sleep(0.05)
        reply = await ctx.chat(messages, max_tokens=1)
    await ctx.call_tool("answer", {"letter": "C" if rank == 1 else "A"})
    return AgentResult(final_message=reply.text)


#: where the running test's run writes (the harness waits on its metrics)
ctx_log_path: list[Path] = [Path()]


@pytest.fixture
def local_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """platoon's local server in this process (the test reads its records), as the run's Tinker service."""
    from platoon.local_server import LocalTinkerServer

    with LocalTinkerServer(state_dir=tmp_path / "server") as server:
        monkeypatch.setenv("TINKER_API_KEY", server.api_key)
        yield server


def _events(log_path: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted((_run_dir(log_path) / "rollouts" / "train").rglob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


@pytest.mark.slow
def test_a_rollout_spanning_an_update_records_both_versions_and_keeps_its_session(site, local_server, capsys):
    import inspect

    import tinker

    from platoon.local_server.inflight import InflightSampler

    if "kind" not in inspect.signature(tinker.TrainingClient.save_weights_and_get_sampling_client).parameters:
        pytest.skip(
            "this Tinker SDK has no in-flight sampling (test_inflight_sampling.py checks that it is refused)"
        )
    harness(SPANS)(_spans_an_update)  # again: another test may have cleared the registry
    _tasks.clear()
    _seen.clear()
    _ready[0] = 0
    log_path = ctx_log_path[0] = site.parent / "logs"
    argv = [
        "train",
        str(BANDIT),
        f"log_path={log_path}",
        f"tinker_base_url={local_server.base_url}",
        "train.batch_size=1",
        "train.max_training_steps=2",
        "train.workflow_config.group_size=2",
        "train.max_concurrent_rollouts=4",
        f"environments=[{{env: platoon-bandit, harness: {SPANS}}}]",
        *INFLIGHT,
    ]
    assert main(argv) == 0, capsys.readouterr().err
    recorded: dict[str, tuple[int, ...]] = {}
    for event in _events(log_path):
        if "policy_versions" in event:
            recorded[event["collection_id"]] = (event["policy_version"], *event["policy_versions"])
    # (policy_version, *policy_versions) of each rollout: the first task's two sampled version 0 only; the second
    # task's first sampled version 0 before step 1's update and version 1 after it, and its second, which opened
    # before the update but sampled only after it, version 1 alone: exactly, as the local server says (a range
    # would give it 0 and 1)
    assert sorted(recorded.values()) == [(0, 0), (0, 0), (0, 0, 1), (1, 1)]
    # one in-flight session (the client the rollouts started with) answered on both weights versions
    served = [
        sorted(set(sampler.backend.served))
        for sampler in local_server.state.samplers.values()
        if isinstance(sampler.backend, InflightSampler)
    ]
    assert [1, 2] in served


#: whether the quick rollout of the straggler test has its answer
_quick_answered = [False]


@harness(STRAGGLES)
async def _straggles(ctx: Any) -> AgentResult:
    """The first rollout answers at once; the second, once the first has its answer (the server samples one request
    at a time), asks for a sample that would run for minutes, which the straggler cutoff drops."""
    _started[0] += 1
    messages = [{"role": "user", "content": ctx.instruction}]
    if _started[0] == 1:
        reply = await ctx.chat(messages, max_tokens=1)
        _quick_answered[0] = True
    else:
        for _ in range(2400):  # a gate, not a timer
            if _quick_answered[0]:
                break
            await asyncio.sleep(0.05)
        # no stop token: the sample runs its 20000 tokens unless it is stopped
        reply = await ctx.chat(messages, max_tokens=20000, stop=[])
    await ctx.call_tool("answer", {"letter": "C"})
    return AgentResult(final_message=reply.text)


def _sdk_cancels_samples() -> bool:
    """Whether the Tinker SDK sends `/cancel_future` for an abandoned sample (0.38 does; 0.16.1 has no cancel)."""
    from tinker.lib.internal_client_holder import InternalClientHolder

    return hasattr(InternalClientHolder, "enqueue_cancel")


def _hold_long_samples(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold every sample past its first token in the server's decode loop until the returned event is set, or until
    the sample is cancelled: the straggler's sample can then neither finish before the test looks at it nor outrun
    the cutoff, however fast the machine (the quick rollout asks for one token and is never held)."""
    from platoon.local_server import inflight, sampling

    released = threading.Event()
    tokens: dict[str | None, int] = {}
    check = inflight.raise_if_cancelled

    def held() -> None:
        check()
        request = inflight.running_request()
        tokens[request] = tokens.get(request, 0) + 1
        while tokens[request] > 1 and not released.wait(0.01):
            check()  # a cancel still stops it

    monkeypatch.setattr(sampling, "raise_if_cancelled", held)
    return released


@pytest.mark.slow
def test_a_dropped_stragglers_sample_is_cancelled_on_the_server(site, local_server, capsys, monkeypatch):
    """Run with each SDK of the lock: 0.38 cancels the straggler's sample and the server stops it; 0.16.1 has no
    cancel, so the request is abandoned and runs on."""
    released = _hold_long_samples(monkeypatch)
    try:
        _check_straggler(site, local_server, capsys)
    finally:
        for request in local_server.state.futures.busy_samples():  # the abandoned sample stops with the test
            local_server.state.futures.cancel(request)
        released.set()


def _check_straggler(site: Path, local_server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    harness(STRAGGLES)(_straggles)
    _started[0] = 0
    _quick_answered[0] = False
    log_path = site.parent / "logs"
    argv = [
        "train",
        str(BANDIT),
        f"log_path={log_path}",
        f"tinker_base_url={local_server.base_url}",
        "train.batch_size=1",
        "train.max_training_steps=1",
        "train.workflow_config.group_size=2",
        "train.workflow_config.straggler_timeout_seconds=2",
        "train.workflow_config.straggler_quorum=1",
        f"environments=[{{env: platoon-bandit, harness: {STRAGGLES}}}]",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    futures = local_server.state.futures
    metrics = [json.loads(line) for line in (_run_dir(log_path) / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["train/straggler_cancelled"] == 1.0
    if not _sdk_cancels_samples():
        assert futures.cancelled == []  # abandoned: the server was never told, and still generates it (held)
        assert len(futures.busy_samples()) == 1
        return
    # the server's own record: the straggler's sample was cancelled, and nothing runs on its engine any more
    for _ in range(600):
        if futures.cancelled:
            break
        time.sleep(0.05)  # the SDK sends the cancel from its own thread
    assert len(futures.cancelled) == 1
    record = futures.get(futures.cancelled[0])
    assert record is not None and record.state == "cancelled"
    assert futures.busy_samples() == []
