"""A gateway server starts per episode: uvicorn's logging is configured by the first of a process only, so the
next ones do not walk every logger of the process again, and what it set stays set."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import asyncio, logging, logging.config
from platoon.gateway.http.server import GatewayServer
from platoon.testing import make_gateway

applied = []
real = logging.config.dictConfig
logging.config.dictConfig = lambda config: (applied.append(config), real(config))[1]

async def main():
    gateway = make_gateway(())
    for _ in range(3):
        server = GatewayServer(gateway)
        await server.astart()
        await server.astop()

asyncio.run(main())
error, access = logging.getLogger("uvicorn.error"), logging.getLogger("uvicorn.access")
print(len(applied), logging.getLevelName(error.level), access.propagate, access.handlers)
"""


def test_only_the_first_server_of_a_process_configures_uvicorns_logging():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "WARNING", "False", "[]"]


def test_a_unix_socket_server_serves_only_its_rollouts_keys_on_a_private_socket_it_removes(tmp_path):
    import asyncio
    import os
    import stat

    import httpx

    from platoon.gateway.http.server import GatewayServer
    from platoon.testing import make_gateway

    path = tmp_path / "gw.sock"
    assert socket_left_by_a_dead_server(path)  # replaced at start

    async def main() -> None:
        gateway = make_gateway(["hello"])
        own = gateway.open_agent(gateway.open_rollout("r"))
        other = gateway.open_agent(gateway.open_rollout("other"))
        async with GatewayServer(gateway, unix_socket=path, rollouts=["r"]) as server:
            assert server.upstream == f"unix://{path}"
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            transport = httpx.AsyncHTTPTransport(uds=str(path))
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
                body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
                reply = await http.post(f"/s/{own.secret}/v1/chat/completions", json=body)
                assert reply.status_code == 200
                assert reply.json()["choices"][0]["message"]["content"] == "hello"
                refused = await http.post(f"/s/{other.secret}/v1/chat/completions", json=body)
                assert refused.status_code == 401
        assert not path.exists()

    asyncio.run(main())


def socket_left_by_a_dead_server(path) -> bool:
    """Bind and close a Unix socket without removing its file, as a killed server leaves it."""
    import socket

    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(path))
    left.close()
    return path.is_socket()


def test_a_server_on_demand_starts_only_when_its_endpoint_is_asked_for():
    import asyncio

    import httpx

    from platoon.gateway.http.server import GatewayServer, serving
    from platoon.testing import make_gateway

    async def main() -> None:
        # run_episode's way: an episode whose harness only calls ctx.chat never starts a server
        idle = make_gateway(())
        never = GatewayServer(idle).serve_on_demand()
        await never.astop()
        assert serving(idle) is None and never.port == 0  # never bound a socket

        gateway = make_gateway(())
        server = GatewayServer(gateway).serve_on_demand()
        assert serving(gateway) is server  # asked for: started now, its URL known at once
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{server.base_url}/healthz")).status_code == 200
        await server.astop()
        assert serving(gateway) is None

    asyncio.run(main())
