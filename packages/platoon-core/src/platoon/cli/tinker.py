"""`platoon tinker serve`: the local Tinker-compatible training server in the foreground.

The server module (its engine, uvicorn) is imported when the command runs, so `platoon --help` stays fast. The command
ends its process once the server has stopped (`exit_process`), even when `main([...])` called it in process.
"""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from platoon.local_server import DEFAULT_ENGINE, DEFAULT_MAX_BODY_BYTES
from platoon.request_limits import DEFAULT_MAX_JSON_DEPTH


class EngineName(enum.StrEnum):
    """The engines `--engine` takes (`platoon.local_server.ENGINE_NAMES`): typer refuses any other as bad usage."""

    numpy = "numpy"
    torch = "torch"


DEFAULT_ENGINE_NAME = EngineName(DEFAULT_ENGINE)


def serve(
    host: Annotated[
        str,
        typer.Option(
            help="The address to listen on; one beyond this machine (0.0.0.0, a LAN address) needs --api-key."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="The port (0: a free one).")] = 0,
    state_dir: Annotated[
        str | None,
        typer.Option(
            "--dir", help="The state directory for checkpoints (default: <site cache>/local-tinker)."
        ),
    ] = None,
    model: Annotated[str, typer.Option(help="The base model the server offers.")] = "platoon/toy",
    api_key: Annotated[
        str | None,
        typer.Option(
            help="The one API key the server takes (tml- and 16 or more characters); default: a fresh random "
            "key, printed on the second stdout line."
        ),
    ] = None,
    max_body_mib: Annotated[
        int, typer.Option(min=1, help="The largest request body, in MiB (413 past it).")
    ] = DEFAULT_MAX_BODY_BYTES >> 20,
    max_json_depth: Annotated[
        int, typer.Option(min=1, help="How deeply a request's JSON may nest (400 past it).")
    ] = DEFAULT_MAX_JSON_DEPTH,
    engine: Annotated[
        EngineName,
        typer.Option(
            metavar="numpy|torch",
            help="What runs the model: numpy, or torch (the local-torch extra; for a GPU).",
        ),
    ] = DEFAULT_ENGINE_NAME,
) -> int:
    """Run the local Tinker-compatible training server until interrupted; prints the TINKER_BASE_URL and the
    TINKER_API_KEY to use."""
    from platoon.local_server.engines import require_engine
    from platoon.local_server.process import check_listening, exit_process, serve_foreground

    check_listening(host, api_key)
    require_engine(engine.value, where="--engine")

    status = serve_foreground(
        host=host,
        port=port,
        state_dir=state_dir,
        model=model,
        api_key=api_key,
        max_body_bytes=max_body_mib << 20,
        max_json_depth=max_json_depth,
        engine=engine.value,
    )
    # The process ends here, as the child server's does: an interpreter exit with torch loaded (or half loaded by
    # the warm-up) can take a minute on a busy machine, and a Ctrl-C must stop the server promptly.
    exit_process(status)
