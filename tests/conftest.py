"""Every test runs without the developer's own site profile or extension-requirement override, without the task
listing cache (a test that changes an environment in place must see it listed anew; the cache's own tests turn it
on), and leaves no Tinker SDK session heartbeating after it."""

from __future__ import annotations

import ast
import asyncio
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _isolated_site(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    monkeypatch.setenv("PLATOON_TASK_CACHE", "0")
    for name in (
        "PLATOON_SITE",
        "PLATOON_HARBOR_CACHE",
        "PLATOON_TOOLCHAINS",
        "PLATOON_IGNORE_EXTENSION_REQUIREMENTS",
    ):
        monkeypatch.delenv(name, raising=False)
    # A run sets its sandbox labels in os.environ (platoon.sandbox_runs): set-then-delete makes the teardown
    # remove one a test's in-process run set, so it never labels a later test's sandboxes.
    monkeypatch.setenv("PLATOON_SANDBOX_LABELS", "{}")
    monkeypatch.delenv("PLATOON_SANDBOX_LABELS")


# ---------------------------------------------------------------------------------------------------------------
# TextCraft's published RAO prompts
#
# `.ci/run` fetches platoon-textcraft 0.1.0 once into .cache/textcraft-published (as it fetches the test
# tokenizers); tests that run the RAO recipes copy its prompts.py into their own site cache. Nothing is downloaded.

PUBLISHED_PROMPTS_CACHE = Path(
    os.environ.get("PLATOON_TEXTCRAFT_PUBLISHED")
    or Path(__file__).resolve().parents[1] / ".cache" / "textcraft-published"
)


@pytest.fixture(scope="session")
def fetched_published_prompts() -> Path:
    """The cache root CI fetched platoon-textcraft 0.1.0 into (its wheel and prompts.py)."""
    from platoon_textcraft.published_prompts import location

    if not (location(PUBLISHED_PROMPTS_CACHE) / "prompts.py").is_file():
        pytest.fail(
            "the published RAO prompts are not fetched: run `python -m platoon_textcraft.published_prompts fetch "
            "--cache .cache/textcraft-published` (CI does, before the tests)"
        )
    return PUBLISHED_PROMPTS_CACHE


@pytest.fixture
def with_published_prompts(fetched_published_prompts: Path):
    """`with_published_prompts(cache_root)`: the published RAO prompts put in that cache root, as a fetch would."""
    from platoon_textcraft.published_prompts import location

    def put(cache_root: Path) -> Path:
        target = location(cache_root)
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(location(fetched_published_prompts) / "prompts.py", target / "prompts.py")
        return cache_root

    return put


# ---------------------------------------------------------------------------------------------------------------
# Tinker SDK sessions
#
# Every `tinker.ServiceClient` starts a task on the SDK's one background event loop that heartbeats its session
# every 10 s until `client.holder.close()` (`platoon.gateway.tinker_service.close_session`); the task holds the
# client, so it is never collected. A client a test leaves open heartbeats for the rest of the session, at a
# server that is gone (or at a later test's server on a reused port) and, after two minutes, logs warnings into
# later tests. These guards fail the test (or, for a module-scoped fixture, the module) that left one open.


def _heartbeats() -> set[asyncio.Task[Any]]:
    """The SDK's session heartbeats still running and not being cancelled; empty while the SDK is not loaded."""
    holder_module = sys.modules.get("tinker.lib.internal_client_holder")
    if holder_module is None:
        return set()
    loop = getattr(holder_module._internal_client_holder_thread_singleton, "_loop", None)
    if loop is None or not loop.is_running():
        return set()

    async def running() -> set[asyncio.Task[Any]]:
        # Runs on the SDK's loop after any close() scheduled before it: a closed client's task is cancelling.
        return {
            task
            for task in asyncio.all_tasks()
            if getattr(task.get_coro(), "__qualname__", "").endswith("._session_heartbeat")
            and not task.done()
            and not task.cancelling()
        }

    return asyncio.run_coroutine_threadsafe(running(), loop).result(timeout=60)


def _session_of(task: asyncio.Task[Any]) -> str:
    frame = getattr(task.get_coro(), "cr_frame", None)
    return str(frame.f_locals.get("session_id")) if frame is not None else "?"


def _is_shadow(task: asyncio.Task[Any]) -> bool:
    """A heartbeat of a holder the SDK made to unpickle a `SamplingClient` (its `_training_client_counter` is None):
    the SDK caches such holders for the process and never closes them, whoever owns their session."""
    frame = getattr(task.get_coro(), "cr_frame", None)
    holder = frame.f_locals.get("self") if frame is not None else None
    return holder is not None and getattr(holder, "_training_client_counter", 0) is None


def _stop(tasks: set[asyncio.Task[Any]]) -> list[str]:
    """Cancel these heartbeats (so they trouble no later test); returns their session ids."""
    for task in tasks:
        task.get_loop().call_soon_threadsafe(task.cancel)
    return sorted(_session_of(task) for task in tasks)


def _left_open(before: set[asyncio.Task[Any]], where: str) -> None:
    leaked = _heartbeats() - before
    # An unpickled copy of a client whose session was already open (a fixture's) opens no session: its redundant
    # heartbeat is stopped here, and the owner closes the session itself.
    owned = {_session_of(task) for task in before}
    copies = {task for task in leaked if _is_shadow(task) and _session_of(task) in owned}
    _stop(copies)
    leaked -= copies
    if leaked:
        sessions = _stop(leaked)
        pytest.fail(
            f"{where} left {len(leaked)} Tinker session(s) heartbeating ({', '.join(sessions)}): close each "
            "ServiceClient it opens when done (client.holder.close(), or "
            "platoon.gateway.tinker_service.close_session(client))",
            pytrace=False,
        )


@pytest.fixture(scope="module", autouse=True)
def _no_tinker_session_outlives_its_module(request: pytest.FixtureRequest) -> Iterator[None]:
    before = _heartbeats()
    yield
    _left_open(before, f"module {request.module.__name__} (its fixtures)")


@pytest.fixture(autouse=True)
def _no_tinker_session_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    before = _heartbeats()
    yield
    _left_open(before, request.node.nodeid)


# ---------------------------------------------------------------------------------------------------------------
# The guarantee sheet
#
# A fault-injection test says what it proves with `@pytest.mark.guarantee(fault, environment, holds)`. When
# `PLATOON_GUARANTEE_RESULTS` names a file, the session writes each marked test's result there, in collection order,
# and `scripts/guarantee_sheet.py` makes docs/reliability.md's table from it (CI checks the committed table against
# its own run). Every test under tests/faults must carry the marker. Under pytest-xdist the marker's text travels to
# the controller in the reports' user_properties, so the one file is written there, in the same order as a serial run.

_FAULTS_DIR = Path(__file__).parent / "faults"
_GUARANTEE_PROPERTY = "platoon-guarantee"
_COLLECTION_INDEX: dict[str, int] = {}
_GUARANTEES: dict[str, dict[str, object]] = {}


# ---------------------------------------------------------------------------------------------------------------
# The torch engine's tests
#
# The dev environment has no torch (the local server's default engine is numpy's). A torch_engine test is one marked
# so (`@pytest.mark.torch_engine`, `pytestmark` of its module, `pytest.param(..., marks=...)`), one whose function or
# fixture asks for torch (`pytest.importorskip("torch")`; of a parametrized fixture, the parameter "torch"), or any
# test of a module that needs torch to import (a module-level `import torch` or `pytest.importorskip("torch")`). Where torch is missing they are deselected, and such modules not collected,
# rather than skipped or failed, so the main run reports no skip CI could have run; the summary says how many and how
# to run them. Where torch is installed they carry the marker, so `-m torch_engine` picks them (.ci/run does, in the
# torch-engine group's environment).

TORCH_ENGINE_COMMAND = (
    "UV_PROJECT_ENVIRONMENT=.venv-torch uv sync --frozen --all-packages --group torch-engine && "
    "UV_PROJECT_ENVIRONMENT=.venv-torch uv run --frozen --all-packages --group torch-engine pytest -m torch_engine"
)
_TORCH_ENGINE_LEFT_OUT = pytest.StashKey[dict[str, int]]()
TESTS_ROOT = Path(__file__).resolve().parent


@functools.cache
def _torch_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _asks_for_torch(node: ast.AST) -> bool:
    """`import torch`, `from torch... import`, `pytest.importorskip("torch")`, or a `torch_engine` mark."""
    if isinstance(node, ast.Import):
        return any(alias.name.partition(".")[0] == "torch" for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").partition(".")[0] == "torch"
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "importorskip"
    ):
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "torch"
    return isinstance(node, ast.Attribute) and node.attr == "torch_engine"


def _is_fixture(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        isinstance(target := (d.func if isinstance(d, ast.Call) else d), ast.Attribute | ast.Name)
        and (target.attr if isinstance(target, ast.Attribute) else target.id) == "fixture"
        for d in function.decorator_list
    )


@functools.cache
def _torch_needs(path: Path) -> tuple[bool, frozenset[str], frozenset[str]]:
    """(whether the module needs torch as a whole, its test functions that ask for torch, its fixtures that do)."""
    source = path.read_text(encoding="utf-8")
    if "torch" not in source:
        return False, frozenset(), frozenset()
    tree = ast.parse(source, str(path))
    functions: set[str] = set()
    fixtures: set[str] = set()
    whole = False
    for statement in tree.body:
        bodies = statement.body if isinstance(statement, ast.ClassDef) else [statement]
        for node in bodies:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if any(_asks_for_torch(inner) for inner in ast.walk(node)):
                    (fixtures if _is_fixture(node) else functions).add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom | ast.Assign | ast.Expr):
                # a module-level import or importorskip of torch, or `pytestmark = ...torch_engine...`
                whole = whole or any(_asks_for_torch(inner) for inner in ast.walk(node))
    return whole, frozenset(functions), frozenset(fixtures)


def _needs_torch(item: pytest.Item) -> bool:
    """Whether the item's module or function asks for torch, or a fixture of its module or of a conftest above it
    does: a parametrized one only for the parameter `"torch"` (an engine fixture's `params=["numpy", "torch"]`)."""
    path = Path(str(item.path))
    whole, functions, _ = _torch_needs(path)
    if whole or getattr(item, "originalname", item.name) in functions:
        return True
    fixture_files = [path, *(d / "conftest.py" for d in path.parents if TESTS_ROOT in (d, *d.parents))]
    asking = set().union(*(_torch_needs(f)[2] for f in fixture_files if f.is_file()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(
        name in asking and (name not in params or params[name] == "torch")
        for name in getattr(item, "fixturenames", ())
    )


def _left_out(config: pytest.Config) -> dict[str, int]:
    return config.stash.setdefault(_TORCH_ENGINE_LEFT_OUT, {"tests": 0, "modules": 0})


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if (
        collection_path.suffix == ".py"
        and collection_path.name.startswith("test_")
        and not _torch_installed()
        and _torch_needs(collection_path)[0]
    ):
        _left_out(config)["modules"] += 1
        return True
    return None


class _TorchEngineTests:
    """Marks the torch_engine tests before `-m` selects (hence a plugin of its own, tryfirst), and deselects them
    where torch is missing."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        for item in items:
            if Path(str(item.path)).suffix == ".py" and _needs_torch(item):
                item.add_marker("torch_engine")
        left_out = _left_out(config)
        if not _torch_installed():
            deselected = [item for item in items if item.get_closest_marker("torch_engine") is not None]
            if deselected:
                config.hook.pytest_deselected(items=deselected)
                items[:] = [item for item in items if item.get_closest_marker("torch_engine") is None]
            left_out["tests"] = len(deselected)
        # an xdist worker's counts reach the controller, which prints the summary, through its workeroutput
        workeroutput = getattr(config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput["torch_engine_left_out"] = dict(left_out)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        reported = getattr(node, "workeroutput", {}).get("torch_engine_left_out", {})
        left_out = _left_out(node.config)
        for key, count in reported.items():
            left_out[key] = max(left_out[key], count)  # every worker collects the same tests

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        left_out = _left_out(config)
        if left_out["tests"] or left_out["modules"]:
            terminalreporter.write_line(
                f"deselected {left_out['tests']} torch_engine test(s) and {left_out['modules']} module(s) that "
                f"need torch: torch is not installed here; run them with {TORCH_ENGINE_COMMAND}"
            )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_TorchEngineTests(), "platoon-torch-engine-tests")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for index, item in enumerate(items):
        _COLLECTION_INDEX[item.nodeid] = index
        if _FAULTS_DIR in Path(str(item.path)).parents and item.get_closest_marker("guarantee") is None:
            raise pytest.UsageError(
                f"{item.nodeid}: a fault test names its guarantee (@pytest.mark.guarantee)"
            )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("guarantee")
    if marker is not None:
        fault, environment, holds = marker.args
        guarantee = {"fault": fault, "environment": environment, "holds": holds}
        item.user_properties.append(
            (_GUARANTEE_PROPERTY, {**guarantee, "order": _COLLECTION_INDEX.get(item.nodeid, 0)})
        )
    escape = item.get_closest_marker("escape")
    if escape is not None:
        cell = dict(
            zip(("configuration", "label", "row", "what", "capability", "kind"), escape.args, strict=True)
        )
        item.user_properties.append(
            (_ESCAPE_PROPERTY, {**cell, "order": _COLLECTION_INDEX.get(item.nodeid, 0)})
        )


#: how long a guarantee test's leftovers may take to go once it ended (a process exiting, a container removed): a
#: hang guard on a loaded machine, spent only when something is left
_LEFTOVER_GRACE_SECONDS = 30.0


def _processes_in(folder: Path) -> list[str]:
    """Live processes, other than this one, whose command line names `folder` or who run in it."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(Path(entry.path, "cwd"))
        except OSError:  # gone while we looked, or not ours to read
            continue
        if cmdline and (str(folder) in cmdline or Path(cwd).is_relative_to(folder)):
            found.append(f"pid {entry.name}: {cmdline.strip()[:300]}")
    return found


def _containers_of_runs_in(folder: Path) -> list[str]:
    """Containers (running or not) whose run label is a run directory under `folder`; none when no engine answers."""
    docker = os.environ.get("PLATOON_DOCKER", "docker")
    if shutil.which(docker) is None:
        return []
    try:
        listed = subprocess.run(
            [
                docker,
                "ps",
                "--all",
                "--filter",
                "label=platoon.run",
                "--format",
                '{{.Names}} {{.Label "platoon.run"}}',
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        return ["the Docker engine did not list its containers within 60 s"]
    if listed.returncode != 0:
        return []  # no engine here: this test started no container
    return [
        line for line in listed.stdout.splitlines() if Path(line.partition(" ")[2]).is_relative_to(folder)
    ]


@pytest.fixture(autouse=True)
def _a_guarantee_leaves_nothing_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every row of the guarantee sheet also holds that its fault left nothing running: once a guarantee test and
    its fixtures are done, no process names its folder or runs in it, and no container carries the label of a run
    in it. A teardown failure fails the row."""
    if request.node.get_closest_marker("guarantee") is None or "tmp_path" not in request.fixturenames:
        yield
        return
    folder: Path = request.getfixturevalue("tmp_path")
    yield
    deadline = time.monotonic() + _LEFTOVER_GRACE_SECONDS
    while left := _processes_in(folder) + _containers_of_runs_in(folder):
        if time.monotonic() > deadline:
            pytest.fail(f"{request.node.nodeid} left these running:\n" + "\n".join(left), pytrace=False)
        time.sleep(0.5)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record_escape_cell(report)
    guarantee = next((value for name, value in report.user_properties if name == _GUARANTEE_PROPERTY), None)
    if guarantee is None:
        return
    entry = _GUARANTEES.setdefault(report.nodeid, {"nodeid": report.nodeid, **guarantee, "outcome": "passed"})
    if report.failed:
        entry["outcome"] = "failed"
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"


def pytest_sessionfinish(session: pytest.Session) -> None:
    is_xdist_worker = hasattr(session.config, "workerinput")
    escapes_target = os.environ.get("PLATOON_SECURITY_RESULTS")
    if escapes_target and _ESCAPES and not is_xdist_worker:
        cells = sorted(_ESCAPES.values(), key=lambda entry: int(str(entry["order"])))
        rows = [{key: value for key, value in entry.items() if key != "order"} for entry in cells]
        Path(escapes_target).write_text(json.dumps(rows, indent=1) + "\n")
    target = os.environ.get("PLATOON_GUARANTEE_RESULTS")
    if target and _GUARANTEES and not is_xdist_worker:
        in_collection_order = sorted(_GUARANTEES.values(), key=lambda entry: int(str(entry["order"])))
        rows = [
            {key: value for key, value in entry.items() if key != "order"} for entry in in_collection_order
        ]
        Path(target).write_text(json.dumps(rows, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# The escape suite's table
#
# An escape-suite test (tests/security) names its cell with `@pytest.mark.escape(configuration, label, row, what,
# capability, kind)` and appends its verdict (held, escaped, not enforced, works, broken, no result) and evidence
# to its user_properties. When `PLATOON_SECURITY_RESULTS` names a file, the session writes every cell there, as the
# guarantee sheet's results are written, and `scripts/security_table.py` makes docs/security.md's table from it.

_ESCAPE_PROPERTY = "platoon-escape"
_ESCAPE_VERDICT_PROPERTY = "platoon-escape-verdict"  # tests/security/escape_suite.py appends it
_ESCAPES: dict[str, dict[str, object]] = {}


def _record_escape_cell(report: pytest.TestReport) -> None:
    cell = next((value for name, value in report.user_properties if name == _ESCAPE_PROPERTY), None)
    if cell is None:
        return
    entry = _ESCAPES.setdefault(report.nodeid, {"nodeid": report.nodeid, **cell, "outcome": "passed"})
    for name, value in report.user_properties:
        if name == _ESCAPE_VERDICT_PROPERTY:
            entry.update(value)
    if report.failed:
        entry["outcome"] = "failed"
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
