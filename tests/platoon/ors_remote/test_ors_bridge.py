"""The ORS bridge in process: the `log_dir` event log and state file, `bridge_tools`, and the
trajectory viewer reading the log as written. The remote half is in `test_remote_service.py` beside it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from platoon import plugins
from platoon.envs.ors.bridge import rollout_slug
from platoon.envs.ors.inprocess import InProcessOrsService
from platoon.envs.ors.remote import RemoteOrsService
from platoon.testing import ScriptedPolicy, run_episode
from platoon.testing.number_search import react_binary_search as binary_search
from platoon.viz.model import EventModel, bridge_node

NUMBER_SEARCH = "python://platoon.envs.number_search.env:NumberSearchEnvironment"


def events(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / "bridge_events.jsonl").read_text().splitlines()]


def state(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "bridge_state.json").read_text())


def check_episode_log(directory: Path, turns: int) -> dict[str, Any]:
    """The log of a won number-search episode of `turns` guesses; returns its first record."""
    records = events(directory)
    assert [r["type"] for r in records] == [
        "session_started",
        "task_requested",
        *["tool_call", "tool_result"] * turns,
        "session_closing",
    ]
    assert {r["session"] for r in records} == {records[0]["session"]}
    assert all(isinstance(r["time"], float) for r in records)
    calls = [r for r in records if r["type"] == "tool_call"]
    assert [c["turn"] for c in calls] == list(range(1, turns + 1))
    assert all(c["payload"]["name"] == "guess" and "number" in c["payload"]["arguments"] for c in calls)
    last = [r for r in records if r["type"] == "tool_result"][-1]["payload"]
    assert (last["finished"], last["reward"]) == (True, 1.0)
    assert "correctly" in last["text"]
    saved = state(directory)
    assert (saved["turn"], saved["finished"], saved["last_reward"], saved["closed"]) == (
        turns,
        True,
        1.0,
        True,
    )
    assert saved["session"] == records[0]["session"]
    assert not list(directory.glob(".*.tmp"))  # written through a temporary file, renamed into place

    # The trajectory viewer groups the log per turn as written: the setup, then one turn per guess.
    model = EventModel()
    model.apply_all(records, str(directory))
    (collection,) = model.collections.values()
    node = bridge_node(collection, "k")
    assert [child.label.split(":")[0] for child in node.children] == [f"turn {n}" for n in range(turns + 1)]
    assert node.children[1].label.startswith("turn 1: guess(")
    return records[0]


def test_a_number_search_episode_writes_the_event_log_and_the_state(tmp_path: Path):
    run = run_episode(
        "train:0",
        service=NUMBER_SEARCH,
        service_kwargs={"log_dir": str(tmp_path / "bridge"), "bridge_tools": True},
        harness="platoon-react",
        policy=ScriptedPolicy(binary_search),
        output_dir=tmp_path / "out",
    )
    assert run.reward == 1.0
    (directory,) = (tmp_path / "bridge").iterdir()
    started = check_episode_log(directory, len(run.policy.calls))
    assert started["payload"]["task_id"] == "train:0"
    assert directory.name == rollout_slug(started["payload"]["rollout_id"])


def test_bridge_tools_are_read_only_answer_from_state_and_refusals_are_logged(tmp_path: Path):
    service = InProcessOrsService(NUMBER_SEARCH, log_dir=str(tmp_path), bridge_tools=True, max_tool_calls=1)

    async def go() -> tuple[Any, ...]:
        session = await service.open(await service.get_task("train:0"), rollout_id="train:0/r 1")
        tools = {t.name: t for t in await session.tools()}
        task = json.loads((await session.call_tool("get_task", {})).as_text())
        await session.call_tool("guess", {"number": -5})
        capped = await session.call_tool("guess", {"number": 1})
        again = await session.call_tool("guess", {"number": 1})
        status = json.loads((await session.call_tool("get_status", {})).as_text())
        fresh = await session.fork("fresh")
        await fresh.call_tool("guess", {"number": -5})
        await fresh.close()
        await session.close()
        return tools, task, capped, again, status, session._lease.session_id

    tools, task, capped, again, status, sid = asyncio.run(go())
    assert [(n, t.read_only, t.terminal) for n, t in tools.items()] == [
        ("guess", False, False),
        ("get_task", True, False),
        ("get_status", True, False),
    ]
    assert task["prompt"].startswith("Guess") or "between" in task["prompt"]
    assert [t["function"]["name"] for t in task["tools"]] == ["guess", "get_task", "get_status"]
    assert (
        task["tools"][0]["type"] == "function" and "properties" in task["tools"][0]["function"]["parameters"]
    )
    assert task["completion_policy"]["mode"] == "claim_done"  # number search declares no terminal tool
    assert capped.metadata["error"] == "max_tool_calls_exceeded"
    assert again.metadata["error"] == "environment_already_finished"
    assert status == {
        "session": sid,
        "turn": 1,
        "finished": True,
        "last_reward": None,
        "max_tool_calls": 1,
        "tool_calls_left": 0,
        "cap_hit": True,
        "closed": False,
    }

    (directory,) = tmp_path.iterdir()
    assert directory.name == "train_0_r_1"
    records = events(directory)
    mine = [r["type"] for r in records if r["session"] == sid]
    assert mine == [
        "session_started",
        "task_requested",  # at open
        "task_requested",  # get_task; get_status is not logged
        "tool_call",
        "tool_result",
        "max_tool_calls_exceeded",
        "tool_not_run",
        "session_closing",
    ]
    # The fresh fork is a new session in the same log, naming its parent.
    forked = [r for r in records if r["session"] != sid]
    assert forked[0]["type"] == "session_started"
    assert forked[0]["payload"]["fork"] == "fresh" and forked[0]["payload"]["parent"] == sid
    assert [r["type"] for r in forked][-1] == "session_closing"
    saved = state(directory)
    assert saved["session"] == sid and saved["cap_hit"] and saved["turn"] == 1
    assert set(saved["sessions"]) == {sid, forked[0]["session"]}


def test_without_log_dir_nothing_is_written_and_no_bridge_tools_are_listed(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    service = InProcessOrsService(NUMBER_SEARCH)

    async def go() -> list[str]:
        session = await service.open(await service.get_task("train:0"), rollout_id="r")
        try:
            names = [t.name for t in await session.tools()]
            result = await session.call_tool("get_status", {})
            assert result.is_error  # not a tool of this environment
            return names
        finally:
            await session.close()

    assert asyncio.run(go()) == ["guess"]
    assert list(tmp_path.iterdir()) == []


def test_the_options_are_accepted_checked_and_a_path_option(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = InProcessOrsService(NUMBER_SEARCH, log_dir="logs", bridge_tools=True)
    assert local.log_dir == tmp_path / "logs" and local.bridge_tools
    remote = RemoteOrsService("ors+http://a:1/Env", log_dir="logs", bridge_tools=True)
    assert remote.log_dir == tmp_path / "logs" and remote.bridge_tools
    for bad, says in [
        ({"bridge_tools": "yes"}, "bridge_tools must be true or false"),
        ({"log_dir": 3}, "log_dir must be a directory path"),
    ]:
        with pytest.raises(ValueError, match=says):
            InProcessOrsService(NUMBER_SEARCH, **bad)
        with pytest.raises(ValueError, match=says):
            RemoteOrsService("ors+http://a:1/Env", **bad)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is not a directory"):
        InProcessOrsService(NUMBER_SEARCH, log_dir="file")
    for uri in (NUMBER_SEARCH, "ors+http://a:1/Env"):
        assert [o.name for o in plugins.get_service_path_options(uri)] == ["log_dir"]
