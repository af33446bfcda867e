"""The console script leaves the interpreter's shutdown little to walk: `main()` with no argv (what `platoon` and
`python -m platoon` call, `sys.exit` following) freezes the objects alive at its end out of the cyclic collector's
reach; an in-process call (`main([...])`) leaves collection as it was."""

from __future__ import annotations

import gc

from platoon.cli import main


def test_the_console_script_freezes_the_heap_before_exit_and_an_in_process_call_does_not(monkeypatch, capsys):
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
