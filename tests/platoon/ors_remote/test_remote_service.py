"""`ors+http://` services against real openreward servers (`Server([...]).run` on 127.0.0.1, one process each):
the same rewards as in process, pools sharded by rollout, a server killed mid-episode, graders that raise or hang,
and no session left open on a server afterwards.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
from typing import Any

import pytest

from platoon.envs.ors.remote import RemoteOrsService, parse_uri, resolve_pool, server_order
from platoon.envs.ors.sessions import registry
from platoon.envs.resolve import resolve_service
from platoon.testing import ScriptedPolicy, run_episode, tool_call
from platoon.testing.number_search import react_binary_search as binary_search

NUMBER_SEARCH = "python://platoon.envs.number_search.env:NumberSearchEnvironment"


def remote(*servers: Any, env: str = "NumberSearchEnvironment", variant: str | None = None) -> str:
    hosts = ",".join(s.host for s in servers)
    return f"ors+http://{hosts}/{env}" + (f"?variant={variant}" if variant else "")


def guess_env(*servers: Any) -> str:
    return remote(*servers, env="GuessEnv", variant="guessenv")


def always_zero(prompt: str) -> str:
    """A policy that never finds the number (unless it is 0)."""
    return "\n" + tool_call("guess", {"number": 0})


# -- the URI and the pool -------------------------------------------------------------------------------------------


def test_the_uri_names_hosts_environment_and_query():
    uri = parse_uri("ors+https://a:1,b:2/Env?variant=v&label=L")
    assert (uri.scheme, uri.hosts, uri.environment, uri.query) == (
        "https",
        ("a:1", "b:2"),
        "Env",
        {"variant": "v", "label": "L"},
    )
    assert parse_uri("ors+http:///Env").hosts == ()
    for bad, says in [
        ("ors+http://a:1/Env?flavour=x", "unknown query key 'flavour'"),
        ("ors+http://a/Env", "'a' is not HOST:PORT"),
        ("ors+http://a:1/Env?variant=x&variant=y", "given twice"),
        ("ors+http://a:1/E/F", "one environment name"),
    ]:
        with pytest.raises(ValueError, match=re.escape(says)):
            parse_uri(bad)


def test_the_pool_comes_from_the_uri_then_the_variables_in_order():
    environ = {
        "OPENREWARD_SESSION_URLS_MY_ENV_2": "h1:1, https://h2:2",
        "OPENREWARD_SESSION_URLS": "legacy:1",
        "OPENREWARD_SESSION_URL": "single:1",
    }
    assert resolve_pool(("http://u:1",), label="x", environ=environ).urls == ("http://u:1",)
    label = resolve_pool((), label="my-env.2", environ=environ)
    assert (label.urls, label.source) == (
        ("http://h1:1", "https://h2:2"),
        "$OPENREWARD_SESSION_URLS_MY_ENV_2",
    )
    assert resolve_pool((), label="other", environ=environ).urls == ("http://legacy:1",)
    assert resolve_pool((), label="other", legacy_global_pool=False, environ=environ).urls == (
        "http://single:1",
    )
    assert resolve_pool((), label="x", session_urls_env_var="MINE", environ={"MINE": "m:9"}).urls == (
        "http://m:9",
    )
    assert resolve_pool((), label="x", environ={}).urls == ("http://localhost:8080",)


def test_a_rollout_keeps_its_server_and_rollouts_spread_over_the_pool():
    urls = ["http://a:1", "http://b:2"]
    firsts = [server_order(urls, f"rollout-{i}")[0] for i in range(64)]
    assert firsts == [server_order(urls, f"rollout-{i}")[0] for i in range(64)]
    assert set(firsts) == set(urls)


def test_options_are_checked_where_the_config_writes_them():
    with pytest.raises(ValueError, match="not an option of ors"):
        RemoteOrsService("ors+http://a:1/Env", flavour=1)
    with pytest.raises(ValueError, match="differ"):
        RemoteOrsService("ors+http://a:1/Env?variant=v", variant="w")
    with pytest.raises(ValueError, match="in the URI or in urls, not both"):
        RemoteOrsService("ors+http://a:1/Env", urls=["b:2"])
    with pytest.raises(ValueError, match="name the environment"):
        RemoteOrsService("ors+http://a:1/")
    assert RemoteOrsService("ors+http://a:1/", environment="Env").environment == "Env"


def test_session_urls_of_the_label_are_read_at_open(monkeypatch, servers):
    service = resolve_service("ors+http:///GuessEnv?variant=guessenv&label=guess-pool")
    monkeypatch.setenv("OPENREWARD_SESSION_URLS_GUESS_POOL", servers[1].host)

    async def go() -> str:
        session = await service.open(await service.get_task("train:0"), rollout_id="r")
        try:
            return session.server
        finally:
            await session.close()

    assert asyncio.run(go()) == servers[1].url
    assert servers[1].open_sessions() == 0


# -- the same rewards as in process ---------------------------------------------------------------------------------


def test_number_search_remote_gives_the_in_process_rewards(servers, tmp_path):
    def rewards(service: str) -> list[tuple[Any, int]]:
        found = []
        for i, policy in enumerate([binary_search, binary_search, always_zero, binary_search]):
            run = run_episode(
                f"train:{i}",
                service=service,
                harness="platoon-react",
                policy=ScriptedPolicy(policy),
                max_steps=4 if policy is always_zero else None,
                output_dir=tmp_path / f"{i}-{len(service)}",
            )
            found.append((run.reward, len(run.policy.calls)))
        return found

    in_process = rewards(NUMBER_SEARCH)
    assert [r for r, _ in in_process] == [1.0, 1.0, 0.0, 1.0]
    assert rewards(remote(servers[0])) == in_process
    assert servers[0].open_sessions() == 0


GUESS_SCRIPTS: list[tuple[str, list[tuple[str, dict[str, Any]]]]] = [
    ("train:0", [("guess", {"number": 3}), ("guess", {"number": 7}), ("submit", {"answer": "7"})]),
    ("train:1", [("guess", {"number": 2}), ("submit", {"answer": "5"})]),
    ("train:2", [("guess", {"number": "nine"}), ("nope", {}), ("guess", {"number": 9})]),
    ("train:0", [("submit", {"answer": "7"}), ("guess", {"number": 1})]),
]


async def play(service: Any, task_id: str, calls: list[tuple[str, dict[str, Any]]]) -> tuple[Any, ...]:
    session = await service.open(await service.get_task(task_id), rollout_id=f"play-{task_id}")
    try:
        tools = [(t.name, t.terminal) for t in await session.tools()]
        results = []
        for name, arguments in calls:
            result = await session.call_tool(name, arguments)
            results.append(
                (result.as_text() if not result.is_error else result.metadata.get("error"), result.reward)
            )
        outcome = await session.grade()
        return session.instruction, tools, results, outcome.status, outcome.reward, outcome.reason
    finally:
        await session.close()


def test_the_guessing_environment_remote_plays_as_in_process(servers):
    in_process = resolve_service("python://ors_server:GuessEnv")
    served = resolve_service(guess_env(servers[0]))

    async def both() -> None:
        for task_id, calls in GUESS_SCRIPTS:
            assert await play(served, task_id, calls) == await play(in_process, task_id, calls)

    asyncio.run(both())
    first = asyncio.run(play(served, *GUESS_SCRIPTS[0]))
    assert first[3:5] == ("scored", 1.0)
    assert servers[0].open_sessions() == 0


# -- pools, failures ------------------------------------------------------------------------------------------------


def test_a_pool_of_two_servers_shares_the_rollouts(servers):
    a, b = servers
    service = resolve_service(guess_env(a, b))

    async def go() -> list[str]:
        task = await service.get_task("train:0")
        sessions = [await service.open(task, rollout_id=f"rollout-{i}") for i in range(12)]
        assert a.open_sessions() + b.open_sessions() == 12
        where = [s.server for s in sessions]
        for s in sessions:
            await s.close()
        return where

    where = asyncio.run(go())
    assert where == [server_order([a.url, b.url], f"rollout-{i}")[0] for i in range(12)]
    assert set(where) == {a.url, b.url}
    assert (a.open_sessions(), b.open_sessions()) == (0, 0)
    assert registry.open_sessions == []


def test_a_server_killed_mid_episode_is_untrainable_and_the_run_goes_on(server_factory):
    doomed, spare = server_factory(), server_factory()
    service = resolve_service(guess_env(doomed, spare))
    on_doomed = [
        f"r{i}" for i in range(32) if server_order([doomed.url, spare.url], f"r{i}")[0] == doomed.url
    ]

    async def go() -> None:
        task = await service.get_task("train:0")
        session = await service.open(task, rollout_id=on_doomed[0])
        assert session.server == doomed.url
        await session.tools()
        assert (await session.call_tool("guess", {"number": 7})).as_text() == "right"
        doomed.kill()
        submitted = await session.call_tool("submit", {"answer": "7"})
        assert submitted.is_error and submitted.metadata["error"] == "env_error"
        outcome = await session.grade()
        assert (outcome.status, outcome.failure_kind, outcome.reward) == ("error", "env_error", None)
        assert not outcome.trainable
        assert f"the server at {doomed.url} stopped answering" in (outcome.reason or "")
        # a later call is refused without running: the session is over
        refused = await session.call_tool("guess", {"number": 1})
        assert refused.metadata["error"] == "session_dead"
        await session.close()
        # the next rollout that hashes to the dead server opens on the one left, and scores
        moved = await service.open(task, rollout_id=on_doomed[1])
        assert moved.server == spare.url
        await moved.tools()
        await moved.call_tool("submit", {"answer": "7"})
        assert (await moved.grade()).reward == 1.0
        await moved.close()

    asyncio.run(go())
    assert spare.open_sessions() == 0
    assert registry.open_sessions == []


@pytest.mark.parametrize(
    ("task_id", "reason"),
    [
        ("train:3", "terminal tool 'submit' raised on the server: grader database unreachable"),
        ("train:4", "terminal tool 'submit' did not answer within 0.5 s"),
    ],
)
def test_a_grader_that_raises_or_hangs_is_an_infra_outcome(servers, task_id, reason):
    service = resolve_service(guess_env(servers[0]), {"call_timeout_s": 0.5})
    status, reward, why = asyncio.run(play(service, task_id, [("submit", {"answer": "4"})]))[3:]
    assert (status, reward, why) == ("error", None, reason)
    assert servers[0].open_sessions() == 0


def test_a_session_dying_ends_the_call_it_waits_on(servers):
    """The SDK marks a session dead (its ping learnt the server dropped it): a call waiting on the server ends at
    once as an infrastructure failure, not at its timeout."""
    from openreward.api._session.ping import ErrorResponse

    service = resolve_service(guess_env(servers[0]), {"call_timeout_s": 600})

    async def go() -> tuple[Any, Any]:
        session = await service.open(await service.get_task("train:4"), rollout_id="dies")  # submit hangs
        try:
            await session.tools()
            call = asyncio.ensure_future(session.call_tool("submit", {"answer": "4"}))
            while not session.env._watched:  # the request is on its way
                await asyncio.sleep(0.01)
            session.env._mark_dead(ErrorResponse(type="error", message="session gone on the server"))
            return await call, await session.grade()
        finally:
            await session.close()

    result, outcome = asyncio.run(go())
    assert result.metadata["error"] == "env_error"
    assert (outcome.status, outcome.reward) == ("error", None)
    assert "session gone on the server" in (outcome.reason or "")
    assert servers[0].open_sessions() == 0


def test_a_cold_start_looks_each_thing_up_once_for_all_its_rollouts(servers):
    """32 rollouts starting together on a fresh service ask for tasks of one window at once: one server check, one
    listing of the splits, one count and one window of task specs serve them all."""
    import aiohttp

    service = resolve_service(remote(servers[0]))
    paths: list[str] = []
    trace = aiohttp.TraceConfig()

    async def started(_: Any, __: Any, params: Any) -> None:
        paths.append(params.url.path)

    trace.on_request_start.append(started)
    trace.freeze()

    async def go() -> list[Any]:
        sdk_client = (await service._environment(servers[0].url)).client
        sdk_client._trace_configs.append(trace)
        try:
            return await asyncio.gather(*(service.get_task(f"train:{i}") for i in range(32)))
        finally:
            sdk_client._trace_configs.remove(trace)

    tasks = asyncio.run(go())
    assert [t.id for t in tasks] == [f"train:{i}" for i in range(32)]
    lookups = [
        "/list_environments",
        "/numbersearchenvironment/splits",
        "/numbersearchenvironment/num_tasks",
        "/numbersearchenvironment/task_range",
    ]
    # (the SDK wraps each listing in a session of its own: /create_session and /delete_session around it)
    assert {path: paths.count(path) for path in lookups} == dict.fromkeys(lookups, 1)


@pytest.mark.parametrize("through", ["wire", "sdk"])
def test_a_session_reuses_its_connections_for_all_its_requests(servers, through, monkeypatch):
    """A session's requests (its creation, prompt, tools, calls and deletes) reuse keep-alive connections: on
    the wire (`platoon.envs.ors.wire`), and through the SDK's aiohttp when the wire is not used (httptools
    missing, a proxy set, `PLATOON_ORS_WIRE=0`). The prompt and the tool listing are asked for at once, so they
    take two connections; every other request goes on one of those. Through the SDK, `/call` answers are SSE
    streams it stops reading at their `end` event; the rest is read so the connection goes back to the pool
    instead of closing."""
    import aiohttp

    if through == "sdk":
        monkeypatch.setenv("PLATOON_ORS_WIRE", "0")  # the way around the wire
    service = resolve_service(remote(servers[0]))
    made: list[str] = []
    reused: list[str] = []
    trace = aiohttp.TraceConfig()

    async def created(*_: Any) -> None:
        made.append("new")

    async def again(*_: Any) -> None:
        reused.append("reused")

    trace.on_connection_create_end.append(created)
    trace.on_connection_reuseconn.append(again)
    trace.freeze()

    async def go() -> int:
        task = await service.get_task("train:0")
        sdk_client = (await service._environment(servers[0].url)).client
        sdk_client._trace_configs.append(trace)
        try:
            session = await service.open(task, rollout_id="keep")
            try:
                await session.tools()
                for number in (1, 2, 3, 4, 5):
                    await session.call_tool("guess", {"number": number})
            finally:
                await session.close()
        finally:
            sdk_client._trace_configs.remove(trace)
        wire = session.env._wire
        return -1 if wire is None else wire.opened

    opened = asyncio.run(go())
    if through == "wire":
        # creation (2), prompt and tools together, five calls, deletes (2): eleven requests on two connections
        assert (opened, made, reused) == (2, [], [])
    else:
        assert opened == -1
        # ten on the connection the task lookup left in the pool, and one more for the listing beside the prompt
        assert (made, len(reused)) == (["new"], 10)


def test_a_session_closed_before_its_tools_are_listed_leaves_nothing_behind(servers, caplog, monkeypatch):
    """The listing asked for beside the prompt is dropped when the session closes first, even one that failed:
    no "exception was never retrieved" report, and the session is deleted on the server."""
    from platoon.envs.ors.remote import _session_class

    async def failing_listing(self: Any, format: Any = None) -> Any:
        raise RuntimeError("the listing failed")

    monkeypatch.setattr(_session_class(), "list_tools", failing_listing)
    service = resolve_service(remote(servers[0]))

    async def go() -> None:
        session = await service.open(await service.get_task("train:0"), rollout_id="unlisted")
        await asyncio.wait([session._lease.listing_ahead])  # it has failed (waiting does not retrieve it)
        await session.close()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        asyncio.run(go())
        gc.collect()  # an exception nobody retrieved is reported when its task is collected
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    assert servers[0].open_sessions() == 0


def test_a_server_that_serves_another_default_refuses_the_name_without_a_variant(servers):
    service = resolve_service(remote(servers[0], env="GuessEnv"))
    with pytest.raises(ValueError, match=r"'GuessEnv' is not its default .*name it with \?variant=guessenv"):
        asyncio.run(service.list_tasks("train"))


def test_forks_share_the_session_or_open_fresh_on_the_same_server(servers):
    service = resolve_service(guess_env(*servers))

    async def go() -> None:
        parent = await service.open(await service.get_task("train:0"), rollout_id="forked")
        await parent.tools()
        shared = await parent.fork("shared")
        fresh = await parent.fork("fresh")
        assert fresh.server == parent.server
        await shared.call_tool("guess", {"number": 1})
        assert parent._lease.turns == 1 and fresh._lease.turns == 0
        with pytest.raises(Exception, match="copy fork needs the environment in process"):
            await parent.fork("copy")
        for s in (shared, fresh, parent):
            await s.close()

    asyncio.run(go())
    assert servers[0].open_sessions() + servers[1].open_sessions() == 0


def test_a_mixture_may_not_reach_one_server_under_two_names_without_a_variant():
    from types import SimpleNamespace

    from platoon.envs.ors.remote import mixture_problems

    def entry(service: str) -> SimpleNamespace:
        return SimpleNamespace(service=service, service_kwargs={})

    assert mixture_problems([entry("ors+http://a:1/One"), entry("ors+http://b:2/Two")]) == []
    assert (
        mixture_problems([entry("ors+http://a:1/One?variant=one"), entry("ors+http://a:1/Two?variant=two")])
        == []
    )
    assert mixture_problems([entry("ors+http://a:1,b:2/One"), entry("ors+http://b:2/Two")]) == [
        "environments.1.service: 'Two' and environments.0's 'One' reach http://b:2 without ?variant=, so both "
        "would get its default environment: name each with ?variant=<name>"
    ]


# -- the bridge: the event log and the bridge tools ----------------------------------------------------


def bridge_log(directory: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    lines = (directory / "bridge_events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], json.loads((directory / "bridge_state.json").read_text())


def test_a_remote_episode_writes_the_bridge_log_and_answers_the_bridge_tools(servers, tmp_path):
    log_dir = tmp_path / "bridge"
    run = run_episode(
        "train:0",
        service=remote(servers[0]),
        service_kwargs={"log_dir": str(log_dir), "bridge_tools": True},
        harness="platoon-react",
        policy=ScriptedPolicy(binary_search),
        output_dir=tmp_path / "out",
    )
    assert run.reward == 1.0
    turns = len(run.policy.calls)
    (directory,) = log_dir.iterdir()
    records, state = bridge_log(directory)
    assert [r["type"] for r in records] == [
        "session_started",
        "task_requested",
        *["tool_call", "tool_result"] * turns,
        "session_closing",
    ]
    assert records[0]["payload"]["server"] == servers[0].url
    assert [r["turn"] for r in records if r["type"] == "tool_call"] == list(range(1, turns + 1))
    assert records[-2]["payload"]["finished"] is True and records[-2]["payload"]["reward"] == 1.0
    assert (state["turn"], state["finished"], state["last_reward"]) == (turns, True, 1.0)
    assert state["session"] == records[0]["session"]

    # Directly: the bridge tools are listed read-only and answer; a fresh fork shares the log on the same server.
    service = RemoteOrsService(remote(servers[1]), log_dir=str(log_dir), bridge_tools=True)

    async def go() -> tuple[Any, ...]:
        session = await service.open(await service.get_task("train:1"), rollout_id="direct")
        tools = [(t.name, t.read_only) for t in await session.tools()]
        await session.call_tool("guess", {"number": -5})
        status = json.loads((await session.call_tool("get_status", {})).as_text())
        task = json.loads((await session.call_tool("get_task", {})).as_text())
        fresh = await session.fork("fresh")
        await fresh.close()
        await session.close()
        return tools, status, task, session.env.sid

    tools, status, task, sid = asyncio.run(go())
    assert tools == [("guess", False), ("get_task", True), ("get_status", True)]
    assert (status["session"], status["turn"], status["finished"]) == (sid, 1, False)
    assert [t["function"]["name"] for t in task["tools"]] == ["guess", "get_task", "get_status"]
    assert "between" in task["prompt"] and task["completion_policy"]["mode"] in (
        "claim_done",
        "submit_answer",
    )
    records, state = bridge_log(log_dir / "direct")
    assert [r["type"] for r in records if r["session"] == sid] == [
        "session_started",
        "task_requested",
        "tool_call",
        "tool_result",
        "task_requested",
        "session_closing",
    ]
    forked = [r for r in records if r["session"] != sid]
    assert forked[0]["payload"]["fork"] == "fresh" and forked[0]["payload"]["parent"] == sid
    assert forked[0]["payload"]["server"] == servers[1].url
    assert state["session"] == sid and state["turn"] == 1
    assert servers[0].open_sessions() + servers[1].open_sessions() == 0
