"""`platoon tinker serve` ends its process once the server stopped, without the interpreter's teardown or the C++
exit handlers: a Ctrl-C that lands while the warm-up thread still imports torch once left libtorch's exit-time
destructors running for a minute on a loaded machine. The check is structural (an `atexit` handler never runs),
not a timing."""

from __future__ import annotations

import signal
import subprocess
import sys

#: a hang guard only
HANG_GUARD_SECONDS = 120

SCRIPT = """
import atexit, sys
atexit.register(lambda: print("interpreter teardown ran", file=sys.stderr, flush=True))
from platoon.cli import main
sys.exit(main(["tinker", "serve", "--dir", sys.argv[1]]))
"""


def test_a_ctrl_c_during_the_warm_up_ends_the_process_without_the_teardown(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", SCRIPT, str(tmp_path / "state")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as at a terminal (a suite started without job control inherits SIGINT ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().startswith("http://127.0.0.1:")
        # The banner (one write) follows the URL on stderr; a Ctrl-C before it would stop the server before it says it.
        assert child.stderr is not None
        assert child.stderr.readline().startswith("platoon: local Tinker server for ")
        child.send_signal(signal.SIGINT)  # at once: the warm-up thread is importing torch
        try:
            _, stderr = child.communicate(timeout=HANG_GUARD_SECONDS)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGABRT)
            _, stderr = child.communicate(timeout=10)
            raise AssertionError(f"the server did not stop after Ctrl-C; its threads:\n{stderr}") from None
    finally:
        child.kill()
    assert child.returncode == 0, stderr
    assert "interpreter teardown ran" not in stderr
