"""Harbor test fixtures. A local hub-compatible HTTP server for the Harbor dataset tests: the endpoints huggingface_hub calls to list a
dataset repo at a commit and download its files (`/api/datasets/{repo}/revision/{rev}`,
`/api/datasets/{repo}/tree/{rev}[/{path}]`, `/datasets/{repo}/resolve/{rev}/{file}`), counting every request."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

import pytest


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {}  # repo -> commit -> path -> bytes
        self.refs: dict[str, dict[str, str]] = {}  # repo -> branch -> commit
        self.requests: list[str] = []
        self.tamper: dict[str, bytes] = {}  # path -> bytes served instead of the listed content
        self.url = ""

    def publish(self, repo: str, commit: str, files: dict[str, bytes], branch: str | None = "main") -> None:
        self.repos.setdefault(repo, {})[commit] = dict(files)
        if branch:
            self.refs.setdefault(repo, {})[branch] = commit

    def downloads(self, path: str | None = None) -> list[str]:
        return [
            r
            for r in self.requests
            if r.startswith("GET") and "/resolve/" in r and (path is None or r.endswith(path))
        ]


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def _send(
            self, code: int, body: bytes, headers: dict[str, str] | None = None, head: bool = False
        ) -> None:
            self.send_response(code)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _not_found(self, head: bool = False) -> None:
            self._send(404, b'{"error": "not found"}', {"X-Error-Code": "EntryNotFound"}, head)

        def _commit(self, repo: str, rev: str) -> str | None:
            commits = hub.repos.get(repo, {})
            return rev if rev in commits else hub.refs.get(repo, {}).get(rev)

        def _route(self, head: bool) -> None:
            hub.requests.append(f"{self.command} {self.path}")
            path = unquote(urlparse(self.path).path)
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "datasets"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                repo, kind, rev, rest = "/".join(parts[2:4]), parts[4], parts[5], "/".join(parts[6:])
                commit = self._commit(repo, rev)
                if commit is None:
                    return self._not_found(head)
                files = hub.repos[repo][commit]
                if kind == "revision":
                    body = {"id": repo, "sha": commit, "siblings": [{"rfilename": p} for p in sorted(files)]}
                    return self._send(
                        200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head
                    )
                prefix = f"{rest}/" if rest else ""
                entries = [
                    {"type": "file", "oid": blob_id(data), "size": len(data), "path": p}
                    for p, data in sorted(files.items())
                    if p.startswith(prefix)
                ]
                return self._send(
                    200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head
                )
            if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
                repo, rev, file = "/".join(parts[1:3]), parts[4], "/".join(parts[5:])
                commit = self._commit(repo, rev)
                if commit is None or file not in hub.repos[repo][commit]:
                    return self._not_found(head)
                data = hub.repos[repo][commit][file]
                served = hub.tamper.get(file, data)
                headers = {
                    "X-Repo-Commit": commit,
                    "ETag": f'"{blob_id(data)}"',
                    "Content-Type": "application/octet-stream",
                }
                return self._send(200, served, headers, head)
            self._not_found(head)

        def do_GET(self) -> None:
            self._route(head=False)

        def do_HEAD(self) -> None:
            self._route(head=True)

    return Handler


@contextmanager
def serve(hub: FakeHub) -> Iterator[FakeHub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    """A fake hub on a free local port; tests point HF_ENDPOINT at `hub.url`."""
    with serve(FakeHub()) as running:
        yield running
