"""The console script leaves the interpreter's shutdown little to walk: `main()` with no argv (what `platoon` and
`python -m platoon` call, `sys.exit` following) freezes the objects alive at its end out of the cyclic collector's
reach; an in-process call (`main([...])`) leaves collection as it was."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from platoon.cli import main


def test_the_console_script_freezes_the_heap_before_exit_and_an_in_process_call_does_not(monkeypatch, capsys):
    # an earlier test's in-process server may have loaded triton, which turns the freeze off
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    gc.unfreeze()
    try:
        assert main(["--help"]) == 0
        assert gc.get_freeze_count() == 0
        monkeypatch.setattr("sys.argv", ["platoon", "--help"])
        assert main() == 0
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert "Usage" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--help"], ["env", "list"]], ids=["root-help", "typer-command"])
def test_a_reader_that_closed_stdout_gets_no_traceback(args):
    """`platoon --help | head -1`: the reader is gone before platoon writes; platoon says nothing on stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe now fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "platoon", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 1


def test_a_command_that_loaded_triton_exits_without_nanobind_leak_reports():
    """`platoon tinker serve --engine torch` builds the model in process, which loads torch's triton (nanobind
    bindings): its exit frees the heap instead of freezing it, so no page of "nanobind: leaked ..." follows a clean
    stop."""
    pytest.importorskip("torch")
    script = (
        "import sys\n"
        "from platoon.local_server.engines import warm_up\n"
        "warm_up('platoon/toy', 'torch')\n"
        "assert 'triton' in sys.modules, 'this check needs a torch that loads triton'\n"
        "from platoon.cli import main\n"
        "sys.argv = ['platoon', '--help']\n"
        "sys.exit(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr
