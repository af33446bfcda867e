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
