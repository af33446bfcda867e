"""A stop is quiet: clients that go away mid-request and requests still open when the server stops leave no
traceback in the server's output, only its `platoon:` lines."""

from __future__ import annotations

import socket
import subprocess
import sys
from urllib.parse import urlsplit

import httpx
import pytest

#: a hang guard only
HANG_GUARD_SECONDS = 60


def half_a_body(key: str) -> bytes:
    return (
        b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\n" % key.encode()
        + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    )


@pytest.mark.guarantee(
    "Clients gone mid-request, a stop with requests open",
    "local server",
    "dropped quietly, no traceback",
)
def test_clients_gone_mid_request_and_a_stop_with_a_request_open_print_no_traceback(tmp_path):
    # the child-process server as `TINKER_BASE_URL=local` starts it, its stderr captured
    command = [sys.executable, "-m", "platoon.local_server.process", "--dir", str(tmp_path)]
    child = subprocess.Popen(
        [*command, "--exit-on-stdin-eof"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None and child.stderr is not None
        base_url = child.stdout.readline().strip()
        half = half_a_body(child.stdout.readline().strip())  # the key it issued: the body is then read
        address = urlsplit(base_url)
        assert address.hostname and address.port
        # clients that exit while sending a request: half a body, then the connection closes
        for _ in range(3):
            with socket.create_connection((address.hostname, address.port)) as gone:
                gone.sendall(half)
        # a request whose body is still arriving when the server stops
        open_request = socket.create_connection((address.hostname, address.port))
        open_request.settimeout(HANG_GUARD_SECONDS)
        open_request.sendall(half)
        assert httpx.get(f"{base_url}/api/v1/healthz", timeout=HANG_GUARD_SECONDS).json() == {"status": "ok"}

        child.stdin.close()  # how the command that started it stops it
        assert child.wait(timeout=HANG_GUARD_SECONDS) == 0
        stderr = child.stderr.read()
        with open_request:
            reply = b""
            while chunk := open_request.recv(65536):
                reply += chunk
    finally:
        child.kill()
        child.wait()
    # the open request was answered (or its connection closed), not left hanging
    assert reply == b"" or reply.startswith(b"HTTP/1.1 503 ")
    assert "Traceback" not in stderr and "ClientDisconnect" not in stderr and "ERROR" not in stderr, stderr
    assert [line for line in stderr.splitlines() if not line.startswith("platoon: ")] == [], stderr
