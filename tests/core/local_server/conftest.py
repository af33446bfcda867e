"""Local Tinker server fixtures: a server with the real torch backend shared by a module, and SDK clients."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TINKER_TELEMETRY", "0")
# an unknown base model must fail at once, not after the hub's retries
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from platoon.local_server import LocalTinkerServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTinkerServer]:
    """A local server with the real backend (tiny Qwen3, the toy tokenizer) for the module's tests."""
    with LocalTinkerServer(state_dir=tmp_path_factory.mktemp("local-tinker")) as running:
        yield running


@pytest.fixture(scope="module")
def service(server: LocalTinkerServer) -> Iterator[Any]:
    """An SDK client of the module's server; its session stops heartbeating when the module is done."""
    import tinker

    from platoon.gateway.tinker_service import close_session

    client = tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key)
    # SDK 0.38 opens the session at its first use: here, so that no test is taken for its opener
    assert client.holder is not None
    yield client
    close_session(client)
