"""Fixtures shared by core's tests: third-party extensions really installed from tests/fixtures/extensions."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from platoon import plugins

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "extensions"
ACME_MODULES = ("acme_agents", "acme_future", "acme_broken", "acme_clash")

# the layout tests' shared reader of the source's imports (source_imports.py)
sys.path.insert(0, str(Path(__file__).parent))


def _install(target: Path, *names: str) -> Path:
    uv = shutil.which("uv")
    assert uv, "the tests install fixture extensions with uv: put uv on PATH (pip install uv)"
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--no-deps", "--python", sys.executable, "--target", str(target)]
        + [str(FIXTURES / name) for name in names],
        check=True,
    )
    return target


@pytest.fixture(scope="session")
def extension_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Install the fixture extensions once per session into two target directories (two environments)."""
    base = tmp_path_factory.mktemp("extensions")
    return {
        "main": _install(base / "main", "acme-agents", "acme-future", "acme-broken"),
        "clash": _install(base / "clash", "acme-clash"),
    }


def _forget_acme() -> None:
    for name in list(sys.modules):
        if name.split(".", 1)[0] in ACME_MODULES:
            del sys.modules[name]


@pytest.fixture
def fresh_plugins() -> Iterator[None]:
    """A clean plugin state before and after the test (metadata scan, loads, registries)."""
    plugins.reset()
    yield
    plugins.reset()
    _forget_acme()


@pytest.fixture
def with_extensions(
    extension_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, fresh_plugins: None
) -> dict[str, Path]:
    """This process's environment with acme-agents, acme-future and acme-broken installed."""
    monkeypatch.syspath_prepend(str(extension_dirs["main"]))
    importlib.invalidate_caches()
    plugins.reset()
    return extension_dirs


def _run_python(
    code: str, *, path: tuple[Path, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120
    )


@pytest.fixture
def run_python():
    """Run code in a fresh interpreter of this environment: `run_python(code, path=(dir,), env={...})`."""
    return _run_python
