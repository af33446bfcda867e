"""Where torch is not installed (the dev environment), the suite deselects the tests marked `torch_engine` rather
than skipping or failing them, and says in one line how many and how to run them (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def _suite_without_torch(tmp_path: Path) -> Path:
    """A copy of the suite's root conftest beside one torch_engine test and one plain test, and a plugin that makes
    `torch` unimportable (as on a machine without it) whether or not this environment has it."""
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
            def test_needs_torch():
                import torch

            def test_plain():
                assert True
            """
        )
    )
    return tmp_path


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_torch_engine_tests_are_deselected_with_one_line_saying_how_to_run_them(tmp_path, workers):
    suite = _suite_without_torch(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(suite)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "hide_torch", "-p", "no:cacheprovider", "-q", *workers],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout and "skipped" not in result.stdout
    lines = [line for line in result.stdout.splitlines() if line.startswith("deselected 1 torch_engine test")]
    assert len(lines) == 1, result.stdout
    assert "pytest -m torch_engine" in lines[0] and "--group torch-engine" in lines[0]
