#!/usr/bin/env python3
"""platoon-bash: a small shell agent for the `platoon-bash@1` spec.

It asks an OpenAI-compatible Chat Completions endpoint (platoon's gateway) what to do, runs the `bash` commands the
model asks for in the current directory, calls the environment's tools over MCP (streamable HTTP) when given
`--mcp-url`, and stops when the model answers without a tool call. The run's final message is written to
`--final-message-file`.

It is copied into task sandboxes and run there with whatever `python3` the sandbox has, so it uses the standard
library only and runs on Python 3.8 or later (no newer syntax or library calls).

Exit codes: 0 a final answer; 2 a model request failed; 3 the turn limit was reached; 4 the MCP server is
unavailable or its transport failed; 1 a bad invocation.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

# Imported where first needed: `subprocess` and `threading` (bash commands), `urllib.request` (a proxy or https),
# `argparse` (an unusual command line) and `uuid`. An agent starts per rollout, and imports were most of its start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

EXIT_FINAL = 0
EXIT_USAGE = 1
EXIT_MODEL = 2
EXIT_TURN_LIMIT = 3
EXIT_MCP = 4

MODEL_TIMEOUT_S = 1800.0
#: an MCP request may wait as long as a model request (a tool may run a while; SSE keepalives keep it alive)
MCP_TIMEOUT_S = 1800.0
DEFAULT_COMMAND_TIMEOUT_S = 120.0
OUTPUT_CHARS = 16000
#: bytes of command output kept while it runs (enough for OUTPUT_CHARS characters of any UTF-8 text)
OUTPUT_BYTES = 4 * OUTPUT_CHARS
#: how long to keep reading a command's output after it exits while a process it left behind holds the pipe
DRAIN_AFTER_EXIT_S = 0.5
#: a kept-alive connection idle longer than this is not reused (servers close idle ones, uvicorn after 5 s)
KEEP_ALIVE_IDLE_S = 2.0
MCP_PROTOCOL = "2025-06-18"
CLIENT_INFO = {"name": "platoon-bash", "version": "1"}

SYSTEM_PROMPT = (
    "You are an agent working in a Linux shell. Use the bash tool to run commands; work on the files in the "
    "current directory. When you are done, reply with your final answer and no tool call."
)
MCP_SENTENCE = (
    " Besides bash you have the task environment's own tools: use them as the task says (for example to submit "
    "your answer)."
)

#: process groups of the commands this agent started, killed when it exits (a command's leftovers included)
_GROUPS: list[int] = []
#: while a command starts, its group is not in _GROUPS yet: a SIGTERM then waits in _PENDING_TERM until it is
_STARTING = False
_PENDING_TERM: int | None = None


class ModelError(Exception):
    """A model request failed (exit 2)."""


class McpError(Exception):
    """The MCP server is unavailable or its transport failed (exit 4)."""


class McpCallError(Exception):
    """The MCP server answered a request with a JSON-RPC error (the model is told; the run goes on)."""


def say(text: str) -> None:
    print(text, flush=True)


def warn(text: str) -> None:
    print("platoon-bash: " + text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- bash


class _Tail:
    """Reads a pipe to its end in a thread, keeping only the last OUTPUT_BYTES bytes."""

    def __init__(self, stream: Any) -> None:
        import threading

        self.data = bytearray()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: Any) -> None:
        try:
            while True:
                chunk = os.read(stream.fileno(), 65536)
                if not chunk:
                    break
                with self.lock:
                    self.data += chunk
                    if len(self.data) > OUTPUT_BYTES:
                        del self.data[: len(self.data) - OUTPUT_BYTES]
        except OSError:
            pass
        finally:
            stream.close()

    def text(self) -> str:
        with self.lock:
            data = bytes(self.data)
        return data.decode("utf-8", errors="replace")[-OUTPUT_CHARS:]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def run_bash(command: str, timeout_s: float) -> str:
    """Run `command` with `bash -c` in a session of its own (stdin /dev/null, stdout and stderr merged).

    Returns "exit code N" or "command timed out after Ns", a newline and the last OUTPUT_CHARS characters of
    the output. On timeout the command's whole process group is SIGKILLed. A command that exits while a process
    it started in the background still runs returns at once (the background process keeps the pipe open, so the
    wait is for the command itself, not for the end of its output).
    """
    import subprocess

    global _STARTING
    _STARTING = True
    try:
        process = subprocess.Popen(
            ["bash", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _GROUPS.append(process.pid)  # a new session: its group id is the leader's pid
    finally:
        _STARTING = False
    if _PENDING_TERM is not None:  # the SIGTERM came while the command started: now its group goes too
        _on_term(_PENDING_TERM, None)
    tail = _Tail(process.stdout)
    try:
        code = process.wait(timeout=timeout_s)
        status = code if code >= 0 else 128 - code  # killed by signal N: 128+N, as bash reports it
        head = f"exit code {status}"
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        process.wait()
        head = f"command timed out after {_seconds(timeout_s)}s"
    tail.thread.join(DRAIN_AFTER_EXIT_S)
    return head + "\n" + tail.text()


def kill_commands() -> None:
    """SIGKILL what is left of every command's process group (background processes they started)."""
    while _GROUPS:
        _kill_group(_GROUPS.pop())


# ---------------------------------------------------------------------------------------------- HTTP


class HttpError(Exception):
    """A reply with status 400 or more."""

    def __init__(self, status: int, reason: str, body: bytes) -> None:
        super().__init__(f"HTTP {status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body


class CannotConnect(Exception):
    """No connection to the server (refused, unresolvable, unreachable)."""


class _Body:
    """A reply's body as its framing delimits it (Content-Length, chunked, or until the server closes)."""

    def __init__(self, stream: Any, length: int | None, chunked: bool) -> None:
        self.stream = stream
        self.left = length
        self.chunked = chunked
        self.done = length == 0 and not chunked
        self.pending = b""
        self.at_boundary = True  # no chunk read in part (a failed read leaves it False)

    def _piece(self) -> bytes:
        """The body's next bytes; b"" at its end."""
        if self.done:
            return b""
        if self.chunked:
            self.at_boundary = False
            size = int(self.stream.readline(65537).split(b";", 1)[0].strip(), 16)  # ValueError when cut off
            if size == 0:
                while self.stream.readline(65537).strip():
                    pass  # trailer fields, up to the blank line
                self.done = True
                return b""
            data = self.stream.read(size)
            if len(data) < size or self.stream.readline(65537).strip():
                raise ConnectionError("the server closed the connection inside a chunked reply")
            self.at_boundary = True
            return data
        if self.left is None:  # HTTP/1.0 style: the body ends when the server closes
            data = self.stream.read1(65536)
            self.done = not data
            return data
        data = self.stream.read1(min(65536, self.left))
        if not data:
            raise ConnectionError("the server closed the connection inside its reply")
        self.left -= len(data)
        self.done = self.left == 0
        return data

    def read(self) -> bytes:
        parts = [self.pending]
        self.pending = b""
        while True:
            piece = self._piece()
            if not piece:
                return b"".join(parts)
            parts.append(piece)

    def readline(self) -> bytes:
        while b"\n" not in self.pending:
            piece = self._piece()
            if not piece:
                line, self.pending = self.pending, b""
                return line
            self.pending += piece
        line, _, self.pending = self.pending.partition(b"\n")
        return line + b"\n"


class Response:
    """A reply: `headers` (lower-case names), `read()` the body, iterate it line by line, `close()`."""

    def __init__(self, headers: dict[str, str], body: Any, release: Any) -> None:
        self.headers = headers
        self.body = body
        self.release = release  # called once with whether the body was read to its end

    def read(self) -> bytes:
        return bytes(self.body.read())

    def __iter__(self) -> Any:
        while True:
            line = self.body.readline()
            if not line:
                return
            yield line

    def close(self) -> None:
        if self.release is not None:
            release, self.release = self.release, None
            release(self.body)


#: kept-alive connections by (host, port): (socket, its reader, when it went idle, whether the last reply's
#: chunked body still owes its last chunk: an SSE reply is left once it gave the reply the client waited for)
_IDLE: dict[tuple[str, int], tuple[Any, Any, float, bool]] = {}
LAST_CHUNK = b"0\r\n\r\n"


def _split_url(url: str) -> tuple[str, str, int, str] | None:
    """(host:port as written, host, port, path) of a plain `http://` URL, or None for anything else."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "http":
        return None
    authority, _, path = rest.partition("/")
    if "@" in authority or "?" in authority or "#" in authority or not authority:
        return None
    if authority.startswith("["):  # [IPv6]:port
        host, _, after = authority[1:].partition("]")
        if after and not after.startswith(":"):
            return None
        port = after[1:]
    else:
        host, _, port = authority.partition(":")
    if port and not port.isdigit():
        return None
    return authority, host, int(port) if port else 80, "/" + path.partition("#")[0]


def _proxied(authority: str) -> bool:
    """Whether an http_proxy (or all_proxy) in the environment applies to this host, as urllib decides."""
    if not any(os.environ.get(name) for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")):
        return False
    import urllib.request

    return "http" in urllib.request.getproxies() and not urllib.request.proxy_bypass(authority)


def _still_open(sock: Any) -> bool:
    """Whether an idle kept-alive connection is still open (the server has not closed it, nor sent anything)."""
    try:
        sock.settimeout(0)
        sock.recv(1, socket.MSG_PEEK)  # b"": the server closed it; data: sent out of turn
    except BlockingIOError:
        return True  # nothing to read: open and quiet
    except OSError:
        pass
    return False


def _took_last_chunk(sock: Any, reader: Any) -> bool:
    """Whether exactly the last chunk (no trailers) has arrived of a body left before its end; it is then read."""
    try:
        sock.settimeout(0)  # peek never waits: the bytes are there or the connection is not reused
        if reader.peek(len(LAST_CHUNK)) != LAST_CHUNK:
            return False
        reader.read(len(LAST_CHUNK))
    except (OSError, ValueError):
        return False
    return True


def _close(sock: Any, reader: Any) -> None:
    reader.close()  # the socket's file descriptor stays open while its reader is
    sock.close()


def _connection(host: str, port: int, timeout: float) -> tuple[Any, Any]:
    held = _IDLE.pop((host, port), None)
    if held is not None:
        sock, reader, since, owes_last_chunk = held
        fresh = time.monotonic() - since < KEEP_ALIVE_IDLE_S
        if fresh and (not owes_last_chunk or _took_last_chunk(sock, reader)) and _still_open(sock):
            sock.settimeout(timeout)
            return sock, reader
        _close(sock, reader)
    try:
        sock = socket.create_connection((host, port), timeout)
    except OSError as exc:
        raise CannotConnect(str(exc)) from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, sock.makefile("rb")


def _reply_head(reader: Any) -> tuple[int, str, str, dict[str, str]]:
    """(status, reason, version, headers) of a reply."""
    line = reader.readline(65537)
    if not line:
        raise ConnectionError("the server closed the connection without a reply")
    parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ConnectionError(f"not an HTTP reply: {line[:80]!r}")
    headers: dict[str, str] = {}
    while True:
        field = reader.readline(65537)
        if not field.strip():
            break
        name, _, value = field.decode("latin-1").partition(":")
        name, value = name.strip().lower(), value.strip()
        headers[name] = headers[name] + ", " + value if name in headers else value
    return int(parts[1]), parts[2] if len(parts) > 2 else "", parts[0], headers


def _send(method: str, url: str, data: bytes | None, headers: dict[str, str], timeout: float) -> Response:
    """One request on a kept-alive connection (a plain http URL without a proxy), else through urllib.

    Raises HttpError (status >= 400), CannotConnect, OSError or ValueError.
    """
    split = _split_url(url)
    if split is None or _proxied(split[0]):
        return _send_by_urllib(method, url, data, headers, timeout)
    authority, host, port, path = split
    sock, reader = _connection(host, port, timeout)
    try:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {authority}", "User-Agent: platoon-bash/1"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if data is not None:
            lines.append(f"Content-Length: {len(data)}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (data or b""))
        status, reason, version, reply = _reply_head(reader)
        bodiless = method == "HEAD" or status in (204, 304) or 100 <= status < 200
        chunked = not bodiless and "chunked" in reply.get("transfer-encoding", "").lower()
        length = 0 if bodiless else None if chunked else reply.get("content-length")
        body = _Body(reader, int(length) if length is not None else None, chunked)
    except BaseException:
        _close(sock, reader)
        raise
    keep = version == "HTTP/1.1" and "close" not in reply.get("connection", "").lower()
    keep = keep and (chunked or body.left is not None)

    def release(body: _Body) -> None:
        # a chunked body left at a chunk's end (nothing of the next one read) may be followed by its last chunk
        left_at_boundary = body.chunked and not body.done and not body.pending and body.at_boundary
        if keep and (body.done or left_at_boundary):
            _IDLE[(host, port)] = (sock, reader, time.monotonic(), not body.done)
        else:
            _close(sock, reader)

    response = Response(reply, body, release)
    if status >= 400:
        try:
            text = body.read()
        finally:
            response.close()
        raise HttpError(status, reason, text)
    return response


def _send_by_urllib(
    method: str, url: str, data: bytes | None, headers: dict[str, str], timeout: float
) -> Response:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=data, method=method)
    for name, value in headers.items():
        request.add_header(name, value)
    try:
        reply = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        try:
            text = exc.read()
        except Exception:
            text = b""
        raise HttpError(exc.code, str(exc.reason), text) from None
    except urllib.error.URLError as exc:
        raise CannotConnect(str(exc.reason)) from None
    return Response({k.lower(): v for k, v in reply.headers.items()}, reply, lambda _body: reply.close())


def _post_json(url: str, body: Any, headers: dict[str, str], timeout: float) -> Response:
    """POST JSON and return the response (the caller reads and closes it)."""
    data = json.dumps(body).encode("utf-8")
    return _send("POST", url, data, {"Content-Type": "application/json", **headers}, timeout)


def _error_text(exc: BaseException) -> str:
    """One line for an HTTP or network failure (with the start of an HTTP error's body)."""
    if isinstance(exc, HttpError):
        body = " ".join(exc.body.decode("utf-8", errors="replace").split())[:500]
        return f"HTTP {exc.status} {exc.reason}" + (": " + body if body else "")
    if isinstance(exc, CannotConnect):
        return f"cannot connect: {exc}"
    return f"{type(exc).__name__}: {exc}"


def chat(base_url: str, api_key: str, model: str, messages: list[Any], tools: list[Any]) -> dict[str, Any]:
    """One Chat Completions call; the assistant message of its first choice. Raises ModelError."""
    url = base_url.rstrip("/") + "/chat/completions"
    body = {"model": model, "messages": messages, "tools": tools}
    try:
        response = _post_json(url, body, {"Authorization": "Bearer " + api_key}, MODEL_TIMEOUT_S)
        try:
            reply = json.loads(response.read().decode("utf-8"))
        finally:
            response.close()
    except (HttpError, CannotConnect, OSError, ValueError) as exc:
        raise ModelError(f"the model request to {url} failed: {_error_text(exc)}") from None
    try:
        message = reply["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise ModelError(f"the model reply from {url} has no message: {json.dumps(reply):.300}") from None
    if not isinstance(message, dict):
        raise ModelError(f"the model reply from {url} has no message: {json.dumps(reply):.300}")
    return message


# ---------------------------------------------------------------------------------------------- MCP


class McpClient:
    """A minimal MCP client over streamable HTTP: JSON-RPC requests by POST, answered as JSON or SSE."""

    def __init__(self, url: str, api_key: str) -> None:
        self.url = url
        self.api_key = api_key
        self.session_id: str | None = None
        self.protocol: str | None = None  # sent as MCP-Protocol-Version once negotiated
        self.next_id = 0

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json, text/event-stream"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
        if self.protocol:
            headers["MCP-Protocol-Version"] = self.protocol
        return headers

    def _post(self, message: dict[str, Any]) -> Any:
        try:
            response = _post_json(self.url, message, self._headers(), MCP_TIMEOUT_S)
        except (HttpError, CannotConnect, OSError, ValueError) as exc:
            method = message["method"]
            raise McpError(f"{method} to {self.url} failed: {_error_text(exc)}") from None
        session = response.headers.get("mcp-session-id")
        if session:
            self.session_id = session
        return response

    def notify(self, method: str) -> None:
        response = self._post({"jsonrpc": "2.0", "method": method})
        response.close()

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The result of one request. Raises McpError (transport) or McpCallError (a JSON-RPC error reply)."""
        self.next_id += 1
        request_id = self.next_id
        response = self._post({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        try:
            kind = (response.headers.get("content-type") or "").split(";")[0].strip().lower()
            if kind == "text/event-stream":
                reply = self._from_events(response, request_id)
            else:
                reply = json.loads(response.read().decode("utf-8"))
        except (OSError, ValueError) as exc:
            raise McpError(f"{method}: the reply from {self.url} is unreadable: {exc}") from None
        finally:
            response.close()
        if isinstance(reply, list):  # a batch reply: ours is the one with our id
            reply = next((r for r in reply if isinstance(r, dict) and r.get("id") == request_id), None)
        if not isinstance(reply, dict) or reply.get("id") != request_id:
            raise McpError(f"{method}: {self.url} sent no reply to the request")
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            text, code = error.get("message", "error"), error.get("code")
            raise McpCallError(f"{text} (code {code})")
        result = reply.get("result")
        if not isinstance(result, dict):
            raise McpError(f"{method}: the reply from {self.url} has no result")
        return result

    @staticmethod
    def _from_events(response: Any, request_id: int) -> Any:
        """Read SSE events until the JSON-RPC reply to `request_id` (progress and other messages are skipped)."""
        data: list[str] = []
        for raw in response:
            line = raw.decode("utf-8").rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:][1:] if line[5:6] == " " else line[5:])
                continue
            if line or not data:
                continue  # other fields (event:, id:), comments (keepalives), blank lines without data
            message = json.loads("\n".join(data))
            data = []
            if isinstance(message, dict) and message.get("id") == request_id and "method" not in message:
                return message
        return None  # the stream ended without our reply

    def initialize(self) -> None:
        result = self.request(
            "initialize", {"protocolVersion": MCP_PROTOCOL, "capabilities": {}, "clientInfo": CLIENT_INFO}
        )
        version = result.get("protocolVersion")
        self.protocol = version if isinstance(version, str) and version else MCP_PROTOCOL
        self.notify("notifications/initialized")

    def list_tools(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor = None
        while True:
            result = self.request("tools/list", {"cursor": cursor} if cursor else {})
            tools.extend(tool for tool in result.get("tools") or [] if isinstance(tool, dict))
            cursor = result.get("nextCursor")
            if not cursor:
                return tools

    def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.request("tools/call", {"name": name, "arguments": arguments})

    def close(self) -> None:
        """End the server's session, if it gave one (DELETE with the session id; failures do not matter)."""
        if not self.session_id:
            return
        try:
            _send("DELETE", self.url, None, self._headers(), 10).close()
        except (HttpError, CannotConnect, OSError, ValueError):
            pass
        self.session_id = None


def result_text(result: dict[str, Any]) -> str:
    """An MCP tool result as the model sees it: the text blocks joined, others as `[type]`; "error: " when
    isError."""
    parts = []
    for block in result.get("content") or []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            kind = block.get("type", "content") if isinstance(block, dict) else "content"
            parts.append(f"[{kind}]")
    text = "\n".join(parts)
    return "error: " + text if result.get("isError") else text


def finished(result: dict[str, Any]) -> bool:
    meta = result.get("_meta")
    platoon = meta.get("platoon") if isinstance(meta, dict) else None
    return isinstance(platoon, dict) and platoon.get("finished") is True


# ---------------------------------------------------------------------------------------------- the agent


def bash_tool(timeout_s: float) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": "bash",
            "description": (
                "Run a bash command in the current directory (stdin is empty). Returns its exit code and the last "
                f"{OUTPUT_CHARS} characters of its output (stdout and stderr merged). A command running longer than "
                f"{_seconds(timeout_s)}s is killed."
            ),
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command to run"}},
                "required": ["command"],
            },
        },
    }


def mcp_function(tool: dict[str, Any]) -> dict[str, Any]:
    schema = tool.get("inputSchema")
    return {
        "type": "function",
        "function": {
            "name": tool["name"],
            "description": tool.get("description") or "",
            "parameters": schema if isinstance(schema, dict) else {"type": "object", "properties": {}},
        },
    }


def parse_arguments(raw: Any) -> dict[str, Any] | None:
    """A tool call's arguments as an object, or None when they are not one."""
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _new_call_id() -> str:
    import uuid

    return "call_" + uuid.uuid4().hex[:12]


def one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class Agent:
    def __init__(self, args: Any, api_key: str, mcp: McpClient | None) -> None:
        self.args = args
        self.api_key = api_key
        self.mcp = mcp
        self.mcp_tools: list[str] = []
        self.tools = [bash_tool(args.command_timeout)]

    def add_mcp_tools(self, tools: list[dict[str, Any]]) -> None:
        for tool in tools:
            name = tool.get("name")
            if not isinstance(name, str) or not name:
                continue
            if name == "bash" or name in self.mcp_tools:
                warn(f"warning: the MCP tool {name!r} is skipped: a tool of that name is already offered")
                continue
            self.mcp_tools.append(name)
            self.tools.append(mcp_function(tool))

    def names(self) -> list[str]:
        return ["bash", *self.mcp_tools]

    def call(self, name: str, raw_arguments: Any) -> tuple[str, bool]:
        """(the tool message text, whether the run is finished). Raises McpError on a transport failure."""
        arguments = parse_arguments(raw_arguments)
        if name not in self.names():
            say(f">>> unknown tool {name!r}")
            available = ", ".join(self.names())
            return f"error: unknown tool {name!r}; the available tools are: {available}", False
        if arguments is None:
            say(f">>> {name}: invalid arguments")
            return (
                f"error: the arguments of {name} must be a JSON object; got {one_line(str(raw_arguments))}",
                False,
            )
        if name == "bash":
            command = arguments.get("command")
            if not isinstance(command, str) or not command.strip():
                say(">>> bash: invalid arguments")
                return 'error: bash needs {"command": "<a shell command>"}', False
            say(f">>> bash: {command}")
            text = run_bash(command, self.args.command_timeout)
            say("<<< " + text.split("\n", 1)[0])
            return text, False
        assert self.mcp is not None
        say(f">>> {name} {json.dumps(arguments, ensure_ascii=False)}")
        try:
            result = self.mcp.call_tool(name, arguments)
        except McpCallError as exc:
            say(f"<<< error: {exc}")
            return f"error: {exc}", False
        text = result_text(result)
        say("<<< " + one_line(text))
        return text, finished(result)

    def run(self, instruction: str) -> tuple[int, str | None]:
        """(exit code, final message)."""
        system = SYSTEM_PROMPT + (MCP_SENTENCE if self.mcp_tools else "")
        messages: list[Any] = [
            {"role": "system", "content": system},
            {"role": "user", "content": instruction},
        ]
        for turn in range(1, self.args.max_turns + 1):
            message = chat(self.args.base_url, self.api_key, self.args.model, messages, self.tools)
            calls = message.get("tool_calls") or []
            content = message.get("content")
            text = content if isinstance(content, str) else ""
            if not calls:
                return EXIT_FINAL, text
            say(f"--- turn {turn}: {len(calls)} tool call(s)")
            # As the endpoint sent it (so the next prompt extends this one), less the fields it left empty.
            messages.append(
                {key: value for key, value in message.items() if value is not None or key == "content"}
            )
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                function = function if isinstance(function, dict) else {}
                call_id = call.get("id") if isinstance(call, dict) else None
                output, done = self.call(str(function.get("name")), function.get("arguments"))
                if done:
                    return EXIT_FINAL, output
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call_id or _new_call_id(),
                        "content": output,
                    }
                )
        say(f"--- the turn limit ({self.args.max_turns}) is reached")
        return EXIT_TURN_LIMIT, None


class Args:
    """The command line's values, as argparse's Namespace holds them."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


#: option -> attribute; the first four are required
OPTIONS = {
    "--base-url": "base_url",
    "--model": "model",
    "--instruction-file": "instruction_file",
    "--final-message-file": "final_message_file",
    "--max-turns": "max_turns",
    "--mcp-url": "mcp_url",
    "--command-timeout": "command_timeout",
}
REQUIRED = ("base_url", "model", "instruction_file", "final_message_file")


def quick_args(argv: list[str]) -> Args | None:
    """The usual command line (`--option value` pairs, each option once, the required ones present, valid
    numbers) without argparse, whose import and set-up were a quarter of the agent's start; None for anything
    else, which argparse then parses (or refuses) as it always did."""
    if len(argv) % 2:
        return None
    values: dict[str, Any] = {}
    for option, value in zip(argv[::2], argv[1::2]):
        name = OPTIONS.get(option)
        if name is None or name in values or value.startswith("-"):
            return None
        values[name] = value
    if any(name not in values for name in REQUIRED):
        return None
    try:
        max_turns = int(values.pop("max_turns", 50))
        command_timeout = float(values.pop("command_timeout", DEFAULT_COMMAND_TIMEOUT_S))
    except ValueError:
        return None
    if max_turns < 1 or not command_timeout > 0:
        return None
    values.setdefault("mcp_url", None)
    return Args(max_turns=max_turns, command_timeout=command_timeout, **values)


def parse_args(argv: list[str] | None) -> Any:
    argv = sys.argv[1:] if argv is None else list(argv)
    quick = quick_args(argv)
    if quick is not None:
        return quick
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> Any:  # a bad invocation exits 1: 2 means a failed model request
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr)
            sys.exit(EXIT_USAGE)

    parser = Parser(prog="platoon_bash.py", description="platoon's small bash agent (key: $PLATOON_API_KEY)")
    parser.add_argument("--base-url", required=True, help="an OpenAI-compatible base URL (ending /v1)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--instruction-file", required=True)
    parser.add_argument("--final-message-file", required=True)
    parser.add_argument("--max-turns", type=int, default=50, help="model calls at most (default 50)")
    parser.add_argument("--mcp-url", default=None, help="the environment's tools over MCP (streamable HTTP)")
    parser.add_argument(
        "--command-timeout",
        type=float,
        default=DEFAULT_COMMAND_TIMEOUT_S,
        help=f"seconds a bash command may run (default {_seconds(DEFAULT_COMMAND_TIMEOUT_S)})",
    )
    args = parser.parse_args(argv)
    if args.max_turns < 1:
        parser.error("--max-turns must be at least 1")
    if not args.command_timeout > 0:
        parser.error("--command-timeout must be positive")
    return args


def _on_term(signum: int, frame: Any) -> None:
    global _PENDING_TERM
    if _STARTING:  # a command is starting and its group is not known yet: run_bash ends the run once it is
        _PENDING_TERM = signum
        return
    kill_commands()  # the commands run in sessions of their own: a signal to this process misses them
    os._exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")  # a sandbox without a UTF-8 locale must not crash a print
    signal.signal(signal.SIGTERM, _on_term)
    try:
        with open(args.instruction_file, encoding="utf-8") as handle:
            instruction = handle.read()
    except OSError as exc:
        warn(f"cannot read the instruction file: {exc}")
        return EXIT_USAGE
    api_key = os.environ.get("PLATOON_API_KEY", "")
    if not api_key:
        warn("PLATOON_API_KEY is not set: the model cannot be called")
        return EXIT_MODEL
    mcp = McpClient(args.mcp_url, api_key) if args.mcp_url else None
    agent = Agent(args, api_key, mcp)
    try:
        if mcp is not None:
            try:
                mcp.initialize()
                agent.add_mcp_tools(mcp.list_tools())
            except McpCallError as exc:
                raise McpError(f"the MCP server at {args.mcp_url} refused: {exc}") from None
        code, final = agent.run(instruction)
    except ModelError as exc:
        warn(str(exc))
        return EXIT_MODEL
    except McpError as exc:
        warn(f"MCP is unavailable: {exc}")
        return EXIT_MCP
    finally:
        kill_commands()
        if mcp is not None:
            mcp.close()
    if final is not None:
        directory = os.path.dirname(os.path.abspath(args.final_message_file))
        os.makedirs(directory, exist_ok=True)
        with open(args.final_message_file, "w", encoding="utf-8") as handle:
            handle.write(final)
        say(final)
    return code


if __name__ == "__main__":
    sys.exit(main())
