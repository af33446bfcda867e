"""Fixtures of `platoon eval` / `platoon rollout` tests: a working directory without a site profile, config files,
the local Tinker-compatible server shared by a module, and a scripted OpenAI-compatible server on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from eval_support import HOSTED_KEY, HOSTED_KEY_ENV, HostedServer, completion


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory of its own, no site profile, no Tinker settings from the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("PLATOON_SITE", "TINKER_BASE_URL", "TINKER_API_KEY", "TINKER_SAMPLE_TIMEOUT_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
def write_config(workdir: Path) -> Callable[..., Path]:
    """`write_config(data, name="eval.yaml")` -> the path of the YAML file written in the working directory."""

    def write(data: dict[str, Any], name: str = "eval.yaml") -> Path:
        path = workdir / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write


@pytest.fixture(scope="session")
def tinker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The local Tinker-compatible server (tiny Qwen3, toy tokenizer), built once for these tests."""
    from platoon.local_server import LocalTinkerServer

    with LocalTinkerServer(state_dir=tmp_path_factory.mktemp("local-tinker")) as running:
        yield running


@contextlib.contextmanager
def serve_app(app: Any) -> Iterator[str]:
    """Serve a starlette app on a free 127.0.0.1 port (uvicorn in a thread) for the block; yields its base URL.

    A thread, not a task: the command under test runs its own event loop (`asyncio.run`)."""
    import asyncio

    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60  # a hang guard
    while not server.started:
        assert time.monotonic() < deadline, "the scripted server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def refusing_service() -> Iterator[str]:
    """A service answering every request with 401, as a Tinker service refusing the key does; yields its URL."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def refuse(request: Request) -> JSONResponse:
        return JSONResponse({"detail": "Invalid API key"}, status_code=401)

    methods = ["GET", "POST", "PUT", "DELETE"]
    with serve_app(Starlette(routes=[Route("/{path:path}", refuse, methods=methods)])) as base_url:
        yield base_url


@pytest.fixture
def hosted_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostedServer]:
    """A scripted OpenAI-compatible server on 127.0.0.1 (uvicorn in a thread): it checks the Bearer key, answers
    the probe with OK and the game with binary-search tool calls. Sets the key variable."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    state = HostedServer()
    monkeypatch.setenv(HOSTED_KEY_ENV, HOSTED_KEY)

    async def chat(request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        messages = body.get("messages") or []
        probe = len(messages) == 1 and messages[0].get("content") == "Reply with OK."
        with state.lock:
            state.seen.append({"headers": dict(request.headers), "body": body, "probe": probe})
            failure = state.fail_with.pop(0) if state.fail_with and not probe else None
        if request.headers.get("authorization") != f"Bearer {HOSTED_KEY}":
            return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
        if probe and state.probe_status != 200:
            return JSONResponse({"error": {"message": "no such model"}}, status_code=state.probe_status)
        if failure is not None:
            # A careless server echoing the key: the gateway must redact it from everything it records.
            echoed = f"upstream failed for key {HOSTED_KEY}"
            return JSONResponse({"error": {"message": echoed}}, status_code=failure)
        return JSONResponse(completion(state, body, probe=probe))

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    with serve_app(app) as base_url:
        state.base_url = f"{base_url}/v1"
        yield state
