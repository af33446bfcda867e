"""Every shell and Python block of README.md, CONTRIBUTING.md and docs/ runs, so no command in the docs can rot.

Each page is one test: its fenced ```bash / ```sh / ```shell / ```console / ```python blocks run in page order in a
fresh working folder (a copy of examples/, links to benchmarks/, scripts/, recipes/ and packages/), shell blocks with `bash -euo
pipefail`, Python blocks in one interpreter per page (so a page's later blocks see its earlier names; top-level
`await` works). Commands find this environment's `platoon` and `python` first on PATH; `uv` is a stand-in that runs
`uv run ... CMD` as CMD in this environment and treats `uv sync` as done (this environment is the synced one), so a
block never syncs or installs. A page whose blocks take more than a few seconds (training runs) is marked `slow`.

An HTML comment on the lines right above a block's fence adjusts how it runs (CONTRIBUTING.md documents them for
writers); each says why in its own words:

    <!-- docs-test: skip REASON -->          not run; listed with its reason by test_exemptions_are_few_and_listed
    <!-- docs-test: compile REASON -->       compiled, not run (a fragment of a larger program); listed likewise
    <!-- docs-test: file PATH -->            the block is a file's content: written to PATH (Python is compiled)
    <!-- docs-test: cd DIR -->               run in DIR of the working folder ($DOCS_REPO: the repository,
                                             $DOCS_TMP: the page's temporary folder, where a clone goes)
    <!-- docs-test: env NAME=VALUE -->       an environment variable for this block
    <!-- docs-test: replace OLD => NEW -->   run the block with OLD replaced by NEW (a stand-in URL, a free port)
    <!-- docs-test: before COMMAND -->       a shell command run before the block (creating what it reads)
    <!-- docs-test: server TEXT -->          the line holding TEXT starts a foreground server: it runs in the
                                             background until it prints its URL, the block's other lines run, then
                                             it is stopped with SIGINT and must exit cleanly
    <!-- docs-test: stand-in NAME -->        a hosted service replaced by a local one for the page: `local-tinker`
                                             (TINKER_BASE_URL and TINKER_API_KEY of platoon's local server) or
                                             `hosted-openai` (an OpenAI-compatible server answering number search
                                             with a scripted binary search at $DOCS_OPENAI_BASE_URL, its key in
                                             $OPENAI_API_KEY)
    <!-- docs-test: requires MODULE -->      skipped (and said so) where MODULE is not installed
    <!-- docs-test: slow -->                 the page's test is marked slow
    <!-- docs-test: files-from PAGE -->      first write the `file` blocks of PAGE (relative to the repository)
    <!-- docs-test: venv REQUIREMENT -->     an install block: it runs in a fresh virtual environment (with pip)
                                             holding the locked third-party dependencies of REQUIREMENT (a
                                             workspace package with extras: `platoon[tinker,ors]`), activated, and
                                             offline: `pip` and `uv pip` install into it from local files only,
                                             `uv build` builds; nothing reaches the registry or this environment.
                                             `venv REQUIREMENT editable` also installs the package itself, editable
                                             from this repository (a block that builds on an installed platoon).
                                             The page's blocks naming the same venv share it (a Python block runs
                                             in an interpreter of its own there, in the block's `cd` folder)
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import string
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")],
    key=lambda p: str(p.relative_to(ROOT)),
)
RUN_LANGUAGES = {"bash", "sh", "shell", "console", "python"}
DIRECTIVE = re.compile(r"^<!--\s*docs-test:\s*(\S+)\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
BLOCK_TIMEOUT_S = 300
#: how long a `server` block's server may take to print its URL (platoon's own START_TIMEOUT for its server child)
SERVER_START_S = 180
#: exemptions (skip or compile) allowed across all docs: raising it needs a reason in the block's comment
MAX_EXEMPT = 12


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    directives: list[tuple[str, str]] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def values(self, key: str) -> list[str]:
        return [value for name, value in self.directives if name == key]

    def first(self, key: str) -> str | None:
        found = self.values(key)
        return found[0] if found else None


def parse(page: Path) -> list[Block]:
    """Every fenced block of a page with the directives right above it (the fence's indentation is removed)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        indent, ticks, language = match.groups()
        end = index + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        body = [line[len(indent) :] if line.startswith(indent) else line for line in lines[index + 1 : end]]
        directives: list[tuple[str, str]] = []
        above = index - 1
        while above >= 0 and (found := DIRECTIVE.match(lines[above].strip())):
            directives.insert(0, (found.group(1), found.group(2)))
            above -= 1
        blocks.append(Block(page, index + 1, language.lower(), "\n".join(body) + "\n", directives))
        index = end + 1
    return blocks


def _runnable(block: Block) -> bool:
    return block.language in RUN_LANGUAGES or block.first("file") is not None


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _page_params() -> list[Any]:
    params = []
    for page in PAGES:
        blocks = [b for b in parse(page) if _runnable(b)]
        if not blocks:
            continue
        marks = [pytest.mark.slow] if any(b.first("slow") is not None for b in blocks) else []
        params.append(pytest.param(page, id=_page_id(page), marks=marks))
    return params


# ---------------------------------------------------------------------------------------------------------------
# The working folder and the `uv` stand-in

UV_STAND_IN = r"""#!/usr/bin/env bash
# docs test: `uv run [options] CMD ...` runs CMD in the test's environment; `uv sync` is done already (the test
# runs in the synced environment). Anything else would install or build, which a docs block must not do here.
set -euo pipefail
sub="${1:-}"; shift || true
case "$sub" in
  run)
    while [ $# -gt 0 ]; do
      case "$1" in
        --frozen|--locked|--exact|--no-sync|--quiet|-q|--all-packages|--all-extras) shift ;;
        --package|--extra|--group|--python|-p|--project|--directory|--with) shift 2 ;;
        --package=*|--extra=*|--group=*|--python=*|--project=*|--directory=*) shift ;;
        *) break ;;
      esac
    done
    exec "$@" ;;
  sync) echo "(docs test) uv sync: this environment is already synced" >&2 ;;
  build|pip)  # an install block's own throwaway environment (the venv directive), offline
    [ -n "${DOCS_VENV:-}" ] || { echo "(docs test) uv $sub installs or builds: mark the block with venv" >&2; exit 97; }
    exec "$DOCS_REAL_UV" "$sub" "$@" ;;
  --version) echo "uv (docs-test stand-in)" ;;
  *) echo "(docs test) uv $sub is not stood in: mark the block with a docs-test directive" >&2; exit 97 ;;
esac
"""


def _workdir(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples")
    for name in ("benchmarks", "scripts", "recipes", "packages"):
        (work / name).symlink_to(ROOT / name)
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    uv = bin_dir / "uv"
    uv.write_text(UV_STAND_IN)
    uv.chmod(0o755)
    (tmp / "home").mkdir()
    return work


def _environment(tmp: Path, work: Path) -> dict[str, str]:
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([str(tmp / "bin"), venv_bin, env.get("PATH", "")])
    env["HOME"] = str(tmp / "home")
    env["XDG_CONFIG_HOME"] = str(tmp / "home" / ".config")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(work), env.get("PYTHONPATH")]))
    env["DOCS_REPO"] = str(ROOT)
    env["DOCS_REAL_UV"] = shutil.which("uv") or "uv"
    env["COLUMNS"] = "100"
    for name in ("TINKER_BASE_URL", "TINKER_API_KEY", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS"):
        env.pop(name, None)
    return env


# ---------------------------------------------------------------------------------------------------------------
# Stand-ins for hosted services


@contextlib.contextmanager
def _local_tinker(env: dict[str, str]) -> Iterator[dict[str, str]]:
    from platoon.local_server import local_tinker_server

    with local_tinker_server(model="platoon/toy") as server:
        yield {"TINKER_BASE_URL": server.base_url, "TINKER_API_KEY": server.api_key}


def _guess(messages: list[dict[str, Any]]) -> int:
    """Binary search over an OpenAI conversation of number search: the range from the task, hints from tools."""
    text = str(next(m["content"] for m in messages if m.get("role") == "user"))
    found = re.search(r"between (\d+) and (\d+)", text)
    low, high = (int(found.group(1)), int(found.group(2))) if found else (0, 1024)
    guesses = [
        int(json.loads(call["function"]["arguments"])["number"])
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or ()
    ]
    hints = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
    for number, hint in zip(guesses, hints, strict=False):
        low, high = (
            (number + 1, high)
            if "Too low" in hint
            else (low, number - 1)
            if "Too high" in hint
            else (low, high)
        )
    return (low + high) // 2


@contextlib.contextmanager
def _hosted_openai(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """An OpenAI-compatible Chat Completions server on 127.0.0.1 that checks its key, answers the probe with OK and
    number search with binary-search tool calls."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    key = "sk-docs-test-0123456789"

    async def chat(request: Request) -> JSONResponse:
        if request.headers.get("authorization") != f"Bearer {key}":
            return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
        body = json.loads(await request.body())
        messages = body.get("messages") or []
        if len(messages) == 1 and messages[0].get("content") == "Reply with OK.":
            message: dict[str, Any] = {"role": "assistant", "content": "OK"}
        else:
            arguments = json.dumps({"number": _guess(messages)})
            call = {"id": f"call_{time.monotonic_ns()}", "type": "function"}
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{**call, "function": {"name": "guess", "arguments": arguments}}],
            }
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return JSONResponse(
            {
                "id": f"chatcmpl-{time.monotonic_ns()}",
                "object": "chat.completion",
                "model": body.get("model", "stand-in"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10},
            }
        )

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the hosted-openai stand-in did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield {"DOCS_OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": key}
    finally:
        server.should_exit = True
        thread.join(timeout=10)


STAND_INS = {"local-tinker": _local_tinker, "hosted-openai": _hosted_openai}


def _install_venv(tmp: Path, requirement: str, env: dict[str, str]) -> dict[str, str]:
    """A fresh venv (with pip, which install blocks call) holding the locked third-party dependencies of
    `requirement`, and the environment that runs a block in it, activated and offline. The lock's versions come
    from uv's cache, so an install block resolves nothing from the registry: the packages it installs from local
    wheels, folders or git URLs find their dependencies already there."""
    from packaging.requirements import Requirement

    spec, _, flag = requirement.partition(" ")
    assert flag in ("", "editable"), f"venv takes REQUIREMENT [editable], not {requirement!r}"
    wanted = Requirement(spec)
    venv = tmp / f"venv-{len(list(tmp.glob('venv-*')))}"
    uv = env["DOCS_REAL_UV"]
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    lock = venv / "pylock.toml"
    export = [
        "export",
        "--frozen",
        "--quiet",
        "--format",
        "pylock.toml",
        "--package",
        wanted.name,
        "--no-dev",
    ]
    extras = [f"--extra={extra}" for extra in sorted(wanted.extras)]
    subprocess.run(
        [uv, *export, *extras, "--no-emit-workspace", "--output-file", str(lock)], cwd=ROOT, check=True
    )
    python = str(venv / "bin" / "python")
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--offline", "--python", python, "-r", str(lock)], check=True
    )
    if flag == "editable":  # the package itself too, from this repository, as `uv sync` installs it
        own = ["install", "--quiet", "--offline", "--no-deps", "--python", python, "--editable"]
        subprocess.run([uv, "pip", *own, str(ROOT / "packages" / wanted.name)], check=True)
    # The `uv` stand-in first, then the venv, and not this environment: `pip`, `python` and every script a block
    # installs are the venv's own, and a command the install failed to provide is missing, not found here.
    this_env = str(Path(sys.executable).parent)
    rest = [entry for entry in env["PATH"].split(os.pathsep) if entry not in (this_env, str(tmp / "bin"))]
    return {
        "DOCS_VENV": str(venv),
        "VIRTUAL_ENV": str(venv),
        "UV_PYTHON": python,  # uv's interpreter setting outranks VIRTUAL_ENV: name the venv's own
        "PATH": os.pathsep.join([str(tmp / "bin"), str(venv / "bin"), *rest]),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "UV_OFFLINE": "1",
        "PYTHONPATH": "",
    }


# ---------------------------------------------------------------------------------------------------------------
# Running blocks

PY_RUNNER = r"""
import ast, asyncio, inspect, json, os, sys, traceback
protocol = os.fdopen(int(sys.argv[1]), "w")
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    block = json.loads(line)
    error = None
    try:
        code = compile(block["source"], block["where"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(code, namespace)
        if inspect.iscoroutine(result):
            asyncio.run(result)
    except BaseException:
        error = traceback.format_exc()
    sys.stdout.flush(); sys.stderr.flush()
    protocol.write(json.dumps({"error": error}) + "\n"); protocol.flush()
"""


class PythonSession:
    """One interpreter per page, fed one block at a time; its output goes to the test's captured output."""

    def __init__(self, cwd: Path, env: dict[str, str], python: Path | None = None) -> None:
        read, write = os.pipe()
        self.process = subprocess.Popen(
            [str(python or sys.executable), "-c", PY_RUNNER, str(write)],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            text=True,
            pass_fds=(write,),
        )
        os.close(write)
        self.protocol = os.fdopen(read)

    def run(self, block: Block, source: str) -> str | None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"source": source, "where": block.where}) + "\n")
        self.process.stdin.flush()
        line = self.protocol.readline()
        if not line:
            return f"the page's Python process exited ({self.process.wait()})"
        error: str | None = json.loads(line)["error"]
        return error

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.protocol.close()


def _shell(block: Block, source: str) -> str:
    if block.language == "console":  # `$ command` lines are commands; the rest is output
        source = "\n".join(line[2:] for line in source.splitlines() if line.startswith("$ ")) + "\n"
    server = block.first("server")
    if server is None:
        return source
    lines = source.splitlines()
    (index,) = [i for i, line in enumerate(lines) if server in line]
    command = lines[index].split("#", 1)[0].strip()
    # Job control on: a background job otherwise starts with SIGINT ignored, and Ctrl-C is what stops the server.
    # The wait for its URL is a hang guard (as long as platoon gives its own server child to start), and a server
    # that never printed one fails the block instead of being interrupted and passing.
    started = (
        f'set -m\n{command} >"$DOCS_TMP/server.log" 2>&1 &\nserver_pid=$!\nSECONDS=0\n'
        "until grep -q 'http://' \"$DOCS_TMP/server.log\"; do "
        'kill -0 "$server_pid" 2>/dev/null || { cat "$DOCS_TMP/server.log"; exit 1; }; '
        f'[ "$SECONDS" -lt {SERVER_START_S} ] || {{ echo "docs test: the server printed no URL within '
        f'{SERVER_START_S} s" >&2; kill -KILL "$server_pid"; cat "$DOCS_TMP/server.log"; exit 1; }}; '
        "sleep 0.1; done\n"
    )
    stop = (
        'kill -INT "$server_pid"\nstatus=0; wait "$server_pid" || status=$?\n'
        'cat "$DOCS_TMP/server.log"; [ "$status" = 0 ] || [ "$status" = 130 ]\n'
    )
    return "\n".join([*lines[:index], started, *lines[index + 1 :], stop]) + "\n"


def _run_shell(
    block: Block, script: str, cwd: Path, env: dict[str, str], tmp: Path
) -> subprocess.CompletedProcess[str]:
    """Run a shell block in a session of its own. Past its timeout every process of that session is killed (a
    `server` block's server is in a process group of its own, which killing the shell would leave running) and
    the block fails with what it and its server printed."""
    timeout = int(block.first("timeout") or BLOCK_TIMEOUT_S)
    with subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # Ctrl-C as at a terminal: a suite started as a background job of a script inherits SIGINT ignored, and a
        # server a block starts would then ignore the Ctrl-C that stops it (the block ran into its timeout).
        preexec_fn=_default_sigint,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            left = _kill_session(process.pid)
            stdout, stderr = process.communicate()
            log = tmp / "server.log"
            server = log.read_text(errors="replace")[-4000:] if log.is_file() else "(no server log)"
            pytest.fail(
                f"{block.where}: the shell block ran past its {timeout} s; killed its processes {left}\n"
                f"--- stdout\n{stdout[-4000:]}\n--- stderr\n{stderr[-4000:]}\n--- server log\n{server}"
            )
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _kill_session(sid: int) -> list[str]:
    """SIGKILL every process of session `sid` (field 6 of /proc/PID/stat); their pids and names."""
    killed = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(f"{entry.name} ({name})")
    return killed


def _prepare(block: Block, env: dict[str, str]) -> str:
    """The block's text with its replacements made; `${NAME}` in a replacement is NAME from the page's environment
    (a stand-in's URL), so a file block gets the value itself."""
    source = block.text
    for rule in block.values("replace"):
        old, sep, new = rule.partition(" => ")
        assert sep, f"{block.where}: replace takes OLD => NEW"
        assert old in source, f"{block.where}: replace: {old!r} is not in the block"
        source = source.replace(old, string.Template(new).safe_substitute(env))
    return source


def _write_file(block: Block, work: Path, env: dict[str, str]) -> None:
    target = work / str(block.first("file"))
    target.parent.mkdir(parents=True, exist_ok=True)
    text = _prepare(block, env)
    target.write_text(text, encoding="utf-8")
    if block.language == "python":
        compile(text, block.where, "exec")


def _missing(block: Block) -> str | None:
    for module in block.values("requires"):
        if importlib.util.find_spec(module) is None:
            return module
    return None


@pytest.mark.parametrize("page", _page_params())
def test_docs_page_blocks_run(page: Path, tmp_path: Path) -> None:
    blocks = [b for b in parse(page) if _runnable(b)]
    work = _workdir(tmp_path)
    env = _environment(tmp_path, work)
    env["DOCS_TMP"] = str(tmp_path)
    ran, skipped, timings = 0, [], []
    with contextlib.ExitStack() as stack:
        for name in {value for b in blocks for value in b.values("stand-in")}:
            env.update(stack.enter_context(STAND_INS[name](env)))
        for source_page in {value for b in blocks for value in b.values("files-from")}:
            for other in parse(ROOT / source_page):
                if other.first("file") is not None:
                    _write_file(other, work, env)
        sessions: dict[str | None, PythonSession] = {}  # one interpreter per page, and one per venv it uses
        venvs: dict[str, dict[str, str]] = {}  # a page's blocks naming one venv share it
        try:
            for block in blocks:
                if block.first("file") is not None:
                    _write_file(block, work, env)
                    continue
                if block.first("skip") is not None:
                    skipped.append(f"{block.where}: {block.first('skip')}")
                    continue
                if block.first("compile") is not None:
                    compile(block.text, block.where, "exec", flags=0x2000)  # PyCF_ALLOW_TOP_LEVEL_AWAIT
                    continue
                missing = _missing(block)
                if missing is not None:
                    skipped.append(f"{block.where}: {missing} is not installed here")
                    continue
                where = (block.first("cd") or ".").replace("$DOCS_REPO", str(ROOT))
                cwd = work / where.replace("$DOCS_TMP", str(tmp_path))
                block_env = dict(env)
                venv = block.first("venv")
                if venv is not None:
                    if venv not in venvs:
                        venvs[venv] = _install_venv(tmp_path, venv, env)
                    block_env.update(venvs[venv])
                for assignment in block.values("env"):
                    name, _, value = assignment.partition("=")
                    block_env[name] = value
                for command in block.values("before"):
                    subprocess.run(
                        ["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=block_env, check=True
                    )
                source = _prepare(block, block_env)
                print(f"--- {block.where} ({block.language})", flush=True)
                started = time.monotonic()
                if block.language == "python":
                    if venv not in sessions:
                        python = Path(block_env["DOCS_VENV"]) / "bin" / "python" if venv else None
                        sessions[venv] = PythonSession(cwd if venv else work, block_env, python)
                    error = sessions[venv].run(block, source)
                    assert error is None, f"{block.where}: the Python block failed:\n{error}"
                else:
                    done = _run_shell(block, _shell(block, source), cwd, block_env, tmp_path)
                    print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", flush=True)
                    assert done.returncode == 0, (
                        f"{block.where}: the shell block exited {done.returncode}\n--- stdout\n"
                        f"{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
                    )
                ran += 1
                timings.append(f"{block.where} {time.monotonic() - started:.1f}s")
        finally:
            for session in sessions.values():
                session.close()
    print(f"{_page_id(page)}: {ran} block(s) ran ({', '.join(timings)}); not run: {skipped or 'none'}")
    if skipped and all(s.endswith("is not installed here") for s in skipped) and not ran:
        pytest.skip("; ".join(skipped))


def test_exemptions_are_few_and_listed() -> None:
    """Blocks that do not run (skip, compile) are counted and each names its reason; the count stays small."""
    exempt = []
    total = 0
    for page in PAGES:
        for block in parse(page):
            if block.language not in RUN_LANGUAGES or block.first("file") is not None:
                continue
            total += 1
            for kind in ("skip", "compile"):
                reason = block.first(kind)
                if reason is not None:
                    assert len(reason.split()) >= 3, f"{block.where}: {kind} needs a reason"
                    exempt.append(f"{kind:7} {block.where}: {reason}")
    print(f"{total} shell and Python blocks in the docs; {len(exempt)} not run:", *exempt, sep="\n  ")
    assert len(exempt) <= MAX_EXEMPT, "\n".join(exempt)


def test_directives_are_known() -> None:
    known = {
        "skip", "compile", "file", "cd", "env", "replace", "before", "server", "stand-in", "requires", "slow",
        "files-from", "timeout", "venv",
    }  # fmt: skip
    for page in PAGES:
        for block in parse(page):
            for name, value in block.directives:
                assert name in known, f"{block.where}: unknown docs-test directive {name!r}"
                if name == "stand-in":
                    assert value in STAND_INS, f"{block.where}: unknown stand-in {value!r}"
        text = page.read_text(encoding="utf-8")
        for line in text.splitlines():
            if "docs-test:" in line and line.strip().startswith("<!--"):
                assert DIRECTIVE.match(line.strip()), (
                    f"{_page_id(page)}: malformed directive {line.strip()!r}"
                )
