"""`platoon.envs.ors.wire`: keep-alive HTTP/1.1 connections, against small asyncio servers on 127.0.0.1 that answer
each request with bytes the test chooses (a whole answer, one cut short, one that stalls), and the SSE reader.

The real openreward server over these connections is tested in tests/platoon/ors_remote."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from platoon.envs.ors.wire import Lost, Refused, Wire, sse_events

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]
"""Writes the answer to one request (its head and body as read); returns whether to keep the connection."""


async def serve(answer: Answer) -> tuple[asyncio.Server, str, list[bytes]]:
    """A server answering every request with `answer`; the URL and the list of requests it has read."""
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                request = head + await reader.readexactly(length)
                requests.append(request)
                if not await answer(request, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", requests


def json_answer(status: int = 200, body: bytes = b'{"ok": true}', close: bool = False) -> Answer:
    async def answer(_: bytes, writer: asyncio.StreamWriter) -> bool:
        connection = b"Connection: close\r\n" if close else b""
        writer.write(
            b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (status, len(body), connection, body)
        )
        await writer.drain()
        return not close

    return answer


def chunked(*chunks: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_requests_share_one_connection_and_bodies_come_back_whole():
    async def go() -> tuple[list[bytes], int, list[bytes]]:
        server, url, requests = await serve(json_answer())
        async with server:
            wire = Wire(url)
            bodies = [
                await wire.request("POST", "/create", {"X-Session-ID": "s1"}, {"split": "train", "index": 3}),
                await wire.request("GET", "/env/prompt", {"X-Session-ID": "s1"}),
                await wire.request("POST", "/delete", {}),
            ]
            wire.close()
            return bodies, wire.opened, requests

    bodies, opened, requests = asyncio.run(go())
    assert bodies == [b'{"ok": true}'] * 3
    assert opened == 1
    first, second, third = requests
    assert first.startswith(b"POST /create HTTP/1.1\r\n")
    assert b"X-Session-ID: s1\r\n" in first and b"Content-Type: application/json\r\n" in first
    assert first.endswith(b'{"split": "train", "index": 3}')
    assert second.startswith(b"GET /env/prompt HTTP/1.1\r\n") and b"Content-Length" not in second
    assert third.startswith(b"POST /delete HTTP/1.1\r\n") and b"Content-Length: 0\r\n" in third


def test_a_chunked_event_stream_is_read_to_its_end():
    async def answer(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(SSE_HEAD + chunked(b"event: task_id\r\ndata: t-1\r\n\r\n"))
        await writer.drain()
        await asyncio.sleep(0.05)  # the end comes in a later packet
        writer.write(chunked(b": ping\r\n\r\n", b'event: end\r\ndata: {"ok": true}\r\n\r\n') + b"0\r\n\r\n")
        await writer.drain()
        return True

    async def go() -> bytes:
        server, url, _ = await serve(answer)
        async with server:
            wire = Wire(url)
            body = await wire.request("POST", "/env/call", {"Accept": "text/event-stream"}, {"name": "guess"})
            wire.close()
            return body

    assert sse_events(asyncio.run(go())) == [("task_id", "t-1"), ("end", '{"ok": true}')]


def test_a_status_other_than_2xx_is_refused_with_its_body():
    async def go() -> Refused:
        server, url, _ = await serve(json_answer(404, b'{"detail": "Active environment not found"}'))
        async with server:
            wire = Wire(url)
            with pytest.raises(Refused) as caught:
                await wire.request("GET", "/env/prompt", {})
            wire.close()
            return caught.value

    refused = asyncio.run(go())
    assert refused.status == 404 and b"Active environment not found" in refused.body


def test_a_connection_the_server_closes_is_not_used_again():
    async def go() -> int:
        server, url, requests = await serve(json_answer(close=True))
        async with server:
            wire = Wire(url)
            for _ in range(3):
                assert await wire.request("GET", "/health", {}) == b'{"ok": true}'
            wire.close()
            assert len(requests) == 3
            return wire.opened

    assert asyncio.run(go()) == 3


def test_a_server_that_is_not_there_is_lost_before_anything_was_sent():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connecting is refused

    async def go() -> Lost:
        with pytest.raises(Lost) as caught:
            await Wire(f"http://127.0.0.1:{port}").request("GET", "/health", {})
        return caught.value

    lost = asyncio.run(go())
    assert lost.sent is False and "cannot connect" in str(lost)


def test_a_stream_cut_short_is_lost_with_what_had_arrived():
    async def answer(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(SSE_HEAD + chunked(b"event: task_id\r\ndata: t-9\r\n\r\n"))
        await writer.drain()
        return False  # closed before the end

    async def go() -> Lost:
        server, url, _ = await serve(answer)
        async with server:
            with pytest.raises(Lost) as caught:
                await Wire(url).request("POST", "/env/call", {}, {"name": "guess"})
            return caught.value

    lost = asyncio.run(go())
    assert lost.sent is True and not lost.timed_out
    assert sse_events(lost.body) == [("task_id", "t-9")]


def test_a_stream_that_goes_quiet_is_lost_after_the_idle_timeout():
    async def answer(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(SSE_HEAD + chunked(b"event: task_id\r\ndata: t-5\r\n\r\n"))
        await writer.drain()
        await asyncio.sleep(3600)  # never answers; the test ends the server
        return False

    async def go() -> Lost:
        server, url, _ = await serve(answer)
        wire = Wire(url)
        with pytest.raises(Lost) as caught:
            await wire.request("POST", "/env/call", {}, {"name": "guess"}, idle_timeout_s=0.2)
        server.close()
        return caught.value

    lost = asyncio.run(go())
    assert lost.timed_out and lost.sent
    assert sse_events(lost.body) == [("task_id", "t-5")]


def test_a_cancelled_request_does_not_leave_its_connection_to_the_next():
    """A request cancelled mid-answer (a timeout, a dying session) closes its connection: the next request must not
    read the rest of the first one's answer."""
    release = asyncio.Event()

    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/slow" in request:
            await release.wait()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n" + (b"slow" if b"/slow" in request else b"fast")
        )
        await writer.drain()
        return True

    async def go() -> tuple[bytes, int]:
        server, url, _ = await serve(answer)
        async with server:
            wire = Wire(url)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(wire.request("GET", "/slow", {}), 0.1)
            release.set()
            body = await wire.request("GET", "/fast", {})
            wire.close()
            return body, wire.opened

    assert asyncio.run(go()) == (b"fast", 2)


def test_sse_events_read_every_line_ending_and_skip_comments():
    body = b": hello\n\nevent: chunk\ndata: a\ndata: b\n\r\nevent:end\r\ndata:{}\r\n\r\ndata: plain\r\r"
    assert sse_events(body) == [("chunk", "a\nb"), ("end", "{}"), ("message", "plain")]


def test_a_header_value_with_a_line_break_is_refused():
    async def go() -> None:
        await Wire("http://127.0.0.1:1").request("GET", "/", {"X-API-Key": "a\r\nX-Evil: 1"})

    with pytest.raises(ValueError, match="X-API-Key holds a line break"):
        asyncio.run(go())


# -- a session's `/call` on the wire, and what it hands to the SDK ---------------------------------------------------


def call_on(answers: list[bytes]) -> tuple[object, list[bytes]]:
    """`call_raw("guess", {"number": 3})` of a remote session whose server answers the n-th `/call` with
    `answers[n]` (then closes the connection); the result (or the exception) and the requests the server read."""
    from platoon.envs.ors.remote import _sdk_client, _session_class

    async def answer(_: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(answers.pop(0))
        await writer.drain()
        return False

    async def go() -> tuple[object, list[bytes]]:
        server, url, requests = await serve(answer)
        api = _sdk_client().AsyncEnvironmentsAPI(base_url=url, api_key="local")
        try:
            async with server:
                env = api.get("env", variant="env", base_url=url)
                session = _session_class()(env, split="train", index=0, api_key="local", wire=Wire(url))
                session.sid = "s-1"  # as if opened: only the call is under test
                try:
                    return await session.call_raw("guess", {"number": 3}), requests
                except Exception as exc:
                    return exc, requests
        finally:
            await api.aclose()

    return asyncio.run(go())


END = b'event: end\r\ndata: {"ok": true, "output": {"blocks": [], "finished": false}}\r\n\r\n'


def test_a_call_cut_after_the_server_named_its_task_is_resumed_not_sent_again():
    cut = SSE_HEAD + chunked(b"event: task_id\r\ndata: t-1\r\n\r\n")
    whole = SSE_HEAD + chunked(b"event: task_id\r\ndata: t-1\r\n\r\n", END) + b"0\r\n\r\n"
    result, requests = call_on([cut, whole])
    assert result == {"blocks": [], "finished": False}
    first, second = requests
    assert b'"task_id"' not in first
    assert b'"task_id": "t-1"' in second  # the SDK's resumption of the same task


def test_a_call_cut_before_the_server_named_its_task_fails_without_being_sent_twice():
    result, requests = call_on([SSE_HEAD])
    assert isinstance(result, ConnectionResetError)
    assert len(requests) == 1


def test_a_call_the_server_refused_is_posted_again_by_the_sdk():
    """A status other than 2xx means the call never ran: the SDK posts it, and its answer (here, the same 503) is
    what the session sees, with the SDK's own error."""
    import aiohttp

    busy = b"HTTP/1.1 503 Unavailable\r\nContent-Length: 2\r\n\r\n{}"
    whole = SSE_HEAD + chunked(b"event: task_id\r\ndata: t-2\r\n\r\n", END) + b"0\r\n\r\n"
    result, requests = call_on([busy, whole])
    assert result == {"blocks": [], "finished": False} and len(requests) == 2
    result, requests = call_on([busy, busy])
    assert isinstance(result, aiohttp.ClientResponseError) and result.status == 503
    assert len(requests) == 2
