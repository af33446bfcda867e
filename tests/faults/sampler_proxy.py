"""A Tinker-compatible service's sampler gone bad, for the guarantee sheet: `python sampler_proxy.py UPSTREAM`.

It listens on a free loopback port (printed as its URL on the first line of stdout) and passes every request to
UPSTREAM (the local server in a process of its own, as a hosted service would be), except two sample requests: the
first is answered 503, and the second is never answered, as a sampler that stalls.
"""

import asyncio
import socket
import sys

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

UPSTREAM = sys.argv[1].rstrip("/") if __name__ == "__main__" else ""
_samples = 0
_client: httpx.AsyncClient | None = None


async def forward(request: Request) -> Response:
    global _samples, _client
    if request.url.path.endswith("/asample"):
        _samples += 1
        if _samples == 1:
            return JSONResponse({"error": "sampler overloaded (injected)"}, status_code=503)
        if _samples == 2:
            await asyncio.Event().wait()  # a sampler that never answers
    if _client is None:
        _client = httpx.AsyncClient(base_url=UPSTREAM, timeout=None)
    headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
    upstream = await _client.request(
        request.method,
        request.url.path,
        params=request.query_params,
        content=await request.body(),
        headers=headers,
    )
    passed = {
        k: v for k, v in upstream.headers.items() if k.lower() not in ("content-length", "transfer-encoding")
    }
    passed.pop("content-encoding", None)  # httpx has already decoded the body
    return Response(upstream.content, status_code=upstream.status_code, headers=passed)


app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "PUT", "DELETE"])])

if __name__ == "__main__":
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    print(f"http://127.0.0.1:{port}", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
