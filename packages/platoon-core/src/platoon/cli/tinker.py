"""`platoon tinker serve`: the local Tinker-compatible training server in the foreground.

The server module (torch, uvicorn) is imported when the command runs, so `platoon --help` stays fast. The command
ends its process once the server has stopped (`exit_process`), even when `main([...])` called it in process.
"""

from __future__ import annotations

from typing import Annotated

import typer


def serve(
    host: Annotated[str, typer.Option(help="The address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="The port (0: a free one).")] = 0,
    state_dir: Annotated[
        str | None,
        typer.Option(
            "--dir", help="The state directory for checkpoints (default: <site cache>/local-tinker)."
        ),
    ] = None,
    model: Annotated[str, typer.Option(help="The base model the server offers.")] = "platoon/toy",
) -> int:
    """Run the local Tinker-compatible training server until interrupted; prints the TINKER_BASE_URL to use."""
    from platoon.local_server import require_torch

    require_torch()
    from platoon.local_server.process import exit_process, serve_foreground

    status = serve_foreground(host=host, port=port, state_dir=state_dir, model=model)
    # The process ends here, as the child server's does: an interpreter exit with torch loaded (or half loaded by
    # the warm-up) can take a minute on a busy machine, and a Ctrl-C must stop the server promptly.
    exit_process(status)
