"""The tests that need torch are the `torch_engine` tests (tests/conftest.py): where torch is not installed (the dev
environment) the suite deselects them rather than skipping or failing them, and says in one line how many and how
to run them; where it is installed, `-m torch_engine` picks exactly them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def _suite(tmp_path: Path) -> Path:
    """The suite's root conftest beside the ways a test needs torch (a mark, an importorskip in the test, in one
    parameter of a fixture, at a module's import) and a plain test, and a plugin that makes `torch` unimportable (as on a machine without it) whether or not this environment has it."""
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = ["--strict-markers"]\nmarkers = ["torch_engine: needs torch"]\n'
    )
    (tmp_path / "hide_torch.py").write_text("import sys\n\nsys.modules['torch'] = None\n")
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.torch_engine
            def test_marked():
                import torch

            def test_asks_for_torch():
                torch = pytest.importorskip("torch")
                assert torch.zeros(1).shape == (1,)

            def test_plain():
                assert True

            @pytest.fixture(params=["numpy", "torch"])
            def engine(request):
                if request.param == "torch":
                    pytest.importorskip("torch")
                return request.param

            def test_engine(engine):
                assert engine in ("numpy", "torch")
            """
        )
    )
    (tmp_path / "test_whole_module.py").write_text(
        'import pytest\n\ntorch = pytest.importorskip("torch")\n\n\ndef test_tensor():\n    assert torch.ones(2).sum() == 2\n'
    )
    return tmp_path


def _pytest(suite: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=suite,
        env={**os.environ, "PYTHONPATH": str(suite)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_without_torch_they_are_deselected_with_one_line_saying_how_to_run_them(tmp_path, workers):
    result = _pytest(_suite(tmp_path), "-q", "-p", "hide_torch", *workers)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout and "skipped" not in result.stdout  # test_plain, test_engine[numpy]
    lines = [line for line in result.stdout.splitlines() if line.startswith("deselected ")]
    assert len(lines) == 1, result.stdout
    assert lines[0].startswith("deselected 3 torch_engine test(s) and 1 module(s) that need torch")
    assert "--group torch-engine" in lines[0] and "pytest -m torch_engine" in lines[0]


def test_with_torch_the_marker_picks_exactly_them(tmp_path):
    pytest.importorskip(
        "torch"
    )  # a torch_engine test itself: .ci/run runs it in the torch engine's environment
    result = _pytest(_suite(tmp_path), "-m", "torch_engine", "-v")
    assert result.returncode == 0, result.stdout + result.stderr
    passed = sorted(line.split()[0] for line in result.stdout.splitlines() if " PASSED" in line)
    assert passed == [
        "test_sample.py::test_asks_for_torch",
        "test_sample.py::test_engine[torch]",
        "test_sample.py::test_marked",
        "test_whole_module.py::test_tensor",
    ]
    assert "2 deselected" in result.stdout.splitlines()[-1]  # test_plain, test_engine[numpy]
