"""`platoon harbor ...`: registered so the command line is complete; each command says it is not available yet."""

from __future__ import annotations

from platoon.cli.output import new_app
from platoon.cli.pending import not_available

app = new_app("Harbor datasets: fetch and lock, verify, task images.")
images = new_app("Task images: plan, build, verify, alias.")
app.add_typer(images, name="images")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def fetch() -> int:
    """Fetch a Harbor dataset once and pin it with a lock."""
    return not_available("harbor fetch", "the Harbor service")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def verify() -> int:
    """Verify a fetched dataset against its lock."""
    return not_available("harbor verify", "the Harbor service")


for _step in ("plan", "build", "verify", "alias"):

    def _image_step(step: str = _step) -> int:
        return not_available(f"harbor images {step}", "Harbor task images")

    images.command(
        _step,
        help=f"Task images: {_step}.",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(_image_step)
