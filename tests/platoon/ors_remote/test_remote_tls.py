"""`ors+https://`: a session on an ORS server over TLS, its requests on platoon's keep-alive connections (the wire
verifies the server's certificate as the SDK's client does: the system's trust store, or `SSL_CERT_FILE`), and a
server whose certificate is not trusted refused in one line.

The server is the SDK's app on uvicorn with a certificate from a test CA (trustme). The client runs in a fresh
process, as a user's run would, so that `SSL_CERT_FILE` is read where the SDK's aiohttp builds its TLS context (at
import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CLIENT = """
import asyncio, json, sys

from platoon.envs.number_search.env import task_spec
from platoon.envs.resolve import resolve_service


async def play(host):
    service = resolve_service(f"ors+https://{host}/NumberSearchEnvironment")
    try:
        task = await service.get_task("train:0")
        session = await service.open(task, rollout_id="tls")
    except Exception as exc:
        return {"refused": f"{type(exc).__name__}: {exc}"}
    try:
        await session.tools()
        result = await session.call_tool("guess", {"number": task_spec("train", 0)["misc"]["target"]})
        wire = session.env._wire
        return {"reward": result.reward, "finished": result.finished, "connections": wire and wire.opened}
    finally:
        await session.close()


print(json.dumps(asyncio.run(play(sys.argv[1]))))
"""


@pytest.fixture(scope="module")
def tls_server(server_factory, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:  # type: ignore[no-untyped-def]
    """A server over TLS with a certificate for 127.0.0.1 from a test CA; returns it and the CA's PEM file."""
    import trustme

    where = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    cert, key, ca_file = where / "cert.pem", where / "key.pem", where / "ca.pem"
    cert.write_bytes(b"".join(pem.bytes() for pem in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    return server_factory(tls=(cert, key, ca_file)), ca_file


def play(host: str, **env: str | None) -> dict[str, Any]:
    environ = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, host], capture_output=True, text=True, env=environ, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_session_over_tls_plays_on_the_wire_and_is_deleted(tls_server):
    server, ca_file = tls_server
    answer = play(server.host, SSL_CERT_FILE=str(ca_file), PLATOON_ORS_WIRE=None)
    assert answer == {"reward": 1.0, "finished": True, "connections": 2}  # the prompt and the listing at once
    assert server.open_sessions() == 0


def test_a_server_whose_certificate_is_not_trusted_is_refused_in_one_line(tls_server):
    server, _ = tls_server
    answer = play(server.host, SSL_CERT_FILE=None, SSL_CERT_DIR=None)
    assert "certificate verify failed" in answer["refused"]
    assert "\n" not in answer["refused"]
    assert server.open_sessions() == 0
