"""Shared fixtures of the sandbox tests: an HTTP upstream on a Unix socket, as the gateway serves a rollout."""

from __future__ import annotations

import http.server
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from the host: {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:  # a Unix peer has no host/port pair
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def unix_upstream(tmp_path: Path) -> Iterator[str]:
    """An HTTP server on a Unix socket in a host directory (standing in for the model gateway)."""
    sock = tmp_path / "gw" / "gw.sock"
    sock.parent.mkdir()
    server = _UnixHTTPServer(str(sock), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"unix://{sock}"
    finally:
        server.shutdown()
        server.server_close()
